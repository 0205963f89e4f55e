"""The fingerprint's definition shared by its two paths (``checksums``' torch ops, ``triton_fingerprint``'s
kernel): the two lanes ``(p, g)`` of ``H = sum((b[k] + 1) * g**k) mod p`` over a tensor's bytes, and the closed
form of the ``+ 1`` terms. A module of its own, importing nothing, so that the kernel's module need not import
``checksums`` (which imports ``statistics``, which imports the kernel's module where Triton serves)."""

LANES = ((2147483647, 48271), (2147483629, 40007))


def geometric_sum(g, n, p):
    """``sum(g**k for k < n) mod p``."""
    return (pow(g, n, p) - 1) * pow(g - 1, -1, p) % p

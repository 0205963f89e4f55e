"""A generated torch model module of a given size, for the memory benchmark (``rewrite_memory.py``).

Realistic shapes, repeated with varying names until the size is reached: classes of ``nn.Module`` with layers
built in ``__init__``, ``forward`` methods full of torch and functional calls, method calls on tensors,
operators, comparisons, truth tests, augmented assignments (names, attributes, subscripts), subscript stores,
comprehensions, f-strings, docstrings and comments. Deterministic: the same size gives the same bytes.

    python bench/generated_module.py 1000000 > /tmp/model.py
"""

from __future__ import annotations

import sys

HEADER = '''"""A generated model: many blocks of torch code."""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import relu


'''

BLOCK = '''class Block{n}(nn.Module):
    """Block {n}: attention-like mixing, a gated MLP and a norm."""

    def __init__(self, hidden: int = {h}, heads: int = 4, dropout: float = 0.1) -> None:
        super().__init__()
        self.hidden = hidden
        self.heads = heads
        self.scale = 1.0 / math.sqrt(hidden // heads)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.dropout = nn.Dropout(dropout)
        self.steps = 0

    def attention(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(batch, seq, self.heads, -1).transpose(1, 2)
        k = k.view(batch, seq, self.heads, -1).transpose(1, 2)
        v = v.view(batch, seq, self.heads, -1).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        weights = F.softmax(scores, dim=-1)
        weights = self.dropout(weights)
        out = (weights @ v).transpose(1, 2).reshape(batch, seq, -1)
        return self.proj(out)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc1(x).chunk(2, dim=-1)
        hidden = F.gelu(gate, approximate="tanh") * up
        hidden = torch.cat([hidden, -hidden], dim=-1)
        return self.fc2(relu(hidden))

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        residual = x
        x = self.norm(x)
        x = residual + self.attention(x, mask)
        x += self.mlp(self.norm(x)) * 0.5
        self.steps += 1
        stats = torch.zeros(4)
        stats[0] += x.abs().max()
        stats[1] = x.mean() - x.min()
        if x.dim() > 2 and self.training:
            x = x - x.mean(dim=-1, keepdim=True)
        norms = [torch.linalg.vector_norm(row) for row in x.unbind(0) if row.numel() > 0]
        total = sum(n.item() for n in norms) / max(len(norms), 1)
        # keep the scale bounded: a NaN here is what the dump is for
        while total > {h} and not torch.isnan(x).any():
            x = x / 2
            total /= 2
        assert x.shape[-1] == self.hidden, f"block {n}: width {{x.shape[-1]}} != {{self.hidden}}"
        return x if self.steps % 2 == 0 else torch.tanh(x) + ~(x > 0).int()


def init_block{n}(block: Block{n}, std: float = 0.02) -> None:
    for name, parameter in block.named_parameters():
        if "weight" in name and parameter.dim() >= 2:
            nn.init.normal_(parameter, mean=0.0, std=std / math.sqrt(2 * {n} + 1))
        elif parameter.dim() == 1:
            nn.init.zeros_(parameter)
    block.scale *= 1.0 + {n} / 1000


'''


def generate(size: int) -> bytes:
    """At least ``size`` bytes of the module (whole blocks), ending with a model that uses every block."""
    parts, total, n = [HEADER], len(HEADER), 0
    while total < size:
        block = BLOCK.format(n=n, h=64 + 8 * (n % 16))
        parts.append(block)
        total += len(block)
        n += 1
    blocks = ", ".join(f"Block{i}()" for i in range(min(n, 8)))
    parts.append(f"MODEL = nn.Sequential({blocks})\n")
    return "".join(parts).encode()


if __name__ == "__main__":
    sys.stdout.buffer.write(generate(int(sys.argv[1]) if len(sys.argv) > 1 else 100_000))

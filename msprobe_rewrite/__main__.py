"""``python -m msprobe_rewrite``: the same as the ``msprobe-rewrite`` console script."""

import sys

from .cli import main

sys.exit(main())

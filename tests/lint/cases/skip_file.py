# msprobe: skip-file
# lint-args: --select ALL
# A file that opts out of instrumentation as a whole is not linted either.
from torch import *

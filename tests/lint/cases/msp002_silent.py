# lint-args: --select MSP002
# Star imports from modules that hold no catalogued API, and a relative one with no package to resolve it.
from os.path import *
from collections import *
from torch.nn import *
from .helpers import *

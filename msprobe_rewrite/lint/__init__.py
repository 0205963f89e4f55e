"""The lint behind ``msprobe-rewrite check``: constructs that hide an API call from static instrumentation.

``rules`` lists the rules and selects among them, ``checker`` finds them in one module (with the compiler's
own scopes and resolver), ``noqa`` reads suppression comments, ``output`` prints, ``runner`` is the command.
Nothing here imports torch: the pre-commit hook's environment has none.
"""

from .checker import Finding, check_source  # noqa: F401
from .rules import RULES, RuleSelectionError, enabled_codes  # noqa: F401

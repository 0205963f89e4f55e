"""The names instrumented code and the runtime agree on (docs/contract.md): the module the rewrite imports,
and the global it binds it to. The compiler writes them; the runtime tells instrumented code by the second
(a module whose globals hold it was rewritten). Imports nothing."""

RUNTIME_MODULE = "msprobe_runtime"
RUNTIME_NAME = "__msprobe__"

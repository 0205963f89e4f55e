"""The API accuracy pre-check (``msprobe-rewrite precheck DUMP -o DIR``): replay every API call of a task
'tensor' dump on the CPU, in float64 (the golden) and in the call's own dtype, and grade the dumped (device)
result against the golden, relative to what the CPU reaches in the same dtype.

Modules, each one job: ``source`` (which entries to check, from one dump reader), ``apis`` (dump name ->
callable, and what cannot be replayed), ``values`` (records -> arguments, tensors read from disk),
``replay`` (run a call and its backward), ``metrics`` (errors of one tensor), ``standards`` (the criteria),
``worker`` (one entry, end to end), ``runner`` (order, progress), ``worker_processes`` (the processes, each
watched: one that dies costs only its entry), ``report_*`` (CSV, JSON, HTML), ``cli``. torch is imported only
inside this package, and only in the modules that run calls.
"""

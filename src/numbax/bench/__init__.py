"""numbax's benchmark suite, shipped with the package.

``python -m numbax bench --help`` runs it. Modules:

- :mod:`numbax.bench.run`: command line and orchestration (interleaved rounds)
- :mod:`numbax.bench.mode`: GPU suite, CPU smoke run, or a clear refusal
- :mod:`numbax.bench.impls`: the implementations of ``op(x) = 2*x + 1``
- :mod:`numbax.bench.timing`: the measurements, the checks, the scheduler
- :mod:`numbax.bench.report`: ratios, the table, the JSON record
- :mod:`numbax.bench.plot`: ``--plot`` and ``--plot-from`` (matplotlib)
- :mod:`numbax.bench.progress`: the progress bar (tqdm when installed)
- :mod:`numbax.bench.native`: the native CUDA C++ reference handler (nvcc)
- :mod:`numbax.bench.bridge_cost`, :mod:`numbax.bench.hlo`: diagnostics
"""

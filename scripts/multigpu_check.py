#!/usr/bin/env python3
"""Runs numbax's multi-GPU and multi-process tests: `pytest -m multigpu`.

    python scripts/multigpu_check.py [--cpu] [pytest args]

The tests are tests/test_multigpu.py (shard_map, sharded jit, threads over
every local GPU) and tests/test_multiprocess.py (jax.distributed, two
processes of one GPU each). They need 2 or more GPUs of one host and are
skipped, with the reason, below that. Without paths in the pytest args,
pytest runs the `multigpu` tests of tests/ (e.g. add tests/test_multiprocess.py
for those alone, or -x, -k ...). numbax must be importable (built; see
docs/multi_gpu.md). scripts/gpu_check.sh runs the same tests on a machine
with 2 GPUs.

--cpu is a dry run of the test code on 2 fake CPU devices through Numba's
CUDA simulator: device ids are not real there and funcs run one at a time,
so the checks of those are GPU only.
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    cpu = "--cpu" in argv
    args = [a for a in argv if a != "--cpu"]
    env = dict(os.environ)
    if cpu:
        env.update(NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu")
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                            " --xla_force_host_platform_device_count=2").strip()
    else:
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # -rs: a skipped test says why (fewer than 2 GPUs, a GPU-only check).
    cmd = [sys.executable, "-m", "pytest", "-m", "multigpu", "-rs",
           "-p", "no:cacheprovider", *args]
    print(" ".join(cmd), flush=True)
    return subprocess.call(cmd, cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Every example in examples/ runs, in its own process, and matches numpy.

On CI the examples run on JAX's CPU backend through Numba's CUDA simulator
(small sizes); scripts/gpu_check.sh runs them on the GPU (full sizes), since
the tests are marked `gpu`. Each example prints a line with "matches" and
True or False for each check it makes, and exits 1 when one fails.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SIMULATOR

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
# The examples the docs walk through; others found in examples/ run too.
REQUIRED = {"quickstart.py", "spiking_network.py", "softmax_scratch.py",
            "histogram.py", "stdp_inplace.py", "numba_kernel.py"}


def test_documented_examples_exist():
    missing = REQUIRED - {p.name for p in EXAMPLES}
    assert not missing, f"examples missing from examples/: {sorted(missing)}"


def run_example(path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if SIMULATOR:
        env.update(NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu")
    else:
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return subprocess.run([sys.executable, str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_and_matches_numpy(path):
    proc = run_example(path)
    output = f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"{path.name} exited {proc.returncode}\n{output}"
    checks = [line for line in proc.stdout.splitlines()
              if re.search(r"\bmatch(es)?\b", line)]
    assert checks, f"{path.name} printed no 'matches' line\n{output}"
    assert all(re.search(r"\bTrue\b", line) and not re.search(r"\bFalse\b", line)
               for line in checks), f"{path.name}: a check failed\n{output}"

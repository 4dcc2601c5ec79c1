"""scripts/split_tests.py: the parts gpu_check.sh (TEST_SHARDS) and
sanitizer_check.sh run as separate processes."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SCRIPT = os.path.join(ROOT, "scripts", "split_tests.py")


def _run(*args):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)],
                          capture_output=True, text=True, cwd="/")


def _gpu_files():
    """The files pytest itself collects `gpu` tests from."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu",
         "-p", "no:cacheprovider", "tests"],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert ids, proc.stdout[-2000:] + proc.stderr[-2000:]
    return sorted({i.split("::")[0] for i in ids})


@pytest.fixture(scope="module")
def gpu_files():
    return _gpu_files()


@pytest.mark.parametrize("n", [1, 2, 3, 6])
def test_parts_cover_every_gpu_file_once(n, gpu_files):
    proc = _run(n)
    assert proc.returncode == 0, proc.stderr
    parts = [line.split() for line in proc.stdout.splitlines()]
    assert len(parts) == n
    everything = [f for part in parts for f in part]
    assert sorted(everything) == gpu_files
    assert all(parts), parts  # no empty part while files outnumber parts
    # Part K alone is line K.
    for k, part in enumerate(parts, start=1):
        alone = _run(n, k)
        assert alone.stdout.split() == part


def test_bad_arguments_are_refused():
    assert _run().returncode == 2
    assert _run(0).returncode == 2
    assert _run(2, 3).returncode == 2
    assert "part 3 of 2" in _run(2, 3).stderr

"""NUMBAX_TEST_STALL_S (tests/conftest.py): a test that runs that long gets
every thread's stack printed, so a stalled run shows where it stopped."""

import os
import subprocess
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_stalled_test_prints_where_it_waits():
    # A test file next to conftest.py, so the fixture applies, and removed
    # afterwards.
    path = os.path.join(HERE, f"test_zz_stall_probe_{os.getpid()}.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent("""
            import time

            def test_waits_in_here():
                time.sleep(2.5)
        """))
    try:
        env = dict(os.environ, NUMBAX_TEST_STALL_S="1")
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
             path], capture_output=True, text=True, timeout=120, env=env,
            cwd=os.path.dirname(HERE))
    finally:
        os.remove(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_waits_in_here" in proc.stderr, proc.stderr[-2000:]
    assert "Thread" in proc.stderr


def test_off_by_default():
    path = os.path.join(HERE, f"test_zz_stall_probe_off_{os.getpid()}.py")
    with open(path, "w") as f:
        f.write("import time\n\ndef test_quiet():\n    time.sleep(1.5)\n")
    try:
        env = {k: v for k, v in os.environ.items() if k != "NUMBAX_TEST_STALL_S"}
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
             path], capture_output=True, text=True, timeout=120, env=env,
            cwd=os.path.dirname(HERE))
    finally:
        os.remove(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_quiet" not in proc.stderr

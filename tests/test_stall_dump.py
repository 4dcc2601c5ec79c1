"""NUMBAX_TEST_STALL_S (tests/conftest.py): a test that runs that long gets
every thread's stack written to NUMBAX_TEST_STALL_FILE, so a stalled run
shows where it stopped, with pytest capturing output as usual."""

import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _run_probe(tmp_path, body, env_extra):
    # A copy of conftest.py beside the probe test: the fixture applies, and
    # nothing is written into tests/.
    shutil.copy(os.path.join(HERE, "conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_probe.py").write_text(body)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NUMBAX_TEST_STALL")}
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_probe.py")],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


SLOW = "import time\n\ndef test_waits_in_here():\n    time.sleep(2.5)\n"


def test_a_stalled_test_writes_where_it_waits(tmp_path):
    stalls = tmp_path / "stalls.txt"
    proc = _run_probe(tmp_path, SLOW, {"NUMBAX_TEST_STALL_S": "1",
                                       "NUMBAX_TEST_STALL_FILE": str(stalls)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = stalls.read_text()
    assert "== test_probe.py::test_waits_in_here" in text
    # The stack, dumped while the test slept: its frame is in it.
    assert "test_waits_in_here" in text.split("\n", 1)[1], text
    assert "Thread" in text


def test_off_by_default(tmp_path):
    proc = _run_probe(tmp_path, SLOW, {})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (tmp_path / "numbax-test-stalls.txt").exists()

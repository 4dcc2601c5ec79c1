"""numbax under jax.distributed: two processes on one host, one GPU each.

Each test starts two tests/multiprocess_child.py processes with a
coordinator on 127.0.0.1 at a free port; each runs plain, capture=True and
kernel ops under jax.shard_map on global arrays, checks its own shards
against numpy, that its funcs ran on its own GPU, and a global sum that
needs both processes. test_two_processes_split_by_xla runs two
tests/partitioned_process_child.py processes instead: ops XLA splits under
plain jax.jit, no shard_map. Marked `multigpu` (skipped below 2 local devices,
tests/conftest.py); on 2 fake CPU devices under the simulator (the
command is in tests/conftest.py) they run the `visible` layout with one CPU
device per process.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import SIMULATOR

pytestmark = pytest.mark.multigpu

HERE = os.path.dirname(os.path.abspath(__file__))
REPEATS = 5 if SIMULATOR else 20
N = 256 if SIMULATOR else 1 << 16   # elements per shard
TIMEOUT = 300                       # seconds a process may take, start-up included


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(mode, i):
    env = dict(os.environ)
    env.update(PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false",
               NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS="0")
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env.pop("XLA_FLAGS", None)  # one device per process, even in a dry run
    if SIMULATOR:
        env.update(JAX_PLATFORMS="cpu", NUMBA_ENABLE_CUDASIM="1")
    elif mode == "visible":
        env["CUDA_VISIBLE_DEVICES"] = str(i)
    return env


def run_two_processes(mode, script="multiprocess_child.py", child_args=None):
    """[(exit code, RESULT dict or None, output)] of the two processes.

    Each runs tests/`script` with `child_args(i, port, seed)` (default:
    multiprocess_child.py's arguments for `mode`)."""
    port, seed = free_port(), int.from_bytes(os.urandom(4), "little")
    if child_args is None:
        def child_args(i, port, seed):
            return [str(i), str(port), mode, str(seed), str(REPEATS), str(N),
                    str(TIMEOUT)]
    procs, logs = [], []
    try:
        for i in range(2):
            cmd = [sys.executable, os.path.join(HERE, script),
                   *child_args(i, port, seed)]
            log = tempfile.TemporaryFile("w+")  # a file, not a pipe: never blocks
            logs.append(log)
            procs.append(subprocess.Popen(cmd, env=child_env(mode, i),
                                          stdout=log, stderr=subprocess.STDOUT,
                                          text=True))
        deadline = time.monotonic() + TIMEOUT + 30
        notes = ["", ""]
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if any(p.returncode not in (None, 0) for p in procs):
                # One process failed: the other may wait forever on it.
                deadline = min(deadline, now + 30)
            if now > deadline:
                for i, p in enumerate(procs):  # ours: started above, ended by pid
                    if p.poll() is None:
                        p.kill()
                        notes[i] = "\n[killed: no end before the timeout]"
                break
            time.sleep(0.5)
        results = []
        for i, p in enumerate(procs):
            p.wait()
            logs[i].seek(0)
            text = logs[i].read() + notes[i]
            lines = [l for l in text.splitlines() if l.startswith("RESULT ")]
            result = json.loads(lines[-1][len("RESULT "):]) if lines else None
            results.append((p.returncode, result, text))
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()


@pytest.mark.parametrize("mode", ["visible", "local"])
def test_two_processes_under_jax_distributed(mode):
    """visible: CUDA_VISIBLE_DEVICES=i per process, local_device_ids=[0];
    local: every GPU visible, local_device_ids=[i], so process 1 runs on
    CUDA device 1 and numbax must bind the ordinal XLA gives it."""
    if SIMULATOR and mode == "local":
        pytest.skip("local_device_ids picks CUDA ordinals: GPU only")
    results = run_two_processes(mode)
    for i, (code, result, text) in enumerate(results):
        tail = "\n".join(text.splitlines()[-40:])
        assert code == 0 and result is not None and result["ok"], (
            f"{mode} process {i} exited {code}:\n{tail}")
        assert result["failures"] == [] and result["global_sum_ok"], result
        assert result["iterations"] == REPEATS, result
        assert len(result["global_devices"]) == 2, result
        # The CUDA device each func ran on (-1: the simulator has none).
        want = -1 if SIMULATOR else 0 if mode == "visible" else i
        assert result["ran_on"] == [want], result


def test_two_processes_split_by_xla():
    """No shard_map: numbax ops with a sharding rule (and jax.vmap of one
    without) under plain jax.jit on global arrays, split by XLA across the
    two processes' GPUs with no collective around them
    (tests/partitioned_process_child.py; the simulator's version runs in
    tests/test_scale_out.py in every CI row)."""
    def args(i, port, seed):
        return [str(i), str(port), str(seed), str(TIMEOUT)]
    results = run_two_processes("visible", "partitioned_process_child.py",
                                args)
    for i, (code, result, text) in enumerate(results):
        tail = "\n".join(text.splitlines()[-40:])
        assert code == 0 and result is not None and result["ok"], (
            f"process {i} exited {code}:\n{tail}")
        for name, found in result["collectives"].items():
            assert found == [], (name, result)

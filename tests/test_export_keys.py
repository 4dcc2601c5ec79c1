"""Keys of ops made by one factory, in fresh processes (tests/export_factory.py).

Two closures from one factory share module, qualified name and
configuration. In one process both work (keys traced here resolve exactly);
a program naming such a key must never run the wrong one elsewhere: numbax
refuses it and asks for name=. With name= each op has its own key, and the
creation order in the loading process does not matter.

Each test runs on the CPU simulator (CI) and, marked `gpu`, on a real GPU.
"""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "export_factory.py")
TIMEOUT = 180
KINDS = ["callable", "captured", "kernel"]
MODES = [pytest.param("sim", id="sim"),
         pytest.param("gpu", id="gpu", marks=pytest.mark.gpu)]


@pytest.fixture(params=MODES)
def mode(request):
    simulator = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")
    if request.param == "gpu" and simulator:
        pytest.skip("needs a real GPU")
    if request.param == "sim" and not simulator:
        pytest.skip("simulator mode only (NUMBA_ENABLE_CUDASIM=1)")
    return request.param


def child(mode, *args):
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    if mode == "sim":
        env.update(NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu")
    else:
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        env.pop("JAX_PLATFORMS", None)
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, CHILD, *map(str, args)],
                          capture_output=True, text=True, env=env,
                          timeout=TIMEOUT, cwd=HERE)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"child {args} exited {proc.returncode}\nstdout:\n{proc.stdout}\n"
        f"stderr:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("kind", KINDS)
def test_two_closures_of_one_factory_work_in_one_process(mode, kind):
    result = child(mode, "eager", kind)
    assert result["ok"], result


@pytest.mark.parametrize("kind", KINDS)
def test_ambiguous_factory_key_is_refused_never_misread(mode, kind, tmp_path):
    blob = tmp_path / "program.bin"
    exported = child(mode, "export", kind, blob, 0)
    if kind == "kernel":
        # A kernel's key is made while lowering: the export itself refuses.
        assert not exported["ok"], exported
        assert exported["error_type"] == "ValueError", exported
        assert "name=" in exported["message"], exported
        assert "cannot export" in exported["message"], exported
        return
    assert exported["ok"], exported
    # A callable's key was fixed when traced: the loading process refuses
    # it, whatever order it creates the closures in.
    for order in ("2,3", "3,2", "3"):
        loaded = child(mode, "load", kind, blob, order, 0)
        assert not loaded["ok"], (order, loaded)
        assert "name=" in loaded["message"], loaded
        assert "several different functions" in loaded["message"], loaded


@pytest.mark.parametrize("kind", KINDS)
def test_named_factory_ops_export_and_run_in_any_creation_order(
        mode, kind, tmp_path):
    blob = tmp_path / "program.bin"
    exported = child(mode, "export", kind, blob, 1)
    assert exported["ok"], exported
    assert f"export_factory.scale2.{kind}/" in exported["text"]
    for order in ("3,2", "2,3"):
        loaded = child(mode, "load", kind, blob, order, 1)
        assert loaded["ok"], (order, loaded)
        assert loaded["factor"] == pytest.approx(2.0), loaded


@pytest.mark.parametrize("kind", KINDS)
def test_unique_key_meeting_two_closures_at_load_is_refused(
        mode, kind, tmp_path):
    # Exported while only the x*2 closure existed: a plain key. A process
    # holding both closures cannot tell which one it names, and refuses; one
    # holding only the x*2 closure runs it.
    blob = tmp_path / "program.bin"
    exported = child(mode, "export", kind, blob, 0, 1)
    assert exported["ok"], exported
    assert "~" not in exported["text"].split("key = ")[1].split('"')[1]
    for order in ("3,2", "2,3"):
        loaded = child(mode, "load", kind, blob, order, 0)
        assert not loaded["ok"], (order, loaded)
        assert "ambiguous in this process" in loaded["message"], loaded
        assert "name=" in loaded["message"], loaded
    loaded = child(mode, "load", kind, blob, "2", 0)
    assert loaded["ok"], loaded
    assert loaded["factor"] == pytest.approx(2.0), loaded


def test_recreated_kernel_op_serves_a_program_of_a_collected_one(mode):
    # The helper pattern: a numba_cuda_kernel re-created per call. A program
    # lowered by an op that was then collected still runs, served by the op
    # of the same kernel created later (not refused as collected).
    code = (
        "import gc, json, jax, jax.numpy as jnp, numpy as np\n"
        "from numba import cuda\n"
        "import numbax\n"
        "@cuda.jit\n"
        "def add1(x, out):\n"
        "    i = cuda.grid(1)\n"
        "    if i < x.shape[0]:\n"
        "        out[i] = x[i] + 1\n"
        "spec = jax.ShapeDtypeStruct((16,), jnp.float32)\n"
        "x = np.arange(16, dtype=np.float32)\n"
        "first = numbax.numba_cuda_kernel(add1, spec, launch_dims=16)\n"
        "exp = jax.export.export(jax.jit(first),\n"
        "    disabled_checks=numbax.export_disabled_checks())(spec)\n"
        "del first; gc.collect()\n"
        "again = numbax.numba_cuda_kernel(add1, spec, launch_dims=16)\n"
        "out = np.asarray(jax.export.deserialize(exp.serialize()).call(x))\n"
        "print('RESULT ' + json.dumps(dict(ok=bool((out == x + 1).all()))))\n")
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    if mode == "sim":
        env.update(NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu")
    else:
        env.pop("NUMBA_ENABLE_CUDASIM", None)
        env.pop("JAX_PLATFORMS", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, env=env, timeout=TIMEOUT)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    assert json.loads(lines[-1][len("RESULT "):])["ok"]

"""jax.export and the persistent compilation cache, across processes (CPU simulator).

The ops live in tests/export_ops.py, which this process and the fresh ones
(tests/export_child.py) import under the same module name, so they build the
same keys. Each child prints one ``RESULT {json}`` line.
"""

import functools
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax import export

import numbax
from numbax.runtime import targets

import export_ops

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "export_child.py")
CHILD_TIMEOUT = 120


@pytest.fixture(autouse=True)
def _simulator(simulator_only):
    pass


def run_child(*args, env=None):
    full_env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu",
                    **(env or {}))
    full_env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, CHILD, *map(str, args)],
                          capture_output=True, text=True, env=full_env,
                          timeout=CHILD_TIMEOUT)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"child {args} exited {proc.returncode}\nstdout:\n{proc.stdout}\n"
        f"stderr:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def write_data(path, seed):
    args = export_ops.inputs(seed)
    want = export_ops.reference(*args)
    np.savez(path, x=args[0], m=args[1], s=args[2],
             y0=want[0], y1=want[1], y2=want[2])
    return args, want


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The serialised export of export_ops.program, and fresh data for it."""
    tmp = tmp_path_factory.mktemp("export")
    exp = export.export(jax.jit(export_ops.program),
                        disabled_checks=numbax.export_disabled_checks())(
        *export_ops.SPECS)
    blob = tmp / "program.bin"
    blob.write_bytes(exp.serialize())
    data = tmp / "data.npz"
    seed = int.from_bytes(os.urandom(4), "little")
    args, want = write_data(data, seed)
    return exp, blob, data, args, want


def test_disabled_checks_cover_every_numbax_target():
    checks = numbax.export_disabled_checks()
    assert all(isinstance(c, export.DisabledSafetyCheck) for c in checks)
    names = {c.is_custom_call() for c in checks}
    assert names == set(targets.ALL_TARGETS)
    assert {"numbax_callable", "numbax_callable_capture", "numbax_kernel",
            "numbax_callable_batch"} <= names


def test_export_refuses_numbax_ops_without_the_checks():
    with pytest.raises(ValueError, match="numbax_callable"):
        export.export(jax.jit(export_ops.program))(*export_ops.SPECS)


def test_exported_module_names_ops_by_stable_key(exported):
    exp, *_ = exported
    text = exp.mlir_module()
    for target in ("numbax_callable", "numbax_callable_batch"):
        assert f"@{target}(" in text
    # Keys name module.qualname (or the explicit name=) and a digest: no
    # address or counter of this process.
    assert 'key = "export_ops.affine_launch/' in text
    assert 'key = "export_ops.square_kernel/kernel;' in text
    assert 'key = "export_ops_named/' in text
    # Readable parts: what the op was created with, then the call's arrays.
    assert ('key = "export_ops.affine_launch/callable;outs=float32[64];'
            'scratch=;capture=0/in=float32[64]"') in text
    assert 'export_ops.captured_launch/callable;outs=float32[64];' \
        'scratch=;capture=1/' in text
    assert "num_batch_dims" in text  # the partitionable declaration survives


def test_round_trip_in_this_process(exported):
    exp, blob, _, args, want = exported
    again = export.deserialize(bytearray(blob.read_bytes()))
    for got, ref in zip(again.call(*args), want):
        np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-6)


def test_round_trip_in_a_fresh_process(exported):
    # The child only creates the ops (a plain callable, a kernel, a captured
    # callable, a named and a batch-partitionable one); it never calls or
    # traces them: the keys carry the shapes, and the kernel is compiled at
    # XLA's instantiate stage.
    _, blob, data, _, _ = exported
    result = run_child("run", blob, data)
    assert result["ok"], result
    assert result["resolves"] == 5, result  # one per call site
    assert result["registry"] == [5, 0], result  # the kernel runs simulated


def _registers_before_xla_compiles(result):
    """Whether the child's JAX gave numbax a moment to register its targets
    before XLA compiled the program: a backend-start hook (jax 0.10) or the
    compile scalar numbax listens to (runtime/targets.py; jax 0.11)."""
    return result["registration"] == "backend hook" or result["compiles"] > 0


def test_loading_recipe_as_written_runs_without_starting_jax_first(exported):
    # docs/export.md's recipe: import the module that creates the ops,
    # deserialise, call; JAX is not started first. On jax 0.11 (no
    # backend-start hook) this failed with XLA's "No FFI handler registered
    # for numbax_callable": the ops, created before JAX started, could not
    # register numbax's targets, and nothing else did.
    _, blob, data, _, _ = exported
    result = run_child("recipe", blob, data)
    if not _registers_before_xla_compiles(result):
        pytest.skip("this JAX has neither a backend-start hook nor a compile "
                    "event: docs/export.md says start JAX first")
    assert result["ok"], result
    assert result["resolves"] == 5, result


def test_op_created_with_other_outs_is_a_clear_error_naming_both(exported):
    _, blob, data, _, _ = exported
    result = run_child("mismatch", blob, data)
    assert not result["ok"]
    message = result["message"]
    assert "export_ops.affine_launch" in message, message
    assert "callable;outs=float32[64]" in message, message  # the program's
    assert "callable;outs=float32[32]" in message, message  # this process's


def test_missing_op_in_a_fresh_process_is_a_clear_error(exported):
    _, blob, data, _, _ = exported
    result = run_child("missing", blob, data)
    assert not result["ok"]
    message = result["message"]
    if not _registers_before_xla_compiles(result):
        # No op created, no backend hook and no compile event: no target
        # registered yet, and XLA says so itself (docs/export.md).
        assert "numbax_" in message and "handler" in message.lower(), message
        return
    assert "is not registered in this process" in message, message
    assert "export_ops." in message or "export_ops_named" in message, message
    assert "numbax.numba_cuda_" in message and "Create the same op" in message


def test_partly_created_ops_name_the_missing_key(exported):
    _, blob, data, _, _ = exported
    result = run_child("partial", blob, data)
    assert not result["ok"]
    message = result["message"]
    assert "is not registered in this process" in message, message
    # The callable was created; what is missing is one of the others.
    assert "export_ops.affine_launch/" not in message
    assert any(k in message for k in (
        "export_ops.square_kernel/", "export_ops.row_scale_launch/",
        "export_ops_named/", "export_ops.captured_launch/")), message


def test_persistent_compilation_cache_across_processes(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    data = tmp_path / "data.npz"
    write_data(data, int.from_bytes(os.urandom(4), "little"))
    first = run_child("cache", cache, data)
    assert first["ok"], first
    assert first["misses"] >= 1 and first["hits"] == 0, first
    entries = os.listdir(cache)
    assert entries, "the first process wrote nothing to the cache"
    second = run_child("cache", cache, data)
    assert second["ok"], second
    assert second["hits"] >= 1 and second["misses"] == 0, second
    # The cached executable still calls into numbax: the ops ran.
    assert second["counters"]["calls"] >= 3, second
    assert sorted(os.listdir(cache)) == sorted(entries)


def test_import_starts_no_backend_and_registers_targets_when_one_starts():
    # numbax may be imported before jax.distributed.initialize or a platform
    # choice, so import must not start JAX's backends; the targets (and so
    # the missing-op message above) arrive when a backend starts.
    code = (
        "import json, numbax, jax\n"
        "from jax._src import xla_bridge as xb\n"
        "from numbax.runtime import targets as r\n"
        "before = (xb.backends_are_initialized(), sorted(r._platforms_registered))\n"
        "jax.devices()\n"
        "after = sorted(r._platforms_registered)\n"
        "print('RESULT ' + json.dumps(dict(before=before, after=after)))\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, env=env, timeout=CHILD_TIMEOUT)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["before"] == [False, []], result
    from jax._src import xla_bridge
    if hasattr(xla_bridge, "register_backend_initialization_hook"):
        assert result["after"] == ["cpu"], result
    else:
        # jax < 0.10 has no backend start hook: the targets arrive with the
        # first op (docs/export.md).
        assert result["after"] == [], result


def test_backend_registration_mechanism_follows_what_jax_offers():
    """jax 0.10 calls a hook as each backend starts; jax 0.11 has none (seen
    on the H200), so numbax registers once the PJRT plugins are discovered."""
    from numbax.runtime import targets

    calls = []

    class WithHook:
        @staticmethod
        def register_backend_initialization_hook(f):
            calls.append(("hook", f))

        @staticmethod
        def register_plugin_callbacks(f):
            calls.append(("plugins", f))

    class PluginsOnly:
        @staticmethod
        def register_plugin_callbacks(f):
            calls.append(("plugins", f))

    assert targets._install_backend_hook(WithHook) == "backend hook"
    assert calls == [("hook", targets._on_backend_started)]
    calls.clear()
    assert targets._install_backend_hook(PluginsOnly) == "plugin callback"
    assert calls == [("plugins", targets._on_plugins_discovered)]
    assert targets._install_backend_hook(object()) == "none"
    # Called as JAX calls it (c_api=...), after the targets are registered:
    # a second registration is a no-op and never raises.
    targets.ensure_targets()
    targets._on_plugins_discovered(c_api=None)


_PLUGIN_LOCK_CHILD = r"""
import threading
import numbax
from numbax.runtime import targets
from jax._src import xla_bridge
from jax._src.lib import xla_client

# As on jax 0.11 with a GPU plugin: its handlers are ready when the plugin
# callbacks run, before any backend has started.
targets._handlers_ready = lambda platform: platform == "cpu"
declared = []
xla_client.register_custom_call_as_batch_partitionable = (
    lambda *a: declared.append(a))
plugin = object()

# JAX runs plugin callbacks holding this (non-reentrant) lock.
with xla_bridge._plugin_callback_lock:
    t = threading.Thread(
        target=targets._on_plugins_discovered, kwargs={"c_api": plugin},
        daemon=True)
    t.start()
    t.join(30)
    hung = t.is_alive()
print("RESULT", hung, sorted(targets._platforms_registered),
      sorted((a[0], len(a) == 2 and a[1] is plugin) for a in declared))
"""


def test_plugin_callback_never_reenters_jax_plugin_lock():
    """On jax 0.11 JAX calls numbax's plugin callback with its plugin locks
    held; declaring the batch targets through jax.ffi took that lock again,
    and `jax.devices()` hung forever (seen on the H200). The callback must
    finish and declare the batch targets for XLA and for the plugin."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _PLUGIN_LOCK_CHILD],
                          capture_output=True, text=True, timeout=240,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")]
    assert line, proc.stdout + proc.stderr[-3000:]
    assert line[-1] == (
        "RESULT False ['cpu'] "
        "[('numbax_callable_batch', False), ('numbax_callable_batch', True), "
        "('numbax_callable_capture_batch', False), "
        "('numbax_callable_capture_batch', True), "
        "('numbax_cpu_kernel_batch', False), ('numbax_cpu_kernel_batch', True), "
        "('numbax_kernel_batch', False), ('numbax_kernel_batch', True)]"), \
        line[-1]


@functools.cache
def _symbolic_ops():
    """One op of each kind, each taking a 1-D float32 input of any length."""
    from shared_kernels import affine

    same = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
    kernel = numbax.numba_cuda_kernel(affine, same,
                                      launch_dims=lambda x: x.shape[0])
    fixed = numbax.numba_cuda_kernel(
        affine, jax.ShapeDtypeStruct((8,), np.float32), launch_dims=8)

    def launch(x, out, stream):
        # Under jax.vmap (broadcast_all) func gets the whole batch.
        rows = [(x, out)] if x.ndim == 1 else zip(x, out)
        for x_row, out_row in rows:
            affine[(x_row.shape[0] + 31) // 32, 32, stream](x_row, out_row)

    # (vmap_method="sequential" maps func over the slices with lax.map,
    # which takes a symbolic batch size: each slice's shape is concrete.)
    callable_op = numbax.numba_cuda_callable(launch, same,
                                             vmap_method="broadcast_all")
    custom = numbax.XLACustomKernel("export_symbolic_affine")
    custom.def_numba_cuda_kernel(
        lambda outs: numbax.numba_cuda_kernel(
            affine, outs, launch_dims=outs.shape[0]))
    # kind -> (op, how its errors name it)
    return {"kernel": (kernel, "numba_cuda_kernel(shared_kernels.affine)"),
            "kernel, fixed outs": (
                fixed, "numba_cuda_kernel(shared_kernels.affine)"),
            "callable": (callable_op, "numba_cuda_callable("),
            "XLACustomKernel": (lambda x: custom(x, outs=same),
                                "export_symbolic_affine")}


@pytest.mark.parametrize("vmapped", [False, True])
@pytest.mark.parametrize("kind", ["kernel", "kernel, fixed outs", "callable",
                                  "XLACustomKernel"])
def test_symbolic_dimension_is_refused_naming_the_op(kind, vmapped):
    # jax.export's shape polymorphism traces with a symbolic extent, which
    # numbax's trace code met with JAX's InconclusiveDimensionOperation,
    # naming no op. numbax compiles for concrete shapes: it says so, for a
    # symbolic extent of an input and for a symbolic jax.vmap batch size.
    op, name = _symbolic_ops()[kind]
    f = jax.vmap(op) if vmapped else op
    shape = (3, 8) if vmapped else (8,)
    n, = export.symbolic_shape("n")
    with pytest.raises(ValueError) as info:
        export.export(jax.jit(f),
                      disabled_checks=numbax.export_disabled_checks())(
            jax.ShapeDtypeStruct((n,) + shape[1:], np.float32))
    message = str(info.value)
    assert name in message, message
    assert ("symbolic shape (n, 8)" if vmapped else "symbolic shape (n,)") \
        in message, message
    assert "numbax ops need concrete shapes" in message, message
    assert "jax.ShapeDtypeStruct(" in message, message
    # The same op still exports (and runs) with a concrete shape.
    x = np.random.default_rng().standard_normal(shape).astype(np.float32)
    exp = export.export(jax.jit(f),
                        disabled_checks=numbax.export_disabled_checks())(
        jax.ShapeDtypeStruct(shape, np.float32))
    np.testing.assert_allclose(np.asarray(exp.call(x)), 2 * x + 1, rtol=1e-6)

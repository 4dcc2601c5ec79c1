"""jax.jit with sharded inputs, and the batch-partitionable declaration.

The multi-device checks run in tests/sharding_child.py, a process with 4
fake CPU devices (XLA_FLAGS must be set before JAX starts), once under
Shardy and once under GSPMD; each test below reads one check of its report.
The rest runs here, on one device.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numbax
from shared_kernels import row_scale as _rows_kernel

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = jnp.float32


@pytest.fixture(scope="module", params=["shardy", "gspmd"])
def report(request):
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
        pytest.skip("simulator mode only: the GPU version is "
                    "tests/test_multigpu.py (pytest -m multigpu)")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu")
    seed = int.from_bytes(os.urandom(4), "little")
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "sharding_child.py"),
         request.param, str(seed)],
        capture_output=True, text=True, env=env, timeout=180)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"sharding child exited {proc.returncode}\n{proc.stdout}\n"
        f"{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def test_without_declaration_xla_gathers_and_result_is_correct(report):
    r = report["gathered"]
    assert r["ok"], r
    # XLA gathers the sharded operands around the opaque call, and every
    # device runs func on the whole array (the result is replicated).
    assert "all-gather" in r["collectives"], r
    assert r["seen"] == [[64, 4]] and r["out_spec"] == "P()", r


@pytest.mark.parametrize("check", ["partitioned", "partitioned_capture"])
def test_declared_partitionable_runs_on_each_devices_rows(report, check):
    r = report[check]
    assert r["ok"], r
    assert r["collectives"] == [], r  # no all-gather around the call
    assert r["seen"] == [[16, 4]] and r["calls"] == 4, r  # 64 rows / 4
    assert r["out_spec"] == "P('x',)" and r["shard_rows"] == [16], r


def test_partitionable_with_a_replicated_operand(report):
    r = report["partitioned_replicated_operand"]
    assert r["ok"], r
    assert r["collectives"] == [] and r["seen"] == [[16, 4]], r


def test_partitionable_gets_whole_rows_when_columns_are_sharded(report):
    r = report["partitioned_2d_mesh"]
    assert r["ok"], r
    # Rows stay split over mesh axis 'a'; the column split is undone.
    assert r["seen"] == [[32, 4]], r


def test_partitionable_chain_stays_sharded(report):
    r = report["partitioned_chain"]
    assert r["ok"], r
    assert r["collectives"] == [] and r["out_spec"] == "P('x',)", r


def test_partitionable_uneven_rows(report):
    r = report["partitioned_uneven"]
    assert r["ok"], r
    assert r["seen"] == [[3, 4]], r  # 10 rows padded to 12 over 4 devices


def test_shard_map_runs_each_block_on_its_device(report):
    r = report["shard_map"]
    assert r["ok"], r
    assert r["collectives"] == [] and r["seen"] == [[16]], r
    assert r["calls"] == 8, r  # plain + capture callable on 4 devices


# -- one device, in this process ------------------------------------------

def _rows(m, s, out, stream):
    _rows_kernel[(m.shape[0] + 31) // 32, 32, stream](m, s, out)


def _rows_ref(m, s):
    return m * s[..., None] + np.arange(m.shape[-1], dtype=np.float32)


def _rows_op(shape=(8, 3), **kw):
    return numbax.numba_cuda_callable(
        _rows, jax.ShapeDtypeStruct(shape, F32), batch_partitionable=True,
        **kw)


def test_partitionable_eager_and_jit(rng):
    op = _rows_op()
    m = rng.standard_normal((8, 3)).astype(np.float32)
    s = rng.standard_normal(8).astype(np.float32)
    np.testing.assert_allclose(op(m, s), _rows_ref(m, s), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(op)(m, s), _rows_ref(m, s), rtol=1e-6)
    text = jax.jit(op).lower(m, s).as_text()
    assert "numbax_callable_batch" in text and "num_batch_dims" in text


def test_partitionable_capture_uses_its_own_target(rng):
    op = _rows_op(capture=True)
    m = rng.standard_normal((8, 3)).astype(np.float32)
    s = rng.standard_normal(8).astype(np.float32)
    np.testing.assert_allclose(jax.jit(op)(m, s), _rows_ref(m, s), rtol=1e-6)
    assert "numbax_callable_capture_batch" in jax.jit(op).lower(m, s).as_text()


def test_default_is_not_partitionable(rng):
    op = numbax.numba_cuda_callable(_rows, jax.ShapeDtypeStruct((8, 3), F32))
    text = jax.jit(op).lower(jnp.zeros((8, 3)), jnp.zeros(8)).as_text()
    assert "numbax_callable_batch" not in text
    assert "num_batch_dims" not in text


@pytest.mark.parametrize("method", ["sequential", "expand_dims",
                                    "broadcast_all"])
def test_partitionable_under_vmap(rng, method):
    def rows_any_rank(m, s, out, stream):  # expand_dims adds a leading axis
        if m.ndim == 3:
            for b in range(out.shape[0]):
                _rows(m[b if m.shape[0] > 1 else 0],
                      s[b if s.shape[0] > 1 else 0], out[b], stream)
        else:
            _rows(m, s, out, stream)
    op = numbax.numba_cuda_callable(
        rows_any_rank, jax.ShapeDtypeStruct((8, 3), F32),
        batch_partitionable=True, vmap_method=method)
    m = rng.standard_normal((5, 8, 3)).astype(np.float32)
    s = rng.standard_normal(8).astype(np.float32)
    got = jax.jit(jax.vmap(op, in_axes=(0, None)))(m, s)
    np.testing.assert_allclose(got, _rows_ref(m, s[None]), rtol=1e-6)


def test_partitionable_vmap_without_method_raises():
    op = _rows_op()
    with pytest.raises(NotImplementedError, match="vmap_method"):
        jax.vmap(op, in_axes=(0, None))(jnp.zeros((2, 8, 3)), jnp.zeros(8))


def test_partitionable_needs_equal_leading_extents():
    op = _rows_op()
    with pytest.raises(ValueError, match="leading extents must be equal"):
        op(jnp.zeros((8, 3)), jnp.zeros(4))
    bad_out = numbax.numba_cuda_callable(
        _rows, jax.ShapeDtypeStruct((4, 3), F32), batch_partitionable=True)
    with pytest.raises(ValueError, match="batch_partitionable"):
        bad_out(jnp.zeros((8, 3)), jnp.zeros(8))

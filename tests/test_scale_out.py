"""Scaling out without gathers: numbax ops XLA splits across devices.

Every op kind with a sharding rule (``sharding_rule=``, or
``batch_partitionable=True``), and ``jax.vmap`` of ops without one, under
plain ``jax.jit`` over sharded inputs (docs/multi_gpu.md, "Scaling out").

The multi-device checks run in tests/scale_out_child.py, a process with 8
fake CPU devices (XLA_FLAGS must be set before JAX starts), once under
Shardy and once under GSPMD; each test below reads one check of its report.
The jax.distributed check runs two processes of tests/
partitioned_process_child.py. Neither needs the `multigpu` marker or a
fake-device flag in the pytest process: both run wherever the simulator
tests run, CI included (scripts/wheel_matrix.sh runs this file on every
row). The rest runs here, on one device.
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
from conftest import SIMULATOR
from numbax.trace import sharding_rules
from shared_kernels import affine, row_scale

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = jnp.float32
N = 64  # rows in the child; 8 per device

simulator_only = pytest.mark.skipif(
    not SIMULATOR, reason="simulator mode only: the GPU versions are the "
    "multigpu tests (pytest -m multigpu)")


@pytest.fixture(scope="module", params=["shardy", "gspmd"])
def report(request):
    if not SIMULATOR:
        pytest.skip("simulator mode only: the GPU versions are the multigpu "
                    "tests (pytest -m multigpu)")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)  # the child sets its own device count
    seed = int.from_bytes(os.urandom(4), "little")
    proc = subprocess.run(
        [sys.executable, os.path.join(HERE, "scale_out_child.py"),
         request.param, str(seed)],
        capture_output=True, text=True, env=env, timeout=600)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (
        f"scale-out child exited {proc.returncode}\n{proc.stdout[-4000:]}\n"
        f"{proc.stderr[-6000:]}")
    result = json.loads(lines[-1][len("RESULT "):])
    result["partitioner"] = request.param
    return result


# Checks whose inputs divide evenly: nothing is gathered anywhere, the
# result stays split along the rows, and each shard is one device's.
EVEN = {
    # name: rows of each shard of the result (64 rows, or 16 vmapped
    # slices, or 8 outer slices, over 8 devices)
    "kernel_batch_partitionable": 8,
    "kernel_aliased": 8,
    "kernel_scalar_partitionable": 8,
    "callable_scalar_shape_fn": 8,
    "kernel_rule_matvec": 8,
    "kernel_rule_gather": 8,
    "callable_rule_matvec": 8,
    "callable_rule_gather": 8,
    "custom_kernel_rule": 8,
    "vmap_kernel_folded": 2,
    "vmap_kernel_per_slice": 2,
    "vmap_kernel_nested": 1,
    "vmap_kernel_broadcast_input": 2,
    "vmap_callable": 2,
    "vmap_callable_expand_dims": 2,
    "vmap_custom_kernel": 2,
    # vmap_method='sequential' (was: an XLA loop, gathered onto every
    # device, the result replicated): one call per device, over its slices.
    "vmap_callable_sequential": 2,
    "vmap_callable_sequential_capture": 2,
    "vmap_callable_sequential_nested": 1,
    "vmap_callable_sequential_broadcast_input": 2,
}


@pytest.mark.parametrize("check", sorted(EVEN))
def test_split_without_collectives(report, check):
    r = report[check]
    assert r["ok"], r  # the same values as numpy (the unsharded result)
    assert r["custom_calls"] == 1, r
    assert r["collectives"] == [], r  # no all-gather/all-to-all anywhere
    assert r["out_spec"] == "P('x',)", r
    assert r["shard_rows"] == [EVEN[check]], r
    assert r["num_batch_dims"], r  # annotated for XLA's batch partitioner


@pytest.mark.parametrize("check", ["kernel_batch_partitionable",
                                   "kernel_aliased", "kernel_rule_matvec",
                                   "kernel_scalar_partitionable",
                                   "custom_kernel_rule"])
def test_kernel_grid_is_the_shards(report, check):
    # 4 threads per block: each device's 8 rows take 2 blocks, the whole
    # array 16. The grid comes from the shard the call receives.
    assert report[check]["grid"] == [2], report[check]
    assert report["kernel_one_device"]["grid"] == [16], report


def test_callables_see_their_shards(report):
    assert report["callable_rule_matvec"]["seen"] == [[8, 5]]
    assert report["callable_rule_matvec"]["calls"] == 8  # one per device
    assert report["callable_rule_gather"]["seen"] == [[8]]  # table whole
    assert report["vmap_callable"]["seen"] == [[2, 7]]
    # expand_dims: the unbatched matrix... is batched here; v stays whole
    assert report["vmap_callable_expand_dims"]["seen"] == [[2, N, 5]]


@pytest.mark.parametrize("check", ["vmap_callable_sequential",
                                   "vmap_callable_sequential_capture",
                                   "vmap_callable_sequential_nested"])
def test_sequential_slices_stay_on_their_shard_in_order(report, check):
    r = report[check]
    # One func call per slice, each seeing one slice (16 slices; nested:
    # 8 x 3), where the XLA loop ran every slice on every device.
    n = 24 if check.endswith("nested") else 16
    assert r["seen"] == [[7]] and r["calls"] == n, r
    # Each device calls func on its own shard's slices (consecutive
    # indices, outer-major when nested), one at a time and in order.
    per_shard = n // 8
    assert sorted(r["order"]) == list(range(n)), r
    for shard in range(8):
        mine = [k for k in r["order"] if k // per_shard == shard]
        assert mine == sorted(mine), (shard, r["order"])
    # An unbatched input stays whole on every device: each slice gets it.
    b = report["vmap_callable_sequential_broadcast_input"]
    assert b["seen"] == [[N, 5]] and b["calls"] == 16, b


@pytest.mark.parametrize("check", ["kernel_rule_uneven",
                                   "vmap_kernel_uneven",
                                   "vmap_callable_sequential_uneven"])
def test_uneven_shards(report, check):
    r = report[check]
    assert r["ok"], r
    # Nothing is gathered into the op: XLA pads the last shards (60 rows or
    # 10 slices over 8 devices). The program's result, of a size that does
    # not divide, is gathered afterwards (jit returns it whole).
    assert r["upstream"] == [], r
    if "grid" in r:
        assert r["grid"] == [2], r  # 8 (padded) rows per device


def test_export_keeps_the_split(report):
    if report["partitioner"] != "shardy":
        pytest.skip("exported under Shardy (JAX's default) only")
    r = report["export"]
    assert r["annotated"], r  # num_batch_dims and sdy.sharding_rule
    assert r["ok"] and r["collectives"] == [], r
    assert r["out_spec"] == "P('x',)" and r["shard_rows"] == [8], r


@simulator_only
def test_two_processes_under_jax_distributed():
    from test_multiprocess import TIMEOUT, run_two_processes

    def args(i, port, seed):
        return [str(i), str(port), str(seed), str(TIMEOUT)]
    results = run_two_processes("visible", "partitioned_process_child.py",
                                args)
    for i, (code, result, text) in enumerate(results):
        tail = "\n".join(text.splitlines()[-40:])
        assert code == 0 and result is not None and result["ok"], (
            f"process {i} exited {code}:\n{tail}")
        assert len(result["global_devices"]) == 2, result
        for name, found in result["collectives"].items():
            assert found == [], (name, result)
        assert result["shard_rows"] == {
            "kernel_rule": [8], "callable_batch_partitionable": [8],
            "vmap_kernel": [8]}, result


# -- one device, in this process ----------------------------------------------

def _matvec_op(**kw):
    def launch(m, v, out, stream):  # never called: these tests only trace
        raise AssertionError("not called")
    return numbax.numba_cuda_callable(
        launch, jax.ShapeDtypeStruct((8,), F32), **kw)


def test_rule_lowers_to_the_batch_target_with_both_annotations():
    op = _matvec_op(sharding_rule="i j, j -> i")
    m, v = jnp.zeros((8, 3)), jnp.zeros(3)
    text = jax.jit(op).lower(m, v).as_text()
    assert "numbax_callable_batch" in text
    # v has one axis: the matrix gets a leading unit axis so that v has
    # fewer than the batch axes (num_batch_dims 2), and XLA passes it whole.
    assert 'num_batch_dims = "2"' in text
    assert "sdy.sharding_rule" in text and "need_replication" in text
    assert "tensor<1x8x3xf32>" in text


@pytest.mark.parametrize("rule, match", [
    ("i j -> i", "names 1 input.s., but the call has 2"),
    ("i j, j -> i, i", "names 2 result.s., but the op has 1 outputs"),
    ("i, j -> i", "gives input 0 1 axes .i., but it has rank 2"),
    ("i j, i -> i", "factor 'i' is axis of extent 8 in input 0 but 3"),
    ("i i, j -> i", "factor 'i' names two axes of input 0"),
    ("i j, j -> k", "unknown factor 'k'"),
    ("j i, j -> i", "can split only factors that lead every output"),
    ("i j, j", "exactly one '->'"),
    ("i j, (j k) -> i", "compound factors"),
    ("i 2, j -> i", "'2' is not a factor name"),
])
def test_wrong_rules_are_refused_at_trace_time_naming_the_op(rule, match):
    op = _matvec_op(sharding_rule=rule) if "->" in rule and "(" not in rule \
        and "2" not in rule else None
    if op is None:  # a syntax error: refused when the op is made
        with pytest.raises(ValueError, match=match) as info:
            _matvec_op(sharding_rule=rule)
    else:
        # 'j i': the rows of the output are the columns of a (3, 8) input
        m = jnp.zeros((3, 8) if rule.startswith("j i") else (8, 3))
        with pytest.raises(ValueError, match=match) as info:
            jax.jit(op).lower(m, jnp.zeros(3))
    assert "numba_cuda_callable(" in str(info.value)
    assert "launch" in str(info.value)  # the op's function


def test_a_rule_that_leaves_out_the_scratch_buffer_says_scratch():
    # The rule names the outputs, then the scratch buffers: one that
    # names only the output was refused as "the op has 2 outputs".
    def launch(m, v, out, tmp, stream):  # never called: only traced
        raise AssertionError("not called")
    spec = jax.ShapeDtypeStruct((8,), F32)
    op = numbax.numba_cuda_callable(launch, spec, scratch=spec,
                                    sharding_rule="i j, j -> i")
    m, v = jnp.zeros((8, 3)), jnp.zeros(3)
    with pytest.raises(ValueError, match=r"numba_cuda_callable\(.*launch\)"
                       r".*names 1 result.s., but the op has 1 output.s. and 1 "
                       r"scratch buffer.s., and the rule must name all 2: "
                       r"after '->' come the outputs, then the scratch "
                       r"buffers.*'i j, j -> i, s0'"):
        jax.jit(op).lower(m, v)
    # The example the message gives is a rule that works.
    fixed = numbax.numba_cuda_callable(launch, spec, scratch=spec,
                                       sharding_rule="i j, j -> i, s0")
    assert "numbax_callable_batch" in jax.jit(fixed).lower(m, v).as_text()


def test_kernel_rule_errors_name_the_kernel():
    op = numbax.numba_cuda_kernel(
        row_scale, jax.ShapeDtypeStruct((8, 3), F32), launch_dims=8,
        sharding_rule="i j, i -> i")
    with pytest.raises(ValueError, match=r"numba_cuda_kernel\(.*row_scale"
                       r".*gives output 0 1 axes"):
        op(jnp.zeros((8, 3)), jnp.zeros(8))


def test_kernel_launch_dims_must_cover_the_split_factors():
    op = numbax.numba_cuda_kernel(
        row_scale, jax.ShapeDtypeStruct((8, 3), F32), launch_dims=4,
        sharding_rule="i j, i -> i j")
    with pytest.raises(ValueError, match=r"launch_dims must start with the "
                       r"extents of the split factors \('i',\) \(\(8,\)\)"):
        op(jnp.zeros((8, 3)), jnp.zeros(8))
    bp = numbax.numba_cuda_kernel(
        affine, jax.ShapeDtypeStruct((8,), F32), launch_dims=3,
        batch_partitionable=True)
    with pytest.raises(ValueError, match="launch axis 0 is 3"):
        bp(jnp.zeros(8))
    with pytest.raises(ValueError, match="leading extents must be equal"):
        numbax.numba_cuda_kernel(
            affine, jax.ShapeDtypeStruct((8,), F32), launch_dims=8,
            batch_partitionable=True)(jnp.zeros(4))


@pytest.mark.parametrize("kw", [
    dict(outs=lambda x: jax.ShapeDtypeStruct(x.shape, F32), launch_dims=8),
    dict(outs=jax.ShapeDtypeStruct((8,), F32),
         launch_dims=lambda x: x.shape[0]),
])
@pytest.mark.parametrize("rule", [dict(batch_partitionable=True),
                                  dict(sharding_rule="i -> i")])
def test_kernel_rule_refuses_shape_functions(kw, rule):
    with pytest.raises(ValueError, match=r"numba_cuda_kernel\(.*affine\).*"
                       r"cannot be combined with outs= or launch_dims= "
                       r"given as a function"):
        numbax.numba_cuda_kernel(affine, **kw, **rule)


def test_rule_and_batch_partitionable_are_exclusive():
    with pytest.raises(ValueError, match="not both"):
        numbax.numba_cuda_kernel(affine, jax.ShapeDtypeStruct((8,), F32),
                                 launch_dims=8, batch_partitionable=True,
                                 sharding_rule="i -> i")
    with pytest.raises(ValueError, match="not both"):
        _matvec_op(batch_partitionable=True, sharding_rule="i j, j -> i")


def test_kernel_rule_runs_on_one_device(rng):
    op = numbax.numba_cuda_kernel(
        row_scale, jax.ShapeDtypeStruct((8, 3), F32), launch_dims=8,
        sharding_rule="i j, i -> i j")
    m = rng.standard_normal((8, 3)).astype(np.float32)
    s = rng.standard_normal(8).astype(np.float32)
    want = m * s[:, None] + np.arange(3, dtype=np.float32)
    np.testing.assert_allclose(op(m, s), want, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(op)(m, s), want, rtol=1e-6)
    np.testing.assert_allclose(
        jax.vmap(op)(np.stack([m, m]), np.stack([s, s])),
        np.stack([want, want]), rtol=1e-6)


def test_vmap_on_one_device_is_not_annotated():
    # jax.vmap's axis is split only in programs of several devices: a
    # program of one device is the program it always was.
    op = numbax.numba_cuda_kernel(affine, jax.ShapeDtypeStruct((8,), F32),
                                  launch_dims=8)
    text = jax.jit(jax.vmap(op)).lower(jnp.zeros((4, 8))).as_text()
    assert "num_batch_dims" not in text and "_batch" not in text


def test_custom_kernel_rule_is_checked_when_called():
    op = numbax.XLACustomKernel("scale_out_rule_check",
                                sharding_rule="i j -> i")

    @op.def_numba_cuda_kernel
    def _(*, outs):
        return numbax.numba_cuda_kernel(affine, outs, launch_dims=8)
    with pytest.raises(ValueError, match=r"XLACustomKernel\('scale_out_rule"
                       r"_check'\).*gives input 0 2 axes"):
        op(jnp.zeros(8), outs=jax.ShapeDtypeStruct((8,), F32))
    with pytest.raises(TypeError, match="sharding rule must be a str"):
        op.def_sharding_rule(3)


def test_custom_kernel_rule_reaches_the_kernel(rng):
    op = numbax.XLACustomKernel("scale_out_rule_kernel")
    op.def_sharding_rule(lambda *, outs: "i -> i")

    @op.def_numba_cuda_kernel
    def _(*, outs):
        return numbax.numba_cuda_kernel(affine, outs, launch_dims=8)
    x = rng.standard_normal(8).astype(np.float32)
    outs = jax.ShapeDtypeStruct((8,), F32)
    text = jax.jit(lambda v: op(v, outs=outs)).lower(x).as_text()
    assert "num_batch_dims" in text
    np.testing.assert_allclose(op(x, outs=outs), 2 * x + 1, rtol=1e-6)


@pytest.mark.parametrize("rule, ins, outs, factors, units, lead, trail", [
    # elementwise: nothing whole, no unit axis; no split input has an axis
    # besides the split one, so each gets one at the end
    ("i, i -> i", [(8,), (8,)], [(8,)], ("i",), 0, (0, 0, 0), (1, 1, 0)),
    # row-wise: rows split, nothing whole; m has an axis besides the rows
    ("i j, i -> i j", [(8, 3), (8,)], [(8, 3)], ("i",), 0, (0, 0, 0),
     (0, 0, 0)),
    # matrix-vector: v whole (1 axis), so the split arrays get 1 unit axis
    ("i j, j -> i", [(8, 3), (3,)], [(8,)], ("i",), 1, (1, 0, 1), (0, 0, 0)),
    # gather from a table every row reads: the table whole (2 axes); idx,
    # the only split input, has no other axis
    ("i, t d -> i d", [(8,), (5, 2)], [(8, 2)], ("i",), 2, (2, 0, 2),
     (1, 0, 0)),
    # two leading factors
    ("b c x, b c -> b c x", [(2, 4, 3), (2, 4)], [(2, 4, 3)], ("b", "c"), 0,
     (0, 0, 0), (0, 0, 0)),
])
def test_split_of_common_shapes(rule, ins, outs, factors, units, lead, trail):
    s = sharding_rules.split(sharding_rules.parse(rule, "op"), ins, outs,
                             "op")
    assert (s.factors, s.units, s.lead, s.trail) == (factors, units, lead,
                                                     trail)
    assert s.num_batch_dims == units + len(factors)

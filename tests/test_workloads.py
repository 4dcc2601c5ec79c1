"""Realistic workloads through numba_cuda_callable, against numpy on fresh data;
and numbax's own workload benchmarks (numbax.bench.workloads) run and check."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import SIMULATOR, random_array

pytestmark = pytest.mark.gpu


@cuda.jit
def csr_matvec_kernel(indptr, indices, data, x, y):
    row = cuda.grid(1)
    if row < y.shape[0]:
        acc = 0.0
        for k in range(indptr[row], indptr[row + 1]):
            acc += data[k] * x[indices[k]]
        y[row] = acc


def random_csr(rng, rows, cols, density):
    mask = rng.random((rows, cols)) < density
    dense = np.where(mask, rng.standard_normal((rows, cols)), 0).astype(np.float32)
    indptr = np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(np.int32)
    indices = np.nonzero(mask)[1].astype(np.int32)
    data = dense[mask]
    return dense, indptr, indices, data


def test_csr_matvec(rng):
    rows, cols = 300, 200
    dense, indptr, indices, data = random_csr(rng, rows, cols, 0.05)
    x = random_array(rng, (cols,), np.float32)

    def matvec(indptr, indices, data, x, y, stream):
        threads = 128
        csr_matvec_kernel[-(-y.shape[0] // threads), threads, stream](
            indptr, indices, data, x, y)

    op = numbax.numba_cuda_callable(
        matvec, outs=jax.ShapeDtypeStruct((rows,), jnp.float32))
    y = jax.jit(op)(indptr, indices, data, x)
    np.testing.assert_allclose(y, dense @ x, rtol=1e-4, atol=1e-4)


@cuda.jit
def zero_fill(out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = 0


@cuda.jit
def scatter_add_kernel(index, values, out):
    i = cuda.grid(1)
    if i < index.shape[0]:
        cuda.atomic.add(out, index[i], values[i])


def test_atomic_scatter_add(rng):
    bins, n = 50, 5000
    index = rng.integers(0, bins, n).astype(np.int32)
    values = random_array(rng, (n,), np.float32)

    def scatter(index, values, out, stream):
        threads = 256
        # Outputs arrive uninitialised: clear on the same stream first.
        zero_fill[-(-out.shape[0] // threads), threads, stream](out)
        scatter_add_kernel[-(-index.shape[0] // threads), threads, stream](
            index, values, out)

    op = numbax.numba_cuda_callable(
        scatter, outs=jax.ShapeDtypeStruct((bins,), jnp.float32))
    expected = np.zeros(bins, np.float64)
    np.add.at(expected, index, values)
    np.testing.assert_allclose(jax.jit(op)(index, values), expected,
                               rtol=1e-4, atol=1e-3)


@cuda.jit
def add_k(x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] + y[i]


@cuda.jit
def square_k(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * x[i]


def test_two_kernel_pipeline_with_temporary(rng):
    # The simulator runs each thread in Python: 1,000 elements (4 blocks,
    # the last one partly used) show the same.
    n = 1000 if SIMULATOR else 10_000

    def pipeline(x, y, out, stream):
        temp = cuda.device_array(x.shape[0], dtype=x.dtype, stream=stream)
        threads = 256
        blocks = -(-x.shape[0] // threads)
        add_k[blocks, threads, stream](x, y, temp)
        square_k[blocks, threads, stream](temp, out)
        # temp stays referenced until both launches are enqueued.
        del temp

    op = numbax.numba_cuda_callable(
        pipeline, outs=jax.ShapeDtypeStruct((n,), jnp.float32))
    f = jax.jit(lambda a, b: op(a, b) + 1)
    for _ in range(3):
        x = random_array(rng, (n,), np.float32)
        y = random_array(rng, (n,), np.float32)
        np.testing.assert_allclose(f(x, y), (x + y) ** 2 + 1, rtol=1e-5)


# -- the workload benchmarks run (tiny in the simulator) ---------------------

def test_workload_benchmarks_run_and_check(rng):
    from numbax.bench import timing, workloads
    cfg = (workloads.WorkloadConfig.cpu_smoke() if SIMULATOR else
           workloads.WorkloadConfig(vmap_shapes=((16, 1024),), vmap_rounds=2,
                                    nested_shape=(4, 4, 1024),
                                    bf16_shape=(16, 1024),
                                    per_slice_shape=(64, 256),
                                    vmap_runs=1, neurons=2000, fan_out=10,
                                    steps=20, snn_rounds=2))
    logged = []
    vmap_rows = workloads.run_vmap(cfg, rng, timing, logged.append)
    bf16 = [r for r in vmap_rows if "bf16" in r["name"]]
    rest = [r for r in vmap_rows if r not in bf16]
    assert {r["status"] for r in rest} == {"ok"}, vmap_rows
    if SIMULATOR:  # no bf16 intrinsics there: one row says so
        assert [r["status"][:8] for r in bf16] == ["skipped:"], bf16
    else:
        assert {r["status"] for r in bf16} == {"ok"}, bf16
        rest += bf16
    by_name = {}
    for r in rest:
        by_name.setdefault(r["name"], []).append(r)
    for name in ("numbax vmap, folded", "numbax nested vmap, folded",
                 "numbax bf16 vmap, folded"):
        assert all(r["vmap"].startswith("one launch per batch")
                   for r in by_name.get(name, [])), name
    for name in ("numbax vmap, per slice", "numbax vmap, per slice from C++",
                 "numbax vmap, sequential (C++)",
                 "numbax bf16 vmap, per slice"):
        assert all(r["vmap"].startswith("one launch per slice")
                   for r in by_name.get(name, [])), name
    assert by_name["numbax nested vmap, folded"][0]["B"] == "x".join(
        map(str, cfg.nested_shape[:-1]))
    assert "numbax per slice, XLA loop (lax.map)" in by_name
    assert all(r["us_per_call"] > 0 and r["us_per_slice"] > 0 for r in rest)
    snn_rows = workloads.run_snn(cfg, 7, timing, logged.append)
    assert len(snn_rows) == 4
    for r in snn_rows:
        assert r["status"] == "ok" and r["spikes_match_jax"], r
        assert r["us_per_step"] > 0 and r["first_call_s"] > 0
    assert snn_rows[0]["spikes_per_step"] > 0  # the network does spike
    table = workloads.format_tables(vmap_rows, snn_rows)
    assert "(d) numba_cuda_kernel, aliased zeros" in table

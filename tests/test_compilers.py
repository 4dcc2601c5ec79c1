"""The kernel, callable, vmap, capture and XLACustomKernel paths with both
compilers: numba-cuda and numba-cuda-mlir (docs/compilers.md).

Every kernel is the same source compiled by each (tests/two_compilers.py).
All GPU-only: numba-cuda-mlir has no simulator, and the numba-cuda half
already runs in the simulator through the other test files. The
numba_cuda_mlir cases skip, saying why, where it does not import. Outputs are
compared with numpy on fresh random data, written over poisoned buffers (or
checked for every element) so an element a launch leaves unwritten shows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numbax
from numbax.kernel import gpu

import two_compilers
from conftest import SIMULATOR, random_array, x64_enabled

pytestmark = pytest.mark.gpu

# Every compiler numbax has (numbax.compilers.ALL), by the name tests and
# two_compilers.py use: a compiler added there runs every test here.
COMPILERS = sorted(two_compilers.COMPILERS)
_loaded: dict = {}


def kernels(compiler: str):
    """tests/two_compilers.py compiled by `compiler` (loaded once)."""
    if SIMULATOR:
        pytest.skip("needs a real GPU (numba-cuda-mlir has no simulator; the "
                    "numba-cuda half runs in the simulator elsewhere)")
    module = two_compilers.COMPILERS[compiler]
    pytest.importorskip(
        module, reason=f"{module} does not import (numba-cuda-mlir is "
        "optional: pip install numba-cuda-mlir)")
    if compiler not in _loaded:
        _loaded[compiler] = two_compilers.load(compiler)
    return _loaded[compiler]


@pytest.fixture(params=COMPILERS)
def k(request):
    return kernels(request.param)


def poisoned(shape, dtype=np.float32):
    fill = np.nan if np.dtype(dtype).kind == "f" else -12345
    return jnp.full(shape, fill, dtype)


def is_mlir(k) -> bool:
    return k.__name__.endswith("numba_cuda_mlir")


# -- numba_cuda_kernel ------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_kernel_elementwise(k, rng, dtype):
    n = 1000
    op = numbax.numba_cuda_kernel(
        k.affine, jax.ShapeDtypeStruct((n,), dtype), launch_dims=n)
    jax.config.update("jax_enable_x64", True)
    try:
        for _ in range(2):  # fresh data per call, one compiled program
            x = random_array(rng, (n,), dtype)
            out = np.asarray(jax.jit(op)(jnp.asarray(x)))
            assert out.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(out, (2 * x + 1).astype(dtype))
    finally:
        jax.config.update("jax_enable_x64", False)


def test_kernel_two_ranks_and_odd_shapes(k, rng):
    # 37x53: blocks do not divide the shape; v (rank 1) next to m (rank 2)
    # checks each memref's sizes/strides land where the kernel reads them.
    m = random_array(rng, (37, 53), np.float32)
    v = random_array(rng, (53,), np.float32)
    op = numbax.numba_cuda_kernel(
        k.scale_rows, jax.ShapeDtypeStruct((37, 53), jnp.float32),
        launch_dims=(37, 53))
    np.testing.assert_allclose(jax.jit(op)(m, v), m * v[None, :], rtol=1e-6)


def test_kernel_rank3(k, rng):
    x = random_array(rng, (5, 7, 9), np.float32)
    op = numbax.numba_cuda_kernel(
        k.box3, jax.ShapeDtypeStruct(x.shape, jnp.float32),
        launch_dims=x.shape)
    i, j, kk = np.indices(x.shape)
    np.testing.assert_allclose(jax.jit(op)(x), x + i * 100 + j * 10 + kk,
                               rtol=1e-6)


def test_kernel_two_outputs_explicit_grid(k, rng):
    n = 777
    a, b = (random_array(rng, (n,), np.float32) for _ in range(2))
    op = numbax.numba_cuda_kernel(
        k.sum_and_diff, (jax.ShapeDtypeStruct((n,), jnp.float32),) * 2,
        grid=(n + 63) // 64, block=64)
    total, diff = jax.jit(op)(a, b)
    np.testing.assert_allclose(total, a + b, rtol=1e-6)
    np.testing.assert_allclose(diff, a - b, rtol=1e-6)


def test_kernel_in_place_alias(k, rng):
    x = random_array(rng, (500,), np.float32)
    op = numbax.numba_cuda_kernel(
        k.scale_in_place, jax.ShapeDtypeStruct((500,), jnp.float32),
        launch_dims=500, input_output_aliases={0: 0})
    np.testing.assert_allclose(jax.jit(op)(x), x * 3, rtol=1e-6)


def test_kernel_explicit_signature_of_another_dtype_is_refused(k, rng):
    # numba-cuda-mlir's dispatcher compiles any types it is asked for, its
    # explicit signature or not: before, float64 code's op ran on float32
    # buffers through it without a word (H200). Both compilers now refuse
    # the arrays no signature takes, and run the one that does.
    typed = k.cuda.jit("void(float64[::1], float64[::1])")(k.affine.py_func)
    n = 64
    op = numbax.numba_cuda_kernel(
        typed, jax.ShapeDtypeStruct((n,), jnp.float32), launch_dims=n)
    with pytest.raises(TypeError, match="explicit signatures only"):
        jax.jit(op)(random_array(rng, (n,), np.float32))
    with x64_enabled(True):
        op64 = numbax.numba_cuda_kernel(
            typed, jax.ShapeDtypeStruct((n,), jnp.float64), launch_dims=n)
        x = random_array(rng, (n,), np.float64)
        np.testing.assert_allclose(jax.jit(op64)(x), 2 * x + 1, rtol=1e-12)


def test_kernel_zero_extent_zero_fills(k):
    op = numbax.numba_cuda_kernel(
        k.affine, jax.ShapeDtypeStruct((0,), jnp.float32), launch_dims=0)
    assert jax.jit(op)(jnp.zeros((0,), jnp.float32)).shape == (0,)


def test_kernel_chain_in_one_program(k, rng):
    # Many launches in one jitted program (XLA may record them into a
    # command buffer: the handler is command-buffer compatible).
    n = 4096
    op = numbax.numba_cuda_kernel(
        k.affine, jax.ShapeDtypeStruct((n,), jnp.float32), launch_dims=n)

    @jax.jit
    def chain(x):
        for _ in range(8):
            x = op(x) * 0.25
        return x

    for _ in range(3):
        x = random_array(rng, (n,), np.float32)
        ref = x.astype(np.float64)
        for _ in range(8):
            ref = (2 * ref + 1) * 0.25
        np.testing.assert_allclose(chain(x), ref, rtol=1e-5, atol=1e-6)


def test_kernel_vmap(k, rng):
    n, batch = 300, 5
    op = numbax.numba_cuda_kernel(
        k.add, jax.ShapeDtypeStruct((n,), jnp.float32), launch_dims=n,
        vmap_method="broadcast_all")
    a = random_array(rng, (batch, n), np.float32)
    b = random_array(rng, (n,), np.float32)  # unbatched: broadcast
    got = jax.jit(jax.vmap(op, in_axes=(0, None)))(a, b)
    np.testing.assert_allclose(got, a + b[None, :], rtol=1e-6)
    # The kernel reads only grid axis x: the batch runs in one launch, with
    # either compiler (numba-cuda-mlir's read from its optimised MLIR).
    decision = op.vmap_fold(jax.ShapeDtypeStruct((n,), jnp.float32),
                            jax.ShapeDtypeStruct((n,), jnp.float32))
    assert decision.folds and decision.axis == "z", decision
    # More slices than one launch takes along z: chunks of 65535.
    big = 65535 + 7
    a = random_array(rng, (big, 4), np.float32)
    op4 = numbax.numba_cuda_kernel(
        k.add, jax.ShapeDtypeStruct((4,), jnp.float32), launch_dims=4,
        vmap_method="broadcast_all")
    got = jax.jit(jax.vmap(op4, in_axes=(0, None)))(a, b[:4])
    np.testing.assert_allclose(got, a + b[None, :4], rtol=1e-6)


def test_kernel_vmap_per_slice_when_it_reads_the_free_axis(k, rng):
    # box3 reads blockIdx.y through cuda.grid(3), and its launch leaves only
    # y free: every slice is a launch of its own.
    shape, batch = (5, 7, 9), 3
    op = numbax.numba_cuda_kernel(
        k.box3, jax.ShapeDtypeStruct(shape, jnp.float32), launch_dims=shape,
        vmap_method="broadcast_all")
    decision = op.vmap_fold(jax.ShapeDtypeStruct(shape, jnp.float32))
    assert not decision.folds and "reads grid axis y" in decision.reason, \
        decision
    x = random_array(rng, (batch,) + shape, np.float32)
    i, j, kk = np.indices(shape)
    got = jax.jit(jax.vmap(op))(x)
    np.testing.assert_allclose(got, x + (i * 100 + j * 10 + kk)[None],
                               rtol=1e-6)


def test_kernel_export_round_trip(k, rng):
    from jax import export
    n = 256
    op = numbax.numba_cuda_kernel(
        k.affine, jax.ShapeDtypeStruct((n,), jnp.float32), launch_dims=n,
        name=f"test_compilers.affine.{k.__name__}")
    exported = export.export(
        jax.jit(op), disabled_checks=numbax.export_disabled_checks())(
        jax.ShapeDtypeStruct((n,), jnp.float32))
    restored = export.deserialize(exported.serialize())
    x = random_array(rng, (n,), np.float32)
    np.testing.assert_allclose(restored.call(x), 2 * x + 1, rtol=1e-6)


def test_mlir_loaded_kernel_uses_memref_abi(rng):
    # The loaded kernel numbax builds says which parameter layout C++ packs.
    kk = kernels("numba_cuda_mlir")
    op = numbax.numba_cuda_kernel(
        kk.affine, jax.ShapeDtypeStruct((64,), jnp.float32), launch_dims=64)
    entry = gpu.entry(op, "", [((64,), np.dtype(np.float32))], 0,
                      (False,))
    loaded = entry.resolve()
    assert loaded.abi == numbax.compilers.base.MEMREF_ABI
    assert all(f != 0 for f in loaded.functions)


# -- numba_cuda_callable: the kernel launched from func ----------------------

def _callable(k, func, n, **kw):
    return numbax.numba_cuda_callable(
        getattr(k, func), outs=jax.ShapeDtypeStruct((n,), jnp.float32),
        input_output_aliases={1: 0}, **kw)


def _count_host_syncs(monkeypatch):
    """Counts numba-cuda-mlir's stream synchronisations (its array-interface
    sync goes through them)."""
    from numba_cuda_mlir.numba_cuda.cudadrv import driver
    calls = []
    original = driver.Stream.synchronize

    def synchronize(self):
        calls.append(int(self.handle) if self.handle is not None else 0)
        return original(self)

    monkeypatch.setattr(driver.Stream, "synchronize", synchronize)
    return calls


@pytest.mark.parametrize("capture", [False, True])
def test_callable_passes_numbax_stream(k, rng, monkeypatch, capture):
    n = 1000
    op = jax.jit(_callable(k, "launch_affine", n, capture=capture))
    syncs = _count_host_syncs(monkeypatch) if is_mlir(k) else []
    numbax.reset_bridge_counters()
    for _ in range(4):  # capture: the first call runs plainly, then replays
        x = random_array(rng, (n,), np.float32)
        got = np.asarray(op(x, poisoned(n)))
        np.testing.assert_allclose(got, 2 * x + 1, rtol=1e-6)
    # numbax's stream is the arrays' stream: no host sync per launch.
    assert syncs == [], f"{len(syncs)} host synchronisations"
    c = numbax.bridge_counters()
    fallbacks = {key: v for key, v in c.items()
                 if key.startswith("fallback_") and v}
    if not capture:
        # The first launch is the compiler's own; later ones are packed in
        # C++ (numba-cuda-mlir's arrays as memrefs).
        assert c["fast_launches"] == 3, c
        assert fallbacks == {"fallback_new_plan": 1}, fallbacks
    else:
        assert set(fallbacks) <= {"fallback_new_plan"}, fallbacks


def test_callable_chain_on_numbax_stream(k, rng, monkeypatch):
    n = 3000
    op = _callable(k, "launch_chain", n)
    syncs = _count_host_syncs(monkeypatch) if is_mlir(k) else []

    @jax.jit
    def program(x):
        for _ in range(5):
            x = op(x, poisoned(n)) * 1e-3
        return x

    x = random_array(rng, (n,), np.float32)
    ref = x.astype(np.float64)
    for _ in range(5):
        ref = 2 * ref + 1
        for _ in range(3):
            ref = 2 * ref + 1
        ref = ref * 1e-3
    np.testing.assert_allclose(program(x), ref, rtol=1e-4)
    assert syncs == [], f"{len(syncs)} host synchronisations"


def test_callable_vmap_sequential(k, rng):
    n, batch = 200, 3
    op = numbax.numba_cuda_callable(
        k.launch_affine, outs=jax.ShapeDtypeStruct((n,), jnp.float32),
        input_output_aliases={1: 0}, vmap_method="sequential")
    x = random_array(rng, (batch, n), np.float32)
    got = jax.jit(jax.vmap(op))(x, jnp.full((batch, n), jnp.nan, jnp.float32))
    np.testing.assert_allclose(got, 2 * x + 1, rtol=1e-6)


# -- XLACustomKernel --------------------------------------------------------

def test_custom_kernel_def_kernel(k, rng):
    op = numbax.XLACustomKernel(f"test_compilers_scale_{k.__name__}")

    def generator(*, outs):
        return numbax.numba_cuda_kernel(k.affine, outs,
                                        launch_dims=outs.shape[0])

    op.def_kernel("gpu", generator, backend=k.__name__)
    x = random_array(rng, (321,), np.float32)
    got = jax.jit(lambda x: op(x, outs=jax.ShapeDtypeStruct(x.shape, x.dtype),
                               backend=k.__name__))(x)
    np.testing.assert_allclose(got, 2 * x + 1, rtol=1e-6)


# -- mixing: both compilers in one func and one program -----------------------

def test_one_func_launches_both_compilers_in_order(rng):
    nb, ml = kernels("numba_cuda"), kernels("numba_cuda_mlir")
    n = 2000

    def func(x, poison, out, stream):
        blocks = (n + 127) // 128
        nb.affine[blocks, 128, stream](x, out)    # out = 2x + 1
        ml.affine[blocks, 128, stream](out, out)  # out = 2 out + 1
        nb.affine[blocks, 128, stream](out, out)

    op = jax.jit(numbax.numba_cuda_callable(
        func, outs=jax.ShapeDtypeStruct((n,), jnp.float32),
        input_output_aliases={1: 0}))
    kernel_op = numbax.numba_cuda_kernel(
        ml.add, jax.ShapeDtypeStruct((n,), jnp.float32), launch_dims=n)
    numbax.reset_bridge_counters()
    for _ in range(3):
        x = random_array(rng, (n,), np.float32)
        got = np.asarray(op(x, poisoned(n)))
        np.testing.assert_allclose(got, 2 * (2 * (2 * x + 1) + 1) + 1,
                                   rtol=1e-5)
        both = jax.jit(lambda x: kernel_op(op(x, poisoned(n)), x))(x)
        np.testing.assert_allclose(both, got + x, rtol=1e-5)
    c = numbax.bridge_counters()
    assert c["fallback_plan_error"] == 0 and c["fallback_numba_error"] == 0, c
    assert c["fast_launches"] > 0, c

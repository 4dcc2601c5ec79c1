"""A kernel compiled for explicit signatures, given buffers none of them
takes (another dtype, rank or layout, or any type after disable_compile()),
is refused with a TypeError that names the op, on every path (jit, eager,
vmap, vmap_fold), and never launched on them; a plain callable's fast launch
of such a kernel is never replayed and gives the bits of Numba's own launch.
After each refusal a good op still runs: the CUDA context is healthy.

Each test runs in a process of its own (conftest.in_own_process): were a
refusal broken, the launch on the wrong buffers could corrupt the context.
GPU only: the simulator ignores explicit signatures.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import (SIMULATOR, assert_close, assert_raises, grid_for, in_own_process,
                      kernel_op, poison)
from shared_kernels import add_one, affine_cols_f32, affine_f32

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("gpu_only", "x64")]

N = 64 if SIMULATOR else 4096
OP = "numba_cuda_kernel("


@cuda.jit("void(float64[:], float64[:])")
def k_f64(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * 2 + 1


@cuda.jit("void(int32[:], int32[:])")
def k_i32(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + 1


@cuda.jit("void(int64[:], int64[:])")
def k_i64(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * 3


@cuda.jit("void(uint32[:], uint32[:])")
def k_u32(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] + 1


@cuda.jit("void(float32[::1,:], float32[::1,:])")
def k_fortran(x, out):
    i, j = cuda.grid(2)
    if i < x.shape[0] and j < x.shape[1]:
        out[i, j] = x[i, j] + 1


@cuda.jit(["void(float64[:], float64[:])", "void(int64[:], int64[:])"])
def k_list_none(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = x[i] * 2


@cuda.jit
def lazy_disabled(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * 5


def f32(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def healthy(rng):
    """A good op after a refusal: the process's CUDA context still works."""
    x = f32(rng, N)
    poison((N,), np.float32)
    got = jax.jit(kernel_op(add_one, (N,), jnp.float32))(x)
    assert_close(got, x + 1, "context check after refusal")


@pytest.mark.parametrize("kernel, dtype", [
    (k_f64, np.float32), (k_i64, np.int32), (k_i32, np.float32), (k_i32, np.int64),
    (k_u32, np.int32),
], ids=["f64_kernel_on_f32", "i64_kernel_on_i32", "i32_kernel_on_f32", "i32_kernel_on_i64",
        "u32_kernel_on_i32"])
@in_own_process()
def test_another_dtype_is_refused_on_every_path(kernel, dtype, rng):
    x = f32(rng, N) if dtype == np.float32 else np.arange(N, dtype=dtype)
    op = kernel_op(kernel, x.shape, dtype)
    for label, f in (("jit", jax.jit(op)), ("eager", op), ("vmap_fold", op.vmap_fold)):
        assert_raises(TypeError, f, x, what=label,
                      contains=(OP, kernel.__name__, np.dtype(dtype).name))
    assert_raises(TypeError, jax.vmap(op), np.stack([x, x]), contains=(OP,), what="vmap")
    healthy(rng)


@in_own_process()
def test_rank_mismatch_is_refused_both_ways(rng):
    op = numbax.numba_cuda_kernel(affine_cols_f32, jax.ShapeDtypeStruct((N,), jnp.float32),
                                  launch_dims=(N, 1))
    assert_raises(TypeError, jax.jit(op), f32(rng, N), what="2-D signature on 1-D",
                  contains=(OP, affine_cols_f32.__name__))
    op1 = numbax.numba_cuda_kernel(
        affine_f32, jax.ShapeDtypeStruct((64, 64), jnp.float32), launch_dims=64)
    assert_raises(TypeError, jax.jit(op1), f32(rng, (64, 64)), what="1-D signature on 2-D",
                  contains=(OP, affine_f32.__name__))
    healthy(rng)


@in_own_process()
def test_no_signature_of_a_list_matches(rng):
    op = kernel_op(k_list_none, (N,), jnp.float32)
    assert_raises(TypeError, jax.jit(op), f32(rng, N),
                  contains=(OP, "k_list_none", "any of its signatures"))
    healthy(rng)


@in_own_process()
def test_fortran_signature_refuses_c_arrays(rng):
    op = kernel_op(k_fortran, (32, 48), jnp.float32)
    assert_raises(TypeError, jax.jit(op), f32(rng, (32, 48)), contains=(OP, "k_fortran"))
    healthy(rng)


@in_own_process()
def test_fast_launch_of_an_int32_kernel_on_float32_is_numbas_own(rng):
    """A callable's func launches an int32[:] kernel on float32 arrays:
    Numba's own launch reinterprets the bits; the fast path never replays
    that launch (fallback_signature_mismatch) and gives the same bits."""
    x = np.arange(N, dtype=np.float32) * 1.5

    def make(fast):
        def launch(x, out, stream):
            k_i32[grid_for(N), 256, stream](x, out)
        return jax.jit(numbax.numba_cuda_callable(
            launch, jax.ShapeDtypeStruct((N,), jnp.float32), fast_launch=fast))

    numbax.reset_bridge_counters()
    first = np.asarray(make(True)(x))
    f = make(True)
    numbax.reset_bridge_counters()
    for _ in range(4):
        got = np.asarray(f(x))
    counters = numbax.bridge_counters()
    slow = np.asarray(make(False)(x))
    want = x.view(np.int32) + 1
    assert np.array_equal(slow.view(np.int32), want), "Numba's own launch"
    assert np.array_equal(got.view(np.int32), want), "fast path != Numba"
    assert np.array_equal(first.view(np.int32), want)
    assert counters.get("fast_launches", 0) == 0, counters
    assert counters.get("fallback_signature_mismatch", 0) >= 3, {
        k: v for k, v in counters.items() if v}
    healthy(rng)


@in_own_process()
def test_disable_compile_after_float32_refuses_float64(rng):
    lazy_disabled.compile("void(float32[:], float32[:])")
    lazy_disabled.disable_compile()
    x = f32(rng, N)
    assert_close(jax.jit(kernel_op(lazy_disabled, (N,), jnp.float32))(x), x * 5, "f32")
    assert_raises(TypeError, jax.jit(kernel_op(lazy_disabled, (N,), jnp.float64)),
                  x.astype(np.float64), contains=(OP, "lazy_disabled"),
                  what="f64 after disable_compile")
    healthy(rng)

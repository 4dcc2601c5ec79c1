"""bfloat16 inputs and outputs, typed by numba-cuda's own numpy support.

Plain arithmetic runs in Numba's CUDA simulator too; the ``cuda.bf16``
intrinsics exist only on a GPU (compute capability >= 8.0). Results are
compared with numpy (ml_dtypes) on fresh random data.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from numba import cuda, float32

import numbax
from numbax.runtime import numba_bridge

from conftest import SIMULATOR

BF16 = ml_dtypes.bfloat16
N = 200


@pytest.fixture(params=["here", pytest.param("gpu", marks=pytest.mark.gpu)])
def where(request):
    # "here" runs in CI (simulator) and on the GPU box alike; "gpu" only on
    # a real GPU, so that `pytest -m gpu` selects these tests too.
    if request.param == "gpu" and SIMULATOR:
        pytest.skip("needs a real GPU")
    return request.param


def bf16_data(rng, shape):
    return rng.standard_normal(shape).astype(np.float32).astype(BF16)


def as_f32(a):
    return np.asarray(a).astype(np.float32)


@cuda.jit
def axpy_bf16(x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = 2 * x[i] + y[i]


@cuda.jit
def product_to_f32(x, y, out):
    # bf16 in, float32 out: the product of two bfloat16 values is exact in
    # float32 (8-bit significands), so the comparison is exact too.
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = float32(x[i]) * float32(y[i])


def axpy_reference(x, y):
    # numpy with ml_dtypes rounds to bfloat16 after every operation, as the
    # GPU's bfloat16 arithmetic does.
    return (BF16(2) * x + y).astype(BF16)


def test_numba_types_bfloat16():
    ty = numba_bridge.numba_type_for(np.dtype(BF16))
    assert ty is not None and "bfloat16" in str(ty)


def test_callable_bfloat16_in_and_out(rng, where):
    fn = numbax.numba_cuda_callable(
        lambda x, y, out, s: axpy_bf16[(N + 63) // 64, 64, s](x, y, out),
        jax.ShapeDtypeStruct((N,), jnp.bfloat16))
    x, y = bf16_data(rng, N), bf16_data(rng, N)
    got = jax.jit(fn)(x, y)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(as_f32(got), as_f32(axpy_reference(x, y)),
                               rtol=1e-2, atol=1e-2)


def test_kernel_bfloat16_in_and_out(rng, where):
    op = numbax.numba_cuda_kernel(
        axpy_bf16, jax.ShapeDtypeStruct((N,), jnp.bfloat16), launch_dims=N)
    x, y = bf16_data(rng, N), bf16_data(rng, N)
    for got in (op(x, y), jax.jit(op)(x, y)):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_allclose(as_f32(got), as_f32(axpy_reference(x, y)),
                                   rtol=1e-2, atol=1e-2)


def test_kernel_bfloat16_in_float32_out(rng, where):
    op = numbax.numba_cuda_kernel(
        product_to_f32, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N)
    x, y = bf16_data(rng, N), bf16_data(rng, N)
    got = jax.jit(op)(x, y)
    assert got.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(got), as_f32(x) * as_f32(y))


def test_kernel_bfloat16_under_vmap(rng, where):
    op = numbax.numba_cuda_kernel(
        product_to_f32, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N)
    x, y = bf16_data(rng, (3, N)), bf16_data(rng, N)
    got = jax.jit(jax.vmap(op, in_axes=(0, None)))(x, y)
    np.testing.assert_array_equal(np.asarray(got), as_f32(x) * as_f32(y))


def test_custom_kernel_bfloat16(rng, where):
    prim = numbax.XLACustomKernel("bf16_axpy_test")

    @prim.def_numba_cuda_kernel
    def _(*, outs):
        return numbax.numba_cuda_kernel(axpy_bf16, outs,
                                        launch_dims=outs.shape[0])

    x, y = bf16_data(rng, N), bf16_data(rng, N)
    got = jax.jit(lambda a, b: prim(
        a, b, outs=jax.ShapeDtypeStruct(a.shape, a.dtype)))(x, y)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(as_f32(got), as_f32(axpy_reference(x, y)),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_bf16_intrinsics_on_gpu(rng, gpu_only):
    from numba.cuda.bf16 import hadd, hfma, hmax, hmul

    @cuda.jit
    def intrinsics(x, y, fma, mx, sm):
        i = cuda.grid(1)
        if i < x.shape[0]:
            fma[i] = hfma(x[i], y[i], x[i])
            mx[i] = hmax(x[i], y[i])
            sm[i] = float32(hadd(hmul(x[i], x[i]), y[i]))

    spec = jax.ShapeDtypeStruct((N,), jnp.bfloat16)
    op = numbax.numba_cuda_kernel(
        intrinsics, (spec, spec, jax.ShapeDtypeStruct((N,), jnp.float32)),
        launch_dims=N)
    x, y = bf16_data(rng, N), bf16_data(rng, N)
    fma, mx, sm = jax.jit(op)(x, y)
    xf, yf = as_f32(x), as_f32(y)
    # fma rounds once; hmul then hadd round twice.
    np.testing.assert_allclose(as_f32(fma), xf * yf + xf, rtol=1e-2, atol=1e-2)
    np.testing.assert_array_equal(as_f32(mx), np.maximum(xf, yf))
    np.testing.assert_allclose(np.asarray(sm), as_f32((x * x).astype(BF16) + y),
                               rtol=1e-2, atol=1e-2)


def test_simulator_lacks_bf16_intrinsics(simulator_only):
    # What docs/simulator.md says: numba.cuda.bf16 is an empty stand-in in
    # the simulator, so kernels that use its intrinsics need a GPU.
    with pytest.raises(ImportError):
        from numba.cuda.bf16 import hadd  # noqa: F401


def test_old_gpu_is_a_clear_error():
    assert numba_bridge.bfloat16_problem({0: (9, 0), 1: (8, 0)}) is None
    why = numba_bridge.bfloat16_problem({0: (9, 0), 1: (7, 5)})
    assert "GPU 1 (compute capability 7.5)" in why
    assert ">= 8.0" in why and "astype(jnp.float32)" in why


@pytest.mark.gpu
def test_old_gpu_refused_at_trace_time(rng, monkeypatch, gpu_only):
    # Pretend every GPU is a Turing: the kernel is refused when lowered,
    # before Numba compiles anything.
    monkeypatch.setattr(
        numba_bridge, "check_bfloat16_devices",
        lambda op: (_ for _ in ()).throw(ValueError(
            f"{op}: " + numba_bridge.bfloat16_problem({0: (7, 5)}))))
    # A name of its own: an op equal to one traced by an earlier test would
    # be the same (interned) op, whose lowering JAX has cached.
    op = numbax.numba_cuda_kernel(
        product_to_f32, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N,
        name="test_bfloat16.old_gpu")
    x = bf16_data(rng, N)
    with pytest.raises(ValueError, match="compute capability 7.5"):
        jax.jit(op).lower(x, x)


@cuda.jit
def product_into(x, y, poisoned, out):
    # `out` is `poisoned`'s buffer (aliased): every element left unwritten
    # stays NaN.
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = float32(x[i]) * float32(y[i])


def test_kernel_bfloat16_writes_every_element_of_a_poisoned_output(rng, where):
    op = numbax.numba_cuda_kernel(
        product_into, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N,
        input_output_aliases={2: 0})
    x, y = bf16_data(rng, N), bf16_data(rng, N)
    poisoned = jnp.full((N,), jnp.nan, jnp.float32)
    got = np.asarray(jax.jit(op)(x, y, poisoned))
    assert not np.isnan(got).any()
    np.testing.assert_array_equal(got, as_f32(x) * as_f32(y))

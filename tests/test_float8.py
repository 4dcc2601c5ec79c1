"""float8 buffers: accepted as inputs and outputs, they
reach kernels and funcs as uint8 arrays of the same shape (their bits, zero
copy), in Numba's simulator and on a GPU alike.

Each test runs on fresh random bit patterns (every code, NaNs included),
compared bit for bit with numpy/ml_dtypes, over outputs poisoned first (an
output aliased to a poisoned input: an element a kernel leaves unwritten
keeps the poison). Sub-byte types stay refused, naming the fix.
"""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from numba import cuda

import numbax
from numbax.runtime import keys, numba_bridge

from conftest import SIMULATOR

pytestmark = pytest.mark.gpu

N = 300
FLOAT8 = [n for n in numba_bridge.FLOAT8_NAMES if hasattr(ml_dtypes, n)
          and hasattr(jnp, n)]
# A bit pattern no test writes: what an unwritten element keeps.
POISON = 0x5A


def fp8_bits(rng, shape, name):
    """Random float8 values: every one of the 256 codes can occur."""
    bits = rng.integers(0, 256, size=shape, dtype=np.uint8)
    return bits.view(getattr(ml_dtypes, name))


def poisoned(shape, name):
    return np.full(shape, POISON, np.uint8).view(getattr(ml_dtypes, name))


def bits_of(a):
    return np.asarray(a).view(np.uint8)


@cuda.jit
def flip_sign_bit(x, poison, out):
    # `out` is `poison`'s buffer (aliased). x and out are uint8 arrays:
    # XOR is an integer operation, so this compiles only for uint8.
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] ^ 0x80


def test_float8_types_in_this_jax():
    # The two every fp8 user holds, at least.
    assert {"float8_e4m3fn", "float8_e5m2"} <= set(FLOAT8)


@pytest.mark.parametrize("name", FLOAT8)
def test_kernel_float8_round_trip(rng, name):
    dtype = getattr(ml_dtypes, name)
    op = numbax.numba_cuda_kernel(
        flip_sign_bit, jax.ShapeDtypeStruct((N,), dtype), launch_dims=N,
        input_output_aliases={1: 0}, name=f"test_float8.flip.{name}")
    x = fp8_bits(rng, N, name)
    got = jax.jit(op)(x, poisoned(N, name))
    assert got.dtype == dtype and got.shape == (N,)
    np.testing.assert_array_equal(bits_of(got), bits_of(x) ^ 0x80)
    if name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3",
                "float8_e3m4"):
        # Sign-magnitude formats: flipping the sign bit is negation, as
        # ml_dtypes computes it (NaNs compare equal here).
        np.testing.assert_array_equal(
            np.asarray(got).astype(np.float32), (-x).astype(np.float32))


def test_kernel_float8_eager_2d_and_vmap(rng):
    name = "float8_e4m3fn"
    shape = (3, 50)
    op = numbax.numba_cuda_kernel(
        copy_2d, jax.ShapeDtypeStruct(shape, ml_dtypes.float8_e4m3fn),
        launch_dims=shape, input_output_aliases={1: 0})
    x = fp8_bits(rng, shape, name)
    got = op(x, poisoned(shape, name))  # eager
    np.testing.assert_array_equal(bits_of(got), bits_of(x))
    xs = fp8_bits(rng, (4,) + shape, name)
    got = jax.jit(jax.vmap(op))(xs, poisoned((4,) + shape, name))
    np.testing.assert_array_equal(bits_of(got), bits_of(xs))


@cuda.jit
def copy_2d(x, poison, out):
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = x[i, j]


# Decoding in a kernel: a 256-entry table, computed by ml_dtypes on the host
# and frozen into the kernel as a constant (docs/quickstart.md, "float8").
E4M3FN_TO_F32 = np.arange(256, dtype=np.uint8).view(
    ml_dtypes.float8_e4m3fn).astype(np.float32)


@cuda.jit
def decode_e4m3fn(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = E4M3FN_TO_F32[x[i]]


def test_kernel_float8_in_float32_out(rng):
    op = numbax.numba_cuda_kernel(
        decode_e4m3fn, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N)
    x = fp8_bits(rng, N, "float8_e4m3fn")
    got = np.asarray(jax.jit(op)(x))
    # NaN codes decode to NaN: assert_array_equal treats NaNs as equal.
    np.testing.assert_array_equal(got, x.astype(np.float32))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_callable_float8_round_trip(rng, name):
    dtype = getattr(ml_dtypes, name)
    seen = []

    def func(x, poison, out, stream):
        seen.append((x.dtype, x.shape, out.dtype, out.shape))
        flip_sign_bit[(N + 127) // 128, 128, stream](x, poison, out)

    op = numbax.numba_cuda_callable(
        func, jax.ShapeDtypeStruct((N,), dtype), input_output_aliases={1: 0},
        name=f"test_float8.callable.{name}")
    x = fp8_bits(rng, N, name)
    got = jax.jit(op)(x, poisoned(N, name))
    assert got.dtype == dtype
    np.testing.assert_array_equal(bits_of(got), bits_of(x) ^ 0x80)
    u8 = np.dtype(np.uint8)
    assert seen and seen[0] == (u8, (N,), u8, (N,))


def test_float8_keys_round_trip():
    # A deserialised program's key spells the dtype; the process that runs
    # it parses it back (keys.parse_avals).
    avals = [((4, 2), np.dtype(getattr(ml_dtypes, n))) for n in FLOAT8]
    assert keys.parse_avals(keys.avals_text(avals)) == avals


@pytest.mark.parametrize("name", ["int4", "uint4", "int2", "float4_e2m1fn"])
def test_sub_byte_types_are_refused_naming_the_fix(name):
    if not hasattr(jnp, name):
        pytest.skip(f"this jax has no {name}")
    x = jnp.zeros(8, getattr(jnp, name))
    op = numbax.numba_cuda_kernel(
        flip_sign_bit, jax.ShapeDtypeStruct((8,), jnp.uint8), launch_dims=8)
    with pytest.raises(ValueError, match=rf"input 0 has dtype {name}, a "
                       r"sub-byte type \([124] bit\(s\) per element.*"
                       r"convert with \.astype\(jnp\.(u?int8|float16)\)"):
        op(x, x)


@pytest.mark.skipif(SIMULATOR, reason="numba-cuda's fp8 intrinsics need a GPU")
def test_kernel_float32_to_float8_with_numba_intrinsics(rng):
    # Encoding on the GPU (compute capability >= 8.9) with numba-cuda's
    # cvt_float_to_fp8, round to nearest even as ml_dtypes rounds.
    from numba.cuda.api import is_fp8_supported
    if not is_fp8_supported():
        pytest.skip("this GPU has no fp8 conversions (compute capability "
                    "< 8.9)")
    from numba.cuda._internal.cuda_fp8 import (cvt_float_to_fp8,
                                               fp8_interpretation_t,
                                               saturation_t)

    @cuda.jit
    def encode(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = cvt_float_to_fp8(x[i], saturation_t.SATFINITE,
                                      fp8_interpretation_t.E4M3)

    op = numbax.numba_cuda_kernel(
        encode, jax.ShapeDtypeStruct((N,), ml_dtypes.float8_e4m3fn),
        launch_dims=N)
    # Inside e4m3fn's finite range (+-448), where both round alike.
    x = (rng.standard_normal(N) * 40).astype(np.float32)
    got = jax.jit(op)(x)
    np.testing.assert_array_equal(
        bits_of(got), bits_of(x.astype(ml_dtypes.float8_e4m3fn)))


@cuda.jit("void(uint8[:], uint8[:], uint8[:])")
def flip_explicit(x, poison, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] ^ 0x80


def test_kernel_with_an_explicit_uint8_signature_takes_float8(rng):
    op = numbax.numba_cuda_kernel(
        flip_explicit, jax.ShapeDtypeStruct((N,), ml_dtypes.float8_e5m2),
        launch_dims=N, input_output_aliases={1: 0})
    x = fp8_bits(rng, N, "float8_e5m2")
    got = jax.jit(op)(x, poisoned(N, "float8_e5m2"))
    np.testing.assert_array_equal(bits_of(got), bits_of(x) ^ 0x80)

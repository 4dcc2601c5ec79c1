"""float8 buffers: accepted as inputs and outputs, they
reach kernels and funcs as uint8 arrays of the same shape (their bits, zero
copy), in Numba's simulator and on a GPU alike.

Each test runs on fresh random bit patterns (every code, NaNs included),
compared bit for bit with numpy/ml_dtypes, over outputs poisoned first (an
output aliased to a poisoned input: an element a kernel leaves unwritten
keeps the poison). Sub-byte types stay refused, naming the fix.
"""

import os

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


# --- One op per float8 type ------------------------------------
# Seven of the eight float8 types share np.dtype(...).str ('<V1'), which the
# op's interning key once spelled its outputs with: the op made for one type
# was returned for another, and its results, typed as the first, read every
# value in the other format (1.0 came back as 2.0).

@cuda.jit
def copy_1d(x, poison, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i]


def copy_op(name, n=N):
    """A copy of `n` elements of float8 type `name`, made without name=:
    ops of equal configuration are one object, and only the dtype tells
    these apart."""
    return numbax.numba_cuda_kernel(
        copy_1d, jax.ShapeDtypeStruct((n,), getattr(ml_dtypes, name)),
        launch_dims=n, input_output_aliases={1: 0})


def finite_values(rng, name, n=N):
    """Random finite values of type `name` (every finite code can occur)."""
    x = fp8_bits(rng, n, name)
    finite = np.isfinite(x.astype(np.float32))
    return np.where(finite, x, np.zeros((), x.dtype)).astype(x.dtype)


def test_e4m3fnuz_after_e4m3fn_is_another_op_and_round_trips(rng):
    # The repro: the fnuz op made after the fn op.
    fn = copy_op("float8_e4m3fn")
    fnuz = copy_op("float8_e4m3fnuz")
    assert fnuz is not fn and fnuz != fn
    assert copy_op("float8_e4m3fnuz") is fnuz  # still interned per type
    for name, op in (("float8_e4m3fn", fn), ("float8_e4m3fnuz", fnuz)):
        dtype = np.dtype(getattr(ml_dtypes, name))
        x = finite_values(rng, name)
        got = jax.jit(op)(x, poisoned(N, name))
        assert got.dtype == dtype, name
        np.testing.assert_array_equal(bits_of(got), bits_of(x))
        # The values, as ml_dtypes reads them: 1.0 stays 1.0.
        np.testing.assert_array_equal(np.asarray(got).astype(np.float32),
                                      x.astype(np.float32))
    one = np.ones(N, ml_dtypes.float8_e4m3fnuz)
    got = jax.jit(fnuz)(one, poisoned(N, "float8_e4m3fnuz"))
    np.testing.assert_array_equal(np.asarray(got).astype(np.float32), 1.0)


def test_every_float8_type_gets_its_own_op(rng):
    ops = {name: copy_op(name) for name in FLOAT8}
    assert len({id(op) for op in ops.values()}) == len(FLOAT8)
    for name, op in ops.items():
        x = finite_values(rng, name)
        got = jax.jit(op)(x, poisoned(N, name))
        assert got.dtype == np.dtype(getattr(ml_dtypes, name)), name
        np.testing.assert_array_equal(np.asarray(got).astype(np.float32),
                                      x.astype(np.float32), err_msg=name)


def test_custom_kernel_with_two_float8_types_runs_both(rng):
    # Through an XLACustomKernel the merged op returned e4m3fn outputs for
    # e4m3fnuz outs: a false TypeError ("output 0 ... is float8_e4m3fn").
    ck = numbax.XLACustomKernel("test_float8_ck_copy")
    ck.def_numba_cuda_kernel(lambda *, outs: numbax.numba_cuda_kernel(
        copy_1d, outs, launch_dims=outs.shape[0],
        input_output_aliases={1: 0}))
    for name in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                 "float8_e5m2fnuz"):
        if name not in FLOAT8:
            continue
        dtype = getattr(ml_dtypes, name)
        x = finite_values(rng, name)
        got = jax.jit(lambda a, p: ck(
            a, p, outs=jax.ShapeDtypeStruct((N,), dtype)))(
                x, poisoned(N, name))
        assert got.dtype == np.dtype(dtype), name
        np.testing.assert_array_equal(np.asarray(got).astype(np.float32),
                                      x.astype(np.float32), err_msg=name)


def _all_dtypes():
    """Every numpy and ml_dtypes dtype numbax might meet: those it accepts
    (bool, ints, floats, complex, bfloat16, float8) and those it refuses by
    name (int4 and the other sub-byte types, complex32...)."""
    found = {}
    for t in set(np.sctypeDict.values()):
        dt = np.dtype(t)
        if dt.kind in "biufc":
            found[dt] = None
    for name in dir(ml_dtypes):
        t = getattr(ml_dtypes, name)
        if isinstance(t, type) and not name.startswith("_"):
            try:
                found[np.dtype(t)] = None
            except TypeError:  # finfo, iinfo
                continue
    return list(found)


def test_distinct_dtypes_have_distinct_spellings_that_read_back():
    dtypes = _all_dtypes()
    names = {d.name for d in dtypes}
    assert {"bfloat16", "int4", "uint4", "bool", "complex64"} <= names
    assert set(FLOAT8) <= names
    spelled = {}
    for d in dtypes:
        text = keys.dtype_name(d)
        assert text not in spelled or spelled[text] == d, (
            f"{d} and {spelled[text]} are both spelled {text!r}")
        spelled[text] = d
        assert keys.dtype_from_name(text) == d, text
    # The same aval spelled in a key's call part reads back as itself.
    avals = [((2, 3), d) for d in dtypes]
    assert keys.parse_avals(keys.avals_text(avals)) == avals
    # Byte order tells two dtypes apart where the name does not.
    assert keys.dtype_name(np.dtype(">f4")) != keys.dtype_name(np.float32)


def test_float8_keys_read_back_in_a_fresh_process():
    # A process that imported neither ml_dtypes nor jax.numpy reads the
    # spellings back (a deserialised program's keys).
    from conftest import run_child
    avals = [((4, 2), np.dtype(getattr(ml_dtypes, n))) for n in FLOAT8]
    avals += [((3,), np.dtype(ml_dtypes.bfloat16)), ((1,), np.dtype(bool))]
    text = keys.avals_text(avals)
    proc = run_child(f"""
        from numbax.runtime import keys
        print("READ", ";".join(repr(d) for _, d in keys.parse_avals({text!r})))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(l for l in proc.stdout.splitlines() if l.startswith("READ "))
    assert line[5:] == ";".join(repr(d) for _, d in avals)


def test_float8_program_exported_runs_in_a_fresh_process(tmp_path, rng):
    # Every float8 op of one program, exported; a fresh process creates the
    # same ops (in the same order, where one merged the next) and runs it.
    from jax import export
    from conftest import run_child
    n = 16
    ops = [copy_op(name, n) for name in FLOAT8]
    xs = [finite_values(rng, name, n) for name in FLOAT8]
    polls = [poisoned(n, name) for name in FLOAT8]

    def program(xs, polls):
        return [op(x, p) for op, x, p in zip(ops, xs, polls)]

    exp = export.export(jax.jit(program),
                        disabled_checks=numbax.export_disabled_checks())(
        xs, polls)
    (tmp_path / "program.bin").write_bytes(exp.serialize())
    np.savez(tmp_path / "data.npz",
             **{f"x{i}": bits_of(x) for i, x in enumerate(xs)})
    proc = run_child(f"""
        import os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        import jax
        import ml_dtypes
        import numpy as np
        from jax import export
        from numbax.runtime import registry
        if registry.BACKEND_REGISTRATION != "backend hook":
            jax.devices()
        import test_float8 as t
        names = {FLOAT8!r}
        ops = [t.copy_op(name, {n}) for name in names]
        exp = export.deserialize(bytearray(
            open({str(tmp_path / "program.bin")!r}, "rb").read()))
        data = np.load({str(tmp_path / "data.npz")!r})
        xs = [data[f"x{{i}}"].view(getattr(ml_dtypes, name))
              for i, name in enumerate(names)]
        polls = [t.poisoned({n}, name) for name in names]
        out = exp.call(xs, polls)
        for name, x, o in zip(names, xs, out):
            o = np.asarray(o)
            ok = (o.dtype == x.dtype and np.array_equal(
                o.view(np.uint8), x.view(np.uint8)))
            print("CHECK", name, o.dtype.name, ok)
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    checks = [l.split() for l in proc.stdout.splitlines()
              if l.startswith("CHECK ")]
    assert [c[1:] for c in checks] == [[n, n, "True"] for n in FLOAT8]

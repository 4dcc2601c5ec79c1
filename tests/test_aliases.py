"""input_output_aliases hold inside XLA's loops and under vmap, for every op kind.

An aliased output must start out holding its input's values. Inside a loop
over slices (vmap 'sequential', lax.map, scan, fori_loop) XLA's GPU
dynamic_slice_fusion once handed such a call two different buffers, and an
in-place kernel started from zeros: `jax.jit(jax.vmap(op))(x)` gave 1 where
2x + 1 was due (H200, jax 0.11.2, slices of 1024 elements and more). Every
numbax handler now copies the input into its aliased output where XLA hands
them two buffers (csrc/aliases.h).

The loop tests run on the GPU (`gpu`) and on the CPU simulator; the
simulator takes a single small size.

input_output_aliases where XLA makes them hard: an aliased input
broadcast under vmap (every dtype width, every vmap_method, the alias at
input 0 or 1), nested vmaps sharing the aliased input, the aliased input
passed twice (op(x, x), the other read backwards: no race), and aliases
inside lax.map / scan / fori_loop over slices (crossed pairs, a callable
and a captured one). Results are numpy's; the caller's array is never
written through.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from numba import cuda

import numbax
from numbax.runtime import keys, registry
from conftest import SIMULATOR, random_array
from conftest import KERNEL_VMAP_METHODS, assert_close, grid_for
from conftest import kernel_op as kernel_op_of

# Slices of 1024 elements and more broke on the H200; 8 did not.
SIZES = (40,) if SIMULATOR else (8, 1024, 4099, 65536)
BATCH = 3


@cuda.jit
def twice_plus_one(x, out):
    # In place: reads the output (the input's values, by the alias), never x.
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = 2 * out[i] + 1


def launch_flat(x, out, stream):
    # Any batch layout func may get ('expand_dims' & co.): one flat pass.
    flat = out.reshape(out.size)
    twice_plus_one[(flat.size + 255) // 256, 256, stream](flat, flat)


def kernel_op(n, vmap_method=None):
    return numbax.numba_cuda_kernel(
        twice_plus_one, jax.ShapeDtypeStruct((n,), jnp.float32),
        launch_dims=n, input_output_aliases={0: 0}, vmap_method=vmap_method)


def callable_op(n, vmap_method="sequential", capture=False):
    return numbax.numba_cuda_callable(
        launch_flat, jax.ShapeDtypeStruct((n,), jnp.float32),
        input_output_aliases={0: 0}, vmap_method=vmap_method, capture=capture)


_custom_ops: dict = {}


def custom_op(n):
    # One XLACustomKernel for the module: its name is global.
    if "op" not in _custom_ops:
        op = numbax.XLACustomKernel("test_aliases_twice_plus_one")
        op.def_numba_cuda_kernel(lambda *, outs: numbax.numba_cuda_kernel(
            twice_plus_one, outs, launch_dims=outs.shape[0],
            input_output_aliases={0: 0}))
        _custom_ops["op"] = op
    op = _custom_ops["op"]
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    return lambda x: op(x, outs=spec)


def fresh(rng, n):
    return rng.standard_normal((BATCH, n)).astype(np.float32)


# Each loop runs op on every row of xs; the result is 2 * xs + 1.
LOOPS = {
    "vmap": lambda op: jax.jit(jax.vmap(op)),
    "lax.map": lambda op: jax.jit(lambda b: lax.map(op, b)),
    "scan": lambda op: jax.jit(
        lambda b: lax.scan(lambda c, x: (c, op(x)), 0, b)[1]),
    "fori_loop": lambda op: jax.jit(lambda b: lax.fori_loop(
        0, b.shape[0], lambda i, acc: acc.at[i].set(op(acc[i])), b)),
}


def check(f, xs):
    got = np.asarray(f(xs))
    np.testing.assert_allclose(got, 2 * xs + 1, rtol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("loop", sorted(LOOPS))
@pytest.mark.parametrize("vmap_method", [None, "sequential"])
def test_kernel_in_place_inside_loops(loop, vmap_method, n, rng):
    if loop != "vmap" and vmap_method is not None:
        pytest.skip("vmap_method only changes jax.vmap")
    check(LOOPS[loop](kernel_op(n, vmap_method)), fresh(rng, n))


CALLABLE_METHODS = ["sequential", "sequential_unrolled", "expand_dims",
                    "broadcast_all", "legacy_vectorized"]


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("capture", [False, True], ids=["plain", "capture"])
@pytest.mark.parametrize("loop", ["vmap-" + m for m in CALLABLE_METHODS]
                         + ["lax.map", "scan", "fori_loop"])
def test_callable_in_place_inside_loops(loop, capture, n, rng):
    if loop.startswith("vmap-"):
        op = callable_op(n, loop[len("vmap-"):], capture)
        f = LOOPS["vmap"](op)
    else:
        f = LOOPS[loop](callable_op(n, "sequential", capture))
    xs = fresh(rng, n)
    check(f, xs)
    # Called again on new data (a captured op replays its graph).
    check(f, fresh(rng, n))


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_custom_kernel_in_place_inside_loops(loop, n, rng):
    check(LOOPS[loop](custom_op(n)), fresh(rng, n))


@pytest.mark.gpu
def test_repeated_in_place_steps_keep_their_state(rng):
    # RNG-state style: the state advanced in place k times in a fori_loop.
    n = SIZES[-1]
    op = kernel_op(n)
    x = rng.standard_normal(n).astype(np.float32)
    got = jax.jit(lambda s: lax.fori_loop(0, 4, lambda _, v: op(v), s))(x)
    want = x
    for _ in range(4):
        want = 2 * want + 1
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


# -- what the handlers are told (CPU) ------------------------------------

def _plain(x, out, stream):
    pass


def test_aliases_are_in_the_key_and_reach_the_handler():
    spec = jax.ShapeDtypeStruct((4,), jnp.float32)
    aliased = numbax.numba_cuda_callable(
        launch_flat, spec, input_output_aliases={0: 0})
    plain = numbax.numba_cuda_callable(launch_flat, spec)
    x = jnp.ones(4, jnp.float32)
    key = aliased._key([x], {0: 0})
    assert key.endswith(";alias=0:0")
    # The same function without aliases never shares the entry.
    assert plain._key([x], None) != key
    assert ";alias" not in plain._key([x], None)
    # The resolver hands C++ the pairs, also for an entry rebuilt from the
    # key alone (a deserialised program).
    assert registry._resolve_callable(key, "cpu")[5] == ((0, 0),)
    with registry._lock:
        registry._entries.pop(key)
    assert registry._resolve_callable(key, "cpu")[5] == ((0, 0),)
    del plain


def test_alias_spec_round_trip_and_malformed():
    fields = keys.spec_fields("in=float32[4];alias=2:0,0:1")
    assert keys.parse_aliases(fields) == ((0, 1), (2, 0))
    assert keys.alias_spec({2: 0, 0: 1}) == ";alias=0:1,2:0"
    assert keys.alias_spec(None) == keys.alias_spec({}) == ""
    with pytest.raises(ValueError, match="malformed alias spec"):
        keys.parse_aliases({"alias": "0-1"})


def test_kernel_key_carries_its_aliases():
    n = 8
    x = jnp.arange(n, dtype=jnp.float32)
    aliased = kernel_op(n)
    unaliased = numbax.numba_cuda_kernel(
        twice_plus_one, jax.ShapeDtypeStruct((n,), jnp.float32),
        launch_dims=n)
    text_a = jax.jit(aliased).lower(x).as_text()
    text_u = jax.jit(unaliased).lower(x).as_text()
    assert ";alias=0:0" in text_a
    assert ";alias" not in text_u
    np.testing.assert_allclose(np.asarray(jax.jit(aliased)(x)),
                               2 * np.arange(n) + 1)


# -- an in-place carry read by a second input (hostile pass) -----------------

@cuda.jit
def twice_plus_other(x, y, out):
    # out aliases x: out = 2 * x + y, in place; y is only read.
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = 2 * out[i] + y[i]


def launch_twice_plus_other(x, y, out, stream):
    twice_plus_other[(out.size + 255) // 256, 256, stream](x, y, out)


@pytest.mark.gpu
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("kind", ["kernel", "callable"])
def test_in_place_carry_read_by_another_input(kind, n, rng):
    # acc[i + 1] = 2 * acc[i] + acc[i + 1], in a loop over rows of one
    # carry: a loop XLA may run with the inputs and the output as slices of
    # one buffer. The second input must be read as it was, never replaced by
    # the aliased input's values (numbax refuses an output XLA puts over
    # another input rather than copy into it: csrc/aliases.cc).
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    if kind == "kernel":
        op = numbax.numba_cuda_kernel(twice_plus_other, spec, launch_dims=n,
                                      input_output_aliases={0: 0})
    else:
        op = numbax.numba_cuda_callable(launch_twice_plus_other, spec,
                                        input_output_aliases={0: 0})
    acc0 = rng.standard_normal((BATCH + 1, n)).astype(np.float32)
    f = jax.jit(lambda acc: lax.fori_loop(
        0, BATCH, lambda i, a: a.at[i + 1].set(op(a[i], a[i + 1])), acc))
    want = acc0.copy()
    for i in range(BATCH):
        want[i + 1] = 2 * want[i] + want[i + 1]
    np.testing.assert_allclose(np.asarray(f(acc0)), want, rtol=1e-5)


# -- vmap of an op whose aliased input is not batched -----------------------
#
# The unbatched aliased input is given to every slice as a copy of its own,
# of its own dtype: a bool kept bool (before: the kernel's batching promoted
# it to int32 and XLA refused the alias), and every vmap_method of a callable
# behaves as 'expand_dims' already did (before: a raw MLIR verifier dump).

FLIP_N = 40


@cuda.jit
def flip_where(flags, x, out):
    # out aliases flags: out[i] = flags[i] xor (x[i] > 0), in place.
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = flags[i] != (x[i] > 0)


def expected(flags, xs):
    return np.stack([np.logical_xor(flags, x > 0) for x in xs])


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.uint16, np.float16,
                                   np.complex64])
def test_kernel_broadcast_aliased_input_keeps_its_dtype(dtype, rng):
    @cuda.jit
    def add_into(acc, x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = acc[i] + x[i]

    if dtype == np.bool_:
        kernel, spec_dtype = flip_where, np.bool_
    else:
        kernel, spec_dtype = add_into, dtype
    op = numbax.numba_cuda_kernel(
        kernel, jax.ShapeDtypeStruct((FLIP_N,), spec_dtype), launch_dims=FLIP_N,
        input_output_aliases={0: 0})
    if dtype == np.bool_:
        first = rng.integers(0, 2, FLIP_N).astype(np.bool_)
        xs = rng.standard_normal((BATCH, FLIP_N)).astype(np.float32)
        want = expected(first, xs)
    else:
        first = rng.integers(0, 5, FLIP_N).astype(dtype)
        xs = rng.integers(0, 5, (BATCH, FLIP_N)).astype(dtype)
        want = np.stack([first + x for x in xs])
    for f in (jax.vmap(op, in_axes=(None, 0)),
              jax.jit(jax.vmap(op, in_axes=(None, 0)))):
        got = np.asarray(f(first, xs))
        assert got.dtype == np.dtype(spec_dtype)
        np.testing.assert_array_equal(got, want)
    # The caller's array is untouched: each slice wrote a copy.
    assert np.asarray(first).dtype == np.dtype(spec_dtype)


def flip_launch(flags, x, out, stream):
    flip_where[1, 64, stream](flags, x, out)


@pytest.mark.parametrize("vmap_method", ["expand_dims", "broadcast_all",
                                         "legacy_vectorized", "sequential",
                                         "sequential_unrolled"])
def test_callable_unbatched_aliased_input_under_every_vmap_method(
        vmap_method, rng):
    op = numbax.numba_cuda_callable(
        flip_launch, jax.ShapeDtypeStruct((FLIP_N,), np.bool_),
        vmap_method=vmap_method, input_output_aliases={0: 0})
    if vmap_method == "legacy_vectorized":
        # Its func sees the batch in one call: launch per row.
        def rows(flags, x, out, stream):
            for b in range(x.shape[0]):
                flip_where[1, 64, stream](flags[b], x[b], out[b])
        op = numbax.numba_cuda_callable(
            rows, jax.ShapeDtypeStruct((FLIP_N,), np.bool_),
            vmap_method=vmap_method, input_output_aliases={0: 0})
    elif vmap_method in ("expand_dims", "broadcast_all"):
        def rows(flags, x, out, stream):
            if x.ndim == 1:
                flip_where[1, 64, stream](flags, x, out)
                return
            for b in range(x.shape[0]):
                flip_where[1, 64, stream](flags[b], x[b], out[b])
        op = numbax.numba_cuda_callable(
            rows, jax.ShapeDtypeStruct((FLIP_N,), np.bool_),
            vmap_method=vmap_method, input_output_aliases={0: 0})
    first = rng.integers(0, 2, FLIP_N).astype(np.bool_)
    xs = rng.standard_normal((BATCH, FLIP_N)).astype(np.float32)
    for f in (jax.vmap(op, in_axes=(None, 0)),
              jax.jit(jax.vmap(op, in_axes=(None, 0)))):
        got = np.asarray(f(first, xs))
        np.testing.assert_array_equal(got, expected(first, xs))


def test_expand_dims_with_unbatched_aliased_input_broadcasts_it(rng):
    @cuda.jit
    def add_into(acc, x, out):
        i, j = cuda.grid(2)
        if i < out.shape[0] and j < out.shape[1]:
            out[i, j] = acc[i, j] + x[i, j]

    def f(acc, x, out, stream):
        # expand_dims: 2-D arrays under vmap, 1-D otherwise
        n = out.shape[out.ndim - 1]
        a2, x2, o2 = (a.reshape(a.size // n, n) for a in (acc, x, out))
        add_into[(o2.shape[0], 1), (1, o2.shape[1]), stream](a2, x2, o2)

    op = numbax.numba_cuda_callable(
        f, jax.ShapeDtypeStruct((4,), jnp.float32), vmap_method="expand_dims",
        input_output_aliases={0: 0})
    acc = random_array(rng, (4,), np.float32)
    xs = random_array(rng, (3, 4), np.float32)
    out = jax.jit(jax.vmap(op, in_axes=(None, 0)))(jnp.asarray(acc), xs)
    np.testing.assert_allclose(out, acc[None] + xs, rtol=1e-6)
    out = jax.vmap(op, in_axes=(None, 0))(jnp.asarray(acc), xs)
    np.testing.assert_allclose(out, acc[None] + xs, rtol=1e-6)


N = 64 if SIMULATOR else 4096


@cuda.jit
def alias_add(x, y, out):  # out aliases x
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] + y[i]


@cuda.jit
def alias_xor(x, y, out):  # out aliases x (bool)
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] != y[i]


@cuda.jit
def alias_add_second(y, x, out):  # out aliases x (input 1)
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] + y[i]


@cuda.jit
def alias_add_reversed(x, y, out):  # out aliases x; y read backwards
    i = cuda.grid(1)
    n = out.shape[0]
    if i < n:
        out[i] = x[i] + y[n - 1 - i]


@cuda.jit
def swap_add(a, b, out_a, out_b):  # out_a aliases b, out_b aliases a
    i = cuda.grid(1)
    if i < out_a.shape[0]:
        ta = out_b[i]
        out_b[i] = out_a[i] + 1
        out_a[i] = ta * 2


def shared_and_batched(rng, dtype, scale=None):
    """x (N,) shared by every slice, ys (3, N) batched, and the expected
    op(x, y) of each slice: x != y for bool, x + y (in dtype) otherwise.
    Values: normal times `scale` where given (bool: 0 or 1), else drawn as
    the dtype suits (int8 over its whole range)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        x, ys = (rng.integers(0, 2, s).astype(dtype) for s in (N, (3, N)))
    elif scale is not None:
        x, ys = ((rng.standard_normal(s) * scale).astype(dtype) for s in (N, (3, N)))
    elif dtype == np.int8:
        x, ys = (rng.integers(-128, 128, s).astype(dtype) for s in (N, (3, N)))
    elif dtype == np.complex64:
        x = (rng.standard_normal(N) + 1j).astype(dtype)
        ys = (rng.standard_normal((3, N)) * 1j).astype(dtype)
    else:
        x, ys = (rng.standard_normal(s).astype(dtype) for s in (N, (3, N)))
    want = x[None] != ys if dtype == np.bool_ else (x[None] + ys).astype(dtype)
    return x, ys, want


@pytest.mark.gpu
@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("method", KERNEL_VMAP_METHODS)
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.float16, np.complex64, np.float32])
def test_kernel_aliased_input_broadcast_under_vmap(dtype, method, rng):
    x, ys, want = shared_and_batched(rng, dtype)
    xj = jnp.asarray(x)
    kernel = alias_xor if dtype == np.bool_ else alias_add
    op = kernel_op_of(kernel, (N,), dtype, vmap_method=method, input_output_aliases={0: 0})
    batched = jax.vmap(op, in_axes=(None, 0))
    for label, f in (("vmap", batched), ("jit(vmap)", jax.jit(batched))):
        assert_close(f(xj, ys), want, label, rtol=1e-2, atol=1e-2)
        assert np.array_equal(np.asarray(xj), x), f"{label}: the caller's x changed"
    if dtype != np.bool_:  # the alias at input 1, broadcast there
        op2 = kernel_op_of(alias_add_second, (N,), dtype, vmap_method=method,
                        input_output_aliases={1: 0})
        assert_close(jax.vmap(op2, in_axes=(0, None))(ys, xj), want, "alias at input 1",
                     rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("method", KERNEL_VMAP_METHODS[1:])  # a callable has no default
@pytest.mark.parametrize("dtype", [np.bool_, np.float32, np.int8])
def test_callable_aliased_input_broadcast_under_vmap(dtype, method, rng):
    kernel = alias_xor if dtype == np.bool_ else alias_add

    def launch(x, y, out, stream):
        xf, yf, of = (a.reshape(a.size) for a in (x, y, out))
        kernel[grid_for(of.size), 256, stream](xf, yf, of)

    x, ys, want = shared_and_batched(rng, dtype, scale=10.0)
    op = numbax.numba_cuda_callable(launch, jax.ShapeDtypeStruct((N,), dtype),
                                    vmap_method=method, input_output_aliases={0: 0})
    xj = jnp.asarray(x)
    assert_close(jax.jit(jax.vmap(op, in_axes=(None, 0)))(xj, ys), want)
    assert np.array_equal(np.asarray(xj), x), "the caller's x changed"


@pytest.mark.gpu
@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("method", KERNEL_VMAP_METHODS)
def test_nested_vmap_with_an_aliased_shared_input(method, rng):
    op = kernel_op_of(alias_add, (N,), np.float32, vmap_method=method,
                   input_output_aliases={0: 0})
    inner = jax.vmap(op, in_axes=(None, 0))
    xa = random_array(rng, (2, N), np.float32)
    yy = random_array(rng, (2, 3, N), np.float32)
    yb = random_array(rng, (3, N), np.float32)
    forms = {
        "outer x, inner y": (jax.vmap(inner, in_axes=(0, 0)), (xa, yy), xa[:, None] + yy),
        "x outer only, y inner only": (jax.vmap(inner, in_axes=(0, None)), (xa, yb),
                                       xa[:, None] + yb[None]),
        "x shared at both": (jax.vmap(inner, in_axes=(None, 0)), (xa[0], yy),
                             xa[0][None, None] + yy),
        "out_axes=1": (jax.vmap(jax.vmap(op, in_axes=(None, 0), out_axes=1), in_axes=(0, 0)),
                       (xa, yy), np.swapaxes(xa[:, None] + yy, 1, 2)),
    }
    for label, (f, args, want) in forms.items():
        assert_close(jax.jit(f)(*args), want, label)


@pytest.mark.gpu
@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("maker", ["kernel", "callable"])
def test_aliased_input_passed_twice(maker, rng):
    """op(x, x) with input 0 aliased and input 1 read backwards: no race,
    the caller's x kept."""
    if maker == "kernel":
        f = kernel_op_of(alias_add_reversed, (N,), jnp.float32, input_output_aliases={0: 0},
                      vmap_method="expand_dims")
    else:
        def launch(x, y, out, stream):
            alias_add_reversed[grid_for(N), 256, stream](x, y, out)
        f = numbax.numba_cuda_callable(launch, jax.ShapeDtypeStruct((N,), jnp.float32),
                                       input_output_aliases={0: 0}, vmap_method="sequential")
    for form, g in (("eager", f), ("jit", jax.jit(f)),
                    ("jit+donate", jax.jit(f, donate_argnums=0))):
        for _ in range(2):
            x = random_array(rng, N, np.float32)
            xj = jnp.asarray(x)
            if form == "jit+donate":
                got = g(xj, jnp.asarray(x))
            else:
                got = g(xj, xj)
                assert np.array_equal(np.asarray(xj), x), f"{form}: the caller's x overwritten"
            assert_close(got, x + x[::-1], f"{form} op(x, x)")
    xs = jnp.asarray(random_array(rng, (3, N), np.float32))
    assert_close(jax.vmap(f)(xs, xs), np.asarray(xs) + np.asarray(xs)[:, ::-1], "vmap(x, x)")
    x = random_array(rng, N, np.float32)
    assert_close(jax.vmap(f, in_axes=(None, None), axis_size=2)(x, x),
                 np.stack([x + x[::-1]] * 2), "vmap, both unbatched")


@pytest.mark.gpu
@pytest.mark.usefixtures("x64")
def test_aliases_inside_xla_loops_with_fresh_data(rng):
    """Slices large enough for XLA's dynamic_slice_fusion, fresh data each
    call, a crossed pair ({0: 1, 1: 0}) in lax.map, an aliased callable (and
    a captured one) in scan and fori_loop."""
    n, b = (64 if SIMULATOR else 8192), 5
    spec = jax.ShapeDtypeStruct((n,), jnp.float32)
    swap = numbax.numba_cuda_kernel(swap_add, (spec, spec), launch_dims=n,
                                    input_output_aliases={0: 1, 1: 0})

    def launch(x, y, out, stream):
        alias_add[grid_for(n), 256, stream](out, y, out)

    ops = [numbax.numba_cuda_callable(launch, spec, capture=capture,
                                      input_output_aliases={0: 0}, vmap_method="sequential")
           for capture in (False, True)]
    mapped = jax.jit(lambda p, q: jax.lax.map(lambda t: swap(*t), (p, q)))
    for k in range(6):
        p, q = random_array(rng, (b, n), np.float32), random_array(rng, (b, n), np.float32)
        got_a, got_b = mapped(p, q)
        assert_close(got_a, 2 * p, f"swap out_a, call {k}")
        assert_close(got_b, q + 1, f"swap out_b, call {k}")
        for op in ops:
            scanned = jax.jit(lambda p, q, op=op: jax.lax.scan(
                lambda c, t: (c, op(*t)), 0, (p, q))[1])
            assert_close(scanned(p, q), p + q, f"callable in scan, call {k}")
            looped = jax.jit(lambda p, q, op=op: jax.lax.fori_loop(
                0, b, lambda i, acc: acc.at[i].set(op(acc[i], q[i])), p))
            assert_close(looped(p, q), p + q, f"callable in fori_loop, call {k}")

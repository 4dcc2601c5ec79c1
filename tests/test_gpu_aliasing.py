"""input_output_aliases where XLA makes them hard: an aliased input
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
from numba import cuda

import numbax
from conftest import (KERNEL_VMAP_METHODS, SIMULATOR, assert_close, grid_for, kernel_op,
                      random_array)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("x64")]

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


@pytest.mark.parametrize("method", KERNEL_VMAP_METHODS)
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.float16, np.complex64, np.float32])
def test_kernel_aliased_input_broadcast_under_vmap(dtype, method, rng):
    x, ys, want = shared_and_batched(rng, dtype)
    xj = jnp.asarray(x)
    kernel = alias_xor if dtype == np.bool_ else alias_add
    op = kernel_op(kernel, (N,), dtype, vmap_method=method, input_output_aliases={0: 0})
    batched = jax.vmap(op, in_axes=(None, 0))
    for label, f in (("vmap", batched), ("jit(vmap)", jax.jit(batched))):
        assert_close(f(xj, ys), want, label, rtol=1e-2, atol=1e-2)
        assert np.array_equal(np.asarray(xj), x), f"{label}: the caller's x changed"
    if dtype != np.bool_:  # the alias at input 1, broadcast there
        op2 = kernel_op(alias_add_second, (N,), dtype, vmap_method=method,
                        input_output_aliases={1: 0})
        assert_close(jax.vmap(op2, in_axes=(0, None))(ys, xj), want, "alias at input 1",
                     rtol=1e-2, atol=1e-2)


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


@pytest.mark.parametrize("method", KERNEL_VMAP_METHODS)
def test_nested_vmap_with_an_aliased_shared_input(method, rng):
    op = kernel_op(alias_add, (N,), np.float32, vmap_method=method,
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


@pytest.mark.parametrize("maker", ["kernel", "callable"])
def test_aliased_input_passed_twice(maker, rng):
    """op(x, x) with input 0 aliased and input 1 read backwards: no race,
    the caller's x kept."""
    if maker == "kernel":
        f = kernel_op(alias_add_reversed, (N,), jnp.float32, input_output_aliases={0: 0},
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

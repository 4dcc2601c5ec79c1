"""jax.vmap of numba_kernel: the whole batch in one handler call.

vmap_method None and 'sequential': the kernel sees one slice at a time,
every slice (of every nested level) run from one custom call, looped by the
wrapper or spread over XLA's pool; 'expand_dims', 'broadcast_all' and
'legacy_vectorized' keep ffi_call's meaning (the kernel gets the batch).
Batch-sharded inputs on 8 fake CPU devices run without gathers (a child
process: XLA_FLAGS must be set before JAX starts). No simulator needed.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numbax
import cpu_kernels as K
from conftest import assert_close, poison, random_array

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = jnp.float32


def spec(shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


def custom_calls(f, *args) -> int:
    return jax.jit(f).lower(*args).as_text().count("numbax_cpu_kernel")


@pytest.mark.parametrize("vmap_method", [None, "sequential"])
@pytest.mark.parametrize("parallel", [None, "xla"])
def test_vmap_per_slice_in_one_call(rng, vmap_method, parallel):
    x = random_array(rng, (64, 300), np.float32)
    op = numbax.numba_kernel(K.affine_range, spec((300,)), launch_dims=300,
                             parallel=parallel, vmap_method=vmap_method)
    poison((64, 300), np.float32)
    f = jax.vmap(op)
    assert_close(jax.jit(f)(x), K.numpy_affine(x))
    assert custom_calls(f, x) == 1  # one handler call for the batch
    plain = numbax.numba_kernel(K.affine, spec((300,)),
                                vmap_method=vmap_method, parallel=parallel)
    assert_close(jax.jit(jax.vmap(plain))(x), K.numpy_affine(x))


def test_vmap_nested_two_deep_with_unbatched_and_scalar_args(rng):
    x = random_array(rng, (3, 4, 5, 6), np.float32)
    c = random_array(rng, (4,), np.float32)  # batched at the inner level only
    op = numbax.numba_kernel(K.row_sum_plus, spec((5,)))

    def inner(xs, cs):  # xs (4, 5, 6), cs (4,)
        return jax.vmap(lambda a, b: op(a, b))(xs, cs)
    f = jax.vmap(inner, in_axes=(0, None))
    got = jax.jit(f)(x, c)
    want = x.sum(-1) + c[None, :, None]
    assert_close(got, want, rtol=1e-5)
    assert custom_calls(f, x, c) == 1
    # Batched at the outer level only, the other input at both.
    c2 = random_array(rng, (3,), np.float32)
    g = jax.vmap(lambda xs, cc: jax.vmap(lambda a: op(a, cc))(xs))
    assert_close(jax.jit(g)(x, c2), x.sum(-1) + c2[:, None, None], rtol=1e-5)
    # vmap's axis elsewhere than 0, scalars by value, two levels.
    s = numbax.numba_kernel(K.scale_shift, spec((6,)))
    h = jax.vmap(jax.vmap(lambda a: s(a, 2.0, 1.0)), in_axes=1)
    z = random_array(rng, (5, 7, 6), np.float32)  # outer: axis 1
    assert_close(jax.jit(h)(z), 2 * np.transpose(z, (1, 0, 2)) + 1,
                 rtol=1e-6)


@pytest.mark.parametrize("parallel", [None, "xla"])
def test_an_input_batched_at_some_levels_only_is_not_copied_per_slice(
        rng, parallel):
    """Nested vmaps: an input batched at some levels keeps only those axes
    and the wrapper finds its slice (before: it was broadcast to every
    level, so 0.6 MiB of inputs became a 787 MiB temporary)."""
    import numba

    @numba.njit
    def combine(a, b, c, y):
        for i in range(y.size):
            y[i] = a[i] + 10 * b[i] + 100 * c[i]
    op = numbax.numba_kernel(combine, spec((5,)), parallel=parallel)
    a = random_array(rng, (2, 5), np.float32)
    b = random_array(rng, (3, 5), np.float32)
    c = random_array(rng, (4, 5), np.float32)
    f = jax.vmap(jax.vmap(jax.vmap(op, in_axes=(None, None, 0)),
                          in_axes=(None, 0, None)), in_axes=(0, None, None))
    want = a[:, None, None] + 10 * b[None, :, None] + 100 * c[None, None, :]
    assert_close(jax.jit(f)(a, b, c), want, rtol=1e-5)
    text = jax.jit(f).lower(a, b, c).as_text()
    assert text.count("numbax_cpu_kernel") == 1
    assert "broadcast" not in text
    # Other axes, and an input at the outer and inner levels, not the
    # middle one.
    g = jax.vmap(jax.vmap(jax.vmap(op, in_axes=(0, None, 0)),
                          in_axes=(None, 0, None)), in_axes=(0, None, 1))
    c3 = random_array(rng, (4, 2, 5), np.float32)  # outer level at axis 1
    got = jax.jit(g)(a[:, None].repeat(4, 1), b, c3)
    want = (a[:, None, None] + 10 * b[None, :, None]
            + 100 * np.transpose(c3, (1, 0, 2))[:, None])
    assert_close(got, want, rtol=1e-5)
    # A program naming such a call is rebuilt from its key alone.
    avals = [((2, 5), np.dtype(np.float32)), ((3, 5), np.dtype(np.float32)),
             ((4, 5), np.dtype(np.float32))]
    masks = ((True, False, False), (False, True, False), (False, False, True))
    key = op.call_key(avals, [((2, 3, 4, 5), np.dtype(np.float32))], (), (),
                      masks, 3)
    assert ";lvl=100.010.001" in key
    call = key.split("/", 2)[2]
    rebuilt = op.entry_for_call(key, call, "cpu").resolve()
    assert rebuilt[0] == op._wrapper(op._layout(
        avals, [((2, 3, 4, 5), np.dtype(np.float32))], (), masks, 3))\
        .address


def test_a_raise_in_a_partially_batched_call_shows_the_exception(rng):
    import numba

    @numba.njit
    def checked(a, b, y):
        for i in range(y.size):
            if b[i] < 0:
                raise ValueError("negative b")
            y[i] = a[i] * b[i]
    op = numbax.numba_kernel(checked, spec((5,)))
    a = np.ones((2, 5), np.float32)
    b = np.ones((3, 5), np.float32)
    f = jax.jit(jax.vmap(jax.vmap(op, in_axes=(None, 0)), in_axes=(0, None)))
    assert_close(f(a, b), np.ones((2, 3, 5), np.float32))
    b[2, 4] = -1
    with pytest.raises((jax.errors.JaxRuntimeError, ValueError),
                       match="ValueError: negative b"):
        jax.block_until_ready(f(a, b))


def test_vmap_with_aliases_writes_each_slice_in_place(rng):
    x = random_array(rng, (8, 16), np.int32)
    op = numbax.numba_kernel(K.add_one_inplace, spec((16,), jnp.int32),
                             input_output_aliases={0: 0})
    np.testing.assert_array_equal(jax.jit(jax.vmap(op))(x), x + 1)
    ranged = numbax.numba_kernel(K.count_range, spec((16,), jnp.int32),
                                 launch_dims=16, parallel="xla",
                                 input_output_aliases={0: 0})
    np.testing.assert_array_equal(
        jax.jit(jax.vmap(jax.vmap(ranged)))(x.reshape(2, 4, 16)),
        x.reshape(2, 4, 16) + 1)


@pytest.mark.parametrize("vmap_method",
                         ["expand_dims", "broadcast_all", "legacy_vectorized"])
def test_vectorized_methods_give_the_kernel_the_batch(rng, vmap_method):
    x = random_array(rng, (6, 9), np.float32)
    op = numbax.numba_kernel(K.batch_sum, spec((1,)),
                             vmap_method=vmap_method)
    assert_close(op(x[0]), x[0].sum(keepdims=True), rtol=1e-5)
    # Under vmap the kernel gets the whole (6, 9) and a (6, 1) output.
    got = jax.jit(jax.vmap(op))(x)
    assert got.shape == (6, 1)
    assert_close(got[:, 0], x.sum(1), rtol=1e-5)
    assert custom_calls(jax.vmap(op), x) == 1


@pytest.mark.parametrize("vmap_method", ["expand_dims", "broadcast_all"])
def test_a_kernel_for_the_batched_rank_only_runs_under_vmap(rng, vmap_method):
    # Written for the (batch, n) arrays a vectorized vmap_method passes, as
    # the reference's users write them: it cannot compile for one slice, so
    # its refusal waits for the lowering, which compiles the batched call
    # (before: refused while the arguments were still one slice).
    import numba

    @numba.njit
    def add_rows(x, y, out):
        for r in range(out.shape[0]):
            for i in range(out.shape[1]):
                out[r, i] = x[r, i] + y[min(r, y.shape[0] - 1), i]
    x = random_array(rng, (5, 8), np.float32)
    y = random_array(rng, (8,), np.float32)
    op = numbax.numba_kernel(add_rows, spec((8,)), vmap_method=vmap_method)
    for f in (jax.vmap(op, in_axes=(0, None)),
              jax.jit(jax.vmap(op, in_axes=(0, None))),
              jax.vmap(jax.jit(op), in_axes=(0, None))):
        assert_close(f(x, y), x + y)
    # Not vmapped, the same kernel is refused when the call is lowered,
    # naming the op and the types.
    with pytest.raises(TypeError, match=r"add_rows\): the kernel cannot be "
                       r"compiled for this call's arguments \(readonly "
                       r"array\(float32, 1d"):
        jax.jit(op)(x[0], y)
    # A per-slice vmap_method keeps refusing at once.
    per_slice = numbax.numba_kernel(add_rows, spec((8,)))
    with pytest.raises(TypeError, match=r"add_rows\): the kernel cannot"):
        jax.make_jaxpr(per_slice)(x[0], y)


def test_sharded_batch_runs_on_each_device_without_gathers(rng):
    code = textwrap.dedent("""
        import json, os, re
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   " --xla_force_host_platform_device_count=8")
        import jax, jax.numpy as jnp, numpy as np, numbax
        from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
        import cpu_kernels as K
        mesh = Mesh(np.array(jax.devices()), ("x",))
        rows = NamedSharding(mesh, P("x"))
        x = np.random.default_rng(SEED).standard_normal((64, 256)).astype(
            np.float32)
        out = {}
        for label, op in [
                ("plain", numbax.numba_kernel(K.affine, jax.ShapeDtypeStruct(
                    (256,), jnp.float32))),
                ("range", numbax.numba_kernel(
                    K.affine_range, jax.ShapeDtypeStruct((256,), jnp.float32),
                    launch_dims=256, parallel="xla"))]:
            f = jax.jit(jax.vmap(op))
            xs = jax.device_put(x, rows)
            text = f.lower(xs).compile().as_text()
            y = f(xs)
            out[label] = dict(
                ok=bool(np.allclose(np.asarray(y), 2 * x + 1)),
                gathers=[c for c in ("all-gather", "all-to-all",
                                     "collective-permute") if c in text],
                shard_rows=sorted({int(s.data.shape[0])
                                   for s in y.addressable_shards}),
                calls=text.count("numbax_cpu_kernel"))
        print("RESULT " + json.dumps(out))
    """).replace("SEED", str(int(rng.integers(1 << 30))))
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, env=env, timeout=600, cwd=HERE)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    for label, r in result.items():
        assert r["ok"], (label, r)
        assert r["gathers"] == [], (label, r)
        assert r["shard_rows"] == [8], (label, r)
        assert r["calls"] >= 1, (label, r)

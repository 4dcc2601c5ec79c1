"""numba_kernel: Numba @njit kernels as XLA ops on JAX's CPU backend.

No simulator needed: every test here passes with and without
NUMBA_ENABLE_CUDASIM=1 (CI sets it), since numba_kernel never touches
numba.cuda. Results are checked against numpy on fresh random data, with
the outputs' memory poisoned first. vmap is in test_numba_kernel_vmap.py,
errors and refusals in test_numba_kernel_errors.py.
"""

import gc
import os
import subprocess
import sys
import textwrap
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numbax
import cpu_kernels as K
from conftest import assert_close, poison, random_array, x64_enabled

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = jnp.float32


def spec(shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int16,
                                   np.complex64, np.uint8])
@pytest.mark.parametrize("jit", [False, True])
def test_results_match_numpy(rng, dtype, jit):
    x = random_array(rng, (1000,), dtype)
    op = numbax.numba_kernel(K.affine, spec((1000,), dtype))
    poison((1000,), dtype)
    got = (jax.jit(op) if jit else op)(jnp.asarray(x))
    assert got.dtype == dtype
    assert_close(got, K.numpy_affine(x), rtol=1e-3)


def test_chain_in_one_jit_and_op_repr(rng):
    x = random_array(rng, (4096,), np.float32)
    op = numbax.numba_kernel(K.affine, spec((4096,)))
    assert "affine" in repr(op)

    def chain(v):
        for _ in range(10):
            v = op(v)
        return v
    want = x.astype(np.float64)
    for _ in range(10):
        want = 2 * want + 1
    assert_close(jax.jit(chain)(x), want.astype(np.float32), rtol=1e-5)


def test_outputs_as_pytree_sequence_and_function(rng):
    x = random_array(rng, (6, 5), np.float32)
    y = random_array(rng, (6, 5), np.float32)
    tree = {"sum": spec((6, 5)), "diff": spec((6, 5))}
    # Pytree leaves are ordered by key: diff first, then sum.
    got = numbax.numba_kernel(
        K.split2, [spec((6, 5)), spec((6, 5))])(x, y)
    assert_close(got[0], x + y)
    assert_close(got[1], x - y)
    by_dict = numbax.numba_kernel(K.split2, tree)(x, y)
    assert_close(by_dict["diff"], x + y)  # the kernel's first output
    assert_close(by_dict["sum"], x - y)
    fn = numbax.numba_kernel(
        K.split2, lambda a, b: (jax.ShapeDtypeStruct(a.shape, a.dtype),) * 2)
    for shape in ((3, 4), (7, 2)):
        a = random_array(rng, shape, np.float32)
        b = random_array(rng, shape, np.float32)
        s, d = jax.jit(fn)(a, b)
        assert_close(s, a + b)
        assert_close(d, a - b)


def test_scalars_are_passed_by_value(rng):
    x = random_array(rng, (64,), np.float32)
    op = numbax.numba_kernel(K.scale_shift, spec((64,)))
    assert_close(op(x, 3.0, np.float32(-2)), 3.0 * x - 2, rtol=1e-6)
    # A new value is a new key: both run, each with its own values.
    f = jax.jit(lambda v: (op(v, 0.5, 1), op(v, np.int16(4), 0.25)))
    a, b = f(x)
    assert_close(a, 0.5 * x + 1)
    assert_close(b, 4 * x + 0.25)


def test_rank_32_arrays_and_31_inputs(rng):
    """Past 30 items CPython 3.11 builds a tuple or a call through a list,
    which Numba rejects: the wrapper builds its shapes and the kernel's
    arguments from parts instead (before: an internal Numba error at rank
    31, or with 31 arguments)."""
    import numba

    @numba.njit
    def corner(x, y):
        y[0] = x.flat[0] + x.flat[x.size - 1]
    shape = (1,) * 30 + (2, 3)
    x = random_array(rng, shape, np.float32)
    op = numbax.numba_kernel(corner, spec((1,)))
    assert_close(jax.jit(op)(x), x.reshape(-1)[[0]] + x.reshape(-1)[[-1]])
    n = 31
    namespace: dict = {}
    exec(f"def ends({', '.join(f'a{i}' for i in range(n))}, y):\n"
         f"    y[0] = a0[0] + a{n - 1}[1]\n", namespace)
    xs = [random_array(rng, (2,), np.float32) for _ in range(n)]
    op = numbax.numba_kernel(numba.njit(namespace["ends"]), spec((1,)))
    assert_close(jax.jit(op)(*xs), xs[0][:1] + xs[-1][1:])


def test_scalars_of_equal_values_and_other_types_are_kept_apart(rng):
    """1, 1.0, np.float32(1) and True are equal (and hash alike) in Python:
    before, the second call reused the wrapper compiled for the first type
    and read the value's bytes as that type (4.6e18 for 1.0), and a float
    index reached a kernel compiled for an int one (a segfault). Wrappers
    are now by type: one serves every value of it."""
    import numba

    @numba.njit
    def add(x, t, y):
        for i in range(x.size):
            y[i] = x[i] + t
    x = random_array(rng, (16,), np.float32)
    op = numbax.numba_kernel(add, spec((16,)))
    values = (1, 1.0, np.float32(1), True, np.int8(1), 2.5, float("nan"))
    got = jax.jit(lambda v: [op(v, t) for t in values])(x)
    for t, y in zip(values, got):
        assert_close(y, x + np.float32(t))
    for t, y in zip(values, [op(x, t) for t in values]):  # eagerly too
        assert_close(y, x + np.float32(t))
    compiled = len(op._wrappers)
    for v in range(20):
        assert_close(op(x, float(v) / 3), x + np.float32(v / 3))
    assert len(op._wrappers) == compiled  # no wrapper per value

    @numba.njit
    def gather(x, i, y):
        y[0] = x[i]
    take = numbax.numba_kernel(gather, spec((1,)))
    np.testing.assert_array_equal(take(x, 3), x[3:4])
    with pytest.raises(TypeError, match=r"gather\): the kernel cannot be "
                       r"compiled.*float64"):
        take(x, 3.0)


def test_launch_dims_and_parallel_xla_cover_the_range_exactly(rng):
    for n in (1, 7, 4096, 100003):
        for parallel in (None, "xla"):
            op = numbax.numba_kernel(
                K.count_range, spec((n,), jnp.int32), launch_dims=n,
                parallel=parallel, input_output_aliases={0: 0})
            got = jax.jit(op)(jnp.zeros(n, jnp.int32))
            np.testing.assert_array_equal(got, np.ones(n, np.int32))
    x = random_array(rng, (50000,), np.float32)
    op = numbax.numba_kernel(K.affine_range, spec((50000,)),
                             launch_dims=50000, parallel="xla")
    poison((50000,), np.float32)
    assert_close(jax.jit(op)(x), K.numpy_affine(x))


@pytest.mark.parametrize("cpus", [1, 2])
def test_parallel_xla_on_small_pools_with_ops_at_once(cpus):
    # XLA's pool has one thread per CPU the process may use: one (the op
    # runs alone, no task scheduled) and two (one helper), with four ops at
    # once in one program competing for it, and a vmapped call's slices
    # spread over it. Every index must be visited exactly once. In a child:
    # the pool is sized when JAX starts.
    proc = _child(f"""
        import os
        cpus = sorted(os.sched_getaffinity(0))[:{cpus}]
        os.sched_setaffinity(0, cpus)
        import jax, jax.numpy as jnp, numpy as np, numbax
        import cpu_kernels as K
        n = 30011
        op = numbax.numba_kernel(K.count_range, jax.ShapeDtypeStruct(
            (n,), jnp.int32), launch_dims=n, parallel="xla",
            input_output_aliases={{0: 0}})
        f = jax.jit(lambda *xs: [op(x) for x in xs])
        for _ in range(20):
            ys = f(*[jnp.full(n, i, jnp.int32) for i in range(4)])
            for i, y in enumerate(ys):
                np.testing.assert_array_equal(y, np.full(n, i + 1))
        v = jax.jit(jax.vmap(op))(jnp.zeros((5, n), jnp.int32))
        np.testing.assert_array_equal(v, np.ones((5, n), np.int32))
        print("OK", len(cpus))
    """)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_input_output_aliases_write_in_place(rng):
    x = random_array(rng, (33,), np.int32)
    op = numbax.numba_kernel(K.add_one_inplace, spec((33,), jnp.int32),
                             input_output_aliases={0: 0})
    np.testing.assert_array_equal(jax.jit(op)(x), x + 1)
    # Donated: XLA hands the input's own buffer.
    f = jax.jit(op, donate_argnums=0)
    np.testing.assert_array_equal(f(jnp.asarray(x)), x + 1)


def test_zero_d_and_zero_size_and_transposed_inputs(rng):
    x = random_array(rng, (5, 4), np.float32)
    c = np.float32(1.5)
    op = numbax.numba_kernel(K.row_sum_plus, spec((5,)))
    assert_close(op(x, jnp.asarray(c)), x.sum(1) + c, rtol=1e-5)
    # A transposed view: XLA hands the kernel a C-contiguous (row-major)
    # buffer holding the transposed values.
    xt = random_array(rng, (4, 5), np.float32)
    assert_close(jax.jit(lambda a: op(a.T, jnp.asarray(c)))(xt),
                 xt.T.sum(1) + c, rtol=1e-5)
    empty = numbax.numba_kernel(K.affine, spec((0,)))
    assert jax.jit(empty)(jnp.zeros(0, F32)).shape == (0,)


@pytest.mark.parametrize("on", [False, True])
def test_x64_on_and_off(rng, on):
    with x64_enabled(on):
        dtype = np.float64 if on else np.float32
        x = random_array(rng, (16,), dtype)
        op = numbax.numba_kernel(K.affine, spec((16,), dtype))
        got = jax.jit(op)(jnp.asarray(x))
        assert got.dtype == dtype
        assert_close(got, K.numpy_affine(x))
        op64 = numbax.numba_kernel(K.affine, spec((16,), jnp.int64))
        if on:
            v = np.arange(16, dtype=np.int64) + 3_000_000_000
            np.testing.assert_array_equal(op64(v), 2 * v + 1)
        else:
            # As JAX does: the 32-bit type, with a warning naming the op.
            v = np.arange(16, dtype=np.int32)
            with pytest.warns(UserWarning, match=r"numba_kernel\(.*affine\)"
                              ".*jax_enable_x64 is off"):
                got = jax.jit(op64)(v)
            assert got.dtype == np.int32
            np.testing.assert_array_equal(got, 2 * v + 1)


def test_names_in_hlo():
    x = jnp.ones(8, F32)
    op = numbax.numba_kernel(K.affine, spec((8,)))
    named = numbax.numba_kernel(K.affine, spec((8,)), name="my_affine_op")
    text = jax.jit(lambda v: named(op(v))).lower(x).as_text()
    assert "numbax_cpu_kernel" in text
    assert "affine" in op.profile_name
    assert named.profile_name == "my_affine_op"
    assert "my_affine_op" in text
    # The key names the op (its name=) and the call.
    assert 'key = "my_affine_op/cpu_kernel;outs=float32[8]/in=float32[8]' \
        in text


def test_no_python_per_call():
    # The handler never resolves again nor enters Python once instantiated:
    # counted by the bridge's resolve counter, which a call does not move.
    op = numbax.numba_kernel(K.affine, spec((8,)))
    f = jax.jit(op)
    x = jnp.ones(8, F32)
    f(x).block_until_ready()
    before = numbax.bridge_counters()["resolves"]
    for _ in range(20):
        f(x)
    jax.block_until_ready(f(x))
    assert numbax.bridge_counters()["resolves"] == before


def _child(code: str, env_extra=None, timeout=300, args=()):
    env = dict(os.environ, JAX_PLATFORMS="cpu", **(env_extra or {}))
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code),
                           *args],
                          capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=HERE)


def test_export_into_a_fresh_process(tmp_path, rng):
    import cpu_kernels  # noqa: F401 (the child imports it by this name)
    x = random_array(rng, (3, 256), np.float32)
    op = numbax.numba_kernel(K.affine_range, spec((256,)), launch_dims=256,
                             parallel="xla")
    scaled = numbax.numba_kernel(K.scale_shift, spec((256,)))

    def f(v):
        return jax.vmap(lambda r: scaled(op(r), 2.0, -1.0))(v)
    exp = jax.export.export(
        jax.jit(f), disabled_checks=numbax.export_disabled_checks())(
        jax.ShapeDtypeStruct(x.shape, F32))
    (tmp_path / "p.bin").write_bytes(exp.serialize())
    np.save(tmp_path / "x.npy", x)
    proc = _child(f"""
        import jax, jax.numpy as jnp, numpy as np, numbax
        import cpu_kernels as K
        # Created (and kept alive), never traced here.
        ops = [numbax.numba_kernel(K.affine_range, jax.ShapeDtypeStruct(
                   (256,), jnp.float32), launch_dims=256, parallel="xla"),
               numbax.numba_kernel(K.scale_shift, jax.ShapeDtypeStruct(
                   (256,), jnp.float32))]
        exp = jax.export.deserialize(open({str(tmp_path / 'p.bin')!r},
                                          'rb').read())
        x = np.load({str(tmp_path / 'x.npy')!r})
        np.save({str(tmp_path / 'y.npy')!r}, np.asarray(exp.call(x)))
        print("OK")
    """)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    got = np.load(tmp_path / "y.npy")
    assert_close(got, 2.0 * K.numpy_affine(x) - 1.0, rtol=1e-6)


def test_works_without_numba_cuda_or_cuda_bindings():
    # A meta-path finder refuses numba.cuda, numba_cuda and cuda (the
    # bindings): numbax imports and numba_kernel runs all the same.
    proc = _child("""
        import sys, importlib.abc
        BLOCKED = ("numba.cuda", "numba_cuda", "cuda")
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if any(name == b or name.startswith(b + ".")
                       for b in BLOCKED):
                    raise ImportError("blocked for the test: " + name)
        sys.meta_path.insert(0, Block())
        import jax, jax.numpy as jnp, numpy as np, numbax
        import cpu_kernels as K
        op = numbax.numba_kernel(K.affine, jax.ShapeDtypeStruct((16,),
                                                                jnp.float32))
        y = jax.jit(op)(jnp.arange(16, dtype=jnp.float32))
        assert np.array_equal(np.asarray(y), 2 * np.arange(16) + 1)
        loaded = [m for m in sys.modules if any(
            m == b or m.startswith(b + ".") for b in BLOCKED)]
        assert not loaded, loaded
        print("OK")
    """, env_extra={"NUMBA_ENABLE_CUDASIM": "0"})
    assert proc.returncode == 0 and "OK" in proc.stdout, (
        proc.stdout[-2000:] + proc.stderr[-3000:])


def test_xla_custom_kernel_def_numba_kernel_is_one_primitive_with_cuda(rng):
    # One XLACustomKernel with both kernels: on JAX's CPU backend the @njit
    # one runs (the cpu default, even under the simulator); a GPU program
    # would lower the CUDA one.
    op = numbax.XLACustomKernel("numba_kernel_test_scale")
    built = []

    @op.def_numba_kernel
    def _(*, factor, outs):
        built.append(factor)
        return numbax.numba_kernel(K.scale_shift_by(factor), outs)

    @op.def_numba_cuda_kernel
    def _(*, factor, outs):  # pragma: no cover - a GPU program's kernel
        raise AssertionError("the CUDA kernel must not run on the CPU")
    x = random_array(rng, (8, 32), np.float32)
    out = jax.ShapeDtypeStruct((32,), F32)
    assert_close(jax.jit(lambda v: op(v, outs=out, factor=3.0))(x[0]),
                 3.0 * x[0] + 1.0)
    f = jax.jit(jax.vmap(lambda v: op(v, outs=out, factor=2.0)))
    assert_close(f(x), 2.0 * x + 1.0)
    assert jax.jit(jax.vmap(lambda v: op(v, outs=out, factor=2.0))).lower(
        x).as_text().count("numbax_cpu_kernel") == 1
    assert built == [3.0, 2.0]
    # A generator that returns the @njit kernel itself is refused.
    bare = numbax.XLACustomKernel("numba_kernel_test_bare")
    bare.def_numba_kernel(lambda *, outs: K.affine)
    with pytest.raises(TypeError, match="returned the @njit kernel itself.*"
                       r"numbax.numba_kernel\(kernel, outs\)"):
        bare(x[0], outs=out)


def test_an_op_created_while_lowering_lives_with_its_program(rng):
    # brainevent's style: the generator returns a function that creates the
    # numba_kernel when called (here with a fresh @njit closure each time),
    # so nothing but the program refers to the op. The compiled program
    # keeps it, and gives it up with the program.
    op = numbax.XLACustomKernel("numba_kernel_test_created_inside")
    made = []

    @op.def_numba_kernel
    def _(*, factor, outs):
        def run(v):
            kernel_op = numbax.numba_kernel(K.scale_shift_by(factor), outs)
            made.append(weakref.ref(kernel_op))
            return kernel_op(v)
        return run
    x = random_array(rng, (4, 32), np.float32)
    out = jax.ShapeDtypeStruct((32,), F32)
    assert_close(op(x[0], outs=out, factor=3.0), 3.0 * x[0] + 1.0)
    f = jax.jit(lambda v: op(v, outs=out, factor=2.0))
    assert_close(f(x[1]), 2.0 * x[1] + 1.0)
    gc.collect()
    assert_close(f(x[2]), 2.0 * x[2] + 1.0)
    g = jax.jit(jax.vmap(lambda v: op(v, outs=out, factor=-1.0)))
    gc.collect()
    assert_close(g(x), -x + 1.0)
    assert any(r() is not None for r in made)
    del f, g
    jax.clear_caches()
    gc.collect()
    assert all(r() is None for r in made)


def test_a_vmapped_custom_kernel_differentiates_where_its_rules_apply(rng):
    """vmap of an XLACustomKernel runs its numba_kernel over the batch in
    one call. Differentiated where the op's rules can apply (grad outside
    any jit, or inside the jit) the batch goes through them; a jit, scan or
    checkpoint traced before jvp/grad met it holds the kernel alone, and
    is refused naming the op and the two ways out (a custom_jvp around the
    batch was tried and reverted: vmapped again after jit, jax 0.10 gave
    its jvp with the batch axes swapped, silently)."""
    from numbax.custom_kernel import is_undefined_primal
    op = numbax.XLACustomKernel("numba_kernel_test_mul_later")

    @op.def_numba_kernel
    def _(*, outs):
        return numbax.numba_kernel(K.multiply, outs)
    op.def_jvp_rule(lambda ta, a, b, *, outs: op(ta, b, outs=outs),
                    lambda tb, a, b, *, outs: op(a, tb, outs=outs),
                    per_input=True)

    @op.def_transpose_rule
    def _(ct, a, b, *, outs):
        return (ct * b if is_undefined_primal(a) else None,
                ct * a if is_undefined_primal(b) else None)

    def mul(a, b):
        return op(a, b, outs=jax.ShapeDtypeStruct(a.shape, a.dtype))
    a = random_array(rng, (4, 9), np.float32)
    b = random_array(rng, (4, 9), np.float32)
    t = random_array(rng, (4, 9), np.float32)
    batched = jax.jit(lambda a: jax.vmap(mul)(a, b))
    assert batched.lower(a).as_text().count("numbax_cpu_kernel") == 1
    assert_close(batched(a), a * b, rtol=1e-5)

    def total(a):
        return jnp.sum(jax.vmap(mul)(a, b))
    assert_close(jax.grad(total)(a), b, rtol=1e-5)
    assert_close(jax.jit(jax.grad(total))(a), b, rtol=1e-5)
    assert_close(jax.jvp(lambda a: jax.vmap(mul)(a, b), (a,), (t,))[1],
                 t * b, rtol=1e-5)
    for later in (lambda: jax.jvp(batched, (a,), (t,)),
                  lambda: jax.grad(jax.jit(total))(a)):
        with pytest.raises(ValueError, match=r"multiply\) cannot be "
                           r"differentiated.*XLACustomKernel that has a JVP "
                           r"rule.*jax.jit\(jax.grad\(f\)\).*"
                           r"def_batching_rule"):
            later()


def test_cache_true_kernels_wrappers_load_from_numbas_cache(tmp_path):
    # A cache=True kernel's wrapper goes to Numba's cache: the second fresh
    # process loads it (the cfunc's cache hit) instead of compiling.
    code = """
        import jax, jax.numpy as jnp, numpy as np, numbax
        import cpu_kernels as K
        op = numbax.numba_kernel(K.cached_affine,
                                 jax.ShapeDtypeStruct((64,), jnp.float32))
        y = jax.jit(op)(jnp.arange(64, dtype=jnp.float32))
        assert np.array_equal(np.asarray(y), 2 * np.arange(64) + 1)
        (cfunc,) = op._wrappers.values()
        print("HITS", cfunc.cache_hits)
    """
    hits = []
    for _ in range(2):
        proc = _child(code, env_extra={"NUMBA_CACHE_DIR": str(tmp_path)})
        assert proc.returncode == 0, proc.stderr[-3000:]
        hits.append(int(proc.stdout.split("HITS")[1].split()[0]))
    assert hits == [0, 1], hits


def test_cache_true_closures_wrappers_load_by_their_captured_values(tmp_path):
    # A factory's cache=True closures: Numba caches each kernel keyed on
    # its captured values, and numbax's wrapper goes beside it, keyed on
    # them too, so a later process loads both (before: the wrapper was
    # compiled in every process), and another value never loads the
    # first's code.
    code = """
        import sys, jax, jax.numpy as jnp, numpy as np, numbax
        import cpu_kernels as K
        factor = float(sys.argv[1])
        op = numbax.numba_kernel(K.cached_scale_by(factor),
                                 jax.ShapeDtypeStruct((64,), jnp.float32))
        y = jax.jit(op)(jnp.arange(64, dtype=jnp.float32))
        assert np.array_equal(np.asarray(y),
                              np.float32(factor) * np.arange(64)), y
        (cfunc,) = op._wrappers.values()
        print("HITS", cfunc.cache_hits)
    """
    hits = []
    for factor in ("2", "2", "3", "3", "2"):
        proc = _child(code, env_extra={"NUMBA_CACHE_DIR": str(tmp_path)},
                      args=[factor])
        assert proc.returncode == 0, proc.stderr[-3000:]
        hits.append(int(proc.stdout.split("HITS")[1].split()[0]))
    assert hits == [0, 1, 0, 1, 1], hits


@pytest.mark.parametrize("layout", ["[::1]", "[:]"])
def test_kernels_with_explicit_signatures_run(rng, layout):
    # @njit("sig") disables compilation: numbax must use the kernel's own
    # overload (a C-contiguous one, or one Numba converts C arrays to), not
    # ask Numba to compile, which it refuses ("compilation disabled").
    import numba

    @numba.njit(f"void(float32{layout}, float32, float32{layout})")
    def shift(x, c, out):
        for i in range(x.size):
            out[i] = x[i] + c
    x = random_array(rng, (37,), np.float32)
    op = numbax.numba_kernel(shift, spec((37,)))
    assert_close(jax.jit(lambda v: op(v, np.float32(1.5)))(x),
                 x + np.float32(1.5))
    assert_close(jax.vmap(lambda r: op(r, np.float32(2)))(
        np.stack([x, -x])), np.stack([x + 2, 2 - x]))
    # An overload the call cannot use is still refused at trace time,
    # naming the op, the call's types and the fix.
    with pytest.raises(TypeError,
                       match=r"numba_kernel\(.*shift\): the kernel cannot"):
        op(x.astype(np.float64) if jax.config.jax_enable_x64 else
           x.astype(np.int32), np.float32(1))


def test_xla_custom_kernel_passes_0d_inputs_to_a_numba_kernel(rng):
    # numba_kernel takes 0-d arrays (as 0-d Numba arrays); an XLACustomKernel
    # whose CPU kernel is one must pass them on, not refuse them as it must
    # for the GPU ops, whose buffers have at least one dimension.
    op = numbax.XLACustomKernel("numba_kernel_test_0d_input")

    @op.def_numba_kernel
    def _(*, outs):
        return numbax.numba_kernel(K.row_sum_plus, outs)
    x = random_array(rng, (5, 4), np.float32)
    c = np.float32(rng.standard_normal())
    out = jax.ShapeDtypeStruct((5,), F32)
    want = x.sum(1) + c
    assert_close(op(x, jnp.asarray(c), outs=out), want, rtol=1e-5)
    assert_close(jax.jit(lambda a, b: op(a, b, outs=out))(x, c), want,
                 rtol=1e-5)
    cs = random_array(rng, (3,), np.float32)
    assert_close(jax.vmap(lambda b: op(x, b, outs=out))(cs),
                 x.sum(1)[None, :] + cs[:, None], rtol=1e-5)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"),
                    reason="needs /proc")
def test_op_recreated_per_call_shares_one_compiled_op():
    """A helper that builds the op on every call (as with the GPU kernel
    family): one op object per distinct configuration, so its wrapper is
    compiled once and JAX keeps one program (before: each re-creation
    compiled a new wrapper and program, about 290 ms and 2 MiB)."""
    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def make(**kw):
        return numbax.numba_kernel(K.affine, spec((64,)), **kw)
    assert make() is make()
    assert make() == make() and hash(make()) == hash(make())
    assert make() is not make(name="other")
    assert make() is not numbax.numba_kernel(K.affine, spec((64,), jnp.int32))
    assert make(input_output_aliases={0: 0}) is \
        make(input_output_aliases={0: 0})
    x = jnp.arange(64, dtype=F32)
    for _ in range(5):  # warm up
        jax.block_until_ready(make()(x))
    size, rss = numbax.registry_size(), rss_mib()
    for _ in range(200):
        y = make()(x)
    np.testing.assert_allclose(y, 2 * np.arange(64) + 1)
    assert numbax.registry_size() == size
    assert rss_mib() - rss < 30
    # Once the op is gone, an op made again finds the kernel's wrappers
    # (they live with the kernel): nothing compiles (before: 780 ms and
    # 1.3 MiB kept per re-creation).
    wrappers = dict(make()._wrappers)
    del y
    jax.clear_caches()
    gc.collect()
    again = make()
    assert_close(jax.jit(jax.vmap(again))(jnp.stack([x, x])),
                 np.stack([2 * np.arange(64) + 1] * 2))
    for layout, cfunc in wrappers.items():
        assert again._wrappers[layout] is cfunc

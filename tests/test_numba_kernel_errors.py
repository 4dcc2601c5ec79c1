"""numba_kernel's errors: never silent, each naming the op and the fix.

A kernel that raises fails the call with an XLA error naming the op and
holding the exception's text (from a diagnostic re-run in Python); what
cannot work is refused when the op is made or traced. Four independent
@njit(parallel=True) ops in one jit run under Numba's workqueue threading
layer without taking the process down. No simulator needed.
"""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numba
import numpy as np
import pytest

import numbax
import cpu_kernels as K
from conftest import assert_close

HERE = os.path.dirname(os.path.abspath(__file__))
F32 = jnp.float32
# What XLA's error becomes in Python: JaxRuntimeError, or ValueError when
# jax's C++ dispatch path runs an executable that already ran once.
RUN_TIME = (jax.errors.JaxRuntimeError, ValueError)


def spec(shape, dtype=F32):
    return jax.ShapeDtypeStruct(shape, dtype)


@pytest.mark.parametrize("parallel", [None, "xla"])
def test_a_kernel_that_raises_is_an_xla_error_naming_op_and_exception(
        parallel):
    if parallel:
        @numba.njit
        def bad(begin, end, x, out):
            for i in range(begin, end):
                if x[i] < 0:
                    raise ValueError("negative input at an index")
                out[i] = x[i]
        op = numbax.numba_kernel(bad, spec((5000,)), launch_dims=5000,
                                 parallel="xla")
    else:
        op = numbax.numba_kernel(K.raises_on_negative, spec((5000,)))
    x = np.ones(5000, np.float32)
    np.testing.assert_array_equal(jax.jit(op)(x), x)  # fine input: runs
    x[4321] = -1
    with pytest.raises(RUN_TIME) as info:
        jax.block_until_ready(jax.jit(op)(x))
    text = str(info.value)
    assert text.startswith("INTERNAL: numbax numba_kernel '"), text
    assert "ValueError: negative input at an index" in text
    # Eager calls fail alike.
    with pytest.raises(RUN_TIME, match="negative input"):
        jax.block_until_ready(op(x))


def test_a_raise_in_a_vmapped_call_of_0d_slices_shows_the_exception():
    # The diagnostic re-run hands each slice as the wrapper does: a batch
    # of 0-d inputs gives 0-d arrays (before: NumPy scalars, and the error
    # was the re-run's TypingError, not the kernel's exception).
    @numba.njit
    def scaled(s, x, y):
        if s[()] < 0:
            raise ValueError("negative scale")
        for i in range(x.size):
            y[i] = x[i] * s[()]
    op = numbax.numba_kernel(scaled, spec((4,)))
    f = jax.jit(jax.vmap(op, in_axes=(0, None)))
    assert_close(f(jnp.array([1.0, 2.0], F32), jnp.ones(4, F32)),
                 np.array([[1.0] * 4, [2.0] * 4], np.float32))
    with pytest.raises(RUN_TIME, match="ValueError: negative scale"):
        jax.block_until_ready(f(jnp.array([1.0, -2.0], F32),
                                jnp.ones(4, F32)))


def test_an_object_mode_block_is_refused_at_trace_time():
    # An exception raised in it escapes Numba's try/except, so the wrapper
    # could not report it (before: the kernel went on, and Python found the
    # exception later, failing the caller with SystemError).
    op = numbax.numba_kernel(K.raises_in_object_mode, spec((6,)))
    for call in (op, jax.jit(op)):
        with pytest.raises(TypeError, match=r"numba_kernel\(.*"
                           r"raises_in_object_mode\): the kernel has a `with "
                           r"numba.objmode\(\):` block.*jax.pure_callback"):
            call(np.ones(6, np.float32))


def test_a_raise_with_an_aliased_input_is_an_error_without_a_rerun():
    @numba.njit
    def bad_inplace(x, out):
        out[0] += 1
        if out[0] > 0:
            raise RuntimeError("boom")
    op = numbax.numba_kernel(bad_inplace, spec((4,)),
                             input_output_aliases={0: 0})
    with pytest.raises(RUN_TIME) as info:
        jax.block_until_ready(jax.jit(op)(jnp.zeros(4, F32)))
    text = str(info.value)
    assert "the kernel raised an exception" in text
    assert "aliased input" in text and "numbax numba_kernel" in text


def test_refuses_what_is_not_an_njit_kernel():
    def plain(x, out):
        out[:] = x
    with pytest.raises(TypeError, match=r"numba_kernel: kernel must be a "
                       r"Numba @njit function.*numba.njit"):
        numbax.numba_kernel(plain, spec((4,)))
    with pytest.raises(TypeError, match="numba_kernel: kernel must be"):
        numbax.numba_kernel(np.sin, spec((4,)))
    obj = numba.jit(forceobj=True)(plain)
    with pytest.raises(TypeError, match="object mode.*numba.njit"):
        numbax.numba_kernel(obj, spec((4,)))


def test_refuses_a_kernel_that_returns_a_value():
    @numba.njit
    def returns(x, out):
        out[0] = x[0]
        return x[0]
    op = numbax.numba_kernel(returns, spec((4,)))
    with pytest.raises(TypeError, match=r"numba_kernel\(.*returns\): the "
                       r"kernel returns a value \(float32\).*return None"):
        op(jnp.ones(4, F32))


def test_refuses_arguments_the_kernel_cannot_take():
    op = numbax.numba_kernel(K.affine, spec((4,)), launch_dims=4)
    with pytest.raises(TypeError, match=r"cannot be compiled.*\(begin, "
                       r"end\) as uint64 first.*Signature mismatch"):
        op(jnp.ones(4, F32))
    # float16: Numba's CPU target cannot even load one, so it is refused
    # before compiling, as an input and as an output, naming the fix.
    f16 = numbax.numba_kernel(K.affine, spec((4,), jnp.float16))
    for x in (jnp.ones(4, jnp.float16), jnp.ones(4, F32)):
        with pytest.raises(TypeError, match=r"affine\): (input|output) 0 "
                           "has dtype float16, which Numba's CPU target "
                           r"cannot load.*x.astype\(jnp.float32\)"):
            f16(x)
    # Scalars: an int Numba cannot type, and a float16 one, name the op.
    for bad, said in ((2**64, "scalar Numba cannot type"), (-2**63 - 1,
                      "scalar Numba cannot type"), (np.float16(1),
                                                    "float16 scalar")):
        with pytest.raises(TypeError, match=r"numba_kernel\(.*input 1 is a "
                           + said):
            numbax.numba_kernel(K.scale_shift, spec((4,)))(
                jnp.ones(4, F32), bad, 1.0)
    # Sub-byte and non-native dtypes are refused without naming CUDA.
    for dtype in (jnp.int4, np.dtype(">f4")):
        with pytest.raises(ValueError) as info:
            numbax.numba_kernel(K.affine, spec((4,), dtype))
        assert "Numba kernels cannot use" in str(info.value)
        assert "CUDA" not in str(info.value)
    bf = numbax.numba_kernel(K.affine, spec((4,)))
    with pytest.raises(TypeError, match="bfloat16, which Numba's CPU arrays "
                       "cannot hold"):
        bf(jnp.ones(4, jnp.bfloat16))


def test_a_typing_error_is_not_taken_for_a_write_to_an_input():
    # Numba's message names the read-only argument types, so "readonly" in
    # it says nothing about writes: the kernel's own mistake is reported as
    # one, with Numba's text (before: "the kernel writes to an input").
    @numba.njit
    def typo(x, out):
        for i in range(out.size):
            out[i] = x.no_such_attribute
    with pytest.raises(TypeError) as info:
        numbax.numba_kernel(typo, spec((4,)))(jnp.ones(4, F32))
    text = str(info.value)
    assert "cannot be compiled for this call's arguments" in text, text
    assert "no_such_attribute" in text and "writes to an input" not in text


def test_a_0d_input_that_the_kernel_takes_as_a_number_names_the_fix():
    # jit traces a scalar argument: the kernel gets a 0-d array, not an int.
    @numba.njit
    def count(n, out):
        for i in range(n):
            out[i] = i
    op = numbax.numba_kernel(count, spec((4,), jnp.int32))
    with pytest.raises(TypeError, match=r"count\): the kernel cannot be "
                       r"compiled.*A 0-d input.*x\[\(\)\]"):
        jax.jit(op)(3)
    # Outside jit's arguments the scalar passes by value, and runs.
    out = np.asarray(jax.jit(lambda: op(3))())
    np.testing.assert_array_equal(out[:3], [0, 1, 2])


def test_a_kernel_with_explicit_signatures_writing_an_input_is_refused(rng):
    # Its overloads take writable arrays, so Numba refuses none of its
    # writes; numbax compiles its function anew for read-only inputs (before:
    # the write changed the caller's JAX array, silently).
    @numba.njit("void(float32[:], float32[:])")
    def writes_directly(x, out):
        x[0] = 99
        out[:] = x

    @numba.njit("void(float32[:], float32[:])")
    def writes_through_flat(x, out):
        x.flat[0] = 99
        out[:] = x

    @numba.njit("void(float32[:], float32[:])")
    def reads_only(x, out):
        out[:] = 2 * x
    host = rng.uniform(1, 2, 8).astype(np.float32)
    x = jnp.asarray(host)
    for kernel in (writes_directly, writes_through_flat):
        op = numbax.numba_kernel(kernel, spec((8,)))
        for call, arg in ((op, x), (jax.jit(op), x), (jax.vmap(op), x[None])):
            with pytest.raises(TypeError) as info:
                jax.block_until_ready(call(arg))
            text = str(info.value)
            for part in (kernel.__name__, "writes to an input",
                         "input_output_aliases", "Found: "):
                assert part in text, text
    np.testing.assert_array_equal(np.asarray(x), host)
    assert_close(numbax.numba_kernel(reads_only, spec((8,)))(x), 2 * host)
    # Reading an input through a helper whose explicit signature takes a
    # writable array is no write: the kernel runs (its twin cannot compile
    # for read-only inputs, so it goes unchecked); a kernel without
    # signatures calling that helper is refused as a typing error naming
    # the signature, never as a write.
    @numba.njit("float32(float32[:], int64)")
    def get(a, i):
        return a[i]

    @numba.njit("void(float32[:], float32[:])")
    def reads_through_a_helper(x, out):
        for i in range(out.size):
            out[i] = get(x, i) * 2
    assert_close(numbax.numba_kernel(reads_through_a_helper, spec((8,)))(x),
                 2 * host)

    @numba.njit
    def lazy(x, out):
        for i in range(out.size):
            out[i] = get(x, i) * 2
    with pytest.raises(TypeError) as info:
        numbax.numba_kernel(lazy, spec((8,)))(x)
    text = str(info.value)
    assert "cannot be compiled" in text and "explicit signatures" in text
    assert "writes to an input" not in text

    # With a 0-d input too, both hints are given.
    @numba.njit
    def lazy_0d(s, x, out):
        for i in range(out.size):
            out[i] = get(x, i) * s
    with pytest.raises(TypeError) as info:
        numbax.numba_kernel(lazy_0d, spec((8,)))(jnp.float32(2), x)
    text = str(info.value)
    assert "explicit signatures" in text and "A 0-d input" in text
    # Aliased, the input may be written.
    aliased = numbax.numba_kernel(writes_directly, spec((8,)),
                                  input_output_aliases={0: 0})
    want = host.copy()
    want[0] = 99
    np.testing.assert_array_equal(np.asarray(jax.jit(aliased)(x)), want)
    np.testing.assert_array_equal(np.asarray(x), host)


@pytest.mark.parametrize("container", [list, tuple], ids=["list", "tuple"])
def test_refuses_a_container_input_as_jax_does(container):
    op = numbax.numba_kernel(K.affine, spec((4,)))
    with pytest.raises(TypeError, match=r"numba_kernel\(.*input 0 is "
                       f"{container.__name__}.*jnp.asarray"):
        op(container([1.0] * 4))


@pytest.mark.parametrize("how", ["eager", "jit", "vmap"])
def test_a_kernel_writing_an_input_is_refused_at_trace_time(how, rng):
    """Inputs go to the kernel read-only (before: the write changed XLA's
    buffer, so the caller's JAX array changed under it, silently)."""
    op = numbax.numba_kernel(K.zeroes_its_input, spec((8,)))
    host = rng.uniform(-1, 1, (3, 8) if how == "vmap" else 8).astype(np.float32)
    x = jnp.asarray(host)
    call = {"eager": op, "jit": jax.jit(op), "vmap": jax.vmap(op)}[how]
    with pytest.raises(TypeError) as info:
        call(x)
    text = str(info.value)
    for part in ("numba_kernel(", "zeroes_its_input", "writes to an input",
                 "input_output_aliases", "readonly array"):
        assert part in text, text
    np.testing.assert_array_equal(np.asarray(x), host)


@pytest.mark.parametrize("kernel", [
    "zeroes_its_input_flat", "zeroes_its_input_flat_in_a_helper",
    "zeroes_its_input_nditer", "zeroes_its_input_nditer_pairs",
    "bumps_its_input_nditer_in_a_helper", "writes_its_input_as_contiguous",
    "writes_its_input_diagonal", "writes_its_input_by_dot_out",
    "writes_nditer_view_by_keyword", "writes_nditer_view_a_helper_returned",
    "writes_nditer_view_from_zip", "writes_nditer_views_kept_in_a_list"])
def test_writes_numba_lets_through_read_only_are_refused_too(kernel, rng):
    """Numba 0.68 compiles these writes to a read-only array (before: each
    changed the caller's JAX array, silently); numbax finds them in the
    typed IR (cpu_kernel/kernel_audit.py)."""
    op = numbax.numba_kernel(getattr(K, kernel), spec((8,)))
    host = rng.uniform(1, 2, 8).astype(np.float32)
    x = jnp.asarray(host)
    for call in (op, jax.jit(op)):
        with pytest.raises(TypeError) as info:
            jax.block_until_ready(call(x))
        text = str(info.value)
        for part in ("numba_kernel(", kernel, "writes to an input",
                     "input_output_aliases", "Found: ", "cpu_kernels.py:"):
            assert part in text, text
    np.testing.assert_array_equal(np.asarray(x), host)


def _run_children(tmp_path, code, runs, before_each=None):
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    env["PYTHONPATH"] = str(tmp_path) + os.pathsep + env.get("PYTHONPATH", "")
    out = []
    for i in range(runs):
        if before_each is not None:
            before_each(i)
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                              capture_output=True, text=True, env=env,
                              timeout=300, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out.append(proc.stdout.splitlines())
    return out


def test_a_cached_kernel_is_audited_in_every_process(tmp_path):
    """Numba caches a kernel (cache=True) before numbax refuses it: numbax
    then flushes that cache, so the next process compiles and refuses it
    again (before: it loaded the cached code without typed IR and ran it,
    writing its input). A kernel that passed is marked beside Numba's cache
    and loads from it with no audit; without the marker numbax audits an
    uncached twin."""
    (tmp_path / "cached_kernels.py").write_text(textwrap.dedent("""
        import numba

        @numba.njit(cache=True)
        def writes(x, out):
            out[:] = 1
            x.flat[0] = 0

        @numba.njit(cache=True)
        def fine(x, out):
            for i in range(x.size):
                out[i] = 2 * x[i]
    """))
    code = """
        import jax, jax.numpy as jnp, numpy as np, numbax
        from numbax.cpu_kernel import kernel_audit
        import cached_kernels as C
        spec = jax.ShapeDtypeStruct((4,), jnp.float32)
        x = jnp.ones(4, jnp.float32)
        try:
            numbax.numba_kernel(C.writes, spec)(x)
            print("RAN", np.asarray(x).tolist())
        except TypeError as e:
            print("REFUSED" if "writes to an input" in str(e) else e)
        y = numbax.numba_kernel(C.fine, spec)(x)
        print("FINE", np.asarray(y).tolist())
        print("HITS", sum(C.writes.stats.cache_hits.values()),
              sum(C.fine.stats.cache_hits.values()))
        print("TWINS", sorted(d.__name__ for d in kernel_audit._twins))
    """

    def before(i):
        if i == 2:  # no marker: the twin audits the cached kernel
            for marker in (tmp_path / "cache").rglob("numbax_audited_*"):
                marker.unlink()
    first, second, third = _run_children(tmp_path, code, 3, before)
    for run in (first, second, third):
        assert run[:2] == ["REFUSED", "FINE [2.0, 2.0, 2.0, 2.0]"], run
    assert first[2:] == ["HITS 0 0", "TWINS []"], first
    assert second[2:] == ["HITS 0 1", "TWINS []"], second
    assert third[2:] == ["HITS 0 1", "TWINS ['fine']"], third


def _cached_kernel_calling_a_helper(tmp_path, name: str) -> str:
    """Writes module `name` (a cache=True kernel k calling `name`_h.h,
    which the test writes) and returns the code of a child that calls k on
    zeros: it prints RAN, the output and the input, or REFUSED and the
    error's text."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(f"""
        import numba
        import {name}_h

        @numba.njit(cache=True)
        def k(x, out):
            out[0] = {name}_h.h(x)
    """))
    return f"""
        import jax, jax.numpy as jnp, numpy as np, numbax, {name}
        x = jnp.zeros(3, jnp.float32)
        try:
            y = numbax.numba_kernel({name}.k, jax.ShapeDtypeStruct(
                (1,), jnp.float32))(x)
            print("RAN", np.asarray(y).tolist(), np.asarray(x).tolist())
        except TypeError as e:
            print("REFUSED", repr(str(e)))
    """


def _write_helper(tmp_path, name: str, body: str) -> None:
    (tmp_path / f"{name}_h.py").write_text(
        "import numba\n\n@numba.njit\ndef h(a):\n    " + body + "\n")


def test_a_cached_kernel_whose_source_no_longer_compiles_is_refused(tmp_path):
    # Numba loads the kernel from its cache (its own file is unchanged); the
    # audit, without a marker, compiles the source again, which fails in
    # the edited helper: a TypeError naming the op and the fix, not Numba's
    # TypingError from inside numbax.
    code = _cached_kernel_calling_a_helper(tmp_path, "kmod2")

    def before(i):
        _write_helper(tmp_path, "kmod2",
                      "return a.sum() + 1" if i == 0 else
                      "return undefined_name")
        if i == 1:
            for marker in (tmp_path / "cache").rglob("numbax_audited_*"):
                marker.unlink()
    first, second = _run_children(tmp_path, code, 2, before)
    assert first == ["RAN [1.0] [0.0, 0.0, 0.0]"], first
    assert second[0].startswith("REFUSED 'numba_kernel(kmod2.k): numbax "
                                "audits a kernel Numba loaded"), second
    assert "Fix it, or clear Numba" in second[0], second


def test_a_cached_closure_kernel_loads_without_an_audit(tmp_path):
    # A factory's kernels (closures) with cache=True: the marker keys on
    # the captured values, as Numba's cache does, so the second process
    # loads the kernel and compiles no twin.
    (tmp_path / "factory.py").write_text(textwrap.dedent("""
        import numba

        def make(scale):
            @numba.njit(cache=True)
            def scaled(x, out):
                for i in range(x.size):
                    out[i] = scale * x[i]
            return scaled
    """))
    code = """
        import jax, jax.numpy as jnp, numpy as np, numbax, factory
        from numbax.cpu_kernel import kernel_audit
        k = factory.make(3.0)
        y = numbax.numba_kernel(k, jax.ShapeDtypeStruct((4,), jnp.float32))(
            jnp.ones(4, jnp.float32))
        print(np.asarray(y).tolist(), sum(k.stats.cache_hits.values()),
              len(kernel_audit._twins))
    """
    first, second = _run_children(tmp_path, code, 2)
    assert first == ["[3.0, 3.0, 3.0, 3.0] 0 0"], first
    assert second == ["[3.0, 3.0, 3.0, 3.0] 1 0"], second


def test_a_refused_kernel_fixed_in_a_function_it_calls_runs_the_fix(tmp_path):
    # Numba's cache notices edits to the kernel's own file only: without
    # the flush on refusal, a later process loaded the refused code (which
    # wrote the input) while the audit read the fixed helper.
    code = _cached_kernel_calling_a_helper(tmp_path, "kmod")

    def before(i):
        _write_helper(tmp_path, "kmod", "a.flat[0] = 99\n    return 100.0"
                      if i == 0 else "return 100.0")
    first, second = _run_children(tmp_path, code, 2, before)
    assert first[0].startswith("REFUSED") and "writes to an input" in \
        first[0], first
    assert second == ["RAN [100.0] [0.0, 0.0, 0.0]"], second


def test_reading_through_flat_and_nditer_and_writing_outputs_runs(rng):
    # The same constructs over outputs, or only reading inputs: no refusal.
    op = numbax.numba_kernel(K.affine_through_nditer, spec((6, 5)))
    host = rng.uniform(-1, 1, (6, 5)).astype(np.float32)
    x = jnp.asarray(host)
    np.testing.assert_allclose(np.asarray(jax.jit(op)(x)), 2 * host + 1,
                               rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(x), host)
    listed = numbax.numba_kernel(K.writes_output_views_kept_in_a_list,
                                 spec((6, 5)))
    np.testing.assert_array_equal(np.asarray(jax.jit(listed)(x)), host)
    zipped = numbax.numba_kernel(
        K.affine_through_zipped_and_enumerated_nditers, spec((6, 5)))
    np.testing.assert_allclose(np.asarray(jax.jit(zipped)(x)), 2 * host + 1,
                               rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(x), host)
    # An aliased input is the output's buffer: nditer may write it (the
    # kernel sets out = 1, then zeroes x, the same buffer).
    alias = numbax.numba_kernel(K.zeroes_its_input_nditer, spec((8,)),
                                input_output_aliases={0: 0})
    y = rng.uniform(1, 2, 8).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(jax.jit(alias)(jnp.asarray(y))),
                                  np.zeros(8, np.float32))


def test_an_aliased_input_may_be_written(rng):
    # Aliased to output 0, input 0 is the output's buffer: writing it is
    # the in-place update aliases are for, and the output shows it.
    op = numbax.numba_kernel(K.zeroes_its_input, spec((8,)),
                             input_output_aliases={0: 0})
    host = rng.uniform(-1, 1, 8).astype(np.float32)
    got = np.asarray(jax.jit(op)(jnp.asarray(host)))
    np.testing.assert_array_equal(got, np.zeros(8, np.float32))


def test_a_0d_output_is_refused_naming_the_fix():
    # The message named only Numba's CUDA device arrays, on a CPU op.
    with pytest.raises(ValueError, match=r"outs\[0\] is 0-d \(a scalar\); "
                       r"numbax's kernels write.*numba_kernel's alike\): use "
                       r"shape \(1,\) and write out\[0\]"):
        numbax.numba_kernel(K.affine, spec(()))


def test_refuses_bad_options():
    with pytest.raises(ValueError, match="parallel must be None or 'xla'"):
        numbax.numba_kernel(K.affine, spec((4,)), parallel=True)
    for bad in (-1, 2.0, (2, 3), True):
        with pytest.raises(ValueError, match="launch_dims must be one "
                           "non-negative int"):
            numbax.numba_kernel(K.affine_range, spec((4,)), launch_dims=bad)
    with pytest.raises(ValueError, match="sharding_rule or launch_dims"):
        numbax.numba_kernel(K.affine_range, spec((4,)), launch_dims=4,
                            sharding_rule="i -> i")
    with pytest.raises(ValueError, match="numba_kernel: vmap_method must.*"
                       "got 'sequential_unrolled'.*'sequential', or None.*"
                       "use it"):
        numbax.numba_kernel(K.affine, spec((4,)),
                            vmap_method="sequential_unrolled")
    with pytest.raises(TypeError, match="outs must be a jax.ShapeDtypeStruct"):
        numbax.numba_kernel(K.affine, [])
    with pytest.raises(ValueError, match="alias"):
        numbax.numba_kernel(K.affine, spec((4,)),
                            input_output_aliases={0: 3})(jnp.ones(4, F32))


def test_lowering_for_a_gpu_is_refused_naming_the_op():
    op = numbax.numba_kernel(K.affine, spec((4,)))
    with pytest.raises(NotImplementedError, match=r"numba_kernel\(.*affine\)"
                       r": numba_kernel runs @njit kernels on JAX's CPU "
                       "backend only"):
        jax.export.export(jax.jit(op), platforms=["cuda"],
                          disabled_checks=numbax.export_disabled_checks())(
            spec((4,)))


def test_grad_is_refused_naming_the_op():
    op = numbax.numba_kernel(K.affine, spec((4,)))
    with pytest.raises(ValueError, match=r"numba_kernel\(.*affine\) cannot "
                       "be differentiated"):
        jax.grad(lambda v: op(v).sum())(jnp.ones(4, F32))


def test_four_parallel_true_ops_at_once_under_workqueue():
    # Numba's workqueue layer aborts the process ("Concurrent access has
    # been detected") when two threads run parallel=True code at once: four
    # independent ops in one jit, each spread over XLA's pool
    # (parallel='xla'), called from two Python threads, do. numbax runs such
    # kernels one at a time. In a child: an abort would end it.
    code = textwrap.dedent("""
        import threading
        import jax, jax.numpy as jnp, numpy as np, numba, numbax
        import cpu_kernels as K
        n = 1 << 18
        ops = [numbax.numba_kernel(k, jax.ShapeDtypeStruct((n,), jnp.float32),
                                   **kw)
               for k, kw in [(K.prange_affine_range,
                              dict(launch_dims=n, parallel="xla"))] * 2
               + [(K.prange_affine, {})] * 2]
        f = jax.jit(lambda *xs: [op(x) for op, x in zip(ops, xs)])
        xs = [jnp.full(n, float(i), jnp.float32) for i in range(4)]
        bad = []
        def work():
            for _ in range(30):
                ys = jax.block_until_ready(f(*xs))
                for i, y in enumerate(ys):
                    if not np.array_equal(np.asarray(y),
                                          np.full(n, 2.0 * i + 1)):
                        bad.append(i)
        threads = [threading.Thread(target=work) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not bad, bad
        assert numba.threading_layer() == "workqueue", numba.threading_layer()
        print("OK")
    """)
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               NUMBA_THREADING_LAYER="workqueue")
    env["PYTHONPATH"] = HERE + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, env=env, timeout=600, cwd=HERE)
    assert proc.returncode == 0 and "OK" in proc.stdout, (
        f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")

"""Errors name the user's op and the fix.

name= is checked alike for both op kinds; jax.grad through a kernel, the
export of two kernels sharing a name=, and jax.vmap of a callable made
without vmap_method each name the op instead of numbax's shared primitive.

Op names (`name=`): a bad name is refused naming the op; odd names
(separators of numbax's keys, 5000 characters, non-ASCII, a newline) run
right eagerly, under jit and vmap; two ops of one name keep their own
kernels, also for a program lowered before the second op existed and run
after its registry entry was evicted; jax.export refuses a shared name,
blaming the name, and round-trips a unique one.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from conftest import SIMULATOR, assert_close, grid_for, kernel_op, random_array
from shared_kernels import add_one

pytestmark = pytest.mark.gpu

SPEC = jax.ShapeDtypeStruct((8,), jnp.float32)


@cuda.jit
def double(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = 2 * x[i]


@cuda.jit
def triple(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = 3 * x[i]


def launch_double(x, out, stream):
    double[1, 32, stream](x, out)


# -- name= ---------------------------------------------------------------------

@pytest.mark.parametrize("bad", [123, ("a", 1), b"bytes", 1.5, True])
def test_non_str_name_is_refused_by_both_op_kinds(bad):
    with pytest.raises(TypeError, match=r"numba_cuda_kernel: name must be a "
                       r"str .* got"):
        numbax.numba_cuda_kernel(double, SPEC, launch_dims=8, name=bad)
    with pytest.raises(TypeError, match=r"numba_cuda_callable: name must be "
                       r"a str .* got"):
        numbax.numba_cuda_callable(launch_double, SPEC, name=bad)


@pytest.mark.parametrize("blank", ["", "   "])
def test_blank_name_is_refused_not_silently_dropped(blank):
    for make, label in (
            (lambda: numbax.numba_cuda_kernel(double, SPEC, launch_dims=8,
                                              name=blank), "numba_cuda_kernel"),
            (lambda: numbax.numba_cuda_callable(launch_double, SPEC,
                                                name=blank),
             "numba_cuda_callable")):
        with pytest.raises(ValueError, match=rf"{label}: name=.* is blank.*"
                           r"non-empty name, or leave name=None"):
            make()


@pytest.mark.parametrize("name", ["a\x00b", "\x00", "trailing\x00"])
def test_name_with_a_nul_is_refused_when_the_op_is_made(name):
    # Accepted before, then every call failed at run time ("embedded null
    # character" from the registry's resolve) naming no op.
    fixed = name.replace("\x00", "")
    for make, label in (
            (lambda: numbax.numba_cuda_kernel(double, SPEC, launch_dims=8,
                                              name=name),
             r"numba_cuda_kernel\(test_op_names\.double\)"),
            (lambda: numbax.numba_cuda_callable(launch_double, SPEC,
                                                name=name),
             r"numba_cuda_callable\(test_op_names\.launch_double\)"),
            (lambda: numbax.XLACustomKernel(name),
             r"XLACustomKernel\('.*'\)")):
        with pytest.raises(ValueError, match=(
                rf"^{label}: name=.* holds a NUL character \(at index "
                rf"{name.index(chr(0))}\), .* every call would fail at run "
                rf"time; give a name without it, e\.g\. "
                rf"name={re.escape(repr(fixed))}$")):
            make()


def test_valid_name_is_the_key_identity():
    op = numbax.numba_cuda_kernel(double, SPEC, launch_dims=8,
                                  name="op_names.double")
    x = jnp.arange(8, dtype=jnp.float32)
    np.testing.assert_allclose(np.asarray(op(x)), 2 * np.arange(8))
    text = jax.jit(op).lower(x).as_text()
    assert "op_names.double/kernel;" in text


# -- grad through a kernel -----------------------------------------------------

def test_grad_through_a_kernel_names_the_op_and_xlacustomkernel():
    op = numbax.numba_cuda_kernel(double, SPEC, launch_dims=8)
    x = jnp.ones(8, jnp.float32)
    for f in (lambda v: op(v).sum(), jax.jit(lambda v: op(v).sum())):
        with pytest.raises(ValueError) as info:
            jax.grad(f)(x)
        message = str(info.value)
        assert "numbax.numba_cuda_kernel(" in message and "double" in message
        assert "cannot be differentiated" in message
        assert "XLACustomKernel" in message and "def_jvp_rule" in message
        assert "numbax_kernel" not in message.split("(")[0]
    with pytest.raises(ValueError, match="cannot be differentiated"):
        jax.jvp(op, (x,), (x,))
    with pytest.raises(ValueError, match=r"numba_cuda_kernel\(.*double\) "
                       "cannot be differentiated"):
        jax.linear_transpose(op, x)(x)


# -- two kernels given one name= ----------------------------------------------

def test_export_of_two_kernels_sharing_a_name_blames_the_name():
    a = numbax.numba_cuda_kernel(double, SPEC, launch_dims=8,
                                 name="op_names.shared")
    b = numbax.numba_cuda_kernel(triple, SPEC, launch_dims=8,
                                 name="op_names.shared")
    x = jnp.ones(8, jnp.float32)
    # In this process each still runs its own kernel.
    np.testing.assert_allclose(np.asarray(jax.jit(a)(x)), 2.0)
    np.testing.assert_allclose(np.asarray(jax.jit(b)(x)), 3.0)
    with pytest.raises(ValueError) as info:
        jax.export.export(
            jax.jit(b), disabled_checks=numbax.export_disabled_checks())(x)
    message = str(info.value)
    assert message.startswith("numbax.numba_cuda_kernel(")
    assert "cannot export it" in message
    assert "the same name='op_names.shared'" in message
    assert "name= of its own" in message
    # Neither the op's vmap summary mid-sentence nor a wrong cause.
    assert "vmap:" not in message and "closures" not in message
    # A name of its own exports and round-trips.
    unique = numbax.numba_cuda_kernel(triple, SPEC, launch_dims=8, name="op_names.unique")
    exported = jax.export.export(
        jax.jit(unique), disabled_checks=numbax.export_disabled_checks())(x)
    try:
        back = jax.export.deserialize(exported.serialize())
    except ImportError:  # serialize needs the flatbuffers package
        back = exported
    np.testing.assert_allclose(np.asarray(back.call(x)), 3.0)


# -- vmap of a callable made without vmap_method ------------------------------

def test_vmap_of_callable_without_vmap_method_names_op_and_option():
    op = numbax.numba_cuda_callable(launch_double, SPEC)
    xs = jnp.ones((3, 8), jnp.float32)
    for f in (jax.vmap(op), jax.vmap(jax.jit(op)), jax.jit(jax.vmap(op))):
        with pytest.raises(NotImplementedError) as info:
            f(xs)
        message = str(info.value)
        assert "numba_cuda_callable(" in message and "launch_double" in message
        assert "vmap_method=" in message and "'sequential'" in message
    # Unbatched, the guard changes nothing.
    x = jnp.arange(8, dtype=jnp.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(op)(x)), 2 * np.arange(8))
    np.testing.assert_allclose(np.asarray(op(x)), 2 * np.arange(8))


def test_vmap_of_a_named_callable_without_vmap_method_names_its_name():
    # A lambda's qualified name (__main__.<lambda>) says
    # nothing; the message names the op's name= too.
    op = numbax.numba_cuda_callable(
        lambda x, out, stream: launch_double(x, out, stream), SPEC,
        name="op_names.named_lambda")
    xs = jnp.ones((3, 8), jnp.float32)
    for f in (jax.vmap(op), jax.vmap(jax.jit(op)), jax.jit(jax.vmap(op))):
        with pytest.raises(NotImplementedError, match=(
                r"^numba_cuda_callable\(test_op_names\.test_vmap_of_a_named"
                r"\w*\.<locals>\.<lambda>, name='op_names\.named_lambda'\) "
                r"was created without vmap_method.*vmap_method=")):
            f(xs)
    x = jnp.arange(8, dtype=jnp.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(op)(x)), 2 * np.arange(8))


# Before: each traced call of a callable made without vmap_method was
# wrapped in a jax.custom_batching.custom_vmap only to give the message
# above, which put a custom_vmap_call around every call in the jaxpr (more
# trace and lowering work). Now numbax's own primitive refuses in its
# batching rule: the same message, no custom_vmap, the same custom call.

def _unbatchable_ops():
    spec2 = (SPEC, SPEC)

    def two(x, y, a, b, scratch, stream):
        double[1, 32, stream](x, a)
        triple[1, 32, stream](y, b)

    return {
        "plain": (numbax.numba_cuda_callable(launch_double, SPEC), 1),
        "aliased, side effect, scratch": (numbax.numba_cuda_callable(
            two, spec2, input_output_aliases={1: 0}, has_side_effect=True,
            scratch=SPEC), 2),
        "capture": (numbax.numba_cuda_callable(launch_double, SPEC,
                                               capture=True), 1),
    }


@pytest.mark.parametrize("which", ["plain", "aliased, side effect, scratch",
                                   "capture"])
def test_callable_without_vmap_method_has_no_custom_vmap(which):
    op, n_in = _unbatchable_ops()[which]
    args = [jnp.arange(8, dtype=jnp.float32) + i for i in range(n_in)]
    for f in (op, jax.jit(op)):
        jaxpr = str(jax.make_jaxpr(f)(*args))
        assert "custom_vmap" not in jaxpr, jaxpr
    # vmap still names the op and vmap_method=, around jit or inside it.
    xs = [jnp.stack([a, a]) for a in args]
    for f in (jax.vmap(op), jax.vmap(jax.jit(op)), jax.jit(jax.vmap(op))):
        with pytest.raises(NotImplementedError) as info:
            f(*xs)
        message = str(info.value)
        assert "numba_cuda_callable(" in message and "was created without " \
            "vmap_method" in message and "vmap_method=..." in message
        assert "'sequential'" in message


@pytest.mark.parametrize("which", ["plain", "aliased, side effect, scratch",
                                   "capture"])
def test_callable_without_vmap_method_lowers_to_the_plain_custom_call(which):
    # The custom call XLA gets is the one jax.ffi.ffi_call builds for the
    # same target, key, layouts, aliases and side effect: nothing but the
    # Python wrapping changed.
    from numbax.runtime import targets
    op, n_in = _unbatchable_ops()[which]
    args = [jnp.arange(8, dtype=jnp.float32) + i for i in range(n_in)]
    key = op._key(args, op.input_output_aliases)
    specs = op.out_specs + op.scratch_specs
    target = (targets.CAPTURE_TARGET if op.capture
              else targets.CALLABLE_TARGET)
    n_out = len(op.out_specs)

    def reference(*xs):
        return list(jax.ffi.ffi_call(
            target, specs, input_layouts=[None] * len(xs),
            output_layouts=[None] * len(specs),
            input_output_aliases=op.input_output_aliases,
            has_side_effect=op.has_side_effect)(*xs, key=key))[:n_out]

    def custom_call(f):
        text = jax.jit(f).lower(*args).as_text()
        lines = [l.split("=", 1)[1].strip() for l in text.splitlines()
                 if "stablehlo.custom_call" in l]
        assert len(lines) == 1, text
        return lines[0]

    assert custom_call(op) == custom_call(reference)
    got = jax.jit(op)(*args)
    got = got if isinstance(got, (tuple, list)) else [got]
    np.testing.assert_allclose(np.asarray(got[0]), 2 * np.arange(8))


N = 64 if SIMULATOR else 4096
F32 = jnp.float32


@cuda.jit
def times_ten(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * 10


def make(maker, name):
    """An op computing x + 1, made by numba_cuda_<maker> with this name."""
    if maker == "kernel":
        return kernel_op(add_one, (N,), F32, name=name)

    def launch(x, out, stream):
        add_one[grid_for(N), 256, stream](x, out)

    return numbax.numba_cuda_callable(launch, jax.ShapeDtypeStruct((N,), F32), name=name,
                                      vmap_method="sequential")


MAKERS = ["kernel", "callable"]
ODD_NAMES = {"separators": "a/b;c=d", "5000 characters": "x" * 5000,
             "non-ASCII": "ünï©ødé ✓", "newline": "line\nbreak",
             "key fields": "in=float32[1];batch=3", "key fields 2": "gpu.k/callable;outs="}


@pytest.mark.usefixtures("x64")
@pytest.mark.parametrize("name", list(ODD_NAMES.values()), ids=list(ODD_NAMES))
@pytest.mark.parametrize("maker", MAKERS)
def test_odd_name_runs_right(maker, name, rng):
    try:
        op = make(maker, name)
    except (TypeError, ValueError) as exc:  # a refusal is fine if it names the op
        assert "numba_cuda_" in str(exc), f"a refusal that does not name the op: {exc}"
        return
    x = random_array(rng, N, np.float32)
    assert_close(op(x), x + 1, "eager")
    assert_close(jax.jit(op)(x), x + 1, "jit")
    xs = random_array(rng, (3, N), np.float32)
    assert_close(jax.vmap(op)(xs), xs + 1, "vmap")


@pytest.mark.usefixtures("x64")
def test_two_kernels_of_one_name_stay_apart(rng):
    a = kernel_op(add_one, (N,), F32, name="gpu_names.shared")
    b = kernel_op(times_ten, (N,), F32, name="gpu_names.shared")
    for _ in range(3):
        x = random_array(rng, N, np.float32)
        assert_close(jax.jit(a)(x), x + 1, "a")
        assert_close(jax.jit(b)(x), x * 10, "b")
        assert_close(a(x), x + 1, "a eager")
        assert_close(b(x), x * 10, "b eager")
        got_a, got_b = jax.jit(lambda v: (a(v), b(v)))(x)  # traced anew each round
        assert_close(got_a, x + 1, "a in a pair")
        assert_close(got_b, x * 10, "b in a pair")
    xs = random_array(rng, (3, N), np.float32)
    assert_close(jax.vmap(a)(xs), xs + 1, "vmap a")
    assert_close(jax.vmap(b)(xs), xs * 10, "vmap b")


@pytest.mark.usefixtures("x64")
def test_program_lowered_before_a_twin_runs_its_own_kernel_after_eviction(small_registry,
                                                                          rng):
    """A program lowered while its op was the only one of its name, run
    after a second op took the same name and the registry entry was
    evicted: it runs its own kernel (docs/architecture.md: an evicted entry
    is rebuilt from its key), never the other one's."""
    small_registry(4)
    a = kernel_op(add_one, (N,), F32, name="gpu_names.late_twin")
    x = random_array(rng, N, np.float32)
    lowered = jax.jit(a).lower(x)
    b = kernel_op(times_ten, (N,), F32, name="gpu_names.late_twin")
    assert_close(jax.jit(b)(x), x * 10, "b")
    for n in range(1, 9):  # flood the registry: a's entry is evicted
        assert_close(jax.jit(kernel_op(add_one, (n,), F32))(x[:n]), x[:n] + 1, f"flood {n}")
    got = np.asarray(lowered.compile()(x))
    assert not np.allclose(got, x * 10), "ran the OTHER op's kernel (x * 10)"
    assert_close(got, x + 1, "a's program, lowered before the twin")

"""Errors name the user's op and the fix.

name= is checked alike for both op kinds; jax.grad through a kernel, the
export of two kernels sharing a name=, and jax.vmap of a callable made
without vmap_method each name the op instead of numbax's shared primitive.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax

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


# -- item 7: name= -------------------------------------------------------------

@pytest.mark.parametrize("bad", [123, ("a", 1), b"bytes", 1.5])
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


# -- item 9: grad through a kernel ----------------------------------------------

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


def test_kernel_under_grad_with_stopped_inputs_still_runs():
    op = numbax.numba_cuda_kernel(double, SPEC, launch_dims=8)
    x = jnp.arange(8, dtype=jnp.float32)

    def f(w):
        return (op(jax.lax.stop_gradient(x)) * w).sum()
    g = jax.grad(f)(jnp.float32(1.0))
    assert float(g) == pytest.approx(float(2 * np.arange(8).sum()))


# -- item 10: two kernels given one name= -------------------------------------

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


# -- item 11: vmap of a callable made without vmap_method ----------------------

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
    # Issue 43, M: a lambda's qualified name (__main__.<lambda>) says
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

"""Errors name the user's op and the fix (issue 24, items 7, 9, 10 and 11).

name= is checked alike for both op kinds; jax.grad through a kernel, the
export of two kernels sharing a name=, and jax.vmap of a callable made
without vmap_method each name the op instead of numbax's shared primitive.
"""

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

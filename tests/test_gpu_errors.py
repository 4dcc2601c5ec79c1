"""Errors on the GPU paths: a func that raises or makes a launch CUDA
refuses fails that call alone (30 calls, failing and good in turn);
vmap_fold refuses whatever a call refuses, with the same error; grad, jvp,
vjp and grad of vmap of an op without rules, and vmap of a callable without
a vmap_method, raise errors that name the op (and the missing option).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numbax
from conftest import SIMULATOR, assert_close, assert_raises, grid_for, kernel_op, outcome
from shared_kernels import add_one

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("x64")]

N = 64 if SIMULATOR else 4096
F32 = jnp.float32
SPEC = jax.ShapeDtypeStruct((N,), F32)


def f32(rng, shape):
    return rng.standard_normal(shape).astype(np.float32)


def add_one_launch(x, out, stream):
    add_one[grid_for(N), 256, stream](x, out)


def test_func_exceptions_and_bad_launches_between_good_calls(rng):
    state = {"fail": None}

    def launch(x, out, stream):
        if state["fail"] == "zero":
            1 / 0  # noqa: B018  (raises on purpose)
        if state["fail"] == "launch":
            add_one[1, 2048, stream](x, out)  # a block size CUDA refuses
            return
        add_one[grid_for(N), 256, stream](x, out)

    op = jax.jit(numbax.numba_cuda_callable(launch, SPEC))
    for i in range(30):
        x = f32(rng, N)
        mode = (None, "zero", "launch")[i % 3]
        if SIMULATOR and mode == "launch":  # the simulator takes 2048 threads
            mode = "zero"
        state["fail"] = mode
        if mode is None:
            assert_close(op(x), x + 1, f"good call {i}")
        else:
            assert_raises((jax.errors.JaxRuntimeError, ValueError), op, x,
                          contains=("ZeroDivisionError",) if mode == "zero" else (),
                          what=f"{mode} call {i}")
    state["fail"] = None
    assert_close(op(x), x + 1, "final")


# Argument sets a call refuses, or takes; vmap_fold must answer alike.
ODD_ARGS = {
    "no args": lambda x: (),
    "two args": lambda x: (x, x),
    "python float": lambda x: (1.5,),
    "0-d": lambda x: (jnp.float32(2.0),),
    "None": lambda x: (None,),
    "string": lambda x: ("abc",),
    "dict": lambda x: ({"a": 1},),
    "float8": lambda x: (jnp.zeros(N, jnp.float8_e4m3fn),),
    "list": lambda x: ([1.0] * N,),
    "int4": lambda x: (jnp.zeros(N, jnp.int4),),
    "2-d": lambda x: (jnp.zeros((4, N), jnp.float32),),
}
# A kernel typing error: the simulator finds it when the kernel runs, after
# the call was traced, so vmap_fold cannot know it.
TYPED_AT_RUN_TIME_IN_THE_SIMULATOR = ("2-d",)
# Scalars alone: vmap_fold refuses them (TypeError naming the op: jax.vmap
# has no array to batch) whatever the call does (issue 43, L).
FOLD_REFUSES_SCALARS_ALONE = ("python float",)


@pytest.mark.parametrize("label", ODD_ARGS)
def test_vmap_fold_refuses_what_the_call_refuses(label, rng):
    if SIMULATOR and label in TYPED_AT_RUN_TIME_IN_THE_SIMULATOR:
        pytest.skip("the simulator finds this kernel typing error at run time")
    if label == "int4" and not hasattr(jnp, "int4"):
        pytest.skip("this JAX has no int4")
    op = kernel_op(add_one, (N,), F32)
    args = ODD_ARGS[label](jnp.asarray(f32(rng, N)))
    call = outcome(lambda: jax.block_until_ready(op(*args)))
    fold = outcome(op.vmap_fold, *args)
    if label in FOLD_REFUSES_SCALARS_ALONE:
        assert fold == ("err", "TypeError"), fold
        assert_raises(TypeError, op.vmap_fold, *args,
                      contains=("numba_cuda_kernel(", "every input is a scalar"))
        return
    if call[0] == "err":
        assert fold[0] == "err", f"the call raises {call[1]}, vmap_fold gives {fold[1]}"
        assert call[1] == fold[1], f"the call raises {call[1]}, vmap_fold {fold[1]}"
    else:
        assert fold[0] == "ok", f"the call works, vmap_fold raises {fold[1]}"
    if fold[0] == "err" and fold[1] not in ("TypeError", "ValueError"):
        # A kernel Numba cannot type for these arrays: Numba's own
        # TypingError, raised at trace time with the op named first, is the
        # documented contract (docs/errors.md).
        try:
            op.vmap_fold(*args)
        except Exception as exc:  # noqa: BLE001
            message = str(exc)
        assert fold[1] == "TypingError", f"a raw {fold[1]}"
        assert "numba_cuda_kernel(" in message and "could not compile" in message, message


def test_vmap_fold_takes_shape_dtype_structs():
    decision = kernel_op(add_one, (N,), F32).vmap_fold(SPEC)
    assert hasattr(decision, "folds"), decision


DIFFERENTIATE = {
    "grad": lambda op, x: jax.grad(lambda v: op(v).sum())(x),
    "jit(grad)": lambda op, x: jax.jit(jax.grad(lambda v: op(v).sum()))(x),
    "jvp": lambda op, x: jax.jvp(op, (x,), (jnp.ones_like(x),)),
    "vjp": lambda op, x: jax.vjp(op, x)[1](jnp.ones_like(x)),
    "grad(vmap)": lambda op, x: jax.grad(lambda v: jax.vmap(op)(v[None]).sum())(x),
}


def add_one_op(maker):
    """x + 1 by numba_cuda_<maker>, and the name its errors give the op."""
    if maker == "kernel":
        return kernel_op(add_one, (N,), F32), "add_one"
    return numbax.numba_cuda_callable(add_one_launch, SPEC, vmap_method="sequential"), \
        "add_one_launch"


@pytest.mark.parametrize("how", DIFFERENTIATE)
@pytest.mark.parametrize("maker", ["kernel", "callable"])
def test_differentiating_an_op_without_rules_names_it(maker, how, rng):
    op, name = add_one_op(maker)
    assert_raises((ValueError, TypeError, NotImplementedError), DIFFERENTIATE[how], op,
                  jnp.asarray(f32(rng, N)), contains=(f"numba_cuda_{maker}", name))


@pytest.mark.parametrize("maker", ["kernel", "callable"])
def test_stop_gradient_around_an_op_without_rules(maker, rng):
    op, _ = add_one_op(maker)
    x = jnp.asarray(f32(rng, N))
    g = jax.grad(lambda v, w: op(jax.lax.stop_gradient(v)).sum() + (w ** 2).sum(),
                 argnums=1)(x, x)
    assert_close(g, 2 * np.asarray(x), "stop_gradient")


def test_vmap_of_a_callable_without_vmap_method_names_op_and_option(rng):
    op = numbax.numba_cuda_callable(add_one_launch, SPEC)
    xs = jnp.asarray(f32(rng, (3, N)))
    for how, f in (("vmap", jax.vmap(op)), ("jit(vmap)", jax.jit(jax.vmap(op))),
                   ("vmap(jit)", jax.vmap(jax.jit(op)))):
        assert_raises(NotImplementedError, f, xs, what=how,
                      contains=("numba_cuda_callable(", "add_one_launch", "vmap_method"))
    assert_close(jax.jit(op)(np.asarray(xs[0])), np.asarray(xs[0]) + 1, "unbatched")

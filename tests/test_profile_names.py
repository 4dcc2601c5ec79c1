"""Op names in profiles.

Each op's custom call carries its name (``name=``, else the kernel's or
func's qualified name; an XLACustomKernel's own name) in the lowered
module's locations and in the compiled HLO: the instruction is named after
it and ``metadata={op_name=...}`` ends with it, which is what JAX's
profiler, TensorBoard and XLA dumps show. The same name reaches C++ (the
kernel op's LaunchPlan, the callable's resolve result), where each call on
a GPU is an NVTX range (csrc/nvtx.h; tests/cpp/nvtx_test.cc).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from numbax import _core
from numbax.runtime import registry

pytestmark = pytest.mark.gpu

N = 16
SPEC = jax.ShapeDtypeStruct((N,), jnp.float32)


@cuda.jit
def double(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = 2 * x[i]


def launch_double(x, out, stream):
    double[1, 32, stream](x, out)


def launch_double_flat(x, out, stream):
    # Any shape (a vmapped call's batch too): one flat launch.
    n = out.size
    double[(n + 31) // 32, 32, stream](x.reshape(n), out.reshape(n))


def hlo_texts(f, *args):
    """(lowered module with locations, compiled HLO) of jax.jit(f)."""
    lowered = jax.jit(f).lower(*args)
    return lowered.as_text(debug_info=True), lowered.compile().as_text()


def custom_calls(hlo: str) -> list[tuple[str, str]]:
    """(instruction name, op_name) of every custom call in compiled HLO."""
    out = []
    for line in hlo.splitlines():
        if "custom-call(" not in line:
            continue
        name = re.search(r"%([\w.\-]+) = ", line).group(1)
        op_name = re.search(r'op_name="([^"]*)"', line)
        out.append((name, op_name.group(1) if op_name else ""))
    return out


def assert_named(f, args, name, *, op_name_tail=None):
    lowered, compiled = hlo_texts(f, *args)
    tail = op_name_tail or name
    assert re.search(rf'loc\("[^"]*/{re.escape(tail)}"', lowered), lowered
    calls = custom_calls(compiled)
    assert calls, compiled
    for instruction, op_name in calls:
        assert op_name.endswith("/" + tail), (op_name, compiled)
        # XLA names the instruction after the op (its own sanitising of
        # characters such as '.', '<' and '>' aside).
        stem = re.sub(r"[^\w]", "_", name.rsplit("/", 1)[-1])
        assert re.sub(r"[^\w]", "_", instruction).startswith(stem), \
            (instruction, compiled)
    return calls


def x():
    return jnp.arange(N, dtype=jnp.float32)


def test_kernel_op_is_named_after_its_kernel():
    op = numbax.numba_cuda_kernel(double, SPEC, launch_dims=N)
    assert op.profile_name == "double"
    calls = assert_named(lambda v: op(v) + 1, [x()], "double")
    assert all(op_name == "jit(<lambda>)/double" for _, op_name in calls)
    np.testing.assert_allclose(np.asarray(jax.jit(op)(x())), 2 * np.asarray(x()))


def test_kernel_op_name_wins():
    op = numbax.numba_cuda_kernel(double, SPEC, launch_dims=N,
                                  name="my_double")
    assert op.profile_name == "my_double"
    assert_named(op, [x()], "my_double")


def test_callable_is_named_after_its_func():
    op = numbax.numba_cuda_callable(launch_double, SPEC)
    assert op.profile_name == "launch_double"
    assert_named(lambda v: op(v) * 3, [x()], "launch_double")
    named = numbax.numba_cuda_callable(launch_double, SPEC, name="doubler")
    assert_named(named, [x()], "doubler")


@pytest.mark.parametrize("vmap_method", ["sequential", "expand_dims",
                                         "broadcast_all"])
def test_callable_with_vmap_method_is_named_plain_and_vmapped(vmap_method):
    op = numbax.numba_cuda_callable(launch_double_flat, SPEC,
                                    vmap_method=vmap_method,
                                    name=f"doubler_{vmap_method}")
    assert_named(op, [x()], op.profile_name)
    # Every method, sequential too, is one custom call for the batch.
    assert_named(jax.vmap(op), [jnp.stack([x(), x()])], op.profile_name)
    got = jax.jit(jax.vmap(op))(jnp.stack([x(), x() + 1]))
    np.testing.assert_allclose(np.asarray(got),
                               2 * np.stack([x(), x() + 1]))


def test_names_sit_under_jax_scopes_and_vmap():
    op = numbax.numba_cuda_kernel(double, SPEC, launch_dims=N)

    def f(v):
        with jax.named_scope("outer"):
            return op(v)
    calls = assert_named(f, [x()], "double")
    assert calls[0][1] == "jit(f)/outer/double"
    calls = assert_named(jax.vmap(op), [jnp.stack([x(), x()])], "double")


def test_local_kernels_keep_their_qualified_name():
    @cuda.jit
    def triple(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = 3 * x[i]

    op = numbax.numba_cuda_kernel(triple, SPEC, launch_dims=N)
    qualname = ("test_local_kernels_keep_their_qualified_name.<locals>"
                ".triple")
    assert op.profile_name == qualname
    assert_named(op, [x()], qualname)


def test_custom_kernel_ops_take_its_name():
    op = numbax.XLACustomKernel("test_profile_names.scale")

    @op.def_numba_cuda_kernel
    def _(*, factor, outs):
        @cuda.jit
        def kernel(x, out):
            i = cuda.grid(1)
            if i < out.shape[0]:
                out[i] = factor * x[i]
        return numbax.numba_cuda_kernel(kernel, outs, launch_dims=N)

    def f(v):
        return op(v, outs=SPEC, factor=2.0)
    calls = assert_named(f, [x()], "test_profile_names.scale")
    # Once, not scale/scale: the op's scope and its kernel's name are one.
    assert calls[0][1] == "jit(f)/test_profile_names.scale"
    np.testing.assert_allclose(np.asarray(jax.jit(f)(x())),
                               2 * np.asarray(x()))


def test_custom_kernel_scopes_what_a_plain_generator_returns():
    op = numbax.XLACustomKernel("test_profile_names.wrapped")
    inner = numbax.numba_cuda_kernel(double, SPEC, launch_dims=N,
                                     name="inner_double")

    @op.def_numba_cuda_kernel
    def _(*, outs):
        return lambda v: inner(v) + 1  # a function around a numbax op

    def f(v):
        return op(v, outs=SPEC)
    calls = assert_named(f, [x()], "inner_double")
    assert calls[0][1] == "jit(f)/test_profile_names.wrapped/inner_double"
    assert inner.profile_name == "inner_double"  # not renamed


def test_the_name_reaches_the_resolver_result():
    kernel_op = numbax.numba_cuda_kernel(double, SPEC, launch_dims=N,
                                         name="resolved_kernel")
    callable_op = numbax.numba_cuda_callable(launch_double, SPEC,
                                             name="resolved_callable")
    for op, name in ((kernel_op, "resolved_kernel"),
                     (callable_op, "resolved_callable")):
        text = jax.jit(op).lower(x()).as_text()
        key = re.search(r'key = "([^"]*)"', text).group(1)
        if numbax.simulator_enabled() or op is callable_op:
            platform = "cpu" if numbax.simulator_enabled() else "cuda"
            resolved = registry._resolve_callable(key, platform)
            assert resolved[6] == name
        else:
            assert registry._resolve_kernel(key).name == name


def test_launch_plan_carries_the_name():
    kw = dict(owner=object(), functions=[], num_inputs=1, num_outputs=1,
              grid=[1, 1, 1], block=[32, 1, 1], shared_mem=0,
              cooperative=False, empty_launch=False, batch=0,
              broadcast=[False], fold_axis=-1, max_slices=65535, abi=0,
              aliases=[], scalars=[], lead_units=[], trail_units=[],
              grid_from=[-1, -1, -1])
    assert _core.LaunchPlan(**kw).name == ""
    assert _core.LaunchPlan(**kw, name="double").name == "double"


def test_no_nvtx_tool_here():
    # The test processes run under no profiler: ranges cost nothing.
    assert _core.nvtx_attached() is False

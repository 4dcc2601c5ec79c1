"""Op names in profiles.

Each op's custom call carries its name (``name=``, else the kernel's or
func's qualified name; an XLACustomKernel's own name) in the lowered
module's locations and in the compiled HLO: the instruction is named after
it and ``metadata={op_name=...}`` ends with it, which is what JAX's
profiler, TensorBoard and XLA dumps show. The same name reaches C++ (the
kernel op's LoadedKernel, the callable's resolve result), where each call on
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


def test_loaded_kernel_carries_the_name():
    kw = dict(owner=object(), functions=[], num_inputs=1, num_outputs=1,
              grid=[1, 1, 1], block=[32, 1, 1], shared_mem=0,
              cooperative=False, empty_launch=False, batch=0,
              broadcast=[False], fold_axis=-1, max_slices=65535, abi=0,
              aliases=[], scalars=[], lead_units=[], trail_units=[],
              grid_from=[-1, -1, -1])
    assert _core.LoadedKernel(**kw).name == ""
    assert _core.LoadedKernel(**kw, name="double").name == "double"


def test_no_nvtx_tool_here():
    # The test processes run under no profiler: ranges cost nothing.
    assert _core.nvtx_attached() is False


# --- A name belongs to the use ---------------------------------
# Interned kernel ops (or one callable op a generator returns) are shared by
# every XLACustomKernel whose generator returns them and by plain calls: the
# first XLACustomKernel's name once stuck to the op, and every later use was
# profiled (HLO and NVTX) under it.

def _keys(f, *args):
    """The numbax keys of jax.jit(f)'s custom calls, in program order."""
    return re.findall(r'key = "([^"]*)"', jax.jit(f).lower(*args).as_text())


def _nvtx_name(key):
    """The name C++ pushes an NVTX range with for `key`'s calls."""
    if numbax.simulator_enabled() or key.split("/")[1].startswith("callable"):
        platform = "cpu" if numbax.simulator_enabled() else "cuda"
        return registry._resolve_callable(key, platform)[6]
    return registry._resolve_kernel(key).name


def _two_custom_kernels(prefix, make):
    """Two XLACustomKernels whose generators both return `make(outs)`."""
    cks = [numbax.XLACustomKernel(f"test_profile_names.{prefix}_{i}")
           for i in (1, 2)]
    for ck in cks:
        ck.def_numba_cuda_kernel(lambda *, outs: make(outs))
    return cks


@pytest.mark.parametrize("kind", ["kernel", "callable"])
def test_an_op_shared_by_two_custom_kernels_is_named_per_use(kind):
    if kind == "kernel":
        plain = numbax.numba_cuda_kernel(double, SPEC, launch_dims=N)

        def make(outs):
            # A new op each time, interned: the same object as `plain`.
            return numbax.numba_cuda_kernel(double, outs, launch_dims=N)
        qualname = "double"
    else:
        plain = numbax.numba_cuda_callable(launch_double, SPEC)

        def make(outs):
            return plain
        qualname = "launch_double"
    first, second = _two_custom_kernels(f"shared_{kind}", make)
    v = x()
    # Each alone first, the plain use traced last (it once took the first
    # XLACustomKernel's name), then all three in one program, where JAX's
    # lowering cache would merge equal equations.
    assert_named(lambda v: first(v, outs=SPEC), [v], first.name)
    assert_named(lambda v: second(v, outs=SPEC), [v], second.name)
    assert_named(plain, [v], qualname)
    assert plain.profile_name == qualname

    def together(v):
        return (first(v, outs=SPEC), second(v, outs=SPEC), plain(v),
                jax.vmap(lambda w: second(w, outs=SPEC))(
                    jnp.stack([v, v + 1])))
    _, compiled = hlo_texts(together, v)
    # Each custom call's op_name ends with its use's name (the vmapped one
    # under vmap's scopes, a loop's for the callable).
    names = sorted(op_name.rsplit("/", 1)[-1]
                   for _, op_name in custom_calls(compiled))
    assert names == sorted([first.name, second.name, qualname,
                            second.name]), compiled
    # The NVTX range of each call (the registry entry of its key) too.
    keys = _keys(together, v)
    assert sorted(_nvtx_name(k) for k in keys) == sorted(
        [first.name, second.name, qualname, second.name]), keys
    got = [np.asarray(r) for r in jax.jit(together)(v)]
    want = 2 * np.asarray(v)
    for r in got[:3]:
        np.testing.assert_allclose(r, want)
    np.testing.assert_allclose(got[3], [want, want + 2])


def test_a_use_name_in_a_key_reads_back():
    # The name is quoted in the key's call part: a process that resolves
    # the key (a deserialised program) names the range as the tracer did.
    from numbax.kernel import calls
    from numbax.runtime import keys
    odd = "ck/with;odd=chars,a:b%2F and spaces"
    assert keys.parse_profile(keys.spec_fields(
        "in=float32[4]" + keys.profile_spec(odd))) == odd
    assert keys.profile_spec(None) == ""
    ck = numbax.XLACustomKernel(odd)
    op = numbax.numba_cuda_kernel(double, SPEC, launch_dims=N)
    ck.def_numba_cuda_kernel(lambda *, outs: op)
    (key,) = _keys(lambda v: ck(v, outs=SPEC), x())
    call_part = keys.split_key(key)[1]
    assert calls.parse(op, call_part)[4].name == odd
    assert _nvtx_name(key) == odd
    (plain_key,) = _keys(op, x())
    assert "prof=" not in plain_key and _nvtx_name(plain_key) == "double"

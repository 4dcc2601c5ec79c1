"""A folded vmap sees the module globals the unbatched kernel was compiled with.

Numba freezes the globals a kernel reads when it compiles it. The folded
vmap compiles the body again inside a generated kernel: before, from the
module as it was then, so a global changed after the first call gave the
old value in a single call and under 'sequential', and the new one under a
folded jax.vmap. Now the batched body is compiled against the values numbax
noted right before the unbatched compile (fold.note_compile); where Numba
compiled the kernel without numbax, a body reading such globals does not
fold, and vmap_fold says why.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from numba import cuda

import numbax
from numbax.compilers import fold, numba_cuda

SCALE = 1.0
OFFSETS = np.array([1.0, 2.0], np.float32)
N = 64


@cuda.jit
def scale_by_global(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * SCALE + OFFSETS[0]


@pytest.fixture
def restore_globals():
    saved = SCALE, OFFSETS.copy()
    yield
    globals()["SCALE"] = saved[0]
    OFFSETS[:] = saved[1]


@pytest.mark.gpu
def test_folded_vmap_uses_the_values_the_kernel_was_compiled_with(
        gpu_only, restore_globals, rng):
    op = numbax.numba_cuda_kernel(
        scale_by_global, jax.ShapeDtypeStruct((N,), jnp.float32),
        launch_dims=N)
    x = rng.standard_normal(N).astype(np.float32)
    xs = rng.standard_normal((3, N)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(op)(x)), x + 1, rtol=1e-6)
    # Changed after Numba compiled the kernel: frozen at 1.0 and 1.0.
    globals()["SCALE"] = 5.0
    OFFSETS[0] = 100.0
    assert op.vmap_fold(x).folds
    np.testing.assert_allclose(np.asarray(jax.jit(op)(x)), x + 1, rtol=1e-6)
    for f in (jax.vmap(op), jax.jit(jax.vmap(op)), jax.jit(jax.vmap(
            numbax.numba_cuda_kernel(
                scale_by_global, jax.ShapeDtypeStruct((N,), jnp.float32),
                launch_dims=N, vmap_method="sequential")))):
        np.testing.assert_allclose(np.asarray(f(xs)), xs + 1, rtol=1e-6)


@pytest.mark.gpu
def test_kernel_numba_compiled_first_does_not_fold_and_says_why(
        gpu_only, restore_globals, rng):
    @cuda.jit
    def scaled(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = x[i] * SCALE

    x = rng.standard_normal(N).astype(np.float32)
    out = cuda.device_array(N, np.float32)
    scaled[1, N](cuda.to_device(x), out)  # Numba compiles, SCALE = 1.0
    globals()["SCALE"] = 3.0
    op = numbax.numba_cuda_kernel(
        scaled, jax.ShapeDtypeStruct((N,), jnp.float32), launch_dims=N)
    decision = op.vmap_fold(x)
    assert not decision.folds
    assert "module globals (SCALE)" in decision.reason
    xs = rng.standard_normal((3, N)).astype(np.float32)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(op))(xs)), xs,
                               rtol=1e-6)


# -- the helpers, without a GPU -----------------------------------------

def test_globals_read_copies_what_numba_freezes(restore_globals):
    values = fold.globals_read(scale_by_global.py_func)
    assert values["SCALE"] == 1.0
    assert values["OFFSETS"] is not OFFSETS  # a copy, as Numba's
    np.testing.assert_array_equal(values["OFFSETS"], OFFSETS)
    assert "cuda" not in values  # modules and code are not values


def test_with_globals_reads_the_noted_values(restore_globals):
    def reads():
        return SCALE, OFFSETS[0]
    frozen = fold.globals_read(reads)
    globals()["SCALE"] = 9.0
    OFFSETS[0] = 50.0
    clone = fold.with_globals(reads, frozen)
    assert clone() == (1.0, 1.0)
    assert reads() == (9.0, 50.0)
    assert clone.__qualname__ == reads.__qualname__
    assert fold.with_globals(reads, {}) is reads


def test_unknown_values_block_the_fold_only_for_bodies_reading_globals():
    class Kernel:  # stands for a dispatcher
        def __init__(self, py_func):
            self.py_func = py_func

    def reads(x):
        return x * SCALE

    def pure(x):
        return x * 2

    a, b = Kernel(reads), Kernel(pure)
    fold.note_compiled_elsewhere(a, ("t",))
    fold.note_compiled_elsewhere(b, ("t",))
    assert "module globals (SCALE)" in fold.unknown_globals_reason(a, ("t",))
    assert fold.unknown_globals_reason(b, ("t",)) is None
    c = Kernel(reads)
    fold.note_compile(c, ("t",))
    assert fold.unknown_globals_reason(c, ("t",)) is None
    assert fold.frozen_globals(c, ("t",)) == {"SCALE": SCALE}


# -- closures and attributes of the user's modules (hostile pass) -----------
#
# Numba freezes closure variables and a module's attributes (cfg.SCALE) at
# compile time too: the batched body compiled later must not read values
# changed since, or must not fold.

CFG = types.ModuleType("numbax_test_fold_cfg")
CFG.SCALE = 2.0


def _launch_batched(kernel, frozen, xs):
    batched = numba_cuda.COMPILER.batched_kernel(
        kernel, 2, (False, False), 2, frozen, ())
    out = np.zeros_like(xs)
    batched[(1, 1, xs.shape[0]), (xs.shape[1], 1, 1)](xs, out)
    return out


def test_batched_body_reads_the_closure_values_numba_froze():
    scale = np.array([2.0], np.float32)
    factor = 3.0

    @cuda.jit
    def closed(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = x[i] * scale[0] * factor

    fold.note_compile(closed, ("closure",))
    scale[0] = 7.0  # in place, after Numba froze a copy
    frozen = fold.frozen_globals(closed, ("closure",))
    xs = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(_launch_batched(closed, frozen, xs), 6.0)
    assert scale[0] == 7.0  # the caller's array is left alone


def test_batched_body_does_not_read_a_changed_module_attribute():
    @cuda.jit
    def via_module(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = x[i] * CFG.SCALE

    fold.note_compile(via_module, ("attr",))
    xs = np.ones((3, 4), np.float32)
    frozen = fold.frozen_globals(via_module, ("attr",))
    # Unchanged: folds, and reads the value Numba froze.
    np.testing.assert_array_equal(_launch_batched(via_module, frozen, xs),
                                  2.0)
    CFG.SCALE = 5.0
    try:
        # Changed: the batched kernel is not built (the op then does not
        # fold, saying why), rather than reading 5.0.
        with pytest.raises(ValueError, match=r"CFG\.SCALE changed"):
            _launch_batched(via_module, frozen, xs)
    finally:
        CFG.SCALE = 2.0


def test_unknown_values_count_closures_and_module_attributes():
    class Kernel:  # stands for a dispatcher
        def __init__(self, py_func):
            self.py_func = py_func

    arr = np.ones(2)

    def closed(x):
        return x * arr[0]

    def via_module(x):
        return x * CFG.SCALE

    a, b = Kernel(closed), Kernel(via_module)
    fold.note_compiled_elsewhere(a, ("t",))
    fold.note_compiled_elsewhere(b, ("t",))
    assert "arr" in fold.unknown_globals_reason(a, ("t",))
    assert "(CFG.SCALE)" in fold.unknown_globals_reason(
        b, ("t",))


@pytest.mark.gpu
def test_folded_vmap_keeps_closure_values_and_module_attributes(
        gpu_only, rng):
    scale = np.array([2.0], np.float32)

    @cuda.jit
    def closed(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = x[i] * scale[0]

    @cuda.jit
    def via_module(x, out):
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = x[i] * CFG.SCALE

    spec = jax.ShapeDtypeStruct((N,), jnp.float32)
    by_closure = numbax.numba_cuda_kernel(closed, spec, launch_dims=N)
    by_module = numbax.numba_cuda_kernel(via_module, spec, launch_dims=N)
    x = rng.standard_normal(N).astype(np.float32)
    xs = rng.standard_normal((3, N)).astype(np.float32)
    for op in (by_closure, by_module):  # compiled: Numba froze 2.0
        np.testing.assert_allclose(np.asarray(jax.jit(op)(x)), 2 * x,
                                   rtol=1e-6)
    scale[0] = 7.0
    CFG.SCALE = 5.0
    try:
        for op in (by_closure, by_module):
            np.testing.assert_allclose(
                np.asarray(jax.jit(jax.vmap(op))(xs)), 2 * xs, rtol=1e-6)
        # The closure's frozen value is given to the batched body: it
        # folds. The module's attribute cannot be: it does not, and says so.
        assert by_closure.vmap_fold(x).folds
        decision = by_module.vmap_fold(x)
        assert not decision.folds
        assert "CFG.SCALE changed" in decision.reason
    finally:
        CFG.SCALE = 2.0

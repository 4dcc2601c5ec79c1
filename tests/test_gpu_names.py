"""Op names (`name=`): a bad name is refused naming the op; odd names
(separators of numbax's keys, 5000 characters, non-ASCII, a newline) run
right eagerly, under jit and vmap; two ops of one name keep their own
kernels, also for a program lowered before the second op existed and run
after its registry entry was evicted; jax.export refuses a shared name,
blaming the name, and round-trips a unique one.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export as jexport
from numba import cuda

import numbax
from conftest import SIMULATOR, assert_close, assert_raises, grid_for, kernel_op, random_array
from shared_kernels import add_one

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("x64")]

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
BAD_NAMES = [(123, TypeError), (("a", 1), TypeError), ("", ValueError), ("   ", ValueError),
             (b"bytes", TypeError), (True, TypeError)]
ODD_NAMES = {"separators": "a/b;c=d", "5000 characters": "x" * 5000,
             "non-ASCII": "ünï©ødé ✓", "newline": "line\nbreak",
             "key fields": "in=float32[1];batch=3", "key fields 2": "gpu.k/callable;outs="}


@pytest.mark.parametrize("name, error", BAD_NAMES, ids=[repr(n) for n, _ in BAD_NAMES])
@pytest.mark.parametrize("maker", MAKERS)
def test_bad_name_is_refused_naming_the_op(maker, name, error):
    assert_raises(error, make, maker, name, contains=(f"numba_cuda_{maker}",))


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


def test_export_refuses_a_shared_name_and_round_trips_a_unique_one(rng):
    a = kernel_op(add_one, (N,), F32, name="gpu_names.export_shared")
    b = kernel_op(times_ten, (N,), F32, name="gpu_names.export_shared")
    sds = jax.ShapeDtypeStruct((N,), F32)
    x = random_array(rng, N, np.float32)
    jax.block_until_ready((jax.jit(a)(x), jax.jit(b)(x)))
    checks = numbax.export_disabled_checks()
    exc = assert_raises(ValueError, jexport.export(jax.jit(a), disabled_checks=checks), sds,
                        contains=("numba_cuda_kernel(", "gpu_names.export_shared"))
    assert "closures made by one factory" not in str(exc), str(exc)[:200]
    assert "vmap:" not in str(exc), f"a vmap summary in the message: {str(exc)[:200]}"
    unique = kernel_op(times_ten, (N,), F32, name="gpu_names.export_unique")
    exported = jexport.export(jax.jit(unique), disabled_checks=checks)(sds)
    try:
        back = jexport.deserialize(exported.serialize())
    except ImportError:  # serialize needs the flatbuffers package
        back = exported
    assert_close(back.call(x), x * 10, "deserialised call")

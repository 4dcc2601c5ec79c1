"""The registry of op keys stays bounded: a kernel op vmapped over 60 batch
sizes with the bound lowered to 8 entries (and 4 launchers) keeps right
results for evicted sizes, for a program lowered before the eviction and
after clear_caches(); callables over 150 shapes stay within the default
bound.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import numbax
from conftest import SIMULATOR, assert_close, grid_for, kernel_op, random_array
from shared_kernels import add_one

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("x64")]

M = 16 if SIMULATOR else 64
# The bound numbax.clear_caches() documents.
DEFAULT_BOUND = 4096


def total_entries():
    return sum(numbax.registry_size())


def test_kernel_vmap_over_many_batch_sizes_with_a_small_bound(small_registry, rng):
    small_registry(8, launchers=4)
    op = kernel_op(add_one, (M,), jnp.float32)
    f = jax.vmap(op)
    early = random_array(rng, (37, M), np.float32)
    lowered = jax.jit(f).lower(early)
    peak = 0
    for b in range(1, 25 if SIMULATOR else 61):
        xs = random_array(rng, (b, M), np.float32)
        assert_close(f(xs), xs + 1, f"batch {b}")
        peak = max(peak, total_entries())
        assert len(op._launchers) <= 4, len(op._launchers)  # private: no public count
    assert peak <= 8, f"the registry grew to {peak} entries (bound 8)"
    for b in (1, 2, 3, 5):  # evicted long ago
        xs = random_array(rng, (b, M), np.float32)
        assert_close(jax.jit(f)(xs), xs + 1, f"evicted batch {b}")
    assert_close(lowered.compile()(early), early + 1, "lowered before the eviction")
    jax.clear_caches()
    numbax.clear_caches()
    assert total_entries() == 0, numbax.registry_size()
    xs = random_array(rng, (7, M), np.float32)
    assert_close(f(xs), xs + 1, "after clear_caches")


def test_callables_over_many_shapes_stay_within_the_default_bound(rng):
    def launch(x, out, stream):
        add_one[grid_for(out.size), 256, stream](x.reshape(x.size), out.reshape(out.size))

    for n in range(1, 40 if SIMULATOR else 150):
        op = numbax.numba_cuda_callable(launch, jax.ShapeDtypeStruct((n,), jnp.float32))
        x = random_array(rng, n, np.float32)
        assert_close(op(x), x + 1, f"n={n}")
    assert total_entries() <= DEFAULT_BOUND, numbax.registry_size()

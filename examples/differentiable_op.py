"""A differentiable, batchable sparse op: CSR matrix-vector product in Numba.

``csr_matvec(indptr, indices, data, x) = A @ x`` for a CSR matrix ``A`` is an
``numbax.XLACustomKernel`` with

* a forward Numba kernel (one thread per row),
* JVP rules: the product is linear in ``data`` and in ``x``, so each tangent
  goes through the same op,
* a transpose rule with two backward Numba kernels: ``A.T @ ct`` (a scatter
  with atomics, after a zero-fill, launched from one ``numba_cuda_callable``)
  for ``x``, and a gather ``ct[row(k)] * x[indices[k]]`` for ``data``,
* a batching rule that turns a batch of vectors into one sparse-times-dense
  kernel (``csr_matmat``, itself differentiable) instead of a loop.

So ``jax.grad``, ``jax.jvp``, ``jax.vmap`` and ``jax.jit`` all work, and the
backward pass runs Numba kernels. docs/custom_kernel.md walks through it.

Run on a GPU, or on the CPU through Numba's CUDA simulator:

    NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu python examples/differentiable_op.py

It prints whether everything matches a dense jnp reference and exits with 0
if it does.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.test_util import check_grads
from numba import cuda

import numbax
from numbax.custom_kernel import is_undefined_primal

THREADS = 128


def _blocks(n):
    return -(-n // THREADS)


# -- Numba kernels -----------------------------------------------------------

@cuda.jit
def csr_matvec_kernel(indptr, indices, data, x, y):
    """y[i] = sum_k data[k] * x[indices[k]] over row i."""
    i = cuda.grid(1)
    if i < y.shape[0]:
        acc = 0.0
        for k in range(indptr[i], indptr[i + 1]):
            acc += data[k] * x[indices[k]]
        y[i] = acc


@cuda.jit
def zero_kernel(out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = 0


@cuda.jit
def csr_scatter_t_kernel(indptr, indices, data, ct, out):
    """out += A.T @ ct: row i adds data[k] * ct[i] to out[indices[k]]."""
    i = cuda.grid(1)
    if i < ct.shape[0]:
        c = ct[i]
        for k in range(indptr[i], indptr[i + 1]):
            cuda.atomic.add(out, indices[k], data[k] * c)


@cuda.jit
def csr_data_grad_kernel(indptr, indices, ct, x, out):
    """out[k] = ct[row(k)] * x[indices[k]], one thread per stored entry."""
    k = cuda.grid(1)
    if k < out.shape[0]:
        m = ct.shape[0]
        if k >= indptr[m]:  # padding past the last row
            out[k] = 0
            return
        # The row of entry k: the last r with indptr[r] <= k (rows may be empty).
        lo = 0
        hi = m
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if indptr[mid] <= k:
                lo = mid
            else:
                hi = mid
        out[k] = ct[lo] * x[indices[k]]


@cuda.jit
def csr_matmat_kernel(indptr, indices, data, xs, ys):
    """ys[b] = A @ xs[b] for a batch of vectors (rows of xs)."""
    b, i = cuda.grid(2)
    if b < ys.shape[0] and i < ys.shape[1]:
        acc = 0.0
        for k in range(indptr[i], indptr[i + 1]):
            acc += data[k] * xs[b, indices[k]]
        ys[b, i] = acc


def scatter_t_launch(indptr, indices, data, ct, out, stream):
    """A.T @ ct: zero the output, then scatter into it (two kernels)."""
    if out.shape[0]:
        zero_kernel[_blocks(out.shape[0]), THREADS, stream](out)
    if ct.shape[0]:
        csr_scatter_t_kernel[_blocks(ct.shape[0]), THREADS, stream](
            indptr, indices, data, ct, out)


# -- the backward ops ----------------------------------------------------------
# Ops of their own, so their kernels are generated once per shape and kept
# alive by the op.

csr_matvec_t = numbax.XLACustomKernel(
    "csr_matvec_t", doc="A.T @ ct for a CSR matrix A: (indptr, indices, data, ct)")
csr_matvec_t.def_numba_cuda_kernel(
    lambda *, outs: numbax.numba_cuda_callable(scatter_t_launch, outs))

csr_data_grad = numbax.XLACustomKernel(
    "csr_data_grad", doc="ct[row(k)] * x[indices[k]]: (indptr, indices, ct, x)")
csr_data_grad.def_numba_cuda_kernel(
    lambda *, outs: numbax.numba_cuda_kernel(
        csr_data_grad_kernel, outs, launch_dims=outs.shape[0]))


def _like(a):
    """The ShapeDtypeStruct of an array or of an UndefinedPrimal."""
    aval = a.aval if is_undefined_primal(a) else a
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype)


# -- the forward op ------------------------------------------------------------

csr_matvec = numbax.XLACustomKernel(
    "csr_matvec", doc="A @ x for a CSR matrix A: (indptr, indices, data, x)")


@csr_matvec.def_numba_cuda_kernel
def _csr_matvec_kernel(*, outs):
    return numbax.numba_cuda_kernel(csr_matvec_kernel, outs,
                                    launch_dims=outs.shape[0])


# Linear in data and in x: each tangent goes through the op itself, and the
# transpose rule below turns those calls around for reverse mode.
csr_matvec.def_jvp_rule(
    None,  # indptr: integer, not differentiable
    None,  # indices
    lambda t_data, indptr, indices, data, x, *, outs:
        csr_matvec(indptr, indices, t_data, x, outs=outs),
    lambda t_x, indptr, indices, data, x, *, outs:
        csr_matvec(indptr, indices, data, t_x, outs=outs),
)


@csr_matvec.def_transpose_rule
def _csr_matvec_transpose(ct, indptr, indices, data, x, *, outs):
    if is_undefined_primal(data) and is_undefined_primal(x):
        raise ValueError("csr_matvec is linear in data or in x, not in both")
    if is_undefined_primal(x):
        ct_x = csr_matvec_t(indptr, indices, data, ct, outs=_like(x))
        return None, None, None, ct_x
    ct_data = csr_data_grad(indptr, indices, ct, x, outs=_like(data))
    return None, None, ct_data, None


# -- batching: a batch of vectors is one sparse-times-dense kernel -------------

csr_matmat = numbax.XLACustomKernel(
    "csr_matmat", doc="xs @ A.T, i.e. A @ xs[b] for each b: (indptr, indices, data, xs)")
csr_matmat.def_numba_cuda_kernel(
    lambda *, outs: numbax.numba_cuda_kernel(csr_matmat_kernel, outs,
                                             launch_dims=outs.shape))
# Also linear in data and in xs; its transposes reuse the vector kernels
# (vmapped: the default batching loop), so grad(vmap(f)) works too.
csr_matmat.def_jvp_rule(
    None, None,
    lambda t_data, indptr, indices, data, xs, *, outs:
        csr_matmat(indptr, indices, t_data, xs, outs=outs),
    lambda t_xs, indptr, indices, data, xs, *, outs:
        csr_matmat(indptr, indices, data, t_xs, outs=outs),
)


@csr_matmat.def_transpose_rule
def _csr_matmat_transpose(ct, indptr, indices, data, xs, *, outs):
    if is_undefined_primal(xs):
        x_like = _like(xs)
        x_like = jax.ShapeDtypeStruct(x_like.shape[1:], x_like.dtype)
        ct_xs = jax.vmap(lambda c: csr_matvec_t(
            indptr, indices, data, c, outs=x_like))(ct)
        return None, None, None, ct_xs
    per_vector = jax.vmap(lambda c, x: csr_data_grad(
        indptr, indices, c, x, outs=_like(data)))(ct, xs)
    return None, None, per_vector.sum(axis=0), None


@csr_matvec.def_batching_rule
def _csr_matvec_batch(args, axes, *, outs):
    indptr, indices, data, x = args
    if axes[:3] != [None, None, None] or axes[3] is None:
        return NotImplemented  # a batched matrix: the default loop
    xs = jnp.moveaxis(x, axes[3], 0)
    ys = csr_matmat(indptr, indices, data, xs,
                    outs=jax.ShapeDtypeStruct((xs.shape[0],) + outs.shape,
                                              outs.dtype))
    return ys, 0


# -- a demo against a dense jnp reference -------------------------------------

def random_csr(rng, m, n, density, dtype):
    """(indptr, indices, data) of a random m x n CSR matrix, and its dense form."""
    dense = rng.standard_normal((m, n)) * (rng.random((m, n)) < density)
    dense[0] = 0  # an empty row
    rows, cols = np.nonzero(dense)
    indptr = np.zeros(m + 1, np.int32)
    np.add.at(indptr, rows + 1, 1)
    indptr = np.cumsum(indptr).astype(np.int32)
    return (indptr, cols.astype(np.int32), dense[rows, cols].astype(dtype),
            dense.astype(dtype))


def dense_from_csr(indptr, indices, data, shape):
    rows = np.repeat(np.arange(shape[0]), np.diff(indptr))
    return jnp.zeros(shape, data.dtype).at[rows, indices].add(data)


def main():
    jax.config.update("jax_enable_x64", True)  # float64: tight comparisons
    rng = np.random.default_rng(0)
    m, n = 20, 30
    indptr, indices, data, dense = random_csr(rng, m, n, 0.2, np.float64)
    x = rng.standard_normal(n)
    spec = jax.ShapeDtypeStruct((m,), jnp.float64)

    def f(data, x):
        return csr_matvec(indptr, indices, data, x, outs=spec)

    def loss(data, x):
        return jnp.sum(jnp.sin(f(data, x)))

    def loss_ref(data, x):
        a = dense_from_csr(indptr, indices, data, (m, n))
        return jnp.sum(jnp.sin(a @ x))

    results = {}
    results["forward"] = np.allclose(jax.jit(f)(data, x), dense @ x,
                                     rtol=1e-12, atol=1e-12)
    g = jax.jit(jax.grad(loss, argnums=(0, 1)))(data, x)
    g_ref = jax.grad(loss_ref, argnums=(0, 1))(data, x)
    results["jit(grad)"] = all(np.allclose(a, b, rtol=1e-10, atol=1e-12)
                               for a, b in zip(g, g_ref))
    try:
        check_grads(f, (data, x), order=1, modes=("fwd", "rev"))
        results["check_grads"] = True
    except AssertionError as exc:
        print(exc)
        results["check_grads"] = False
    xs = rng.standard_normal((4, n))
    batched = jax.jit(jax.vmap(f, in_axes=(None, 0)))(data, xs)
    loop = np.stack([f(data, v) for v in xs])
    results["vmap"] = np.allclose(batched, loop, rtol=1e-12, atol=1e-12)
    gv = jax.grad(lambda d: jnp.sum(jax.vmap(f, in_axes=(None, 0))(d, xs) ** 2))(data)
    gv_ref = jax.grad(lambda d: jnp.sum(
        (xs @ dense_from_csr(indptr, indices, d, (m, n)).T) ** 2))(data)
    results["grad(vmap)"] = np.allclose(gv, gv_ref, rtol=1e-10, atol=1e-12)

    device = jax.devices()[0]
    mode = "Numba CUDA simulator" if numbax.simulator_enabled() else "CUDA"
    print(f"device: {device.device_kind} ({device.platform}), numba: {mode}")
    for name, ok in results.items():
        print(f"  {name:12s} {'ok' if ok else 'MISMATCH'}")
    ok = all(results.values())
    print("matches jnp reference:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""@njit kernels the numba_kernel tests share, defined at module level so that
a fresh process (tests/numba_kernel_child.py) builds the same op keys."""

import numba
import numpy as np


@numba.njit
def affine(x, out):
    for i in range(out.size):
        out[i] = 2 * x[i] + 1


@numba.njit(cache=True)
def cached_affine(x, out):
    for i in range(out.size):
        out[i] = 2 * x[i] + 1


@numba.njit
def affine_range(begin, end, x, out):
    for i in range(begin, end):
        out[i] = 2 * x[i] + 1


@numba.njit
def count_range(begin, end, x, out):
    # out is aliased to x: each index adds 1 where it is visited, so out is
    # x + 1 everywhere iff the chunks cover the range exactly once.
    for i in range(begin, end):
        out[i] += 1


@numba.njit
def scale_shift(x, a, b, out):
    for i in range(out.size):
        out[i] = a * x[i] + b


@numba.njit
def split2(x, y, total, diff):
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            total[i, j] = x[i, j] + y[i, j]
            diff[i, j] = x[i, j] - y[i, j]


@numba.njit
def add_one_inplace(x, out):
    for i in range(out.size):
        out.flat[i] += 1


@numba.njit
def zeroes_its_input(x, out):
    """out = x + 1, then x = 0: writes its input."""
    for i in range(x.size):
        out[i] = x[i] + 1
        x[i] = 0


@numba.njit
def zeroes_its_input_flat(x, out):
    """out = 1, then x.flat[0] = 0: writes its input through .flat."""
    out[:] = 1
    x.flat[0] = 0


@numba.njit
def _writes_one_flat_entry(flat):
    flat[0] = 0


@numba.njit
def zeroes_its_input_flat_in_a_helper(x, out):
    """out = 1; a helper writes x through the .flat it was given."""
    out[:] = 1
    _writes_one_flat_entry(x.flat)


@numba.njit
def zeroes_its_input_nditer(x, out):
    """out = 1; x = 0 through the views np.nditer yields."""
    out[:] = 1
    for v in np.nditer(x):
        v[...] = 0


@numba.njit
def zeroes_its_input_nditer_pairs(x, out):
    """Pairs of views (x, out): out = x, and x = 0 (the write refused)."""
    for a, b in np.nditer((x, out)):
        b[...] = a
        a[...] = 0


@numba.njit
def _bump(view):
    view += 1


@numba.njit
def bumps_its_input_nditer_in_a_helper(x, out):
    """out = 1; a helper adds 1 in place to the views of x."""
    out[:] = 1
    for v in np.nditer(x):
        _bump(v)


@numba.njit
def writes_its_input_as_contiguous(x, out):
    """np.ascontiguousarray returns x's own buffer, typed writable."""
    out[:] = 1
    y = np.ascontiguousarray(x)
    y[0] = 0


@numba.njit
def writes_its_input_diagonal(x, out):
    out[:] = 1
    np.fill_diagonal(x.reshape(2, 4), 0)


@numba.njit
def writes_its_input_by_dot_out(x, out):
    out[:] = 1
    a = np.ones((2, 2), np.float32)
    np.dot(a, a, x.reshape(4, 2)[:2])


@numba.njit
def _zero_view(view):
    view[...] = 0


@numba.njit
def writes_nditer_view_by_keyword(x, out):
    out[:] = 1
    for v in np.nditer(x):
        _zero_view(view=v)


@numba.njit
def _same(view):
    return view


@numba.njit
def writes_nditer_view_a_helper_returned(x, out):
    out[:] = 1
    for v in np.nditer(x):
        w = _same(v)
        w[...] = 0


@numba.njit
def writes_nditer_view_from_zip(x, out):
    out[:] = 1
    for v, _ in zip(np.nditer(x), range(8)):
        v[...] = 0


@numba.njit
def writes_nditer_views_kept_in_a_list(x, out):
    out[:] = 1
    views = []
    for v in np.nditer(x):
        views.append(v)
    views[0][...] = 0


@numba.njit
def writes_output_views_kept_in_a_list(x, out):
    """out = x, through a list of out's nditer views (writable)."""
    views = []
    for _, b in np.nditer((x, out)):
        views.append(b)
    for i in range(x.size):
        views[i][...] = x.flat[i]


@numba.njit
def affine_through_zipped_and_enumerated_nditers(x, out):
    """out = 2x + 1, through zip of two nditers and enumerate of a pair."""
    for a, b in zip(np.nditer(x), np.nditer(out)):
        b[...] = 2 * a
    for i, (a, b) in enumerate(np.nditer((x, out))):
        b[...] = 2 * a + 1 + 0 * i


@numba.njit
def affine_through_nditer(x, out):
    """out = 2x + 1, written through the out views np.nditer pairs with x's,
    read through x's views and .flat: no input written."""
    for a, b in np.nditer((x, out)):
        b[...] = 2 * a + 1
    total = 0.0
    for v in x.flat:
        total += v
    for w in np.nditer(x):
        total += w.item()
    out.flat[0] = out.flat[0] + 0 * total


def _object_mode_check(v):
    if v < 0:
        raise ValueError("negative, seen in object mode")


@numba.njit
def raises_in_object_mode(x, out):
    """out = x; raises from a `with numba.objmode()` block on a negative."""
    for i in range(x.size):
        out[i] = x[i]
    with numba.objmode():
        _object_mode_check(x.min())


@numba.njit
def raises_on_negative(x, out):
    for i in range(out.size):
        if x[i] < 0:
            raise ValueError("negative input at an index")
        out[i] = x[i]


@numba.njit(parallel=True)
def prange_affine(x, out):
    for i in numba.prange(out.size):
        out[i] = 2 * x[i] + 1


@numba.njit(parallel=True)
def prange_affine_range(begin, end, x, out):
    for j in numba.prange(end - begin):
        i = begin + j
        out[i] = 2 * x[i] + 1


@numba.njit
def row_sum_plus(x, c, out):
    # x: (n, m), c: 0-d; out: (n,)
    for i in range(x.shape[0]):
        s = c[()]
        for j in range(x.shape[1]):
            s += x[i, j]
        out[i] = s


@numba.njit
def batch_sum(x, out):
    # x (n,) and out (1,), or, given the batch (vmap_method='expand_dims'),
    # x (batch, n) and out (batch, 1): row sums either way.
    rows = x.reshape((-1, x.shape[-1]))
    sums = out.reshape(-1)
    for b in range(rows.shape[0]):
        s = np.float32(0)
        for j in range(rows.shape[1]):
            s += rows[b, j]
        sums[b] = s


def numpy_affine(x):
    return (2 * np.asarray(x) + 1).astype(np.asarray(x).dtype)


def scale_shift_by(factor):
    """An @njit kernel for one factor (a generator's closure): out = factor
    * x + 1."""
    @numba.njit
    def kernel(x, out):
        for i in range(out.size):
            out[i] = factor * x[i] + 1
    return kernel


@numba.njit
def multiply(a, b, out):
    """out = a * b, element by element."""
    for i in range(out.size):
        out[i] = a[i] * b[i]


def cached_scale_by(factor):
    """A cache=True @njit kernel for one factor (a factory's closure, as
    the reference's generators make them): out = factor * x."""
    @numba.njit(cache=True)
    def kernel(x, out):
        for i in range(out.size):
            out[i] = factor * x[i]
    return kernel

"""Kernels written once, compiled by numba-cuda and by numba-cuda-mlir.

Both compilers take the same ``@cuda.jit`` language but each reads ``cuda``
from the kernel's globals, so this file is executed once per compiler as a
module of its own, with ``cuda`` bound to that compiler's module (``load``);
numba-cuda-mlir reads kernels' source, which a real file keeps available. Used by
tests/test_compilers.py.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from typing import Any

import numbax.compilers

# This compiler's module, bound by load() before the kernels compile (they
# read it when compiled, not when defined).
cuda: Any = None

#: Every compiler of numbax (numbax.compilers.ALL) by the name tests
#: parametrise over -> the module that has its `cuda`.
COMPILERS = {c.name.replace("-", "_"): c.cuda_module
             for c in numbax.compilers.ALL}


def load(compiler: str):
    """This file as a module whose kernels `compiler` compiles."""
    import importlib
    cuda_module = importlib.import_module(COMPILERS[compiler])
    spec = importlib.util.spec_from_file_location(
        f"two_compilers_{compiler}", pathlib.Path(__file__))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered as a module: compilers and pickling find kernels' modules
    # through sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.cuda = cuda_module  # type: ignore[attr-defined]
    module.jit_all()  # type: ignore[attr-defined]
    return module


def affine(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = 2 * x[i] + 1


def add(a, b, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a[i] + b[i]


def scale_rows(m, v, out):
    # 2-D, and a second array of another rank: both memrefs' sizes and
    # strides must land where the kernel reads them.
    i, j = cuda.grid(2)
    if i < m.shape[0] and j < m.shape[1]:
        out[i, j] = m[i, j] * v[j]


def box3(x, out):
    i, j, k = cuda.grid(3)
    if i < x.shape[0] and j < x.shape[1] and k < x.shape[2]:
        out[i, j, k] = x[i, j, k] + i * 100 + j * 10 + k


def sum_and_diff(a, b, total, diff):
    i = cuda.grid(1)
    if i < a.shape[0]:
        total[i] = a[i] + b[i]
        diff[i] = a[i] - b[i]


def scale_in_place(x, out):
    # out is x's buffer (input_output_aliases={0: 0}).
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * 3


def launch_affine(x, poison, out, stream):
    # A plain callable's func: out is poison's buffer, so an element the
    # kernel leaves unwritten keeps its poison.
    n = x.shape[0]
    affine[(n + 127) // 128, 128, stream](x, out)


def launch_chain(x, poison, out, stream):
    # Several launches on numbax's stream, each reading the last's output:
    # wrong ordering (or a lost stream) shows in the values.
    n = x.shape[0]
    blocks = (n + 127) // 128
    affine[blocks, 128, stream](x, out)
    for _ in range(3):
        affine[blocks, 128, stream](out, out)


KERNELS = ("affine", "add", "scale_rows", "box3", "sum_and_diff",
           "scale_in_place")


def jit_all() -> None:
    """Replaces each kernel's Python function by this compiler's kernel."""
    for name in KERNELS:
        globals()[name] = cuda.jit(globals()[name])

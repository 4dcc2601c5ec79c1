"""The one interface between an op and the compiler of its kernel.

A ``numba_cuda_kernel`` op picks its kernel's compiler once, when it is
created (``compilers.compiler_of``), and asks it everything that differs
between compilers: the kernel's argument types, its compilation (and that
of the generated kernel a folded vmap launches), which grid axes its code
reads (the fold reader), its function on each device, and how C++ packs
its array parameters. A ``numba_cuda_callable``'s func launches kernels of
any compiler itself; each compiler may put numbax's C++ launch path on
those launches (:meth:`Compiler.install_launch_hook`).

A new compiler is one module with a subclass of :class:`Compiler`, listed
in ``compilers.ALL``; tests/test_compilers.py runs every op path with each
compiler listed there.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from . import signatures

#: How C++ packs a kernel's array parameters (csrc/kernel_args.h, ArrayAbi):
#: numba-cuda's array struct, or an MLIR memref.
NUMBA_ARRAY_ABI = 0
MEMREF_ABI = 1

# -- what the C++ launch hook (csrc/fast_launch.h) hands plan builders ----------

# How C++ marks each argument in `ours`: a buffer's index (>= 0) for an
# array numbax gave func, one of these for a view of one (with the Numba
# layout C++ computed for it), or OTHER.
OTHER = -1
VIEW_LAYOUTS = {-2: "C", -3: "F", -4: "A"}
# Argument types whose Numba type depends on the type alone (a Python int
# also on its range, which the C++ side checks), grouped by what the kernel
# parameter may be packed from, as ctypes and cuda.core would convert them.
INTS = (int, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
        np.uint32, np.uint64)
BOOLS = (bool, np.bool_)
FLOATS = (float, np.float32, np.float64)
COMPLEX = (complex, np.complex64, np.complex128)
SCALAR_TYPES = frozenset(INTS + BOOLS + FLOATS + COMPLEX)


class Compiler:
    """One compiler of ``@cuda.jit`` kernels, as numbax's ops use it.

    `label` arguments name the op in errors; `argtypes` are what
    :meth:`argtypes` returned; a compiled kernel is whatever :meth:`compile`
    returns, with a ``cooperative`` attribute (it synchronises its grid).
    """

    #: The compiler's name in messages (its distribution's name).
    name = ""
    #: The module whose ``jit`` compiles its kernels (kernels and device
    #: functions of the same source: tests/two_compilers.py).
    cuda_module = ""
    #: How C++ packs array parameters (NUMBA_ARRAY_ABI or MEMREF_ABI).
    abi = NUMBA_ARRAY_ABI
    #: Whether numbax passes Python and NumPy scalars by value to its
    #: kernels (trace/scalar_args.py).
    takes_scalars = True

    def owns(self, kernel: Any) -> bool:
        """Whether `kernel` is one of its ``@cuda.jit`` dispatchers (a
        kernel or a device function)."""
        raise NotImplementedError

    def check_simulated(self, label: str) -> None:
        """Refuses, naming the op, to launch its kernels through Numba's
        CPU simulator when it has none."""

    def argtypes(self, avals, batch: int, scalars, label: str) -> tuple:
        """The kernel's argument types: C-contiguous arrays of `avals` (the
        leading axis dropped when `batch`), with each scalar of `scalars`
        (trace/scalar_args.Scalar) at its position."""
        raise NotImplementedError

    def parameter_types(self, kernel, argtypes: tuple, label: str,
                        n_in: int | None) -> tuple:
        """The types of the kernel's parameters in the version that runs for
        `argtypes`: its explicit signature's (the one Numba's launch would
        pick, or a TypeError), else `argtypes` themselves."""
        chosen = signatures.select_signature(kernel, argtypes, label, n_in)
        return argtypes if chosen is None else tuple(chosen)

    def compile(self, kernel, argtypes: tuple, label: str,
                n_in: int | None = None) -> Any:
        """`kernel` compiled for `argtypes` (noting the globals the code
        freezes: fold.note_compile), for the current device; ValueError or
        TypeError, naming the op, for a kernel numbax cannot launch."""
        raise NotImplementedError

    def grid_reads(self, kernel, compile: Callable[[], Any]
                   ) -> tuple[bool, frozenset | None, str | None]:
        """The fold reader: (cooperative, the grid axes the kernel's code
        reads or None, why it could not be read). `compile()` returns the
        compiled kernel, compiling it only if needed."""
        raise NotImplementedError

    def batched_kernel(self, kernel, num_args: int, broadcast: tuple,
                       axis: int | None, frozen: dict | None, scalars: tuple,
                       traced: tuple = ()) -> Any:
        """The generated kernel that runs a vmapped batch in one launch
        (fold.batched_kernel) with `kernel`'s body reading `frozen` for its
        globals; `scalars`: the positions of scalar parameters; `traced`:
        those of traced scalars (1-element buffers whose element the body
        gets; with `axis` None, the unbatched kernel of such a call). Only
        compilers with `takes_scalars` get `traced`."""
        raise NotImplementedError

    def compile_batched(self, kernel, batched, argtypes: tuple,
                        label: str) -> Any:
        """`batched` (what :meth:`batched_kernel` made for `kernel`)
        compiled for the whole buffers' `argtypes`."""
        raise NotImplementedError

    def function_on(self, compiled, ordinal: int, *, grid, block,
                    shared_mem: int, label: str, shared: dict) -> int:
        """The CUfunction of `compiled` in device `ordinal`'s primary
        context, when XLA instantiates a program (kernel/loaded.py).
        `shared` is one dict for all the devices of one loaded kernel."""
        raise NotImplementedError

    def install_launch_hook(self) -> None:
        """Lets launches of its kernels from a numba_cuda_callable's func
        take numbax's C++ launch path where they can. Idempotent and cheap
        once done (called per traced call), never raises."""

"""numba_cuda_kernel: one compiled Numba kernel, launched from C++ with no Python per call.

The op class and the public function. What an op does with a call lives
beside it, one job per file: its launch configuration (launch_config.py),
the primitive it binds (primitive.py), jax.vmap (vmap.py), sharding rules
(sharding.py), the call part of its keys (calls.py), the GPU's compile
and load (gpu.py, loaded.py) and the CPU's launch through Numba's
simulator (simulator.py).
Everything that depends on the kernel's compiler goes through the op's
Compiler (compilers/base.py), chosen once, when the op is created.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import numpy as np

from .. import _core, compilers
from ..compilers import signatures
from ..runtime import keys, numba_bridge, ops, registry
from ..trace import (checks, scalar_args, shape_fns,
                     sharding_rules)
from . import calls, gpu, sharding, simulator, vmap
from .launch_config import (Call, as_dims, check_launch_configuration,
                            check_launch_limits, launch_config, pad3)
from .primitive import numbax_kernel_p


def _is_device_function(kernel) -> bool:
    options = getattr(kernel, "targetoptions", None)
    if isinstance(options, dict) and options.get("device"):
        return True
    return bool(getattr(kernel, "_device", False))  # the simulator's kernels


class NumbaCudaKernel(ops.ByValue, ops.Op):
    """The function of JAX arrays returned by :func:`numba_cuda_kernel`.

    It holds what kernel/'s other modules ask of it, public for them, not
    numbax's API (docs/api.md): its configuration, ``compiler``,
    ``group_key``, ``label``, ``py_func``, their state kept on it
    (``fold_cache``: vmap.py's, ``launchers``: simulator.py's), and its
    methods without an underscore (``fixed_call``, ``kernel_argtypes``, ...).
    """

    vmap_launches_batch = True

    def __init__(self, kernel, outs, *, grid, block, launch_dims,
                 threads_per_block, shared_mem, vmap_method,
                 input_output_aliases, name, batch_partitionable=False,
                 sharding_rule=None):
        self.kernel = kernel
        self.batch_partitionable = bool(batch_partitionable)
        self.sharding_rule = (
            None if sharding_rule is None else sharding_rules.parse(
                sharding_rule, f"numbax.numba_cuda_kernel("
                f"{keys.base_name(getattr(kernel, 'py_func', kernel))})"))
        #: outs= and launch_dims= given as functions of the call's arguments
        #: (shape_fns.py, resolved per signature when traced), else None.
        self.outs_fn = outs if shape_fns.is_function(outs) else None
        self.dims_fn = (launch_dims if shape_fns.is_function(launch_dims)
                        else None)
        if self.has_rule() and (self.outs_fn is not None
                                or self.dims_fn is not None):
            raise sharding.rule_with_shape_fns_error(
                f"numbax.numba_cuda_kernel("
                f"{keys.base_name(getattr(kernel, 'py_func', kernel))})",
                self.batch_partitionable)
        if self.outs_fn is None:
            self.out_specs, self.out_tree = checks.normalize_outs(
                outs, op=f"numba_cuda_kernel("
                f"{keys.base_name(getattr(kernel, 'py_func', kernel))})")
            self._wide_outs = checks.wide_outputs(self.out_specs)
        else:
            self.out_specs, self.out_tree, self._wide_outs = None, None, ()
        self.launch_dims = launch_dims
        self.grid = grid
        self.block = block
        self.threads_per_block = threads_per_block
        self.shared_mem = shared_mem
        self.vmap_method = vmap_method
        self.input_output_aliases = input_output_aliases
        self.name = name
        #: The op's launches on the CPU, simulator.py's to read and write.
        self.launchers = simulator.Launchers()
        self._arities_checked: set = set()
        # Signature -> (Call, out tree, 64-bit outputs), for ops with shape
        # functions or calls with scalars.
        self._calls = shape_fns.Memo()
        self._fixed: Call | None = None  # the Call of the fixed form
        #: Its fold decisions and batched kernels, vmap.py's to read and write.
        self.fold_cache = vmap.FoldCache()
        self.__name__ = getattr(kernel, "__name__", "numba_cuda_kernel")
        #: The kernel's Compiler, chosen once: all that depends on it asks it.
        compiler = compilers.compiler_of(kernel)
        assert compiler is not None, "numba_cuda_kernel checked the kernel"
        self.compiler = compiler
        self._set_identity(self._value_identity())
        #: The registry's group of the op, the first parts of its keys.
        #: Registered now, not when first traced: a process that only
        #: creates the op can run a deserialised program that calls it (the
        #: kernel is compiled then, from the shapes and dtypes in the key).
        self.group_key = registry.register_op(
            self, kernel, name=name, config=self._config(),
            num_outputs=len(self.out_specs or ()))

    @property
    def label(self) -> str:
        """How error messages name the op."""
        return f"numbax.numba_cuda_kernel({keys.base_name(self.py_func)})"

    def __repr__(self):
        return f"{self.label[:-1]}, vmap: {vmap.summary(self)})"

    @property
    def _function(self):
        return self.kernel

    def vmap_fold(self, *args) -> vmap.FoldDecision:
        """How ``jax.vmap`` launches this kernel for unbatched inputs like ``args``.

        ``args`` are the inputs of one unbatched call (arrays or
        ``jax.ShapeDtypeStruct``, and scalars passed by value). Returns a
        :class:`FoldDecision`: ``folds`` (the batch runs in one launch),
        ``axis`` (the grid axis indexing the slice) and ``reason``. On a
        GPU this compiles the kernel for those types, as a call would.
        """
        vmap.check_fold_args(self.label, args)
        # The checks a call runs: what a call refuses gets no verdict.
        inputs, call, _ = self._checked_call(args, shapes=True)
        avals = [(tuple(a.shape), np.dtype(a.dtype)) for a in inputs]
        argtypes = self.kernel_argtypes(avals + call.out_avals(0), 0, call.scalars,
                                  call.traced)
        return vmap.fold_for(self, argtypes, call.grid, n_in=len(args))

    def _value_identity(self) -> tuple:
        """What makes two ops the same op (ops.interned): ops re-created
        with the same kernel, outs and launch configuration (a helper that
        builds the op per call) must compare equal, or every call compiles,
        and keeps, a new program. Shape functions count by identity."""
        return (
            self.kernel, ops.outs_identity(self.outs_fn, self.out_specs),
            self.out_tree, self.launch_dims, self.grid, self.block,
            self.threads_per_block, self.shared_mem, self.vmap_method,
            ops.aliases_identity(self.input_output_aliases), self.name,
            self.batch_partitionable, self.sharding_rule)

    @property
    def py_func(self):
        """The kernel's Python function."""
        return getattr(self.kernel, "py_func", self.kernel)

    def fixed_launch(self):
        """(grid, block, empty) of one unbatched launch, for an op whose
        launch is fixed (not a launch_dims function)."""
        if self.launch_dims is not None:
            grid, block = launch_config(self.launch_dims, self.threads_per_block)
            empty = 0 in self.launch_dims
        else:
            grid, block = pad3(self.grid), pad3(self.block)
            empty = 0 in grid or 0 in block
        return grid, block, empty

    # -- one call: outs, launch and scalars, resolved per signature -------
    def _resolve(self, inputs, scalars):
        """(Call, out tree, 64-bit outputs) of a call with `inputs` (arrays
        or ShapeDtypeStructs) and `scalars`: the fixed form's, or what the
        shape functions return for them (once per signature)."""
        if self.outs_fn is None and self.dims_fn is None:
            fixed = self._fixed
            if fixed is None:
                grid, block, _ = self.fixed_launch()
                outs = tuple((tuple(s.shape), np.dtype(s.dtype))
                             for s in self.out_specs)
                fixed = self._fixed = Call(outs, grid, block)
            # The traced scalars' positions, from the 0-d inputs.
            traced = scalar_args.traced_positions(
                scalar_args.merge(inputs, scalars))
            if scalars or traced:
                fixed = dataclasses.replace(fixed, scalars=tuple(scalars),
                                            traced=traced)
            return fixed, self.out_tree, self._wide_outs
        return self._calls.resolved(
            inputs, scalars, lambda args: self._resolve_by_functions(
                args, scalars))

    def _resolve_by_functions(self, args, scalars):
        """(Call, out tree, 64-bit outputs) from what the shape functions
        return for the call's `args`."""
        op = self.label
        specs, tree = shape_fns.outs_for(self.outs_fn, self.out_specs,
                                         self.out_tree, args, op)
        if self.dims_fn is not None:
            result = shape_fns.evaluate(self.dims_fn, "launch_dims", args,
                                         op)
            what = shape_fns.where("launch_dims", args)
            try:
                dims = as_dims(result, what)
                grid, block = launch_config(dims, self.threads_per_block)
                check_launch_limits(grid, block, f"{op}: {what} = {dims}")
            except ValueError as exc:
                message = str(exc)
                if not message.startswith(op):
                    message = f"{op}: {message}"
                raise ValueError(message) from None
        else:
            grid, block, _ = self.fixed_launch()
        outs = tuple((tuple(s.shape), np.dtype(s.dtype)) for s in specs)
        return (Call(outs, tuple(grid), tuple(block), tuple(scalars),
                     traced=scalar_args.traced_positions(args)),
                tree, checks.wide_outputs(specs))

    def _checked_call(self, args, shapes=False):
        """(input buffers, Call, out tree) of a call with `args`, checked as
        a call checks them (arrays, or with `shapes` ShapeDtypeStructs, and
        scalars passed by value): dtypes, ranks, arity, aliases."""
        op = self.label
        args, traced = scalar_args.with_traced_buffers(
            args, op, aliases=bool(self.input_output_aliases),
            rule=self.has_rule(), not_taken_by=None
            if self.compiler.takes_scalars else self.compiler.name)
        arrays, scalars = scalar_args.split(args, op)
        if scalars and not self.compiler.takes_scalars:
            raise TypeError(
                f"{op}: input {scalars[0].position} is a scalar "
                f"({scalars[0].value!r}), but numbax passes scalars by value "
                f"to numba-cuda kernels only, not to {self.compiler.name} "
                "ones; pass it as a 1-element array (jnp.array([value])) and "
                "read a[0] in the kernel")
        positions = None if not scalars else [
            i for i, a in enumerate(args) if not scalar_args.is_scalar(a)]
        inputs = checks.as_input_arrays(arrays, op, shapes=shapes,
                                         positions=positions)
        # Shape functions see a traced scalar as the 0-d array it is.
        call, tree, wide = self._resolve(
            scalar_args.as_passed(inputs, positions, traced), scalars)
        narrow = checks.narrowed_x64(wide, op, self)
        if narrow:
            # x64 off: the outputs XLA allocates are 32-bit, and the kernel
            # is compiled for those (the key spells them: calls.spec).
            call = dataclasses.replace(call, outs=tuple(
                (s, narrow.get(i, d)) for i, (s, d) in enumerate(call.outs)))
        nargs = len(args) + call.num_outputs
        if nargs not in self._arities_checked:
            checks.check_arity(
                self.py_func, nargs, op,
                checks.arg_layout(len(args), call.num_outputs),
                what="kernel")
            self._arities_checked.add(nargs)
        if self.input_output_aliases is not None:
            specs = self.out_specs if self.outs_fn is None and \
                not narrow else [jax.ShapeDtypeStruct(s, d)
                                 for s, d in call.outs]
            checks.check_aliases(self.input_output_aliases, inputs, specs,
                                  op)
        return inputs, call, tree

    # -- what depends on the compiler (asked by gpu.py, simulator.py) -------
    def kernel_argtypes(self, avals, batch, scalars=(), traced=()):
        """The kernel's argument types: arrays for `avals` (the leading axis
        dropped when `batch`), and each scalar's Numba type at its
        position; at the positions in `traced` (buffers in `avals`) the
        type of their element, which the kernel's body receives."""
        tys = self.compiler.argtypes(avals, batch, scalars, self.label)
        if not traced:
            return tys
        return tuple(t.dtype if i in traced else t
                     for i, t in enumerate(tys))

    def compile_kernel(self, argtypes, n_in=None):
        """The kernel compiled by its compiler for `argtypes` (`n_in`:
        how many of them are inputs)."""
        return self.compiler.compile(self.kernel, tuple(argtypes),
                                     self.label, n_in)

    def scalar_formals(self, argtypes, scalars, n_in):
        """The types the kernel's parameters at the scalars' positions have
        in the version that runs: the explicit signature's, or the scalars'
        own."""
        if not scalars:
            return ()
        formals = self.compiler.parameter_types(self.kernel, argtypes,
                                                self.label, n_in)
        return tuple(formals[s.position] for s in scalars)

    def scalar_values(self, scalars, formals):
        """Each scalar as the kernel parameter of type `formals[i]`
        receives it (a NumPy scalar of its dtype)."""
        names = signatures.parameter_names(self.kernel)
        return [scalar_args.converted(
                    s, f, self.label,
                    signatures.describe_argument(s.position, None, names))
                for s, f in zip(scalars, formals)]

    def scalar_params(self, scalars, formals):
        """(position, kind, bytes) per scalar, for the LoadedKernel."""
        names = signatures.parameter_names(self.kernel)
        return [scalar_args.parameter(
                    s, f, self.label,
                    signatures.describe_argument(s.position, None, names))
                for s, f in zip(scalars, formals)]

    def _config(self) -> str:
        """What the op was created with, as its key spells it: 'fn' for a
        shape function (the call part then spells what it returned)."""
        dims = lambda d: "x".join(map(str, d))  # noqa: E731
        if self.outs_fn is not None:
            outs = "fn"
        else:
            outs = keys.avals_text(
                (tuple(o.shape), o.dtype) for o in self.out_specs)
        if self.dims_fn is not None:
            launch = "grid=fn;block=fn"
        else:
            grid, block, _ = self.fixed_launch()
            launch = f"grid={dims(grid)};block={dims(block)}"
        # Only an op with a rule says so: every other op's key stays what it
        # was before rules existed.
        rule = ("" if not self.has_rule() else ";rule=batch"
                if self.batch_partitionable else
                f";rule={str(self.sharding_rule).replace(', ', ',')}")
        return f"kernel;outs={outs};{launch};smem={self.shared_mem}{rule}"

    # -- what the family's other modules ask of the op ---------------------
    def has_rule(self) -> bool:
        """Whether the op has a sharding rule (or batch_partitionable)."""
        return self.batch_partitionable or self.sharding_rule is not None

    def alias_pairs(self) -> tuple:
        """input_output_aliases as sorted (input, output) int pairs (checked
        by _checked_call before any trace)."""
        return tuple(sorted((int(i), int(o)) for i, o in
                            (self.input_output_aliases or {}).items()))

    def fixed_call(self) -> Call:
        """The Call of an op without shape functions and scalars."""
        return self._resolve((), ())[0]

    # -- what other parts ask of an op (runtime/ops.py) --------------------
    def entry_for_call(self, key, call, platform):
        """The kernel compiled here once per key, from the call part."""
        avals, batch, broadcast, aliases, resolved, units = \
            calls.parse(self, call)
        if platform == "cpu":
            return simulator.entry(self, key, avals, batch, broadcast,
                                   aliases, resolved, units)
        # On XLA's instantiating thread: compile with device 0's primary
        # context bound for the call (as a trace on the main thread would),
        # so that Numba does not push a context of its own onto XLA's thread.
        return _core.call_on_device(
            0, lambda: gpu.entry(self, key, avals, batch, broadcast, aliases,
                                 resolved, units))

    def forget_cached(self):
        """numbax.clear_caches(): drop every simulator launcher."""
        self.launchers.clear()

    def with_sharding_rule(self, rule: str) -> NumbaCudaKernel:
        # outs as the op was given them: a shape function stays one (the
        # rule is then refused, naming it).
        outs = self.outs_fn if self.outs_fn is not None else \
            jax.tree_util.tree_unflatten(self.out_tree, self.out_specs)
        return numba_cuda_kernel(
            self.kernel, outs, grid=self.grid, block=self.block,
            launch_dims=self.launch_dims,
            threads_per_block=self.threads_per_block,
            shared_mem=self.shared_mem, vmap_method=self.vmap_method,
            input_output_aliases=self.input_output_aliases, name=self.name,
            sharding_rule=rule)

    def __call__(self, *args):
        inputs, call, tree = self._checked_call(args)
        # A rule that does not fit this call is refused now, naming the op.
        sharding.check_rule(self, [tuple(x.shape) for x in inputs],
                            call.out_shapes)
        use = self.use_name()  # an XLACustomKernel's, for this call only
        if use is not None:
            call = dataclasses.replace(call, name=use)
        outs = numbax_kernel_p.bind(
            *inputs, op=self, out_shapes=call.outs, batch=0,
            broadcast=tuple(False for _ in inputs), call=call)
        return jax.tree_util.tree_unflatten(tree, list(outs))


def numba_cuda_kernel(
    kernel: Any,
    outs: Any,
    *,
    grid: int | Sequence[int] | None = None,
    block: int | Sequence[int] | None = None,
    launch_dims: int | Sequence[int] | Callable[..., Any] | None = None,
    threads_per_block: int = 256,
    shared_mem: int = 0,
    vmap_method: str | None = None,
    input_output_aliases: dict[int, int] | None = None,
    name: str | None = None,
    batch_partitionable: bool = False,
    sharding_rule: str | None = None,
) -> NumbaCudaKernel:
    """Wrap one ``@cuda.jit`` kernel as a JAX function, launched from C++.

    The kernel's arguments are the inputs, then the outputs. An input is an
    array, or a Python or NumPy scalar (``bool``, ``int``, ``float``,
    ``complex``, ``np.float32(...)``, ...), which is passed by value into the
    kernel's parameter at that position, typed as Numba types it (``int``:
    int64, ``float``: float64, ``bool``: boolean, NumPy scalars their dtype)
    or converted to the type the kernel's explicit signature gives it. A
    scalar is static, like a static argument of ``jax.jit``: it is part of
    the op's key, so each new value is a new key and launch plan (the
    compiled code depends on its type only), and ``jax.vmap`` never batches
    it. A 0-d array input (what ``jax.jit`` makes of a Python scalar
    argument) is a traced scalar: a generated kernel reads its value on the
    device and passes it to the kernel's parameter, typed as its dtype, so
    a new value needs no new trace or compile.
    It is compiled for the argument types when traced; each call then packs
    the arguments in the compiler's kernel ABI (numba-cuda's, or
    numba-cuda-mlir's memrefs) and launches on XLA's stream from C++, with
    no Python and no GIL, and XLA may capture it in CUDA graphs. A kernel
    with ``cache=True`` also gets an entry of numbax's in its Numba cache,
    from which later processes launch it without Numba compiling or loading
    anything (docs/warm_start.md).

    Launch configuration: ``grid`` and ``block`` (int or up to 3 ints), or
    ``launch_dims`` (1-3 extents; 1-D blocks of ``min(threads_per_block, n)``,
    2-D 16x16, 3-D 8x8x4, grid rounded up).

    ``outs`` and ``launch_dims`` may also be functions of the call's
    arguments (arrays as ``jax.ShapeDtypeStruct``, scalars as their values)
    returning what the fixed form takes, e.g. ``outs=lambda x:
    jax.ShapeDtypeStruct(x.shape, x.dtype)``, ``launch_dims=lambda x:
    x.shape[0]``: evaluated when a call is traced, once per signature, so
    one op serves every shape (docs/shapes_and_scalars.md). A zero extent launches nothing and
    the outputs are zero-filled (one aliased to an input keeps its values).
    ``shared_mem`` is dynamic shared memory in bytes.

    Under ``jax.vmap`` every slice runs the unbatched kernel. When the
    compiled kernel cannot tell the difference (a grid axis is free, the
    kernel never reads it, no grid sync) the whole batch runs in one launch;
    otherwise each slice is a launch of its own. ``op.vmap_fold(*args)`` and
    ``repr(op)`` say which, and why (docs/quickstart.md, "vmap of a kernel").
    ``vmap_method='sequential'`` launches one slice at a time. Nested vmaps
    of any depth flatten into one batch, decided the same way.

    Args:
      kernel: a ``@cuda.jit`` kernel (a Numba CUDA dispatcher, not a device
        function), of numba-cuda or of numba-cuda-mlir (GPU only: it has no
        simulator; docs/compilers.md). Its arguments are the op's inputs,
        then its outputs.
      outs: a ``jax.ShapeDtypeStruct`` or a sequence/pytree of them; the
        result has the same structure. Or a function of the call's
        arguments returning one.
      grid: blocks per grid, an int or 1-3 ints; with ``block``.
      block: threads per block, an int or 1-3 ints; with ``grid``.
      launch_dims: 1-3 extents to cover with one thread each, instead of
        ``grid`` and ``block``; numbax picks the blocks as described above.
        Or a function of the call's arguments returning them.
      threads_per_block: the 1-D block size used with ``launch_dims``
        (default 256).
      shared_mem: bytes of dynamic shared memory per block (default 0).
      vmap_method: ``None``, ``'expand_dims'``, ``'broadcast_all'`` or
        ``'legacy_vectorized'`` (all batch as described above), or
        ``'sequential'`` (one launch per slice, in order). Needs
        ``launch_dims`` unless ``None``.
      input_output_aliases: ``{input index: output index}``: the output is
        written in the input's buffer (same shape and dtype). Input indices
        count the array inputs only (scalars are not buffers).
      name: optional stable name for the op's key, a non-empty str
        (default: the kernel's module and qualified name); also the op's
        name in profiles (default there: the kernel's qualified name): its
        HLO custom call and, on a GPU, each call's NVTX range carry it
        (``op.profile_name``; docs/profiling.md).
      batch_partitionable: declare that the kernel treats every index of
        axis 0 of every input and output independently (they must all have
        the same leading extent): under ``jax.jit`` with inputs sharded
        along axis 0, XLA runs the kernel on each device's own rows instead
        of gathering the arrays. ``launch_dims[0]`` must then be that
        extent: each device launches over its own rows (the grid is read
        from the shards the call receives). Same as
        ``sharding_rule="b ..., b ... -> b ..."``. Not with ``outs`` or
        ``launch_dims`` given as functions.
      sharding_rule: which axes of the array inputs and outputs are the
        same factor, in the einsum-like notation of Shardy rules
        (``"i j, j -> i j"``; scalars are not operands of the rule): XLA
        may split the factors that lead every output (each input leading
        with them too, or not naming them), running the kernel on each
        device's shards with whole copies of the other inputs.
        ``launch_dims`` must start with the extents of the split factors,
        in order (each device launches over its shard), or give
        ``grid``/``block`` (kept as given: the kernel must take its sizes
        from its arrays). Not with ``outs`` or ``launch_dims`` given as
        functions. See docs/multi_gpu.md.

    Returns:
      A function of the inputs (JAX arrays and scalars) returning the
      outputs, usable eagerly and inside ``jax.jit`` and ``jax.vmap``.

    Raises:
      ValueError: an invalid launch configuration (both or neither of
        ``grid``/``block`` and ``launch_dims``, extents out of CUDA's limits,
        a bad ``threads_per_block`` or ``shared_mem``, an explicit grid with
        a ``vmap_method``, or an unknown ``vmap_method``), checked first,
        before the kernel or Numba; and, when
        called, a dtype Numba cannot use, aliased buffers
        of different shapes or dtypes, a launch a ``launch_dims`` function
        returned that CUDA cannot run, or an int scalar outside the range
        of its parameter's type in an explicit signature.
      ImportError: Numba with CUDA support is not installed.
      TypeError: ``kernel`` is not a Numba CUDA dispatcher, or is a device
        function; ``name`` is not a str (a blank one is a ValueError);
        when traced, arrays or scalars that none of the signatures the
        kernel was compiled for takes (or a scalar of a kind its parameter
        cannot take: a float for an int); a scalar for a numba-cuda-mlir
        kernel.
    """
    # The launch configuration first, purely (as the reference system does):
    # its errors do not depend on the kernel or on Numba being installed.
    grid, block, launch_dims = check_launch_configuration(
        grid=grid, block=block, launch_dims=launch_dims,
        threads_per_block=threads_per_block, shared_mem=shared_mem,
        vmap_method=vmap_method)
    checks.check_name(name, "numba_cuda_kernel", (
        f"numba_cuda_kernel("
        f"{keys.base_name(getattr(kernel, 'py_func', kernel))})"))
    checks.check_bool(batch_partitionable, "batch_partitionable",
                       "numba_cuda_kernel")
    if sharding_rule is not None and batch_partitionable:
        raise ValueError(
            "numba_cuda_kernel: give sharding_rule or batch_partitionable=True, "
            "not both (batch_partitionable=True is the rule that splits axis 0 "
            "of every array)")
    numba_bridge.require_cuda()
    compiler = compilers.compiler_of(kernel)
    if compiler is None:
        raise TypeError(
            "numba_cuda_kernel: kernel must be a Numba CUDA kernel (a function "
            "decorated with @cuda.jit, from numba.cuda or numba_cuda_mlir), "
            f"got {type(kernel).__name__}; wrap plain Python launch code with "
            "numba_cuda_callable instead")
    if _is_device_function(kernel):
        raise TypeError(
            "numba_cuda_kernel: kernel is a device function "
            "(@cuda.jit(device=True)), which cannot be launched; wrap it in a "
            "@cuda.jit kernel that calls it")
    compiler.install_launch_hook()  # counts the simulator's launches
    op = NumbaCudaKernel(
        kernel, outs, grid=grid, block=block, launch_dims=launch_dims,
        threads_per_block=int(threads_per_block), shared_mem=int(shared_mem),
        vmap_method=vmap_method, input_output_aliases=input_output_aliases,
        name=name, batch_partitionable=batch_partitionable,
        sharding_rule=sharding_rule)
    # One object per distinct op while it lives: its compiled kernels,
    # simulator launchers and registry entries are shared by every re-creation.
    return ops.interned(op, op._identity)

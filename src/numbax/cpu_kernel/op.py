"""numba_kernel: a Numba @njit kernel as an XLA op on JAX's CPU backend.

The op class (its configuration, checks and keys) and the public function.
A call is traced into numbax_cpu_kernel_p (primitive.py, batched by
vmap.py); its key names the op and the call, and resolves, at XLA's
instantiate stage, to the plan of a generated @cfunc wrapper
(wrapper.py) whose address the C++ handler calls on every execution
(csrc/cpu_kernel_handler.cc): no Python and no GIL per call.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from ..runtime import keys, ops, registry
from ..trace import checks, scalar_args, shape_fns, sharding_rules
# vmap.py gives the primitive its batching rule when imported.
from . import kernel_audit, primitive, vmap, wrapper  # noqa: F401

PARALLEL = (None, "xla")
OP = "numba_kernel"


def _plan(op_ref, layout: wrapper.Layout, aliases: tuple, units: tuple):
    """What the C++ call site is built from (cpu_kernel_handler.cc,
    CpuKernelSite::Create). Refers to the op weakly, as registry entries
    must; the owner tuple keeps the wrapper and the kernel alive for the
    site's life."""
    op = op_ref()
    if op is None:
        raise KeyError("numbax numba_kernel: the op was garbage-collected; "
                       "create it again before running the program")
    cfunc = op._wrapper(layout)
    lead, trail = units or ((), ())
    return (int(cfunc.address), layout.n_inputs,
            len(layout.buffers) - layout.n_inputs,
            wrapper.scalar_blob(layout), layout.range_n,
            layout.batch_ndim, op.parallel == "xla", op._serialise,
            tuple(x for pair in aliases for x in pair), tuple(lead),
            tuple(trail), (cfunc, op.kernel),
            wrapper.diagnose(op.kernel, layout, op.label))


class NumbaKernel(ops.ByValue, ops.Op):
    """The function of JAX arrays returned by :func:`numba_kernel`."""

    # jax.vmap runs the whole batch from one handler call (vmap.py): an
    # XLACustomKernel vmaps the op rather than loop over it.
    vmap_launches_batch = True
    # A 0-d input reaches the kernel as a 0-d array: an XLACustomKernel
    # passes it on (custom_kernel/primitive.py).
    takes_0d_inputs = True

    def __init__(self, kernel, outs, *, vmap_method, input_output_aliases,
                 name, parallel, launch_dims, sharding_rule):
        self.kernel = kernel  # strong: the registry refers to it weakly
        # Public: the lowering (primitive.py) names the op in its messages.
        self.label = op = f"numba_kernel({keys.base_name(kernel)})"
        self._outs_fn = outs if shape_fns.is_function(outs) else None
        if self._outs_fn is None:
            self.out_specs, self.out_tree = checks.normalize_outs(outs, op=op)
            self._wide_outs = checks.wide_outputs(self.out_specs)
        else:
            self.out_specs, self.out_tree, self._wide_outs = None, None, ()
        self._calls = shape_fns.Memo()
        self.vmap_method = vmap_method
        self.input_output_aliases = input_output_aliases
        self.name = name
        self.parallel = parallel
        self.launch_dims = launch_dims
        self._range = -1 if launch_dims is None else _launch_range(
            launch_dims, op)
        self.sharding_rule = (None if sharding_rule is None else
                              sharding_rules.parse(sharding_rule, op))
        # @njit(parallel=True): Numba's own threads; such kernels run one
        # at a time in the process (csrc/cpu_kernel_handler.cc).
        self._serialise = bool(getattr(kernel, "targetoptions", {}).get(
            "parallel"))
        self._wrappers = _wrappers_of(kernel)
        self.__name__ = getattr(kernel, "__name__", OP)
        self.__doc__ = getattr(kernel, "__doc__", None)
        self._set_identity(self._value_identity())
        self._group = registry.register_op(
            self, kernel, name=name, config=self._config(),
            num_outputs=len(self.out_specs or ()))

    def __repr__(self):
        return f"numbax.numba_kernel({keys.base_name(self.kernel)})"

    def _value_identity(self) -> tuple:
        """What makes two ops the same op (ops.interned). Shape functions
        count by identity."""
        return (self.kernel, ops.outs_identity(self._outs_fn, self.out_specs),
                self.out_tree, self.vmap_method,
                ops.aliases_identity(self.input_output_aliases), self.name,
                self.parallel, self._range, self.sharding_rule)

    @property
    def _function(self):
        return self.kernel

    def _config(self) -> str:
        outs = ("fn" if self._outs_fn is not None else keys.avals_text(
            (tuple(s.shape), s.dtype) for s in self.out_specs))
        return (f"cpu_kernel;outs={outs}"
                + (f";range={self._range}" if self._range >= 0 else "")
                + (f";parallel={self.parallel}" if self.parallel else ""))

    # -- the wrapper ---------------------------------------------------------

    def _wrapper(self, layout: wrapper.Layout):
        """The compiled wrapper of `layout` (once per layout)."""
        with _wrappers_lock:
            found = self._wrappers.get(layout)
        if found is not None:
            return found
        self._check_kernel(layout)
        try:
            cfunc = wrapper.compile_wrapper(self.kernel, layout)
        except Exception as exc:  # noqa: BLE001 - Numba's many errors
            raise TypeError(
                f"{self.label}: numbax could not compile the kernel's "
                f"wrapper for this call ({type(exc).__name__}: {exc})") \
                from exc
        with _wrappers_lock:
            return self._wrappers.setdefault(layout, cfunc)

    def _check_kernel(self, layout: wrapper.Layout) -> None:
        """Compiles the kernel for the call's argument types; refuses, naming
        the op and the fix, what the wrapper cannot call."""
        wanted = argtypes = wrapper.slice_types(layout)
        shown = ", ".join(str(t) for t in argtypes)
        try:
            argtypes = _compiled_types(self.kernel, argtypes)
        except Exception as exc:  # noqa: BLE001 - Numba's typing errors
            if getattr(self.kernel, "_can_compile", True) and \
                    kernel_audit.writes_when_read_only(self.kernel, wanted,
                                                       exc):
                raise self._writes_an_input(
                    f"Numba said: {type(exc).__name__}: {exc}") from None
            head = ("(begin, end) as uint64 first (launch_dims was given), "
                    if self._range >= 0 else "")
            hints = ""
            if kernel_audit.fixed_signature_mismatch(exc) and any(
                    layout.readonly):
                hints += (" A function it calls has explicit signatures "
                           "that take none of these types: the inputs are "
                           "read-only arrays, which a signature such as "
                           "float32[:] (writable) does not accept. Drop "
                           "that signature, or alias the input to an "
                           "output (it then arrives writable).")
            if any(rank == 0 for _, rank in layout.buffers[:layout.n_inputs]):
                hints += (" A 0-d input (a JAX array, or a scalar that jit "
                          "traced) is a 0-d array: read its value with "
                          "x[()], or pass a Python or NumPy scalar outside "
                          "jit's arguments to have it by value.")
            raise TypeError(
                f"{self.label}: the kernel cannot be compiled for this "
                f"call's arguments ({shown}): numba_kernel calls it with "
                f"{head}the inputs (C-contiguous arrays; scalars by value), "
                f"then the outputs.{hints} Numba said: "
                f"{type(exc).__name__}: {exc}") from None
        cres = self.kernel.overloads.get(tuple(argtypes))
        if cres is None:
            return
        if getattr(cres, "objectmode", False):
            raise TypeError(
                f"{self.label}: the kernel compiled in object mode, which "
                "needs Python (and the GIL) on every call; numba_kernel "
                "runs nopython kernels only. Decorate it with @numba.njit "
                "and make it compile in nopython mode")
        from numba.core import types
        if cres.signature.return_type != types.none:
            raise TypeError(
                f"{self.label}: the kernel returns a value "
                f"({cres.signature.return_type}); numba_kernel discards "
                "return values, so results must be written into the output "
                "arrays (the kernel's last arguments) and the kernel must "
                "return None")
        try:
            if getattr(self.kernel, "_can_compile", True):
                found = kernel_audit.audit_cached(self.kernel,
                                                  tuple(argtypes), cres)
            else:
                found = kernel_audit.audit_fixed_signature(
                    self.kernel, wrapper.slice_types(dataclasses.replace(
                        layout, readonly=layout.protected)))
        except Exception as exc:  # noqa: BLE001 - Numba's compile errors
            # Only a kernel Numba loaded from its cache is compiled here
            # (to audit it): its source no longer compiles.
            raise TypeError(
                f"{self.label}: numbax audits a kernel Numba loaded from its "
                "cache by compiling its source again, and that failed: the "
                "source (or a function it calls) changed since it was "
                "cached. Fix it, or clear Numba's cache (NUMBA_CACHE_DIR, "
                f"or the __pycache__ beside it). Numba said: "
                f"{type(exc).__name__}: {exc}") from None
        if found is not None and found.kind == "objmode":
            raise TypeError(
                f"{self.label}: the kernel has {found.text}. numba_kernel runs "
                "nopython kernels only: an object-mode block takes the GIL on "
                "every call, and an exception raised in it escapes Numba's "
                "try/except, so the op could not report it. Move the Python "
                "code out of the kernel (before or after the op, or into a "
                "jax.pure_callback)")
        if found is not None and found.kind == "typed write":
            raise self._writes_an_input(f"Found: {found.text}.")
        if found is not None:
            raise self._writes_an_input(
                f"Found: {found.text}, which Numba compiles for read-only arrays "
                "but numbax refuses.")

    def _writes_an_input(self, detail: str) -> TypeError:
        return TypeError(
            f"{self.label}: the kernel writes to an input array. Inputs are "
            "XLA's buffers, which other arrays may share, so numba_kernel "
            "passes them read-only: write results into the outputs (the "
            "kernel's last arguments), or, to update an input in place, "
            "alias it to an output (input_output_aliases={input: output}) "
            f"and write that. {detail}")

    # -- keys ------------------------------------------------------------------

    def _layout(self, avals_in, out_shapes, scalars, batched, batch_ndim,
                aliases=()) -> wrapper.Layout:
        n_args = len(avals_in) + len(scalars)
        at = {s.position: j for j, s in enumerate(scalars)}
        args, i = [], 0
        for p in range(n_args):
            if p in at:
                args.append(("s", at[p]))
            else:
                args.append(("a", i))
                i += 1
        buffers = tuple((np.dtype(d).name, len(s)) for s, d in
                        list(avals_in) + list(out_shapes))
        # Per buffer, the batch levels it carries (outermost first): an
        # input batched at some levels only keeps just those axes (the
        # wrapper finds its slice); outputs carry every level.
        k = int(batch_ndim)
        levels = tuple(tuple(bool(x) for x in m) for m in batched) + (
            (True,) * k,) * len(out_shapes) if k else ((),) * len(buffers)
        flags = tuple(any(m) for m in levels)
        # Inputs no output aliases go to the kernel read-only: one it writes
        # is a compile error now, not a change to a buffer XLA may share.
        # A kernel with explicit signatures cannot compile for read-only
        # arrays, so it gets them writable, and its writes are checked on
        # its function compiled anew (_check_kernel).
        aliased = {int(i) for i, _ in aliases}
        protected = tuple(i < len(avals_in) and i not in aliased
                          for i in range(len(buffers)))
        can_compile = getattr(self.kernel, "_can_compile", True)
        return wrapper.Layout(
            args=tuple(args), buffers=buffers, batched=flags,
            batch_ndim=k, levels=levels if k else (),
            scalars=tuple(s.value for s in scalars),
            scalar_types=tuple(self._scalar_type(s) for s in scalars),
            range_n=self._range,
            n_inputs=len(avals_in),
            readonly=protected if can_compile else (False,) * len(buffers),
            protected=protected)

    def _entry(self, key, layout, aliases, units=()):
        return registry.KernelEntry(
            key, functools.partial(_plan, weakref.ref(self), layout,
                                   tuple(aliases), units),
            owner_ref=weakref.ref(self))

    def _scalar_type(self, scalar) -> str:
        """The dtype (name) the kernel gets `scalar` as: Numba's type of
        the value (int -> int64, float -> float64, NumPy scalars their
        own), refused naming the op where Numba has none or its CPU target
        cannot use it."""
        from numba.np import numpy_support
        dtype = numpy_support.as_dtype(
            scalar_args.numba_type(scalar, self.label))
        if dtype == np.float16:
            raise TypeError(
                f"{self.label}: input {scalar.position} is a float16 "
                "scalar, which Numba's CPU target cannot load, store or "
                "compute with; pass np.float32(value) (or a float)")
        return dtype.name

    def call_key(self, avals_in, out_shapes, scalars, aliases, batched,
                 batch_ndim) -> str:
        layout = self._layout(avals_in, out_shapes, scalars, batched,
                              batch_ndim, aliases)
        self._wrapper(layout)  # compiled now: errors at trace time
        call = ("in=" + keys.avals_text(avals_in)
                + ";out=" + keys.avals_text(out_shapes))
        if batch_ndim:
            call += (f";bnd={batch_ndim};bat="
                     + "".join("1" if any(m) else "0" for m in batched))
            if any(any(m) and not all(m) for m in batched):
                # Inputs batched at some levels only: which, per input.
                call += ";lvl=" + ".".join(
                    "".join("1" if x else "0" for x in m) for m in batched)
        call += keys.alias_spec(dict(aliases))
        call += scalar_args.scalars_spec(scalars)
        return registry.program_key(
            self.kernel, self._group, call,
            lambda key: self._entry(key, layout, aliases))

    def entry_for_call(self, key, call, platform):
        """The registry entry of a key this process did not traced (a
        deserialised program, or a call XLA split)."""
        del platform
        fields = keys.spec_fields(call)
        avals = keys.parse_avals(fields.get("in", ""))
        outs = keys.parse_avals(fields.get("out", ""))
        ndim = int(fields.get("bnd", "0") or 0)
        if "lvl" in fields:
            batched = tuple(tuple(c == "1" for c in m)
                            for m in fields["lvl"].split("."))
        else:
            batched = tuple((c == "1",) * ndim for c in fields.get("bat", ""))
        scalars = scalar_args.parse_scalars(fields)
        aliases = keys.parse_aliases(fields)
        layout = self._layout(avals, outs, scalars, batched, ndim, aliases)
        units = keys.parse_units(fields)
        return self._entry(key, layout, aliases, units if any(units) else ())

    def with_sharding_rule(self, rule: str) -> Any:
        outs = self._outs_fn if self._outs_fn is not None else \
            jax.tree_util.tree_unflatten(self.out_tree, self.out_specs)
        return numba_kernel(
            self.kernel, outs, vmap_method=self.vmap_method,
            input_output_aliases=self.input_output_aliases, name=self.name,
            parallel=self.parallel, launch_dims=self.launch_dims,
            sharding_rule=rule)

    # -- a call ----------------------------------------------------------------

    def _resolve(self, inputs, scalars):
        if self._outs_fn is None:
            return self.out_specs, self.out_tree, self._wide_outs
        return self._calls.resolved(inputs, scalars, self._by_function)

    def _by_function(self, args):
        outs, tree = shape_fns.outs_for(self._outs_fn, self.out_specs,
                                        self.out_tree, args, self.label)
        return outs, tree, checks.wide_outputs(outs)

    def __call__(self, *args):
        op = self.label
        arrays, scalars = scalar_args.split(args, op)
        positions = [i for i, a in enumerate(args)
                     if not scalar_args.is_scalar(a)]
        inputs = [_input_array(a, op, p) for a, p in zip(arrays, positions)]
        out_specs, out_tree, wide = self._resolve(inputs, scalars)
        narrow = checks.narrowed_x64(wide, op, self)
        if narrow:
            # x64 off: XLA allocates the 32-bit types (as JAX does, with a
            # warning), and the kernel is compiled for them.
            out_specs = checks.narrow_specs(out_specs, narrow)
        for j, s in enumerate(out_specs):
            _numba_dtype(s.dtype, op, f"output {j}")
        aliases = checks.check_aliases(self.input_output_aliases, inputs,
                                        out_specs, op)
        aliases = tuple(sorted((aliases or {}).items()))
        rule = self.sharding_rule
        if rule is not None:
            sharding_rules.split(
                rule, [x.shape for x in inputs],
                [s.shape for s in out_specs], op, aliases=aliases)
        out_shapes = tuple((tuple(int(d) for d in s.shape), np.dtype(s.dtype))
                           for s in out_specs)
        avals_in = [(tuple(x.shape), np.dtype(x.dtype)) for x in inputs]
        # The kernel and its wrapper compile now: refusals at trace time.
        # Except where the kernel may be written for the batch alone: with
        # vmap_method 'expand_dims', 'broadcast_all' or 'legacy_vectorized'
        # it gets a vmapped call's batch as a leading axis, and a kernel
        # that only handles that rank fails here, where the arguments are
        # still one slice. Its refusal then waits for the lowering, which
        # compiles what the call really passes (and says the same, if the
        # call is not vmapped after all).
        try:
            self._wrapper(self._layout(avals_in, out_shapes, scalars,
                                       ((),) * len(inputs), 0, aliases))
        except TypeError:
            if self.vmap_method in vmap.PER_SLICE:
                raise
        results = primitive.numbax_cpu_kernel_p.bind(
            *inputs, op=self, out_shapes=out_shapes, scalars=scalars,
            aliases=aliases, batched=((),) * len(inputs), batch_ndim=0,
            rule=rule, vmap_only=False)
        return jax.tree_util.tree_unflatten(out_tree, list(results))


# Guards every kernel's wrappers (_wrappers_of).
_wrappers_lock = threading.Lock()


def _wrappers_of(kernel) -> dict:
    """The compiled wrappers of `kernel`, by layout, shared by every op of
    it: an op made again after the last one was collected (a helper that
    builds the op per call) finds them instead of compiling anew (measured:
    780 ms and 1.3 MiB kept per re-creation). Kept on the dispatcher
    itself, so that they go with it (a wrapper refers to its kernel: a
    table keyed weakly on the kernel would keep it forever)."""
    with _wrappers_lock:
        found = getattr(kernel, "_numbax_wrappers", None)
        if found is None:
            found = {}
            try:
                kernel._numbax_wrappers = found
            except (AttributeError, TypeError):
                pass  # a dispatcher without attributes: per op, as before
        return found


def _compiled_types(kernel, argtypes: tuple) -> tuple:
    """Compiles `kernel` for `argtypes` and returns the argument types of
    the overload the wrapper's call will use. A kernel with explicit
    signatures (``@njit("void(float32[:], ...)")``) cannot compile more:
    its overload is then chosen as the wrapper's call chooses it (Numba
    converts a C array to an 'A' one), and refused if none fits."""
    if getattr(kernel, "_can_compile", True):
        kernel.compile(argtypes)
        return argtypes
    from numba.core import types
    sig = kernel.typingctx.resolve_function_type(
        types.Dispatcher(kernel), tuple(argtypes), {})
    if sig is None:
        sigs = ", ".join(str(s) for s in kernel.signatures)
        raise TypeError(f"no overload of its explicit signatures ({sigs}) "
                        "accepts these types; add one, or drop the "
                        "signature so Numba compiles for the call")
    return tuple(sig.args)


def _launch_range(launch_dims, op: str) -> int:
    dims = launch_dims
    if isinstance(dims, (tuple, list)) and len(dims) == 1:
        dims = dims[0]
    if isinstance(dims, (bool, np.bool_)) or not isinstance(
            dims, (int, np.integer)) or int(dims) < 0:
        raise ValueError(
            f"{op}: launch_dims must be one non-negative int, the size of "
            f"the range the kernel's (begin, end) split; got {launch_dims!r}")
    return int(dims)


def _numba_dtype(dtype, op: str, what: str):
    import numba
    if np.dtype(dtype) == np.float16:
        # Numba types it, but its CPU target has no float16 loads, stores
        # or arithmetic: even a kernel that does nothing fails to compile.
        raise TypeError(
            f"{op}: {what} has dtype float16, which Numba's CPU target "
            "cannot load, store or compute with (even a kernel that only "
            "copies fails to compile); convert it (x.astype(jnp.float32)) "
            "before the call, and the result back after it")
    try:
        return numba.from_dtype(np.dtype(dtype))
    except Exception:  # noqa: BLE001 - Numba's NotImplementedError et al.
        raise TypeError(
            f"{op}: {what} has dtype {dtype}, which Numba's "
            "CPU arrays cannot hold; convert it (e.g. x.astype(jnp.float32)) "
            "before the call and after") from None


def _input_array(a, op: str, position: int):
    if isinstance(a, (jax.Array, jax.core.Tracer)):
        x = a
    elif isinstance(a, jax.ShapeDtypeStruct):
        raise TypeError(
            f"{op}: input {position} is {type(a).__name__} ({a!r:.60}), not "
            "an array; pass a jax or numpy array (Python and NumPy scalars "
            "are passed by value)")
    else:
        checks.refuse_non_array(a, op, position)
        try:
            x = jnp.asarray(a)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{op}: input {position} is not an array JAX "
                            f"can hold ({type(a).__name__}): {exc}") from exc
    _numba_dtype(x.dtype, op, f"input {position}")
    return x


def _check_kernel_object(kernel) -> None:
    from numba.core.registry import CPUDispatcher
    if isinstance(kernel, CPUDispatcher):
        if getattr(kernel, "targetoptions", {}).get("forceobj"):
            raise TypeError(
                f"numba_kernel: kernel {keys.base_name(kernel)} is compiled "
                "in object mode (forceobj=True), which needs Python and the "
                "GIL on every call; decorate it with @numba.njit instead")
        return
    hint = ("a @cuda.jit kernel: use numbax.numba_cuda_kernel for it"
            if type(kernel).__module__.startswith(("numba.cuda", "numba_cuda"))
            else "decorate it with @numba.njit")
    raise TypeError(
        f"numba_kernel: kernel must be a Numba @njit function (a CPU "
        f"dispatcher), got {type(kernel).__name__}: {kernel!r:.80}; {hint}")


def numba_kernel(
    kernel: Any,
    outs: Any,
    *,
    vmap_method: str | None = None,
    input_output_aliases: dict[int, int] | None = None,
    name: str | None = None,
    parallel: str | None = None,
    launch_dims: int | None = None,
    sharding_rule: str | None = None,
) -> Callable[..., Any]:
    """Create a JAX op from a Numba ``@njit`` kernel, run on JAX's CPU backend.

    ``kernel(*inputs, *outputs)`` writes the outputs (C-contiguous Numba
    arrays over XLA's own buffers, zero copy) and returns None. numbax
    compiles a ``@cfunc`` wrapper per kernel and argument types at trace
    time; XLA's CPU runtime calls it from C++, with no Python and no GIL
    per call.

    Args:
      kernel: an ``@numba.njit`` function (nopython mode).
      outs: a ``jax.ShapeDtypeStruct``, a sequence/pytree of them (the
        result has the same structure), or a function of the call's
        arguments returning one.
      vmap_method: ``None`` or ``'sequential'``: under ``jax.vmap`` the
        kernel sees one slice at a time, every slice run from one handler
        call (nested vmaps too). ``'expand_dims'``, ``'broadcast_all'``,
        ``'legacy_vectorized'``: as ``jax.ffi.ffi_call``, the kernel gets
        the batch as a leading axis in one call.
      input_output_aliases: ``{input index: output index}``: the output is
        written in the input's buffer (same shape and dtype); input
        indices count the array inputs only.
      name: optional stable name for the op's key, a non-empty str (default:
        the kernel's module and qualified name); also its name in HLO.
      parallel: ``None`` (the kernel runs on the XLA thread that executes
        the op) or ``'xla'``: the call's range (``launch_dims``, times the
        slices of a vmapped call) is split into chunks run on XLA's
        intra-op thread pool, the calling thread taking chunks too.
      launch_dims: an int ``n``: the kernel then takes ``(begin, end)``
        (``numba.uint64``) first and handles indices ``begin <= i < end``
        of ``range(n)``; numbax calls it over all of ``range(n)`` (in
        chunks with ``parallel='xla'``).
      sharding_rule: which axes of the inputs and outputs are the same
        factor, as for ``numba_cuda_callable`` (``"i j, j -> i j"``): under
        ``jax.jit`` XLA may then run the kernel on each device's shards.
        Not with ``launch_dims``.

    Kernels compiled with ``@njit(parallel=True)`` run one at a time in the
    process (Numba's workqueue threading layer aborts on concurrent use).

    Returns:
      A function of JAX arrays (and Python/NumPy scalars, passed by value)
      that works eagerly and inside ``jax.jit``, ``jax.vmap`` and
      ``jax.export``.

    Raises:
      TypeError: ``kernel`` is not an ``@njit`` function; (when called) it
        cannot be compiled for the call's types, returns a value, or a dtype
        Numba cannot hold.
      ValueError: a bad option; (when called) aliases or outs that do not
        fit. docs/errors.md lists every error.
    """
    try:
        import numba  # noqa: F401
    except ImportError as exc:  # pragma: no cover - numbax[cpu] brings it
        raise ImportError(
            "numba_kernel needs numba: pip install 'numbax[cpu]'") from exc
    _check_kernel_object(kernel)
    checks.check_vmap_method(vmap_method, OP, kernel=True)
    checks.check_name(name, OP)
    if parallel not in PARALLEL:
        raise ValueError(f"numba_kernel: parallel must be None or 'xla'; "
                         f"got {parallel!r}")
    if sharding_rule is not None and launch_dims is not None:
        raise ValueError(
            "numba_kernel: give sharding_rule or launch_dims, not both: each "
            "device's shard would cover the whole launch range; take the "
            "sizes from the arrays in the kernel instead of launch_dims")
    if sharding_rule is not None and vmap_method == "legacy_vectorized":
        raise ValueError(
            "numba_kernel: sharding_rule cannot be combined with "
            "vmap_method='legacy_vectorized' (deprecated in JAX); use "
            "'expand_dims', 'broadcast_all' or 'sequential'")
    # One object per distinct op while it lives: its compiled wrappers and
    # registry entries are shared by every re-creation.
    op = NumbaKernel(kernel, outs, vmap_method=vmap_method,
                     input_output_aliases=input_output_aliases, name=name,
                     parallel=parallel, launch_dims=launch_dims,
                     sharding_rule=sharding_rule)
    return ops.interned(op, op._identity)

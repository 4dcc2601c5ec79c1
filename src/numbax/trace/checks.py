"""Trace-time checks shared by every numbax op: shapes, dtypes, outs."""

from __future__ import annotations

import inspect
import math
import operator
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..runtime import numba_bridge

# The element types the C++ bridge can hand to Numba; bfloat16 too, where
# the installed numba-cuda types it (0.30 and newer, see numba_bridge.numba_type_for),
# and the float8 types, as their bits (uint8; numba_bridge.FLOAT8_NAMES).
_SUPPORTED = {np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
    np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64,
    np.complex128)}


# The most axes a buffer may have: csrc/call_frame.h kMaxRank.
MAX_RANK = 32


def check_dtype(dtype: Any, what: str) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError:
        # Not a numpy dtype at all: a PRNG key array, an extended dtype.
        hint = ("use jax.random.key_data(key) to get its uint32 words"
                if "key<" in str(dtype) else "convert it with .astype(...)")
        raise ValueError(
            f"{what} has dtype {dtype}, which is not a numpy dtype and which "
            f"Numba kernels cannot use; {hint}") from None
    if dt in _SUPPORTED:
        return dt
    if dt.byteorder not in "=|" and dt.newbyteorder("=") in _SUPPORTED:
        raise ValueError(
            f"{what} has dtype {dt.str} ({dt.name} in non-native byte "
            f"order), which Numba kernels cannot use; use the native "
            f"{dt.name}, e.g. np.dtype({dt.name!r}) or .astype({dt.name!r})")
    if dt.name == "bfloat16":
        if numba_bridge.numba_type_for(dt) is not None:
            return dt
        raise ValueError(
            f"{what} has dtype bfloat16, which the installed numba-cuda "
            "cannot type (numba-cuda 0.30 or newer can: pip install -U "
            "numba-cuda); or convert it with .astype(jnp.float32) (or "
            "float16) first")
    if numba_bridge.is_float8(dt):
        # Kernels get the bits: a uint8 array of the same shape.
        return dt
    bits = numba_bridge.SUB_BYTE_BITS.get(dt.name)
    if bits is not None:
        wider = ("uint8" if dt.name.startswith("uint") else
                 "int8" if dt.name.startswith("int") else "float16")
        raise ValueError(
            f"{what} has dtype {dt.name}, a sub-byte type ({bits} bit(s) per "
            "element, which XLA may pack several to a byte), which Numba "
            "kernels cannot use: no Numba array addresses elements "
            f"narrower than a byte; convert with .astype(jnp.{wider}) before "
            "the op (and back after it, if needed)")
    raise ValueError(
        f"{what} has dtype {dt.name}, which Numba kernels cannot use. "
        "Supported: bool, int8-64, uint8-64, float16/32/64, complex64/128"
        ", bfloat16, float8 (as uint8 bits); convert with .astype(...)")


# The 64-bit dtypes numbax supports, and what JAX turns each into with
# jax_enable_x64 off (jax.dtypes.canonicalize_dtype).
_NARROWED = {np.dtype(wide): np.dtype(narrow) for wide, narrow in (
    (np.int64, np.int32), (np.uint64, np.uint32), (np.float64, np.float32),
    (np.complex128, np.complex64))}


def wide_outputs(specs) -> tuple[tuple[int, np.dtype], ...]:
    """(index, dtype) of each output in `specs` that needs jax_enable_x64;
    computed once per op, for :func:`narrowed_x64` to read per call."""
    return tuple((i, np.dtype(s.dtype)) for i, s in enumerate(specs)
                 if np.dtype(s.dtype) in _NARROWED)


def narrowed_x64(wide: tuple[tuple[int, np.dtype], ...], op: str,
                 owner: Any) -> dict[int, np.dtype]:
    """{output index: its 32-bit dtype} for the 64-bit outputs (`wide`,
    from :func:`wide_outputs`) while jax_enable_x64 is off; {} otherwise.

    JAX's convention (jnp.ones(n, jnp.float64) is float32 then, with a
    warning; the reference does the same): the op returns the 32-bit type,
    and the caller compiles its kernel for (or hands func) the arrays XLA
    really allocates, the 32-bit ones. Returning a real 64-bit array (as
    numbax once did) made the next op compiled with x64 off read it as its
    32-bit type (an int64 3e9 plus 1 gave -1294967295), which is why such
    outputs were refused before. Read per call, not when the op is made: x64
    may be switched later (a jax.enable_x64 block). The warning names the op
    once (per `owner`, the op object). Scratch buffers never reach JAX, and
    XLA keeps them as declared, so they are never narrowed.
    """
    if not wide or jax.config.read("jax_enable_x64"):
        return {}
    narrow = {i: _NARROWED[dtype] for i, dtype in wide}
    if not getattr(owner, "_x64_warned", False):
        owner._x64_warned = True
        which = ", ".join(f"outs[{i}] {dtype.name} -> {narrow[i].name}"
                          for i, dtype in wide)
        warnings.warn(
            f"{op}: jax_enable_x64 is off, so its 64-bit outputs are "
            f"returned as their 32-bit types ({which}), as JAX does for "
            f"jnp.ones(n, jnp.float64); the kernel (or func) gets 32-bit "
            f"output arrays. Enable x64 with jax.config.update("
            f"'jax_enable_x64', True) (or JAX_ENABLE_X64=1) for 64-bit "
            f"results, or declare the outputs 32-bit to silence this "
            f"warning", UserWarning, stacklevel=4)
    return narrow


def narrow_specs(specs, narrow: dict[int, np.dtype]) -> list:
    """`specs` (ShapeDtypeStructs) with the dtypes of :func:`narrowed_x64`."""
    return [jax.ShapeDtypeStruct(s.shape, narrow[i]) if i in narrow else s
            for i, s in enumerate(specs)]


def is_shape_dtype(obj: Any) -> bool:
    return hasattr(obj, "shape") and hasattr(obj, "dtype")


# XLA refuses (by aborting the process, from inside jaxlib) a shape whose
# element count, or byte size, does not fit in int64; numbax checks first.
_MAX_SIZE = 2**63 - 1


def check_extent_product(shape, itemsize: int, what: str) -> None:
    """ValueError if `shape`'s element count or byte size overflows int64."""
    elements = math.prod(shape)
    if elements > _MAX_SIZE or elements * itemsize > _MAX_SIZE:
        raise ValueError(
            f"{what} has shape {tuple(shape)}: {elements} elements"
            f" ({elements * itemsize} bytes), more than XLA can address "
            f"(2**63 - 1); use a smaller shape")


def _extent(d, what: str, i: int, shape) -> int:
    # A float like 4.7 must not be truncated silently to 4.
    if isinstance(d, (bool, np.bool_)):
        raise TypeError(f"{what}[{i}] has a bool extent in shape {shape!r}; "
                        "extents must be ints")
    try:
        return operator.index(d)
    except TypeError:
        pass
    if isinstance(d, (float, np.floating)):
        raise TypeError(
            f"{what}[{i}] has a non-integer extent {d!r} in shape "
            f"{tuple(shape)!r}: extents must be ints, e.g. "
            f"jax.ShapeDtypeStruct(({int(d) if float(d).is_integer() else 'n'},"
            " ...), dtype)")
    raise TypeError(
        f"{what}[{i}] has a non-static shape {shape!r}: numbax "
        "outputs need concrete shapes of ints")


def normalize_outs(outs: Any, what: str = "outs", op: str | None = None):
    """(flat list of ShapeDtypeStruct, treedef) from a struct or pytree of them."""
    if op:
        what = f"{op}: {what}"
    if isinstance(outs, (tuple, list)) and outs and all(
            isinstance(d, (int, np.integer)) for d in outs):
        raise TypeError(
            f"{what} must be a jax.ShapeDtypeStruct or a sequence/pytree of "
            f"them, not a bare shape {tuple(outs)!r}: write "
            f"jax.ShapeDtypeStruct({tuple(outs)!r}, dtype)")
    if is_shape_dtype(outs):
        leaves, tree = [outs], jax.tree_util.tree_structure(0)
    else:
        leaves, tree = jax.tree_util.tree_flatten(
            outs, is_leaf=is_shape_dtype)
        if not leaves:
            raise TypeError(
                f"{what} must be a jax.ShapeDtypeStruct or a sequence/pytree "
                f"of them; got {outs!r}")
    specs = []
    for i, leaf in enumerate(leaves):
        if not is_shape_dtype(leaf):
            raise TypeError(
                f"{what}[{i}] must be a jax.ShapeDtypeStruct (or have .shape "
                f"and .dtype); got {type(leaf).__name__}: {leaf!r}")
        try:
            raw = tuple(leaf.shape)
        except TypeError as exc:
            raise TypeError(
                f"{what}[{i}] has a non-static shape {leaf.shape!r}: numbax "
                "outputs need concrete shapes") from exc
        shape = tuple(_extent(d, what, i, raw) for d in raw)
        if any(d < 0 for d in shape):
            raise ValueError(f"{what}[{i}] has a negative dimension: {shape}")
        if len(shape) == 0:
            raise ValueError(
                f"{what}[{i}] is 0-d (a scalar); numbax's kernels write their "
                "outputs as arrays of at least one dimension (Numba's CUDA "
                "device arrays, and numba_kernel's alike): use shape (1,) and "
                "write out[0]")
        if len(shape) > MAX_RANK:
            raise ValueError(
                f"{what}[{i}] has {len(shape)} dimensions; numbax's call frame "
                f"takes at most {MAX_RANK}: reshape it to fewer axes")
        dtype = check_dtype(leaf.dtype, f"{what}[{i}]")
        check_extent_product(shape, dtype.itemsize, f"{what}[{i}]")
        specs.append(jax.ShapeDtypeStruct(shape, dtype))
    return specs, tree


def normalize_scratch(scratch: Any, what: str = "scratch",
                      op: str | None = None) -> list:
    """A callable's scratch buffers as a flat list of ShapeDtypeStruct.

    None and an empty sequence or pytree (``[]``, ``()``, ``{}``) both mean
    no scratch buffer: a scratch function that builds its list of buffers
    naturally returns ``[]`` for a call that needs none, as a fixed
    ``scratch=[]`` says the same thing."""
    if scratch is None or (
            not is_shape_dtype(scratch) and
            isinstance(scratch, (list, tuple, dict)) and
            not jax.tree_util.tree_leaves(scratch, is_leaf=is_shape_dtype)):
        return []
    return normalize_outs(scratch, what, op=op)[0]


def check_concrete_shape(shape, op: str, what: str) -> None:
    """ValueError naming the op if `shape` has a symbolic extent (a
    jax.export.symbolic_shape dimension, as jax.export's shape polymorphism
    traces with): numbax compiles and launches for concrete shapes, and its
    keys, loaded kernels and shape functions need ints (JAX's own error, an
    InconclusiveDimensionOperation from deep in numbax, named no op)."""
    symbolic = [d for d in shape if not isinstance(d, (int, np.integer))]
    if not symbolic:
        return
    raise ValueError(
        f"{op}: {what} has the symbolic shape "
        f"({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''}) "
        f"(dimension {symbolic[0]} is not a number): numbax ops need "
        "concrete shapes, since each shape is compiled and launched for "
        "its own. Export with concrete shapes instead (e.g. "
        "jax.ShapeDtypeStruct((1024,), jnp.float32) in jax.export.export"
        "(...)(...)), one export per shape you need (docs/export.md)")


def check_concrete_avals(avals: Sequence[Any], op: str) -> None:
    """check_concrete_shape for each of a primitive's input avals (or
    values)."""
    for i, aval in enumerate(avals):
        check_concrete_shape(getattr(aval, "shape", ()), op, f"input {i}")


def refuse_non_array(a, op: str, position) -> None:
    """TypeError naming the op for an input that is a container, not an
    array: JAX refuses lists and tuples as array arguments (jnp.sin([1.0])
    and jax.ffi calls do), so that a pytree of scalars is never read as one
    array; numbax ops follow it, and vmap_fold with them."""
    if a is None or isinstance(a, (dict, list, tuple)):
        raise TypeError(
            f"{op}: input {position} is {type(a).__name__} ({a!r:.60}), not "
            "an array; pass a numeric jax or numpy array for each input "
            "(jnp.asarray(value) for a list, as jnp functions and jax.ffi "
            "calls require; Python and NumPy scalars are passed by value)")


def as_input_arrays(args: Sequence[Any], op: str,
                    shapes: bool = False, positions=None) -> list:
    """JAX arrays for the call's inputs, checked (no copy of JAX arrays).
    `shapes`: jax.ShapeDtypeStructs stand for arrays too (checked alike).
    `positions`: each arg's position among the call's arguments, as errors
    name it (default: its index in `args`; scalars passed by value sit
    between the arrays)."""
    arrays = []
    for j, a in enumerate(args):
        i = j if positions is None else positions[j]
        if isinstance(a, jax.Array) or isinstance(a, jax.core.Tracer) or (
                shapes and isinstance(a, jax.ShapeDtypeStruct)):
            x = a
        elif isinstance(a, jax.ShapeDtypeStruct):
            raise TypeError(
                f"{op}: input {i} is a jax.ShapeDtypeStruct {a}, which "
                "describes an array but holds none: call the op on arrays, "
                "or on ShapeDtypeStructs through jax.eval_shape(op, ...) "
                "(or jax.jit(op).lower(...))")
        else:
            refuse_non_array(a, op, i)
            try:
                x = jnp.asarray(a)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"{op}: input {i} is not an array JAX can hold "
                    f"({type(a).__name__}): {exc} Pass a numeric jax or "
                    "numpy array (numbax inputs are buffers; Python and "
                    "NumPy scalars are passed by value)") from exc
        check_concrete_shape(x.shape, op, f"input {i}")
        if len(x.shape) == 0:
            raise ValueError(
                f"{op}: input {i} is 0-d (a scalar array); Numba CUDA device "
                "arrays need at least one dimension. Either pass a Python or "
                "NumPy scalar (float(value), np.float32(value), ...), which "
                "numbax passes by value as a static argument (each new value "
                "is a new key and launch plan: for values known when "
                "tracing), or wrap it in a 1-d array, e.g. "
                "jnp.array([value]) or x.reshape(1), and read a[0] in the "
                "kernel (for traced values)")
        dtype = check_dtype(x.dtype, f"{op}: input {i}")
        if isinstance(x, jax.ShapeDtypeStruct):  # an array would exist
            check_extent_product(x.shape, dtype.itemsize, f"{op}: input {i}")
        arrays.append(x)
    return arrays


def check_aliases(aliases, inputs, out_specs, op: str):
    if aliases is None:
        return None
    if not isinstance(aliases, dict):
        raise TypeError(f"{op}: input_output_aliases must be a dict "
                        "{input index: output index}")
    normalized = {}
    for i, o in aliases.items():
        for what, v in (("key", i), ("value", o)):
            if isinstance(v, (bool, np.bool_)) or not isinstance(
                    v, (int, np.integer)):
                raise TypeError(
                    f"{op}: input_output_aliases {what} {v!r} must be an int "
                    "index: the dict is {input index: output index}")
        i, o = int(i), int(o)
        normalized[i] = o
        if not 0 <= i < len(inputs):
            raise ValueError(
                f"{op}: input_output_aliases key {i!r} is not an input index "
                f"(there are {len(inputs)} inputs)")
        if not 0 <= o < len(out_specs):
            raise ValueError(
                f"{op}: input_output_aliases value {o!r} is not an output "
                f"index (there are {len(out_specs)} outputs)")
        a, s = inputs[i], out_specs[o]
        if tuple(a.shape) != tuple(s.shape) or np.dtype(a.dtype) != s.dtype:
            raise ValueError(
                f"{op}: input {i} ({a.dtype}{list(a.shape)}) cannot alias "
                f"output {o} ({s.dtype}{list(s.shape)}): aliased buffers "
                "need the same shape and dtype")
    if len(set(normalized.values())) != len(normalized):
        raise ValueError(
            f"{op}: two inputs alias the same output in "
            f"input_output_aliases={aliases!r}; each output can reuse at "
            "most one input's buffer")
    return normalized


#: The ``vmap_method`` values of numbax's ops: None and jax.ffi.ffi_call's
#: (jax 0.10), checked when an op is created rather than when it is first
#: vmapped. What each means per op kind: kernel/vmap.py, callable/vmap.py.
VMAP_METHODS = (None, "expand_dims", "broadcast_all", "legacy_vectorized",
                "sequential", "sequential_unrolled")
#: numba_cuda_callable's only: a kernel launches its slices from C++, with
#: no XLA loop to unroll.
CALLABLE_ONLY_VMAP_METHODS = ("sequential_unrolled",)


def check_vmap_method(vmap_method, op: str, *, kernel: bool = False) -> None:
    """ValueError naming `op` unless `vmap_method` is one of VMAP_METHODS
    (for a `kernel`, one that is not callable-only)."""
    methods = tuple(m for m in VMAP_METHODS if not (
        kernel and m in CALLABLE_ONLY_VMAP_METHODS))
    if not isinstance(vmap_method, (str, type(None))) or \
            vmap_method not in methods:
        why = ""
        if vmap_method in CALLABLE_ONLY_VMAP_METHODS:
            why = (f" ({vmap_method!r} is an XLA loop of one call per "
                   "slice; here 'sequential', or None, runs every slice "
                   "from one call: use it)")
        raise ValueError(
            f"{op}: vmap_method must be one of "
            f"{', '.join(repr(m) for m in methods)}; got {vmap_method!r}"
            f"{why}")


def check_name(name, op: str, label: str | None = None) -> None:
    """The ``name=`` of an op: None, or a non-empty str (it becomes the
    identity part of the op's key, which another process matches by text)
    without a NUL character. `label` names the op where `op` (the function
    that makes it) does not say which."""
    if name is None:
        return
    if not isinstance(name, str):
        raise TypeError(
            f"{op}: name must be a str (a stable name for the op's key) or "
            f"None, got {type(name).__name__}: {name!r}")
    if not name.strip():
        raise ValueError(
            f"{op}: name={name!r} is blank, which would silently mean no "
            "name (the function's module and qualified name); give a "
            "non-empty name, or leave name=None")
    check_no_nul(name, label or op)


def check_no_nul(name: str, op: str) -> None:
    """Refuses a name holding a NUL character, when the op is made: C++
    reads the name (the op's key, its NVTX range) as a C string, so every
    call would fail at run time with an error naming no op."""
    at = name.find("\0")
    if at >= 0:
        raise ValueError(
            f"{op}: name={name!r} holds a NUL character (at index {at}), "
            "which numbax's C++ side (the op's key and NVTX range) cannot "
            "carry: every call would fail at run time; give a name without "
            f"it, e.g. name={name.replace(chr(0), '')!r}")


def not_differentiable(op: str, what: str) -> ValueError:
    """The error for jax.grad/jvp through an op numbax cannot differentiate
    (`what`: 'func' or 'the kernel')."""
    # A kernel may be an XLACustomKernel's, vmapped as one call
    # (custom_kernel/vmap.py): that op's rules exist, but not here.
    batched = (
        ". If it is the kernel of an XLACustomKernel that has a JVP rule: "
        "jax.vmap of that op inside a jax.jit, lax.scan or jax.checkpoint "
        "runs the batch as the kernel alone, so differentiate inside the "
        "jit (jax.jit(jax.grad(f)), not jax.grad(jax.jit(f))), or give the "
        "op a batching rule (def_batching_rule) that calls the op"
        if what == "the kernel" else "")
    return ValueError(
        f"{op} cannot be differentiated: numbax cannot see what {what} "
        "computes. Give it a derivative with jax.custom_jvp or "
        "jax.custom_vjp around the call, or build the op with "
        "numbax.XLACustomKernel and def_jvp_rule (docs/custom_kernel.md); "
        "wrap an input in jax.lax.stop_gradient if no derivative flows "
        f"through it{batched}")


def refuse_differentiation(primitive, what: str) -> None:
    """Registers JVP and transpose rules for `primitive` that raise
    not_differentiable naming the user's op (its `op` parameter: the op, or
    its label), where JAX's own refusal would name numbax's primitive,
    which every op shares. The JVP rule is only called with a tangent that
    is not a symbolic zero, so stop_gradient around every input still lets
    the op run under jax.grad; the transpose rule answers
    jax.linear_transpose, which would treat the op as linear."""
    from jax.interpreters import ad

    def label(op) -> str:
        return op if isinstance(op, str) else op.label

    def jvp(primals, tangents, *, op, **params):
        raise not_differentiable(label(op), what)

    def transpose(cotangents, *args, op, **params):
        raise not_differentiable(label(op), what)

    ad.primitive_jvps[primitive] = jvp
    ad.primitive_transposes[primitive] = transpose


def not_batchable(op: str) -> NotImplementedError:
    """jax.vmap of a numba_cuda_callable made without vmap_method, naming the
    op and the option (ffi_call's own refusal names neither)."""
    return NotImplementedError(
        f"{op} was created without vmap_method, so numbax does not know "
        "how func handles a batch and jax.vmap cannot batch it. Create "
        "it with numba_cuda_callable(..., vmap_method=...): "
        "'sequential' (XLA loops over the slices: always correct), "
        "'expand_dims' or 'broadcast_all' (func gets the batch, as a "
        "leading axis, in one call) (docs/quickstart.md)")


def check_bool(value, name: str, op: str) -> None:
    """TypeError unless `value` is True or False (a numpy bool too)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"{op}: {name} must be True or False, got "
            f"{type(value).__name__}: {value!r}")


def arg_layout(n_in: int, n_out: int, n_scratch: int = 0,
               stream: bool = False) -> str:
    """How numbax passes arguments, e.g. 'in_0, in_1, out_0, stream'."""
    names = ([f"in_{i}" for i in range(n_in)] +
             [f"out_{i}" for i in range(n_out)] +
             [f"scratch_{i}" for i in range(n_scratch)] +
             (["stream"] if stream else []))
    return ", ".join(names)


def check_arity(func, nargs: int, op: str, layout: str,
                what: str = "func") -> None:
    """TypeError now, at trace time, if `func` cannot take `nargs` positional
    arguments; silent where Python cannot tell (builtins, C callables)."""
    try:
        # What numbax calls is func itself: a functools.wraps wrapper taking
        # *args must be judged by its own signature, not the wrapped one's.
        sig = inspect.signature(func, follow_wrapped=False)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*range(nargs))
    except TypeError as exc:
        raise TypeError(
            f"{op}: numbax calls {what}({layout}), {nargs} positional "
            f"arguments, but {what}{sig} cannot take them ({exc}); give "
            f"{what} one parameter per input, then per output"
            + (", then per scratch buffer, then the stream"
               if layout.endswith("stream") else "")) from None


def renamed(exc: BaseException, message: str) -> BaseException | None:
    """`exc`'s type with `message` (the op named first), or None where that
    type cannot be built from one message (re-raise `exc` as it is then)."""
    try:
        return type(exc)(message)
    except Exception:  # noqa: BLE001 - an exception type of its own
        return None


def compiled_naming_op(compile, what: str):
    """compile(), its error re-raised with the same type as
    "`what`: <its message>" (the op named first) where that type allows."""
    try:
        return compile()
    except Exception as exc:
        named = renamed(exc, f"{what}: {exc}")
        if named is None:
            raise
        raise named from exc

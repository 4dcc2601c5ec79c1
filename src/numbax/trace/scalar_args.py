"""Python and NumPy scalars passed to numbax ops by value.

A ``bool``, ``int``, ``float``, ``complex`` or NumPy scalar (``np.float32(2)``,
``np.int16(3)``, ``np.bool_(True)``, ...) given to an op where an input goes
is not an XLA buffer: it is a static value of the call, like a static
argument of ``jax.jit``. A ``numba_cuda_kernel`` passes it by value into
the kernel's parameter at that position, typed as Numba types it
(``numba.typeof``: ``int`` -> int64, ``float`` -> float64, ``bool`` ->
boolean, NumPy scalars keep their dtype) or converted to the type the
kernel's explicit signature gives that parameter, exactly as Numba's own
launch packs it. A ``numba_cuda_callable`` hands it to ``func`` as the
Python value. Either way it is part of the op's key: a new value is a new
key (for a kernel, a new loaded kernel; the compiled code depends on the type
only).

This module classifies such arguments, spells them in keys (exactly, and
readable: ``2:float:0x1.8p+1``) and back, and converts them to what a kernel
parameter of a given Numba type receives. Everything here runs at trace
time (or when a program's key is resolved), never per call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runtime import keys

# Python scalar types and the names keys give them. NumPy scalars are
# spelled "np.<dtype name>".
_PY_KINDS = {bool: "bool", int: "int", float: "float", complex: "complex"}
_PY_TYPES = {v: k for k, v in _PY_KINDS.items()}


def is_scalar(value: Any) -> bool:
    """True for the values numbax passes by value: Python bool, int, float,
    complex and NumPy bool/number scalars (not 0-d arrays, not JAX values)."""
    return type(value) in _PY_KINDS or isinstance(value, (np.bool_, np.number))


@dataclass(frozen=True)
class Scalar:
    """One scalar argument of a call: its position among the op's inputs
    (arrays and scalars, in call order) and its value, canonical (decoded
    from its key text, so this process and one that rebuilds the call from
    a key see the same value)."""
    position: int
    text: str  # "kind:value", as the key spells it

    @property
    def value(self):
        return decode(self.text)

    def spec(self) -> str:
        return f"{self.position}:{self.text}"


def _float_text(x: Any) -> str:
    return float(x).hex()


def encode(value) -> str:
    """'kind:value' for a scalar: exact, and free of the characters that
    separate a key's parts and fields ('/', ';', ',', '=', ':')."""
    kind = _PY_KINDS.get(type(value))
    if kind is None:
        dtype = np.dtype(type(value))
        kind = f"np.{keys.dtype_name(dtype)}"
        if (dtype.kind == "f" and dtype.itemsize > 8) or (
                dtype.kind == "c" and dtype.itemsize > 16):
            raise TypeError(f"{dtype.name} scalars are not supported")
        value = value.item()
    if isinstance(value, (bool, np.bool_)):
        text = "True" if value else "False"
    elif isinstance(value, (int, np.integer)):
        text = str(int(value))
    elif isinstance(value, (float, np.floating)):
        text = _float_text(value)
    elif isinstance(value, (complex, np.complexfloating)):
        text = f"{_float_text(value.real)}_{_float_text(value.imag)}"
    else:
        raise TypeError(f"{type(value).__name__} scalars are not supported")
    return f"{kind}:{text}"


def decode(text: str):
    """The scalar 'kind:value' spells (the inverse of encode)."""
    kind, sep, body = text.partition(":")
    if not sep:
        raise ValueError(f"malformed scalar spec {text!r}")
    if kind.startswith("np."):
        dtype = keys.dtype_from_name(kind[3:])
        if dtype.kind not in "biufc":
            raise ValueError(f"malformed scalar spec {text!r}")
        py = {"b": "bool", "i": "int", "u": "int", "f": "float",
              "c": "complex"}[dtype.kind]
        return dtype.type(decode(f"{py}:{body}"))
    if kind == "bool" and body in ("True", "False"):
        return body == "True"
    if kind == "int":
        return int(body)
    if kind == "float":
        return float.fromhex(body)
    if kind == "complex":
        re_, sep, im = body.partition("_")
        if sep:
            return complex(float.fromhex(re_), float.fromhex(im))
    raise ValueError(f"malformed scalar spec {text!r}")


def canonical(position: int, value) -> Scalar:
    return Scalar(position, encode(value))


def scalars_spec(scalars) -> str:
    """';scalars=1:float:0x1.8p+1,3:int:7' for a call's scalars, '' for none
    (a call without scalars keeps the key it always had)."""
    if not scalars:
        return ""
    return ";scalars=" + ",".join(s.spec() for s in scalars)


def parse_scalars(fields: dict) -> tuple:
    """The Scalars of a call spec's 'scalars' field."""
    out = []
    for part in filter(None, fields.get("scalars", "").split(",")):
        pos, sep, text = part.partition(":")
        if not sep or not pos.isdigit():
            raise ValueError(f"malformed scalar spec {part!r}")
        decode(text)  # checks it
        out.append(Scalar(int(pos), text))
    return tuple(out)


def split(args, op: str):
    """(the arguments that are not scalars, the scalars as Scalars by
    position among `args`)."""
    arrays, scalars = [], []
    for i, a in enumerate(args):
        if is_scalar(a):
            try:
                scalars.append(canonical(i, a))
            except TypeError as exc:
                raise TypeError(
                    f"{op}: input {i} is a {type(a).__name__} scalar, which "
                    f"numbax cannot pass by value ({exc}); pass it as a "
                    "1-element array, e.g. jnp.array([value])") from None
        else:
            arrays.append(a)
    return arrays, tuple(scalars)


def merge(arrays, scalars, values=None):
    """`arrays` with each scalar's value (or `values[i]` for scalar i) at
    its position: what a kernel or func receives."""
    if not scalars:
        return list(arrays)
    out = list(arrays)
    for i, s in enumerate(scalars):
        out.insert(s.position, s.value if values is None else values[i])
    return out


# -- kernel parameters ---------------------------------------------------------

def numba_type(scalar: Scalar, op: str):
    """The Numba type Numba's launch gives the value (numba.typeof)."""
    import numba
    value = scalar.value
    try:
        ty = numba.typeof(value)
    except Exception as exc:  # noqa: BLE001 - Numba's own refusal
        raise TypeError(
            f"{op}: input {scalar.position} is a scalar Numba cannot type "
            f"({type(value).__name__} {value!r}: {exc}); pass it as a "
            "1-element array, e.g. jnp.array([value])") from None
    return ty


def _dtype_of(formal):
    """The NumPy dtype of a Numba scalar type, or None for other types."""
    from numba.core import types
    if isinstance(formal, types.Boolean):
        return np.dtype(np.bool_)
    if isinstance(formal, (types.Integer, types.Float, types.Complex)):
        try:
            return np.dtype(str(formal))
        except TypeError:
            return None
    return None


def converted(scalar: Scalar, formal, op: str, where: str):
    """The value a kernel parameter of Numba type `formal` receives for
    `scalar`, as a NumPy scalar of its dtype: what Numba's launch passes
    (its ctypes conversion), refusing what that launch would refuse
    (a float for an integer parameter, a complex for a real one) and,
    unlike it, an integer outside the parameter's range (which ctypes would
    wrap silently). `where` names the argument in errors."""
    value = scalar.value
    dtype = _dtype_of(formal)
    got = f"{type(value).__name__} {value!r}"
    if dtype is None:
        raise TypeError(
            f"{op}: {where} is {formal} in the kernel's signature, but "
            f"numbax passes the scalar {got} there; pass an array there (or "
            "fix the signature)")
    integral = isinstance(value, (bool, int, np.bool_, np.integer))
    real = integral or isinstance(value, (float, np.floating))
    if dtype.kind == "b" and not isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"{op}: {where} is a boolean in the kernel's signature, but "
            f"numbax passes the scalar {got}; pass True or False")
    if dtype.kind in "iu":
        if not integral:
            raise TypeError(
                f"{op}: {where} is {formal} in the kernel's signature, but "
                f"numbax passes the scalar {got}, which Numba's launch "
                "refuses too; pass an int (e.g. int(value)) or change the "
                "signature")
        info = np.iinfo(dtype)
        if not info.min <= int(value) <= info.max:
            raise ValueError(
                f"{op}: {where} is {formal} in the kernel's signature, and "
                f"the scalar {got} does not fit in it ({info.min} to "
                f"{info.max}); Numba's launch would wrap it silently")
        return dtype.type(int(value))
    if dtype.kind == "f" and not real:
        raise TypeError(
            f"{op}: {where} is {formal} in the kernel's signature, but "
            f"numbax passes the scalar {got}, which Numba's launch refuses "
            "too; pass a real number")
    with np.errstate(over="ignore"):
        return dtype.type(value)


def parameter(scalar: Scalar, formal, op: str, where: str) -> tuple:
    """(position, kind, bytes) of a scalar kernel parameter for
    numbax._core.LoadedKernel(scalars=...): the value converted to `formal`
    (see converted), its NumPy kind ('b', 'i', 'u', 'f', 'c') and its bytes
    in the host's order. C++ packs them as Numba's launch does
    (csrc/kernel_args.h, MakeScalarParam)."""
    value = converted(scalar, formal, op, where)
    array = np.asarray(value)
    return (scalar.position, array.dtype.kind, array.tobytes())


# -- traced scalars -------------------------------------------
#
# Under jax.jit a Python scalar argument becomes a 0-d array: its value is
# known only when the program runs. numbax passes such a value (any 0-d
# array input, traced or not) as a 1-element buffer: a numba_cuda_callable's
# func gets it as a 1-element device array, a numba_cuda_kernel a generated
# kernel that reads it on the device and calls the user's kernel body with
# the value (compilers/fold.py). No value is part of a key, so a scalar that
# changes every call costs no new trace, key or compile.

def is_traced(value: Any) -> bool:
    """True for a 0-d array input (a jit-traced scalar, a 0-d jax or NumPy
    array): not a scalar passed by value, and not a ShapeDtypeStruct (a
    0-d one stands for the same thing, traced)."""
    if is_scalar(value):
        return False
    shape = getattr(value, "shape", None)
    return shape is not None and tuple(shape) == () and hasattr(
        value, "dtype")


def traced_positions(args) -> tuple:
    """The positions among `args` of the inputs passed as traced scalars."""
    return tuple(i for i, a in enumerate(args) if is_traced(a))


def as_buffer(value):
    """A traced scalar as the 1-element buffer numbax passes (a bitcast in
    XLA: no copy)."""
    import jax
    import jax.numpy as jnp
    if isinstance(value, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((1,), value.dtype)
    return jnp.reshape(value, (1,))


def as_passed(inputs, positions, traced) -> list:
    """`inputs` (the buffers) with each traced scalar's 1-element buffer
    shown as the 0-d array the call passed, as shape functions see it
    (`positions`: each buffer's position among the call's inputs, None
    when they are all buffers)."""
    if not traced:
        return list(inputs)
    import jax
    positions = range(len(inputs)) if positions is None else positions
    return [jax.ShapeDtypeStruct((), x.dtype) if p in traced else x
            for p, x in zip(positions, inputs)]


def with_traced_buffers(args, op: str, *, aliases: bool, rule: bool,
                        not_taken_by: str | None = None):
    """(`args` with each traced scalar as its 1-element buffer, the traced
    positions), refusing traced scalars for an op with `aliases`
    (input_output_aliases count array inputs only, which a buffer would
    shift) or a sharding `rule` (it names array operands), and where
    `not_taken_by` names a compiler that cannot take them."""
    traced = traced_positions(args)
    if not traced:
        return args, ()
    first = args[traced[0]]
    if not_taken_by is not None:
        raise traced_refused(
            op, traced[0], first, "numbax reads on the device for "
            f"numba-cuda kernels only, not for {not_taken_by} ones")
    if aliases:
        raise traced_refused(
            op, traced[0], first, "an op with input_output_aliases cannot "
            "take (its indices count array inputs only, and a traced "
            "scalar would shift them)")
    if rule:
        raise traced_refused(
            op, traced[0], first, "an op with a sharding rule "
            "(sharding_rule= or batch_partitionable=True) cannot take")
    return tuple(as_buffer(a) if i in traced else a
                 for i, a in enumerate(args)), traced


def traced_refused(op: str, position: int, value, why: str) -> TypeError:
    """The refusal of a traced scalar where `op` cannot take one (`why`),
    naming what jit did and the two ways to pass the value statically."""
    dtype = np.dtype(getattr(value, "dtype", "float32")).name
    return TypeError(
        f"{op}: input {position} is a traced scalar (a 0-d {dtype} array: "
        "jax.jit traces a Python scalar argument into one, its value known "
        f"only when the program runs), which {why}. Make the value static: "
        f"jax.jit(op, static_argnums={position}) (the value's position in "
        "the arguments of the function you jit) or a value closed over "
        "(jax.jit(lambda x: op(x, 2.0))); or pass a 1-element array "
        "(x.reshape(1)) and read a[0] in the kernel")

"""Trace-time checks shared by every numbax op: shapes, dtypes, outs."""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from . import _numba

# The element types the C++ bridge can hand to Numba (bfloat16 only where
# the installed Numba can type it).
_SUPPORTED = {np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
    np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64,
    np.complex128)}


def check_dtype(dtype: Any, what: str) -> np.dtype:
    dt = np.dtype(dtype)
    if dt in _SUPPORTED:
        return dt
    if dt.name == "bfloat16":
        if _numba.numba_type_for(dt) is not None:
            return dt
        raise ValueError(
            f"{what} has dtype bfloat16, which the installed Numba cannot "
            "type; convert it with .astype(jnp.float32) (or float16) first")
    raise ValueError(
        f"{what} has dtype {dt.name}, which Numba CUDA kernels cannot use. "
        "Supported: bool, int8-64, uint8-64, float16/32/64, complex64/128"
        " (and bfloat16 where Numba types it); convert with .astype(...)")


def is_shape_dtype(obj: Any) -> bool:
    return hasattr(obj, "shape") and hasattr(obj, "dtype")


def normalize_outs(outs: Any, what: str = "outs"):
    """(flat list of ShapeDtypeStruct, treedef) from a struct or pytree of them."""
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
            shape = tuple(int(d) for d in leaf.shape)
        except TypeError as exc:
            raise TypeError(
                f"{what}[{i}] has a non-static shape {leaf.shape!r}: numbax "
                "outputs need concrete shapes") from exc
        if any(d < 0 for d in shape):
            raise ValueError(f"{what}[{i}] has a negative dimension: {shape}")
        if len(shape) == 0:
            raise ValueError(
                f"{what}[{i}] is 0-d (a scalar); Numba CUDA device arrays must "
                "have at least one dimension: use shape (1,)")
        dtype = check_dtype(leaf.dtype, f"{what}[{i}]")
        specs.append(jax.ShapeDtypeStruct(shape, dtype))
    return specs, tree


def as_input_arrays(args: Sequence[Any], op: str) -> list:
    """JAX arrays for the call's inputs, checked (no copy of JAX arrays)."""
    arrays = []
    for i, a in enumerate(args):
        x = a if isinstance(a, jax.Array) or isinstance(a, jax.core.Tracer) \
            else jnp.asarray(a)
        if x.ndim == 0:
            raise ValueError(
                f"{op}: input {i} is 0-d (a scalar); Numba CUDA device arrays "
                "need at least one dimension: wrap it in a 1-d array, e.g. "
                "jnp.array([value])")
        check_dtype(x.dtype, f"{op}: input {i}")
        arrays.append(x)
    return arrays


def check_aliases(aliases, inputs, out_specs, op: str):
    if aliases is None:
        return None
    if not isinstance(aliases, dict):
        raise TypeError(f"{op}: input_output_aliases must be a dict "
                        "{input index: output index}")
    for i, o in aliases.items():
        if not (isinstance(i, int) and 0 <= i < len(inputs)):
            raise ValueError(
                f"{op}: input_output_aliases key {i!r} is not an input index "
                f"(there are {len(inputs)} inputs)")
        if not (isinstance(o, int) and 0 <= o < len(out_specs)):
            raise ValueError(
                f"{op}: input_output_aliases value {o!r} is not an output "
                f"index (there are {len(out_specs)} outputs)")
        a, s = inputs[i], out_specs[o]
        if tuple(a.shape) != tuple(s.shape) or np.dtype(a.dtype) != s.dtype:
            raise ValueError(
                f"{op}: input {i} ({a.dtype}{list(a.shape)}) cannot alias "
                f"output {o} ({s.dtype}{list(s.shape)}): aliased buffers "
                "need the same shape and dtype")
    if len(set(aliases.values())) != len(aliases):
        raise ValueError(f"{op}: two inputs alias the same output")
    return dict(aliases)

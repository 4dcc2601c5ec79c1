"""Ops made by one factory (closures with the same module, qualified name and
configuration), for tests/test_export_keys.py and the fresh processes it starts.

    python tests/export_factory.py eager KIND
        creates the x*2 and x*3 ops, calls both eagerly and under jit
    python tests/export_factory.py export KIND BLOB NAMED [ONLY]
        creates both (ONLY=1: only the x*2 op), exports jax.jit(x*2 op) to
        BLOB (or reports the refusal)
    python tests/export_factory.py load KIND BLOB ORDER NAMED
        creates the ops in ORDER ("2,3", "3,2" or "2"), runs BLOB on fresh data

KIND is callable, captured or kernel; NAMED is 1 to give each op a name=.
Prints one line ``RESULT {json}``.
"""

import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from numba import cuda

import numbax

N = 32
SPEC = jax.ShapeDtypeStruct((N,), jnp.float32)


def make(kind, factor, named=False):
    """One op computing x * factor; every call makes a new closure."""
    name = f"export_factory.scale{factor}.{kind}" if named else None

    @cuda.jit
    def scale(x, out):
        i = cuda.grid(1)
        if i < x.shape[0]:
            out[i] = x[i] * factor

    if kind == "kernel":
        return numbax.numba_cuda_kernel(scale, SPEC, launch_dims=N, name=name)

    def launch(x, out, stream):
        scale[1, N, stream](x, out)
    return numbax.numba_cuda_callable(launch, SPEC, capture=kind == "captured",
                                      name=name)


def start_jax_where_numbax_cannot_follow_it():
    """On JAX without a backend-start hook (0.8, 0.9, 0.11) a process starts
    JAX before it creates the ops a deserialised program needs (the ops then
    register numbax's targets): docs/export.md."""
    from numbax.runtime import registry
    if registry.BACKEND_REGISTRATION != "backend hook":
        jax.devices()


def report(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def fresh_input():
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    return rng.standard_normal(N).astype(np.float32)


def main():
    mode, kind = sys.argv[1:3]
    x = fresh_input()
    if mode == "eager":
        ops = {f: make(kind, f) for f in (2, 3)}
        got = {f: [np.asarray(op(x)).tolist(), np.asarray(jax.jit(op)(x)).tolist()]
               for f, op in ops.items()}
        ok = all(np.allclose(r, x * f, rtol=1e-6) for f in ops for r in got[f])
        report(ok=bool(ok), registry=list(numbax.registry_size()))
    elif mode == "export":
        blob, named = sys.argv[3], sys.argv[4] == "1"
        only = len(sys.argv) > 5 and sys.argv[5] == "1"
        ops = {f: make(kind, f, named) for f in ((2,) if only else (2, 3))}
        try:
            exp = jax.export.export(
                jax.jit(ops[2]), disabled_checks=numbax.export_disabled_checks())(SPEC)
        except Exception as exc:
            report(ok=False, stage="export", error_type=type(exc).__name__,
                   message=str(exc))
            return
        with open(blob, "wb") as f:
            f.write(exp.serialize())
        report(ok=True, stage="export", text=exp.mlir_module())
    elif mode == "load":
        blob, order, named = sys.argv[3], sys.argv[4], sys.argv[5] == "1"
        start_jax_where_numbax_cannot_follow_it()
        ops = [make(kind, int(f), named) for f in order.split(",")]
        with open(blob, "rb") as f:
            exp = jax.export.deserialize(bytearray(f.read()))
        try:
            out = np.asarray(exp.call(x))
        except Exception as exc:
            report(ok=False, stage="run", error_type=type(exc).__name__,
                   message=str(exc))
            return
        del ops
        report(ok=bool(np.allclose(out, x * 2, rtol=1e-6)), stage="run",
               factor=float(np.median(out / x)))


if __name__ == "__main__":
    main()

"""numbax ops by name in profiles: HLO, jax.profiler traces, NVTX.

Each op's custom call is named after the op (its ``name=``, else its
kernel's or func's qualified name), so XLA dumps, JAX's profiler and
TensorBoard show ``scale.1``, ``add_then_scale.2``, not ``custom-call.N``.
This example prints the names in the compiled HLO, records one step with
``jax.profiler.trace`` and finds the ops' events in the trace by name. On a
GPU under Nsight Systems each call is also an NVTX range with that name:

    python examples/profiling.py                       # on a GPU
    NUMBA_ENABLE_CUDASIM=1 JAX_PLATFORMS=cpu python examples/profiling.py
    nsys profile -t cuda,nvtx -o numbax-profile python examples/profiling.py
    nsys stats -r nvtx_sum numbax-profile.nsys-rep
"""

import glob
import gzip
import json
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from numba import cuda

import numbax

# The simulator runs every CUDA thread in Python: a small array there.
N = 512 if numbax.simulator_enabled() else 1 << 20


# --8<-- [start:ops]
@cuda.jit
def scale(x, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = 2.0 * x[i]


@cuda.jit
def add_kernel(x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] + y[i]


def add_then_scale(x, y, out, stream):
    blocks = (out.shape[0] + 255) // 256
    add_kernel[blocks, 256, stream](x, y, out)
    scale[blocks, 256, stream](out, out)


spec = jax.ShapeDtypeStruct((N,), jnp.float32)
scale_op = numbax.numba_cuda_kernel(scale, spec, launch_dims=N)  # "scale"
fused_op = numbax.numba_cuda_callable(add_then_scale, spec)  # its func's name
offset_op = numbax.numba_cuda_kernel(scale, spec, launch_dims=N,
                                     name="second_scale")  # name= wins


@jax.jit
def step(x, y):
    return offset_op(scale_op(x) + fused_op(x, y))
# --8<-- [end:ops]


def trace_event_names(f, *args):
    """The names of the events one call of `f` records in a JAX profile."""
    f(*args).block_until_ready()  # compiled and warm: trace one step only
    with tempfile.TemporaryDirectory() as logdir:
        with jax.profiler.trace(logdir, create_perfetto_trace=True):
            f(*args).block_until_ready()
        (path,) = glob.glob(f"{logdir}/**/perfetto_trace.json.gz",
                            recursive=True)
        with gzip.open(path) as trace:
            events = json.load(trace)["traceEvents"]
    return {e["name"] for e in events if "name" in e}


def main():
    rng = np.random.default_rng(0)
    x = rng.standard_normal(N).astype(np.float32)
    y = rng.standard_normal(N).astype(np.float32)
    ok = np.allclose(np.asarray(step(x, y)), 2 * (2 * x + 2 * (x + y)),
                     rtol=1e-5)
    print("result matches numpy:", ok)

    hlo = step.lower(x, y).compile().as_text()
    calls = re.findall(r'%(\S+) = \S+ custom-call\(.*op_name="([^"]+)"', hlo)
    for instruction, op_name in calls:
        print(f"HLO: {instruction:<20} op_name={op_name}")
    names = {op.profile_name for op in (scale_op, fused_op, offset_op)}
    in_hlo = {op_name.rsplit("/", 1)[-1] for _, op_name in calls}
    ok_hlo = in_hlo == names
    print("HLO names every op, matches:", ok_hlo)

    events = trace_event_names(step, x, y)
    found = {n for n in names if any(e.startswith(n + ".") for e in events)}
    for n in sorted(found):
        print(f"trace: {sorted(e for e in events if e.startswith(n + '.'))}")
    ok_trace = found == names
    print("jax.profiler trace names every op, matches:", ok_trace)
    print("NVTX tool attached (Nsight Systems):", numbax._core.nvtx_attached())
    return 0 if ok and ok_hlo and ok_trace else 1


if __name__ == "__main__":
    raise SystemExit(main())

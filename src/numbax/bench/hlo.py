"""Why a row is slow: the optimised HLO of each implementation's chain.

python -m numbax.bench.hlo [--length N] [--names a,b]

Prints, per implementation, how many custom calls XLA kept, how many landed
inside command buffers (CUDA graphs), and any copies it added around them.
"""

from __future__ import annotations

import argparse
import re


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m numbax.bench.hlo")
    p.add_argument("--length", type=int, default=10)
    p.add_argument("--names", default="native_cmdbuf,numbax_kernel,numbax_capture,"
                   "buffer_callback_cmdbuf")
    p.add_argument("--dump", action="store_true", help="print the whole HLO")
    args = p.parse_args(argv)

    import jax
    import jax.numpy as jnp

    from . import impls, timing
    from .native import build_and_register

    device = jax.devices()[0]
    env = impls.Env(on_gpu=device.platform == "gpu")
    env.native = build_and_register(getattr(device, "compute_capability", None), None)
    impls.warm_numba_kernel(env)
    x = jnp.ones(4096, jnp.float32)
    wanted = args.names.split(",")
    for impl in impls.all_impls(env):
        if impl.name not in wanted:
            continue
        op = impl.make(4096)
        chain = jax.jit(timing.chain_fn(op, args.length))
        text = chain.lower(x).compile().as_text()
        custom = len(re.findall(r"custom-call\(", text))
        buffers = len(re.findall(r"command_buffer", text))
        copies = len(re.findall(r"= f32\[4096\]\{0\} copy\(", text))
        print(f"{impl.name:24s} custom-calls={custom:3d} command-buffer refs={buffers:3d}"
              f" copies={copies}")
        if args.dump:
            print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A fresh process for tests/test_shapes_and_scalars.py: run an exported program.

    python tests/shapes_scalars_child.py BLOB DATA

Creates the ops (importing shapes_scalars_ops) and nothing else: no call,
no trace. Then deserialises BLOB and runs it on DATA (.npz with a, b, c),
printing one line ``RESULT {json}`` with the largest error against the
reference.
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402


def main(blob, data):
    import jax
    from jax import export

    from numbax.runtime import registry
    if registry.BACKEND_REGISTRATION != "backend hook":
        jax.devices()
    import shapes_scalars_ops as ops
    d = np.load(data)
    args = (d["a"], d["b"], d["c"])
    with open(blob, "rb") as f:
        restored = export.deserialize(bytearray(f.read()))
    got = restored.call(*args)
    want = ops.reference(*args)
    err = max(float(np.max(np.abs(np.asarray(g, np.float64) - w)))
              for g, w in zip(got, want))
    print("RESULT " + json.dumps({"err": err, "n": len(got)}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:3])

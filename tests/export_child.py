"""A fresh process for tests/test_export.py: run an exported or cached program.

    python tests/export_child.py run BLOB DATA       create the ops (only), deserialise, run
    python tests/export_child.py recipe BLOB DATA    as run, JAX not started first (docs/export.md)
    python tests/export_child.py missing BLOB DATA   deserialise and run, no op created
    python tests/export_child.py partial BLOB DATA   only some ops created
    python tests/export_child.py mismatch BLOB DATA  one op created with other outs
    python tests/export_child.py cache DIR DATA      jit through the persistent cache

DATA is an .npz with the inputs (x, m, s) and the expected outputs (y0..y2).

Prints one line ``RESULT {json}`` and exits 0 unless something unexpected
happened (a failed comparison is reported in the JSON, not by the exit code).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402


def report(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


def load(data):
    d = np.load(data)
    return (d["x"], d["m"], d["s"]), (d["y0"], d["y1"], d["y2"])


def compare(got, want):
    errs = [float(np.max(np.abs(np.asarray(g) - w))) for g, w in zip(got, want)]
    return max(errs)


def run_exported(path, data, create, start_jax=True):
    import jax
    from jax import export

    # Whether this JAX announces its compiles (numbax registers its targets
    # then where JAX has no backend-start hook: runtime/targets.py).
    compiles = []
    jax.monitoring.register_scalar_listener(
        lambda event, value, **kw: compiles.append(event)
        if event == "/jax/core/compile/backend_compile_duration" else None)
    # Creating the ops is all this process does before deserialising: no
    # call and no trace of them here. (On JAX without a backend-start hook,
    # 0.8, 0.9 and 0.11, JAX is started first, except in the "recipe" mode,
    # which follows docs/export.md to the letter.)
    from numbax.runtime import registry
    if start_jax and registry.BACKEND_REGISTRATION != "backend hook":
        jax.devices()
    if create == "all":
        os.environ["EXPORT_OPS_CREATE"] = "all"
        import export_ops  # noqa: F401 - creates every op
    elif create == "some":
        # Only the plain callable: the kernel and the others stay unknown.
        os.environ["EXPORT_OPS_CREATE"] = "callable"
        import export_ops  # noqa: F401
    elif create == "mismatch":
        os.environ["EXPORT_OPS_CREATE"] = "none"
        import export_ops
        kept = export_ops.mismatched_callable_op()  # noqa: F841
    else:
        import numbax  # noqa: F401  - numbax imported, no op created
    with open(path, "rb") as f:
        exp = export.deserialize(bytearray(f.read()))
    args, want = load(data)
    import numbax
    before = numbax.bridge_counters()["resolves"]
    try:
        out = exp.call(*args)
        out = [np.asarray(o) for o in out]
    except Exception as exc:  # the missing-op error is the point here
        report(ok=False, error_type=type(exc).__name__, message=str(exc),
               registration=registry.BACKEND_REGISTRATION,
               compiles=len(compiles))
        return
    err = compare(out, want)
    report(ok=err < 1e-5, max_err=err,
           registration=registry.BACKEND_REGISTRATION, compiles=len(compiles),
           resolves=numbax.bridge_counters()["resolves"] - before,
           registry=list(numbax.registry_size()))


def run_cached(cache_dir, data):
    import jax
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    events = {}

    def listen(event, **kwargs):
        if event.startswith("/jax/compilation_cache/"):
            events[event] = events.get(event, 0) + 1
    jax.monitoring.register_event_listener(listen)

    import export_ops
    args, want = load(data)
    out = jax.jit(export_ops.program)(*args)
    err = compare(out, want)
    import numbax
    report(ok=err < 1e-5, max_err=err,
           hits=events.get("/jax/compilation_cache/cache_hits", 0),
           misses=events.get("/jax/compilation_cache/cache_misses", 0),
           counters=numbax.bridge_counters())


def main():
    mode, path, data = sys.argv[1:4]
    if mode == "cache":
        run_cached(path, data)
    elif mode == "recipe":
        run_exported(path, data, "all", start_jax=False)
    else:
        run_exported(path, data,
                     {"run": "all", "missing": None, "partial": "some",
                      "mismatch": "mismatch"}[mode])


if __name__ == "__main__":
    main()

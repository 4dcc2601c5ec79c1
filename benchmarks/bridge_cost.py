"""python -m benchmarks.bridge_cost: see numbax.bench.bridge_cost."""

from numbax.bench.bridge_cost import main

if __name__ == "__main__":
    raise SystemExit(main())

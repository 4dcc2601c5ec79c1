"""python -m benchmarks.hlo: see numbax.bench.hlo."""

from numbax.bench.hlo import main

if __name__ == "__main__":
    raise SystemExit(main())

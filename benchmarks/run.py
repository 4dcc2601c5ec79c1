"""python -m benchmarks.run: the suite, from a source checkout.

The suite lives in the package (numbax.bench) so that an installed numbax
runs it too, as ``python -m numbax bench``; this shim keeps the old command
and its default JSON path (benchmarks/results.json).
"""

import os
import sys

from numbax.bench.run import main

DEFAULT_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                            "results.json")

if __name__ == "__main__":
    sys.exit(main(prog="python -m benchmarks.run", default_json=DEFAULT_JSON,
                  allow_reexec=True))

"""Prints a key for numbax's wheel built from this checkout: a hash of every
file that goes into the wheel or decides how it is compiled (csrc/, src/,
cmake/, CMakeLists.txt, pyproject.toml), and the Python tag it is for.

    python scripts/lib/source_key.py      # e.g. cp311-3f2a...

scripts/build_wheel.sh keeps each release wheel it builds (against the
default, oldest supported FFI headers) under ~/.cache/numbax/wheels/KEY/,
and scripts/demo.sh installs a wheel found there instead of compiling: a
fresh clone of sources built before on this machine needs no compiler run.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INPUTS = ["csrc", "src", "cmake", "CMakeLists.txt", "pyproject.toml"]


def source_key() -> str:
    digest = hashlib.sha256()
    for name in INPUTS:
        path = ROOT / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            if "__pycache__" in rel or rel.endswith((".so", ".pyc")) or \
                    rel == "src/numbax/_build_info.py":
                continue
            digest.update(rel.encode() + b"\0" + f.read_bytes() + b"\0")
    major, minor = sys.version_info[:2]
    return f"cp{major}{minor}-{digest.hexdigest()[:24]}"


if __name__ == "__main__":
    print(source_key())

"""Prints the include directory of a jaxlib release's XLA FFI headers,
fetched once into build/ffi-headers/<version>/ (the wheel is downloaded, its
headers alone unpacked).

    python scripts/lib/ffi_headers.py            # the release wheel's: the
                                                 # jaxlib pinned in pyproject.toml
    python scripts/lib/ffi_headers.py 0.11.2     # any other release

The release wheel is compiled against the oldest supported jaxlib's headers
(pyproject.toml's [build-system] pin); the C++ unit tests compile against
the same ones (scripts/cpp_tests.sh), so they check what the wheel does.
Needs PyPI access the first time.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "jaxlib/include/"


def release_pin() -> str:
    """The jaxlib version pyproject.toml's [build-system] requires."""
    text = (ROOT / "pyproject.toml").read_text()
    build_system = text.split("[build-system]", 1)[1].split("\n[", 1)[0]
    m = re.search(r'"jaxlib==([^"]+)"', build_system)
    if not m:
        sys.exit("ffi_headers.py: pyproject.toml's [build-system] pins no jaxlib")
    return m.group(1)


def headers(version: str) -> Path:
    dest = ROOT / "build" / "ffi-headers" / version
    include = dest / "include"
    if (include / "xla" / "ffi" / "api" / "c_api.h").exists():
        return include
    with tempfile.TemporaryDirectory() as tmp:
        # Any platform's wheel carries the same headers: ask for one that
        # exists for every release (manylinux x86_64, CPython 3.12).
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.12",
               "--implementation", "cp", "--platform", "manylinux_2_27_x86_64",
               "--platform", "manylinux2014_x86_64", "-d", tmp,
               f"jaxlib=={version}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("jaxlib-*.whl"))
        if done.returncode != 0 or not wheels:
            sys.exit(f"ffi_headers.py: could not download jaxlib {version}:\n"
                     f"{done.stderr[-2000:]}")
        staging = dest.with_name(dest.name + ".partial")
        with zipfile.ZipFile(wheels[0]) as wheel:
            for name in wheel.namelist():
                if name.startswith(PREFIX + "xla/ffi/") and not name.endswith("/"):
                    target = staging / "include" / name[len(PREFIX):]
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(wheel.read(name))
        if not (staging / "include" / "xla" / "ffi" / "api" / "c_api.h").exists():
            sys.exit(f"ffi_headers.py: jaxlib {version}'s wheel has no XLA FFI headers")
        (staging / "VERSION").write_text(f"jaxlib {version}\n")
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging.replace(dest)
    return include


if __name__ == "__main__":
    print(headers(sys.argv[1] if len(sys.argv) > 1 else release_pin()))

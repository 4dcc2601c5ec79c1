"""Checks a wheel's platform tags: the glibc floor they promise and the CPU
architecture they name.

    python scripts/lib/wheel_tag.py WHEEL [--max 2_28] [--arch x86_64]

Prints the lowest glibc the tags admit (e.g. "manylinux_2_28_x86_64"), and
exits 1, saying why, when that floor is above --max (default 2_28: the
glibc of RHEL/Rocky/Alma 8, where pip must still find numbax's wheel) or a
tag names another architecture than --arch. A wheel's file name may carry
several platform tags joined by dots (manylinux_2_27_x86_64.manylinux_2_28_x86_64):
pip installs it wherever any of them fits, so the lowest counts. A plain
linux_* tag (an unrepaired wheel) always fails. Standard library only.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def platform_tags(wheel: str) -> list[str]:
    name = Path(wheel).name
    parts = name[: -len(".whl")].split("-")
    if not name.endswith(".whl") or len(parts) not in (5, 6):
        raise ValueError(f"{name}: not a wheel file name (name-version-python-abi-platform.whl)")
    return parts[-1].split(".")


def glibc_floor(tag: str) -> tuple[tuple[int, int], str] | None:
    """((major, minor), arch) for a manylinux tag, None for any other tag."""
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", tag)
    if m:
        return (int(m.group(1)), int(m.group(2))), m.group(3)
    m = re.fullmatch(r"(manylinux1|manylinux2010|manylinux2014)_(\w+)", tag)
    if m:
        return LEGACY[m.group(1)], m.group(2)
    return None


def check(wheel: str, max_glibc: tuple[int, int], arch: str | None) -> tuple[str, list[str]]:
    """(the lowest tag, the problems found)."""
    problems, floors = [], []
    for tag in platform_tags(wheel):
        parsed = glibc_floor(tag)
        if parsed is None:
            problems.append(f"platform tag {tag} is not a manylinux tag (run auditwheel repair)")
            continue
        floor, tag_arch = parsed
        if arch and tag_arch != arch:
            problems.append(f"platform tag {tag} is for {tag_arch}, not {arch}")
        floors.append((floor, tag))
    if not floors:
        return "none", problems or ["no platform tag"]
    low, low_tag = min(floors)
    if low > max_glibc:
        problems.append(
            f"{low_tag} needs glibc {low[0]}.{low[1]}, above the {max_glibc[0]}.{max_glibc[1]} "
            "numbax's wheels promise (RHEL 8 and its rebuilds, Ubuntu 20.04, Debian 11 and "
            "SLES 15 would find no wheel): build with the zig toolchain "
            "(scripts/build_wheel.sh's default), or see `auditwheel show` for the symbols "
            "that raise it")
    return low_tag, problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wheel")
    parser.add_argument("--max", default="2_28", help="highest glibc floor allowed (2_28)")
    parser.add_argument("--arch", default=None, help="the architecture every tag must name")
    args = parser.parse_args(argv)
    major, minor = (int(p) for p in args.max.replace(".", "_").split("_"))
    try:
        low, problems = check(args.wheel, (major, minor), args.arch)
    except ValueError as e:
        print(f"wheel_tag.py: {e}", file=sys.stderr)
        return 1
    print(low)
    for p in problems:
        print(f"wheel_tag.py: {Path(args.wheel).name}: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

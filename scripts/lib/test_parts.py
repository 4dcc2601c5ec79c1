"""Splits the Python test files into N parts of about equal running time,
for scripts/wheel_matrix.sh, which runs the parts of a row as separate
pytest processes beside each other (two cores: two parts, both busy until
the end, where one process of the whole suite kept one core busy alone).

    python scripts/lib/test_parts.py parts N      # N lines of files
    python scripts/lib/test_parts.py seconds FILE...   # their estimate, s
    python scripts/lib/test_parts.py update JUNIT_XML...  # refresh the times

Every test file under tests/ (test_*.py, found by globbing, so renamed,
merged and new files need no list here) goes to exactly one part: the
longest first, each to the part with the least time so far. A file's time
is what test_times.json (beside this script) says, the seconds pytest took
for it in the full row of scripts/wheel_matrix.sh on a 2-core machine;
a file not listed there counts DEFAULT_PER_TEST seconds per test function.
The times only balance the parts: a stale or missing time can make one part
finish later, never leave a file out. `update` rewrites test_times.json
from the JUnit XML files the matrix writes ($NUMBAX_MATRIX_DIR/junit-*.xml).
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import xml.etree.ElementTree as ET

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TIMES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_times.json")
# The full row's mean: about 1,000 tests in 450 s.
DEFAULT_PER_TEST = 0.45


def test_files() -> list[str]:
    """Every test file pytest collects by default, relative to the root."""
    found = set()
    for pattern in ("test_*.py", "*_test.py"):
        found.update(glob.glob(os.path.join(ROOT, "tests", "**", pattern), recursive=True))
    return sorted(os.path.relpath(p, ROOT) for p in found)


def load_times() -> dict[str, float]:
    try:
        with open(TIMES) as f:
            return {k: float(v) for k, v in json.load(f)["seconds"].items()}
    except FileNotFoundError:
        return {}


def seconds(path: str, times: dict[str, float]) -> float:
    if path in times:
        return times[path]
    with open(os.path.join(ROOT, path)) as f:
        count = len(re.findall(r"^\s*(?:async\s+)?def test_", f.read(), re.M))
    return max(1, count) * DEFAULT_PER_TEST


def parts(n: int) -> list[list[str]]:
    times = load_times()
    weights = {p: seconds(p, times) for p in test_files()}
    split: list[list] = [[0.0, []] for _ in range(n)]
    for path in sorted(weights, key=lambda p: (-weights[p], p)):
        smallest = min(split, key=lambda s: s[0])
        smallest[0] += weights[path]
        smallest[1].append(path)
    return [sorted(files) for _, files in split]


def update(xml_paths: list[str]) -> dict[str, float]:
    """Seconds per test file from JUnit XML (classname tests.test_x or
    tests.test_x.TestClass), summed over the files given."""
    known = {p[:-3].replace(os.sep, "."): p for p in test_files()}
    totals: dict[str, float] = {}
    for xml_path in xml_paths:
        for case in ET.parse(xml_path).getroot().iter("testcase"):
            name = case.get("classname", "")
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                path = known[name]
                totals[path] = totals.get(path, 0.0) + float(case.get("time", 0))
    return totals


def main(argv: list[str]) -> int:
    if argv[:1] == ["parts"] and len(argv) == 2 and argv[1].isdigit() and int(argv[1]) > 0:
        for files in parts(int(argv[1])):
            print(" ".join(files))
        return 0
    if argv[:1] == ["seconds"]:
        times = load_times()
        print(round(sum(seconds(p, times) for p in argv[1:])))
        return 0
    if argv[:1] == ["update"] and len(argv) > 1:
        totals = update(argv[1:])
        if not totals:
            print("test_parts.py: no test times in " + " ".join(argv[1:]), file=sys.stderr)
            return 1
        with open(TIMES, "w") as f:
            json.dump({"about": "seconds per test file in the full row of "
                       "scripts/wheel_matrix.sh (2 cores); rewritten by "
                       "scripts/lib/test_parts.py update",
                       "seconds": {k: round(v, 1) for k, v in sorted(totals.items())}},
                      f, indent=1)
            f.write("\n")
        print(f"test_parts.py: {len(totals)} files, {sum(totals.values()):.0f} s")
        return 0
    print(__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

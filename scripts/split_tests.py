"""Splits the test files that hold `gpu` tests into N parts of about equal
size (by their count of test functions, largest file first to the smallest
part), so that parts run as separate processes finish at about the same time.

    python scripts/split_tests.py N        # one line of files per part
    python scripts/split_tests.py N K      # the files of part K (1-based)

Used by scripts/gpu_check.sh (TEST_SHARDS) and scripts/sanitizer_check.sh.
"""

import glob
import os
import re
import sys

GPU_MARK = re.compile(r"^[^#\n]*\bpytest\.mark\.gpu\b", re.M)


def parts(n: int) -> list[list[str]]:
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    weights = {}
    for path in sorted(glob.glob(os.path.join(root, "tests", "test_*.py"))):
        with open(path) as f:
            text = f.read()
        # A real marker (decorator, pytestmark or marks=), not a mention.
        if GPU_MARK.search(text):
            rel = os.path.relpath(path, root)
            weights[rel] = len(re.findall(r"^\s*def test_", text, re.M))
    split: list[list] = [[0, []] for _ in range(n)]
    for path in sorted(weights, key=lambda p: (-weights[p], p)):
        smallest = min(split, key=lambda s: s[0])
        smallest[0] += weights[path]
        smallest[1].append(path)
    return [files for _, files in split]


def main(argv: list[str]) -> int:
    if not argv or not all(a.isdigit() and int(a) > 0 for a in argv):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    n = int(argv[0])
    if len(argv) > 1:
        k = int(argv[1])
        if k > n:
            print(f"part {k} of {n} does not exist", file=sys.stderr)
            return 2
        print(" ".join(parts(n)[k - 1]))
    else:
        for files in parts(n):
            print(" ".join(files))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

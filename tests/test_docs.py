"""The API reference covers the public API: every name, every parameter;
the README's example runs; tests/README.md names every test file.

docs/api.md renders docstrings with mkdocstrings (scripts/lint.sh builds the
site in strict mode); these tests make sure nothing public is left out of it
and that each public function's docstring documents each of its parameters.
"""

import fnmatch
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import numbax

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = [n for n in numbax.__all__ if n != "__version__"]


def test_api_page_lists_every_public_name():
    api = (ROOT / "docs" / "api.md").read_text()
    listed = set(re.findall(r"^::: numbax\.(\w+)\s*$", api, re.M))
    missing = [n for n in PUBLIC if n not in listed]
    assert not missing, f"add '::: numbax.<name>' to docs/api.md for {missing}"
    unknown = listed - set(PUBLIC)
    assert not unknown, f"docs/api.md lists names not in numbax.__all__: {unknown}"


def _documented(doc: str) -> set[str]:
    """Names documented in the Args/Parameters section of a Google docstring."""
    names: set[str] = set()
    in_args, indent = False, None
    for line in doc.splitlines():
        if re.match(r"^\s*(Args|Arguments|Parameters):\s*$", line):
            in_args, indent = True, None
            continue
        if in_args and re.match(r"^\s*[A-Z][A-Za-z ]*:\s*$", line):
            in_args = False        # the next section (Returns:, Raises:, ...)
        if not in_args:
            continue
        m = re.match(r"^(\s+)\*{0,2}(\w+)(\s*\(.*\))?:", line)
        if m and (indent is None or len(m.group(1)) == indent):
            indent = len(m.group(1))   # parameters sit at the first one's indent
            names.add(m.group(2))
    return names


@pytest.mark.parametrize("name", PUBLIC)
def test_public_callable_documents_every_parameter(name):
    obj = getattr(numbax, name)
    if not callable(obj):
        pytest.skip(f"{name} is not callable")
    doc = inspect.getdoc(obj) or ""
    assert doc.strip(), f"numbax.{name} has no docstring"
    target = obj.__init__ if inspect.isclass(obj) else obj
    params = [p for p in inspect.signature(target).parameters.values()
              if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    missing = {p.name for p in params} - _documented(doc)
    assert not missing, (f"numbax.{name}'s docstring does not document "
                         f"{sorted(missing)} under Args:")


def test_readme_example_runs():
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", readme, re.S | re.M)
    assert len(blocks) == 1, "README.md should hold one Python example"
    proc = subprocess.run([sys.executable, "-c", blocks[0]], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "7." in proc.stdout, proc.stdout


def test_tests_readme_names_every_test_file():
    named = set(re.findall(r"\b(test_\w+\.py)\b", (ROOT / "tests" / "README.md").read_text()))
    present = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    assert not present - named, f"add to tests/README.md's table: {sorted(present - named)}"
    assert not named - present, f"tests/README.md names missing files: {sorted(named - present)}"


# `tests/<file>.py::<test>`, `::<test>` (the file named last on the line)
# and, in docs/errors.md, a bare `test_<name>` (its default file).
# A test may carry parameters (`test_x[int8]`) or be a pattern (`test_x_*`).
_NAME = r"([\w*]+)(?:\[[^\]`]*\])?"
_TEST_REF = re.compile(
    rf"`(?:(tests/[\w/]+\.py)(?:::{_NAME})?|::{_NAME}|(test_\w+)(?:\[[^\]`]*\])?)`")
_ERRORS_DEFAULT = "tests/test_errors.py"


def _doc_test_refs():
    """(page:line, test file, test or None) of every test a page names. A
    `::<test>` belongs to the file named last in its paragraph or table
    row."""
    for page in sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]:
        default = _ERRORS_DEFAULT if page.name == "errors.md" else None
        current = default
        for number, line in enumerate(page.read_text().splitlines(), 1):
            if not line.strip() or line.startswith("|"):
                current = default
            for m in _TEST_REF.finditer(line):
                path, test, more, bare = m.groups()
                where = f"{page.relative_to(ROOT)}:{number}"
                if path:
                    current = path
                    yield where, path, test
                elif more:
                    yield where, current, more
                elif bare and default:
                    yield where, default, bare


def test_docs_name_tests_that_exist():
    """Every test file and test the pages name (docs/errors.md's rows, the
    guides' "Tests:" lines) is there: moving or renaming a test updates
    the page that cites it."""
    missing = []
    for where, path, test in _doc_test_refs():
        file = ROOT / path if path else None
        if file is None or not file.is_file():
            missing.append(f"{where}: {path}")
        elif test and not fnmatch.filter(
                re.findall(r"^\s*def (test_\w+)\(", file.read_text(), re.M),
                test):
            missing.append(f"{where}: {path}::{test}")
    assert not missing, "the docs cite tests that do not exist:\n" + \
        "\n".join(missing)

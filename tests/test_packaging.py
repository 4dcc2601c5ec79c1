"""Packaging: one version source, the metadata users see on an index page,
and the wheel's platform tag check.

The version is declared once, in src/numbax/_version.py: pyproject.toml
reads it through scikit-build-core's regex provider, so the wheel's
metadata, ``numbax.__version__`` and ``python -m numbax --version`` agree.
"""

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import numbax

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION_FILE = ROOT / "src" / "numbax" / "_version.py"


def _source_version() -> str:
    m = re.search(r'^__version__ = "([^"]+)"$', VERSION_FILE.read_text(), re.M)
    assert m, f"{VERSION_FILE} declares no __version__"
    return m.group(1)


def test_the_version_is_declared_once():
    project = PYPROJECT["project"]
    assert "version" not in project, "pyproject.toml declares a version: read _version.py"
    assert "version" in project["dynamic"]
    provider = PYPROJECT["tool"]["scikit-build"]["metadata"]["version"]
    assert provider["provider"] == "scikit_build_core.metadata.regex"
    assert (ROOT / provider["input"]).resolve() == VERSION_FILE.resolve()


def test_the_installed_metadata_carries_that_version():
    try:
        installed = importlib.metadata.version("numbax")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("numbax is not installed (run from a wheel or pip install .)")
    assert installed == numbax.__version__ == _source_version()


def test_version_command_prints_it():
    out = subprocess.run([sys.executable, "-m", "numbax", "--version"], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == f"numbax {numbax.__version__}"


def test_classifiers_name_every_supported_python():
    project = PYPROJECT["project"]
    low = int(re.fullmatch(r">=3\.(\d+)", project["requires-python"]).group(1))
    classified = {int(m.group(1)) for c in project["classifiers"]
                  if (m := re.fullmatch(r"Programming Language :: Python :: 3\.(\d+)", c))}
    assert min(classified) == low
    assert classified == set(range(low, max(classified) + 1))
    assert max(classified) >= 14


def test_license_is_an_spdx_expression_without_license_classifiers():
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]


def test_cuda_extras_pull_the_matching_plugin_and_numba_cuda_extra():
    extras = PYPROJECT["project"]["optional-dependencies"]
    for major in (12, 13):
        reqs = extras[f"cuda{major}"]
        assert any(r.startswith(f"jax[cuda{major}]") for r in reqs), reqs
        assert any(r.startswith(f"numba-cuda[cu{major}]") for r in reqs), reqs


def test_readme_links_are_absolute():
    # PyPI shows the README without the repository around it: a relative
    # link there leads nowhere.
    readme = (ROOT / "README.md").read_text()
    prose = re.sub(r"```.*?```", "", readme, flags=re.S)
    links = re.findall(r"\]\(([^)]+)\)", prose)
    assert links
    relative = [link for link in links if not re.match(r"https?://|#", link)]
    assert not relative, f"relative links in README.md: {relative}"


def test_the_sdist_leaves_out_benchmark_results():
    assert "benchmarks/results/" in PYPROJECT["tool"]["scikit-build"]["sdist"]["exclude"]


def _wheel_tag():
    sys.path.insert(0, str(ROOT / "scripts" / "lib"))
    try:
        import wheel_tag
    finally:
        sys.path.pop(0)
    return wheel_tag


@pytest.mark.parametrize("name, ok", [
    ("numbax-0.1.0-cp311-cp311-manylinux_2_24_x86_64.whl", True),
    ("numbax-0.1.0-cp311-cp311-manylinux_2_28_aarch64.whl", True),
    ("numbax-0.1.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", True),
    ("numbax-0.1.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_34_x86_64.whl", True),
    ("numbax-0.1.0-cp311-cp311-manylinux_2_34_x86_64.whl", False),
    ("numbax-0.1.0-cp311-cp311-linux_x86_64.whl", False),
])
def test_wheel_tag_check(name, ok):
    low, problems = _wheel_tag().check(name, (2, 28), None)
    assert (not problems) == ok, problems


def test_wheel_tag_check_names_the_wrong_architecture():
    _, problems = _wheel_tag().check("numbax-0.1.0-cp311-cp311-manylinux_2_28_aarch64.whl",
                                     (2, 28), "x86_64")
    assert problems and "aarch64" in problems[0]

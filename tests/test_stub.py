"""The type stub of the C++ extension is the one the build generates.

mypy reads the checked-in src/numbax/_core.pyi; the build generates
numbax/_core.pyi from the compiled module (CMakeLists.txt,
nanobind_add_stub) and installs it over that copy, so the wheel ships what
the bindings really are. A binding changed in csrc/ without regenerating the
stub (bash scripts/gen_stubs.sh) fails here.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECKED_IN = ROOT / "src" / "numbax" / "_core.pyi"
FIX = "the C++ bindings changed: regenerate the stub with bash scripts/gen_stubs.sh"


def _installed_package() -> Path:
    spec = importlib.util.find_spec("numbax")
    return Path(list(spec.submodule_search_locations)[0])


def test_the_installed_package_is_not_the_source_tree():
    # Otherwise the comparisons below would compare the file with itself.
    assert _installed_package().resolve() != CHECKED_IN.parent.resolve()


def test_the_shipped_stub_is_the_checked_in_stub():
    shipped = _installed_package() / "_core.pyi"
    assert shipped.is_file(), "the build installs numbax/_core.pyi"
    assert shipped.read_text() == CHECKED_IN.read_text(), FIX


def test_the_stub_types_the_extension_not_any_name():
    text = CHECKED_IN.read_text()
    assert "def __getattr__" not in text
    # A few bindings every numbax module relies on, with their signatures.
    assert "def set_call_guard(pairs: object | None) -> None:" in text
    assert "def counters() -> dict:" in text


def test_regenerating_the_stub_gives_the_checked_in_stub(tmp_path):
    """Independent of how the wheel got its stub: nanobind's stubgen, run
    on the installed extension as the build runs it (where nanobind is
    installed: the development venv, not the wheel-test venvs)."""
    pytest.importorskip("nanobind.stubgen")
    out = tmp_path / "_core.pyi"
    subprocess.run(
        [sys.executable, "-m", "nanobind.stubgen", "-q", "-i",
         str(_installed_package()), "-m", "_core", "-o", str(out)],
        check=True, capture_output=True, timeout=120)
    assert out.read_text() == CHECKED_IN.read_text(), FIX

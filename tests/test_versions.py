"""The supported JAX range: the import-time check and what `info` reports.

The versions are faked: the matrix of real JAX versions runs in CI
(scripts/wheel_matrix.sh), which installs the wheel next to each.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from numbax import cli
from numbax.runtime import compat

ROOT = Path(__file__).resolve().parent.parent
MIN = ".".join(map(str, compat.MIN_JAX))


def test_the_range_agrees_with_pyproject():
    text = (ROOT / "pyproject.toml").read_text()
    # The build compiles against the oldest supported jaxlib's headers, and
    # the install range starts there and stops before the first release
    # past the tested one.
    upper = compat.jax_upper_bound()
    assert f'"jaxlib=={MIN}"' in text
    assert f'"jax>={MIN},<{upper}"' in text and f'"jaxlib>={MIN},<{upper}"' in text
    assert compat.release(compat.TESTED_UP_TO)[:2] < compat.release(upper)


def test_readme_and_pyproject_agree_on_python():
    text = (ROOT / "pyproject.toml").read_text()
    floor = text.split('requires-python = ">=', 1)[1].split('"', 1)[0]
    readme = (ROOT / "README.md").read_text()
    assert f"Python >= {floor}" in readme or f"Python {floor}" in readme
    assert "Python >= 3.10" not in readme


@pytest.mark.parametrize("runtime", [(0, 6), (0, 9)])
def test_a_newer_ffi_than_served_is_refused_with_both_versions_and_the_fix(runtime):
    what, fix = compat.problem("0.13.0", "0.13.0", (0, 2), runtime,
                                "jaxlib 0.8.1", allow_untested=False)
    newest = compat.SERVED_FFI_API[1]
    assert f"jaxlib 0.13.0 provides XLA FFI API {runtime[0]}.{runtime[1]}" in what
    assert f"0.2 to {newest[0]}.{newest[1]}" in what
    assert f"'jax<{compat.jax_upper_bound()}'" in fix
    assert f"{compat.ALLOW_UNTESTED_ENV}=1" in fix
    assert compat.problem("0.13.0", "0.13.0", (0, 2), runtime, "jaxlib 0.8.1",
                           allow_untested=True) is None


def test_the_served_range_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv(compat.ALLOW_UNTESTED_ENV, "1")
    assert compat.problem("0.13.0", "0.13.0", (0, 2), (0, 6)) is None
    monkeypatch.setenv(compat.ALLOW_UNTESTED_ENV, "0")
    assert compat.problem("0.13.0", "0.13.0", (0, 2), (0, 6)) is not None


@pytest.mark.parametrize("jax_v, jaxlib_v", [
    ("0.6.2", "0.6.2"), ("0.7.2", "0.7.2"), ("0.8.0", "0.8.0"),
    ("0.8.1", "0.8.0"), ("0.4.35", "0.4.35"),
])
def test_too_old_jax_is_named_with_the_range_and_fix(jax_v, jaxlib_v):
    found = compat.problem(jax_v, jaxlib_v, (0, 2), (0, 1))
    assert found is not None
    what, fix = found
    old = "jax" if compat.release(jax_v) < compat.MIN_JAX else "jaxlib"
    version = jax_v if old == "jax" else jaxlib_v
    assert f"{old} {version} is too old" in what
    assert f">= {MIN}" in what
    assert f"pip install -U 'jax>={MIN}'" in fix


@pytest.mark.parametrize("jax_v, runtime", [
    ("0.8.1", (0, 2)), ("0.8.2", (0, 2)), ("0.9.0", (0, 2)),
    ("0.10.2", (0, 3)), ("0.11.2", (0, 4)), ("0.12.0rc1", (0, 5)),
])
def test_the_wheel_build_runs_on_every_supported_jax(jax_v, runtime):
    assert compat.problem(jax_v, jax_v, (0, 2), runtime, "jaxlib 0.8.1") is None


@pytest.mark.parametrize("built, runtime", [((0, 3), (0, 2)), ((0, 4), (0, 3)),
                                            ((1, 0), (0, 4)), ((0, 2), (1, 0))])
def test_an_extension_built_for_another_ffi_is_refused_with_the_fix(built, runtime):
    what, fix = compat.problem("0.9.0", "0.9.0", built, runtime, "jaxlib 0.10.2")
    assert f"compiled against XLA FFI API {built[0]}.{built[1]}" in what
    assert "the headers of jaxlib 0.10.2" in what
    assert f"jaxlib 0.9.0 provides FFI API {runtime[0]}.{runtime[1]}" in what
    assert "numbax wheel" in fix and "without --no-build-isolation" in fix
    assert "upgrade jax and jaxlib to 0.10.2 or newer" in fix


def test_unknown_versions_are_not_reported_as_problems():
    assert compat.problem(None, None, None, None) is None
    assert compat.problem("0.10.2", "0.10.2", None, (0, 3)) is None
    assert compat.problem("0.10.2", "0.10.2", (0, 2), None) is None


def test_check_raises_import_error_naming_the_supported_versions(monkeypatch):
    monkeypatch.setattr(compat, "current_problem",
                        lambda: compat.problem("0.7.2", "0.7.2", (0, 2), (0, 1)))
    with pytest.raises(ImportError, match=rf"jax 0\.7\.2 is too old.*>= {MIN}"):
        compat.check()


def test_this_build_and_jaxlib_agree():
    built, source = compat.built_ffi_api()
    runtime = compat.runtime_ffi_api()
    assert built is not None and runtime is not None
    assert built[0] == runtime[0] and built[1] <= runtime[1]
    assert source  # "jaxlib X" or the include-dir override
    assert compat.current_problem() is None


def fake_info(**versions):
    info = {"versions": {"jax": "0.10.2", "jaxlib": "0.10.2", "numba": "0.68.1",
                         "numba-cuda": "0.30.4", "numpy": "2.4.6"},
            "xla_ffi_api": {"built": "0.2", "built_from": "jaxlib 0.8.1",
                            "jaxlib": "0.3"},
            "numba_cuda": {"import_error": None, "error": None, "available": None,
                           "gpus": []},
            "extension": {"loaded": True, "error": None, "path": "x"},
            "jax": {"error": None, "backend": "cpu", "gpus": [], "devices": []},
            "cuda_driver": {"loaded": False, "version": None, "error": None},
            "simulator": True}
    info["versions"].update(versions.pop("versions", {}))
    info["xla_ffi_api"].update(versions)
    return info


def test_info_problem_line_for_an_old_jax():
    info = fake_info(versions={"jax": "0.7.2", "jaxlib": "0.7.2"}, jaxlib="0.1")
    problems = cli.find_problems(info)
    assert len(problems) == 1, problems
    assert "jax 0.7.2 is too old" in problems[0].what
    text = cli.format_info(dict(info, numbax="0.1.0", numbax_path="p", python="3.11",
                                jax_plugins={}, env={}), problems)
    assert re.search(r"XLA FFI API +0\.2 compiled into numbax, the headers of "
                     r"jaxlib 0\.8\.1; the running jaxlib provides 0\.1", text)
    assert "problems found: 1" in text and f"fix: pip install -U 'jax>={MIN}'" in text


def test_info_problem_line_for_a_newer_ffi_build():
    info = fake_info(versions={"jax": "0.9.0", "jaxlib": "0.9.0"}, built="0.3",
                     built_from="jaxlib 0.10.2", jaxlib="0.2")
    problems = cli.find_problems(info)
    assert len(problems) == 1, problems
    assert "compiled against XLA FFI API 0.3" in problems[0].what
    assert cli.find_problems(fake_info()) == []


def test_python_m_numbax_info_still_runs_when_import_would_fail(tmp_path):
    # A sitecustomize that makes numbax look built for a newer FFI than the
    # running jaxlib's: `import numbax` must refuse, `python -m numbax info`
    # must report the same problem (exit status 1).
    (tmp_path / "sitecustomize.py").write_text(
        "import sys, types\n"
        "sys.modules['numbax._build_info'] = types.SimpleNamespace(\n"
        "    XLA_FFI_API=(0, 99), XLA_FFI_HEADERS_FROM='jaxlib 9.9')\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(tmp_path))
    imp = subprocess.run([sys.executable, "-c", "import numbax"], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert imp.returncode != 0
    assert "ImportError: numbax cannot run here: numbax's extension was " \
           "compiled against XLA FFI API 0.99" in imp.stderr, imp.stderr
    info = subprocess.run([sys.executable, "-m", "numbax", "info"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert info.returncode == 1, info.stdout + info.stderr
    assert "compiled against XLA FFI API 0.99, the headers of jaxlib 9.9" in info.stdout
    assert "fix: install the numbax wheel" in info.stdout


def test_a_jaxlib_with_a_newer_ffi_is_refused_at_import(tmp_path):
    # The running jaxlib made to report FFI API 0.99 (its headers are where
    # numbax reads the version): import refuses, naming both versions and
    # the fix; info reports it; the override lets import through.
    api = tmp_path / "fakejaxlib" / "include" / "xla" / "ffi" / "api"
    api.mkdir(parents=True)
    (api / "c_api.h").write_text("#define XLA_FFI_API_MAJOR 0\n"
                                 "#define XLA_FFI_API_MINOR 99\n")
    (tmp_path / "sitecustomize.py").write_text(
        "import jaxlib\n"
        f"jaxlib.__file__ = {str(tmp_path / 'fakejaxlib' / '__init__.py')!r}\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(tmp_path))
    env.pop(compat.ALLOW_UNTESTED_ENV, None)
    imp = subprocess.run([sys.executable, "-c", "import numbax"], env=env,
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert imp.returncode != 0
    assert "ImportError: numbax cannot run here: the running jaxlib" in imp.stderr
    assert "provides XLA FFI API 0.99, newer than any this numbax was checked " \
           "against" in imp.stderr, imp.stderr
    assert f"{compat.ALLOW_UNTESTED_ENV}=1" in imp.stderr
    info = subprocess.run([sys.executable, "-m", "numbax", "info"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert info.returncode == 1, info.stdout + info.stderr
    assert "the running jaxlib provides 0.99" in info.stdout
    assert "provides XLA FFI API 0.99, newer than any" in info.stdout
    env[compat.ALLOW_UNTESTED_ENV] = "1"
    ok = subprocess.run([sys.executable, "-c", "import numbax"], env=env,
                        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr


def test_jax_internals_are_reached_only_from_compat():
    """Every jax._src access and JAX-version shim lives in runtime/compat.py, so
    a JAX release that moves one has a single place to fix."""
    src = ROOT / "src" / "numbax"
    offenders = [str(p.relative_to(src)) for p in sorted(src.rglob("*.py"))
                 if p != src / "runtime" / "compat.py"
                 and "jax._src" in p.read_text()]
    assert offenders == []
    assert "jax._src" in (src / "runtime" / "compat.py").read_text()

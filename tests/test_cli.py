"""python -m numbax info / bench, the benchmark scheduler and progress bar."""

import io
import json
import os
import re
import statistics
import subprocess
import sys
from importlib import metadata, resources
from pathlib import Path

import pytest

from numbax import cli
from numbax.bench import progress, timing

ROOT = Path(__file__).resolve().parent.parent
SIM_ENV = {"NUMBA_ENABLE_CUDASIM": "1", "JAX_PLATFORMS": "cpu"}


def run(args, env=None, timeout=300, cwd=ROOT):
    full_env = dict(os.environ)
    for k in SIM_ENV:
        full_env.pop(k, None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------
# info

@pytest.fixture(scope="module")
def info_json():
    proc = run(["-m", "numbax", "info", "--json"], env=SIM_ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def test_info_text_names_versions_and_simulator():
    proc = run(["-m", "numbax", "info"], env=SIM_ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    import numbax
    assert re.search(rf"^numbax\s+{re.escape(numbax.__version__)} ", out, re.M)
    for dist in ("jax", "jaxlib", "numba", "numba-cuda", "numpy"):
        assert re.search(rf"^{re.escape(dist)}\s+{re.escape(metadata.version(dist))}$",
                         out, re.M), f"{dist} version missing:\n{out}"
    assert re.search(r"^XLA FFI API\s+\d+\.\d+ ", out, re.M), out
    assert re.search(r"^simulator\s+on ", out, re.M), out
    assert re.search(r"^GPUs \(JAX\)\s+none$", out, re.M), out
    assert "no known incompatibility found" in out


def test_info_json_matches_the_environment(info_json):
    assert info_json["problems"] == []
    assert info_json["simulator"] is True
    assert info_json["extension"]["loaded"] is True
    for dist in ("jax", "jaxlib", "numba", "numba-cuda", "numpy"):
        assert info_json["versions"][dist] == metadata.version(dist)
    import jax.ffi
    header = Path(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h").read_text()
    major = re.search(r"#define\s+XLA_FFI_API_MAJOR\s+(\d+)", header).group(1)
    minor = re.search(r"#define\s+XLA_FFI_API_MINOR\s+(\d+)", header).group(1)
    # The running jaxlib's FFI API, and the one numbax was compiled against
    # (recorded at build time), which the jaxlib must not be older than.
    assert info_json["xla_ffi_api"]["jaxlib"] == f"{major}.{minor}"
    from numbax import _build_info
    built = info_json["xla_ffi_api"]["built"]
    assert built == "{}.{}".format(*_build_info.XLA_FFI_API)
    assert (int(major), int(minor)) >= _build_info.XLA_FFI_API
    assert info_json["jax"]["backend"] == "cpu"


def test_info_says_which_ffi_versions_this_build_serves(info_json):
    """Before: "0.2 compiled into numbax ...; the running jaxlib provides
    0.5", without the range of FFI versions the build serves."""
    from numbax import _build_info
    from numbax.runtime import compat
    built = tuple(_build_info.XLA_FFI_API)
    oldest = ".".join(map(str, max(built, compat.SERVED_FFI_API[0])))
    newest = ".".join(map(str, compat.SERVED_FFI_API[1]))
    assert info_json["xla_ffi_api"]["serves"] == [oldest, newest]
    text = cli.format_info(with_changes(info_json), [])
    line = next(x for x in text.splitlines() if x.startswith("XLA FFI API"))
    assert f"this build serves XLA FFI API {oldest} to {newest}" in line, line
    assert f"the running jaxlib provides {info_json['xla_ffi_api']['jaxlib']} " \
        "(within that range)" in line, line
    # A jaxlib outside the range says so (find_problems explains it).
    outside = with_changes(info_json, xla_ffi_api__jaxlib="0.9")
    assert "provides 0.9 (outside that range)" in cli.format_info(outside, [])


@pytest.mark.parametrize("built, served", [
    ((0, 2), ((0, 2), (0, 5))), ((0, 3), ((0, 3), (0, 5))),
    ((0, 9), None), (None, None)])
def test_served_ffi_range_starts_at_the_build(built, served, monkeypatch):
    from numbax.runtime import compat
    monkeypatch.setattr(compat, "SERVED_FFI_API", ((0, 2), (0, 5)))
    assert compat.served_ffi_api(built) == served


def test_info_flags_cpu_backend_without_simulator():
    proc = run(["-m", "numbax", "info"], env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "problems found: 1" in proc.stdout
    assert "simulator is off" in proc.stdout
    assert "fix:" in proc.stdout and "NUMBA_ENABLE_CUDASIM=1" in proc.stdout


def test_info_names_the_missing_jax_cuda_plugin():
    """JAX_PLATFORMS=cuda without a JAX CUDA plugin: jax.devices() fails
    with a bare AssertionError (jax 0.10); info must say what is missing and
    how to install it (before: "AssertionError: " and a generic fix)."""
    if any(cli._version(d) for d in cli.JAX_PLUGINS):
        pytest.skip("a JAX CUDA plugin is installed here")
    proc = run(["-m", "numbax", "info"], env={"JAX_PLATFORMS": "cuda"},
               timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "Traceback" not in out + proc.stderr
    assert "JAX_PLATFORMS=cuda asks for JAX's CUDA backend, but no JAX CUDA " \
        "plugin is installed" in out, out
    assert 'pip install -U "jax[cuda13]"' in out and '"jax[cuda12]"' in out
    assert "check JAX_PLATFORMS and the jax/jaxlib install" not in out


@pytest.mark.parametrize("driver, fix", [
    (None, 'pip install -U "jax[cuda13]" for a CUDA 13 driver, or pip install '
           '-U "jax[cuda12]" for a CUDA 12 one'),
    ("12.8", 'for this CUDA 12.8 driver: pip install -U "jax[cuda12]"'),
    ("13.0", 'for this CUDA 13.0 driver: pip install -U "jax[cuda13]"'),
])
def test_missing_jax_cuda_plugin_fix_matches_the_driver(info_json, driver, fix):
    info = with_changes(info_json, jax__error="AssertionError",
                        env__JAX_PLATFORMS="cuda", jax_plugins={},
                        cuda_driver__loaded=driver is not None,
                        cuda_driver__version=driver)
    problems = [p for p in cli.find_problems(info) if "plugin" in p.what]
    assert len(problems) == 1, cli.find_problems(info)
    assert "(AssertionError)" in problems[0].what
    assert fix in problems[0].fix, problems[0].fix
    assert "JAX_PLATFORMS=cpu NUMBA_ENABLE_CUDASIM=1" in problems[0].fix


@pytest.mark.gpu
def test_info_on_a_gpu_sees_it_and_finds_no_problem(gpu_only):
    proc = run(["-m", "numbax", "info", "--json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    info = json.loads(proc.stdout)
    assert info["jax"]["backend"] == "gpu"
    assert info["jax"]["gpus"] and info["numba_cuda"]["gpus"]
    assert info["cuda_driver"]["loaded"]


def with_changes(info, **changes):
    info = json.loads(json.dumps(info))  # deep copy
    for path, value in changes.items():
        target = info
        *parents, leaf = path.split("__")
        for p in parents:
            target = target[p]
        target[leaf] = value
    info.pop("problems", None)
    return info


@pytest.mark.parametrize("numpy_v, numba_cuda_v, flagged", [
    ("2.5.0", "0.30.4", True),
    ("2.6.1", "0.29.0", True),
    ("2.4.6", "0.30.4", False),
    ("2.5.0", "0.31.0", False),
])
def test_numpy_too_new_for_numba_cuda(info_json, numpy_v, numba_cuda_v, flagged):
    info = with_changes(info_json, versions__numpy=numpy_v,
                        **{"versions__numba-cuda": numba_cuda_v})
    problems = cli.find_problems(info)
    hits = [p for p in problems if "numpy" in p.what and "too new" in p.what]
    assert bool(hits) == flagged, problems
    if flagged:
        assert f"numpy {numpy_v}" in hits[0].what
        assert "pip install 'numpy<2.5'" in hits[0].fix


def test_problems_name_their_fix(info_json):
    broken = with_changes(
        info_json, extension__loaded=False,
        extension__error="ImportError: undefined symbol", jax__backend="gpu",
        **{"versions__numba-cuda": None})
    problems = cli.find_problems(broken)
    text = "\n".join(f"{p.what} | {p.fix}" for p in problems)
    assert "numba-cuda is not installed" in text and "pip install numba" in text
    assert "numbax._core cannot be imported" in text
    assert "--no-build-isolation --force-reinstall" in text
    # The simulator is on while JAX runs on a GPU: both ways out are named.
    assert "unset NUMBA_ENABLE_CUDASIM" in text and "JAX_PLATFORMS=cpu" in text
    assert all(p.fix for p in problems)


def test_cli_usage_and_version():
    proc = run(["-m", "numbax"])
    assert proc.returncode == 2 and "info" in proc.stdout and "bench" in proc.stdout
    proc = run(["-m", "numbax", "--version"])
    import numbax
    assert proc.returncode == 0 and proc.stdout.strip() == f"numbax {numbax.__version__}"
    proc = run(["-m", "numbax", "frobnicate"])
    assert proc.returncode == 2 and "unknown command 'frobnicate'" in proc.stderr


# ---------------------------------------------------------------------------
# bench

def test_bench_cpu_smoke_end_to_end(tmp_path):
    """No simulator in the environment: --cpu-smoke switches it on itself."""
    out_json, out_png = tmp_path / "bench.json", tmp_path / "bench.png"
    # The moving-buffer phases have their own smoke test in test_bench_cli.
    proc = run(["-m", "numbax", "bench", "--cpu-smoke", "--rounds", "3",
                "--no-moving", "--json", str(out_json), "--plot", str(out_png)])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    record = json.loads(out_json.read_text())
    rows = {r["name"]: r for r in record["results"]}
    assert rows["native"]["status"] == "skipped (no GPU)"
    for name in ("numbax_kernel", "numbax_callable", "numbax_capture",
                 "pure_callback"):
        row = rows[name]
        assert row["status"] == "ok", row
        for phase in ("chain", "single"):
            samples = row[phase]["samples_us"]
            assert len(samples) == 3 and all(s > 0 for s in samples)
            assert row[phase]["us_per_call"] == statistics.median(samples)
    assert len(rows["numbax_callable"]["bandwidth"]["samples_gb_per_s"]) == 2
    assert record["environment"]["env"]["NUMBA_ENABLE_CUDASIM"] == "1"
    assert "interleaved" in record["method"]
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The table is printed last, after every log line.
    lines = proc.stdout.rstrip().splitlines()
    assert lines[-1].startswith("ratios:")
    table = lines.index("== table")
    assert not any(line.startswith("[") for line in lines[table:])
    assert any(line.startswith("numbax callable ") and " ok " in line
               for line in lines[table:])


def test_bench_only_rejects_unknown_names():
    proc = run(["-m", "numbax", "bench", "--only", "numbax_callable,nope"])
    assert proc.returncode == 2
    assert "unknown implementation(s) ['nope']" in proc.stderr


def test_bench_plot_without_matplotlib_fails_before_running(tmp_path):
    stub = tmp_path / "stub" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('matplotlib blocked')\n")
    png = tmp_path / "x.png"
    proc = run(["-m", "numbax", "bench", "--cpu-smoke", "--plot", str(png)],
               env={"PYTHONPATH": str(stub.parent)})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--plot needs matplotlib" in proc.stderr
    assert "pip install matplotlib" in proc.stderr
    assert "matches numpy" not in proc.stdout and not png.exists()


def test_native_source_ships_with_the_package():
    source = resources.files("numbax.bench.native") / "native_ffi.cu"
    text = source.read_text()
    assert "XLA_FFI_DEFINE_HANDLER_SYMBOL(NativeAffineCmdBuffer" in text


# ---------------------------------------------------------------------------
# The interleaving scheduler and the progress bar.

def test_interleave_measures_every_task_once_per_round_rotating():
    calls = []

    def task(key):
        return timing.Task(key, lambda: calls.append(key) or float(len(calls)))

    steps = []
    samples = timing.interleave([task("a"), task("b"), task("c")], 3,
                                on_step=steps.append)
    assert calls == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert samples == {"a": [1.0, 6.0, 8.0], "b": [2.0, 4.0, 9.0],
                       "c": [3.0, 5.0, 7.0]}
    assert sum(steps) == 9


def test_interleave_drops_warmup_rounds():
    calls = []

    def task(key):
        return timing.Task(key, lambda: calls.append(key) or float(len(calls)))

    steps = []
    samples = timing.interleave([task("a"), task("b")], 2, warmup_rounds=1,
                                on_step=steps.append)
    assert calls == ["a", "b", "b", "a", "a", "b"]     # 3 rounds ran
    assert samples == {"a": [4.0, 5.0], "b": [3.0, 6.0]}  # round 0 dropped
    assert sum(steps) == 6


def test_interleave_drops_a_failing_task_and_goes_on():
    n = {"bad": 0}

    def bad():
        n["bad"] += 1
        if n["bad"] == 2:
            raise RuntimeError("boom")
        return 1.0

    errors, steps = [], []
    samples = timing.interleave(
        [timing.Task("good", lambda: 2.0), timing.Task("bad", bad)], 4,
        on_step=steps.append, on_error=lambda t, e: errors.append((t.key, str(e))))
    assert errors == [("bad", "boom")]
    assert samples == {"good": [2.0] * 4, "bad": [1.0]}
    assert n["bad"] == 2                   # never called after it failed
    assert sum(steps) == 8                 # a full progress bar regardless


def test_simple_progress_bar_draws_on_a_terminal(capsys):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    bar = progress.Progress(2, "rounds", stream=stream, use_tqdm=False)
    assert bar.enabled
    bar.advance()
    bar.write("a message")
    bar.add_total(2)
    bar.advance(3)
    bar.close()
    drawn = stream.getvalue()
    assert "rounds [" in drawn and "1/2 (50%)" in drawn and "4/4 (100%)" in drawn
    assert drawn.endswith("\r\x1b[K")          # erased when closed
    assert capsys.readouterr().out == "a message\n"


def test_progress_bar_stays_quiet_off_a_terminal(capsys):
    stream = io.StringIO()
    bar = progress.Progress(3, "x", stream=stream)
    assert not bar.enabled
    bar.advance(3)
    bar.write("line")
    bar.close()
    assert stream.getvalue() == ""
    assert capsys.readouterr().out == "line\n"


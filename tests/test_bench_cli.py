"""python -m numbax bench on a machine without a GPU, and the charts.

Without a GPU (and the simulator off) the suite must run its CPU rows, each
checked against numpy, and say so; with the simulator on it must run the
smoke configuration by itself and say so; simulator timings must carry no
ratios; and the committed H200 chart must be redrawable from its JSON
without a GPU (--plot-from). No test asserts a timing.
"""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import types
from pathlib import Path

import numpy as np

import pytest

from numbax.bench import cpu, measure, mode, plot, progress, report, run, timing

ROOT = Path(__file__).resolve().parent.parent
SIM_ENV = {"NUMBA_ENABLE_CUDASIM": "1", "JAX_PLATFORMS": "cpu"}
H200_JSON = (ROOT / "benchmarks" / "results" / "h200-2026-11-29"
             / "h200-2026-11-29.json")
H200_PNG = H200_JSON.with_suffix(".png")
COMMANDS = {"python -m numbax bench": ["-m", "numbax", "bench"]}


def run_cli(args, env=None, timeout=300):
    full_env = dict(os.environ)
    for k in SIM_ENV:
        full_env.pop(k, None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------
# No GPU, simulator off: the CPU rows (numbax.bench.cpu), at tiny sizes here.

def _cpu_record(out_json):
    record = json.loads(out_json.read_text())
    return record, {r["name"]: r for r in record["results"]}


def _numba_kernel_here():
    import numbax
    return hasattr(numbax, "numba_kernel")


@pytest.mark.parametrize("prog", COMMANDS)
def test_no_gpu_runs_the_cpu_rows_checked_against_numpy(prog, tmp_path):
    # JAX_PLATFORMS=cpu hides any GPU, so this holds on a GPU machine too.
    out_json = tmp_path / "cpu.json"
    proc = run_cli([*COMMANDS[prog], "--tiny", "--no-progress", "--json",
                    str(out_json)], env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stdout.rstrip().splitlines()
    assert lines[0].startswith("cpu run: JAX sees no GPU here (JAX_PLATFORMS="
                               "cpu keeps JAX on the cpu")
    assert f"`{prog} --cpu-smoke`" in lines[0]     # the other way, named

    record, rows = _cpu_record(out_json)
    assert record["mode"]["cpu"] is True and record["tiny"] is True
    assert list(rows) == cpu.NAMES and record["targets"] == []
    have_cxx = any(shutil.which(c) for c in ("c++", "g++", "clang++"))
    want_ok = {"buffer_callback", "pure_callback", "jnp"}
    if have_cxx:
        want_ok |= {"native", "native_empty"}
    if _numba_kernel_here():
        want_ok |= {"numba_kernel", "numba_kernel_empty", "numba_kernel_xla"}
    else:
        assert rows["numba_kernel"]["status"] == (
            "skipped (numbax.numba_kernel is not in this numbax)")
    try:
        import brainevent  # noqa: F401
        want_ok.add("brainevent")
    except ImportError:
        assert rows["brainevent"]["status"] == \
            "skipped (brainevent is not installed)"
    for name, r in rows.items():
        if name not in want_ok:
            assert r["status"].startswith("skipped ("), r
            continue
        # ok means: single, chain and vmap matched numpy on fresh random
        # data (the empty rows write nothing and are not checked).
        assert r["status"] == "ok", r
        assert r["checked"] is (not name.endswith("empty"))
        for key in ("chain", "single", "vmap"):
            assert len(r[key]["samples"]) == 1 and r[key]["us"] > 0, (name, key)
    large = {r["name"]: r for r in record["large"]}
    assert list(large) == [name for name, _ in cpu.LARGE]
    for r in large.values():
        if _numba_kernel_here():
            assert r["status"] == "ok", r         # checked against numpy
            assert all(r[k]["us"] > 0 for k in ("alone", "at_once", "in_a_row"))
        else:
            assert r["status"].startswith("skipped (numbax.numba_kernel")

    table = lines[lines.index("== cpu table"):]
    assert table[2].split()[:2] == ["implementation", "status"]
    for name, r in rows.items():
        assert any(x.startswith(r["label"] + " ") for x in table), name
    assert table[-1] == ("targets (issue 44): not judged, " + cpu.NOTE_TINY)


def test_no_gpu_without_any_setting_runs_the_cpu_rows():
    """The first-contact case: a plain `python -m numbax bench` on a laptop
    runs the CPU rows (one row and the baselines here, to keep it short)."""
    if mode._cuda_driver_loads():
        pytest.skip("a CUDA driver is installed here: JAX may see a GPU")
    proc = run_cli(["-m", "numbax", "bench", "--tiny", "--only", "jnp",
                    "--no-workloads"], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr
    assert proc.stdout.startswith("cpu run: JAX sees no GPU here (JAX runs on "
                                  "the cpu)")
    table = proc.stdout[proc.stdout.index("== cpu table"):].splitlines()
    assert [x.split()[0] for x in table[3:6]] == ["C++", "C++", "jnp"]


def test_cpu_option_runs_the_cpu_rows_and_says_so(tmp_path):
    out_json = tmp_path / "cpu.json"
    proc = run_cli(["-m", "numbax", "bench", "--cpu", "--tiny", "--only",
                    "pure_callback", "--no-workloads", "--json", str(out_json)])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.startswith("cpu run (--cpu): numbax.numba_kernel")
    _, rows = _cpu_record(out_json)
    assert list(rows) == ["native", "native_empty", "pure_callback"]
    assert rows["pure_callback"]["status"] == "ok"
    assert "vmap" not in rows["pure_callback"]     # --no-workloads


@pytest.mark.parametrize("args, message", [
    (["--cpu", "--cpu-smoke"], "two different runs: give one"),
    (["--cpu", "--tiny", "--plot", "x.png"], "the CPU rows have none"),
])
def test_cpu_options_that_contradict_are_refused(args, message, tmp_path):
    argv = [a if a != "x.png" else str(tmp_path / a) for a in args]
    proc = run_cli(["-m", "numbax", "bench", *argv], timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_tiny_on_the_gpu_suite_is_refused(monkeypatch, capsys):
    from numbax.runtime import numba_bridge
    monkeypatch.setattr(mode, "jax_backend", lambda: mode.Backend("gpu"))
    monkeypatch.setattr(numba_bridge, "simulator_enabled", lambda: False)
    assert run.main(["--tiny"]) == 2
    assert "--tiny sizes the CPU rows" in capsys.readouterr().err


def _tiny_cfg():
    return cpu.CpuConfig.tiny_sizes()


def test_a_cpu_row_that_computes_wrongly_fails_its_check(monkeypatch):
    """A row is timed only after it matched numpy: an op off by one in the
    last element is FAILED (check), never timed."""
    import jax.numpy as jnp
    right = cpu.make_op

    def off_by_one(name, env, vmapped=False):
        op = right(name, env, vmapped=vmapped)
        return lambda x: op(x).at[..., -1].add(jnp.float32(1))
    monkeypatch.setattr(cpu, "make_op", off_by_one)
    logged = []
    row, prepared = cpu.prepare("jnp", cpu.Env(), _tiny_cfg(),
                                np.random.default_rng(0), True, logged.append)
    assert prepared is None
    assert row["status"].startswith("FAILED (check): AssertionError: single, "
                                    "trial 0: 1 of 64 elements wrong")
    monkeypatch.setattr(cpu, "make_op", right)
    row, prepared = cpu.prepare("jnp", cpu.Env(), _tiny_cfg(),
                                np.random.default_rng(0), True, logged.append)
    assert row["status"] == "ok" and set(prepared.programs) == {
        "chain", "single", "vmap"}


def test_a_large_op_child_that_aborts_is_a_failed_row(monkeypatch):
    """Numba's workqueue layer aborts the process on concurrent parallel=True
    kernels: the large rows run in a child, so that costs a row."""
    def aborted(cmd, **kwargs):
        assert cmd[1:4] == ["-m", "numbax.bench.cpu", "--large"]
        return subprocess.CompletedProcess(
            cmd, -6, "", "Terminating: Concurrent access has been detected.\n")
    monkeypatch.setattr(cpu.subprocess, "run", aborted)
    rows = cpu.large_rows(_tiny_cfg(), 1)
    assert rows == [{"name": "large", "status": (
        "FAILED: the child exited -6: Terminating: Concurrent access has been "
        "detected.")}]


def _timed(**us):
    return {k: {"us": v, "samples": [v]} for k, v in us.items()}


def test_targets_are_the_issues_ratios_of_one_run():
    rows = [dict(name=n, status="ok", **t) for n, t in [
        ("native", _timed(chain=0.40, vmap=30.0)),
        ("native_empty", _timed(chain=0.14)),
        ("numba_kernel", _timed(chain=0.46, vmap=40.0)),
        ("numba_kernel_empty", _timed(chain=0.18)),
        ("buffer_callback", _timed(chain=3.2)),
        ("pure_callback", _timed(chain=60.0)),
        ("brainevent", _timed(chain=8.3, vmap=1000.0)),
    ]]
    large = [dict(name="serial", status="ok", **_timed(alone=1000.0)),
             dict(name="xla", status="ok", **_timed(alone=250.0, at_once=900.0,
                                                   in_a_row=1000.0)),
             dict(name="prange", status="ok", **_timed(alone=200.0))]
    got = {t["target"]: t for t in cpu.targets(rows, large)}
    want = {
        "chain: numba_kernel / C++ handler": (0.46 / 0.40, True),
        "chain, empty kernel: numba_kernel - empty C++ handler": (0.04, True),
        "chain: brainevent numba_kernel / numba_kernel": (8.3 / 0.46, True),
        "chain: buffer_callback + @njit / numba_kernel": (3.2 / 0.46, True),
        "chain: jax.pure_callback / numba_kernel": (60 / 0.46, True),
        "vmap: numba_kernel / one C++ handler call over the batch": (
            40 / 30, False),
        "vmap: brainevent 'sequential' / numba_kernel": (25.0, True),
        "large: parallel='xla' speed-up / prange speed-up": (0.8, True),
        "large: parallel='xla' four at once / four in a row": (0.9, True),
    }
    assert set(got) == set(want)
    for what, (value, met) in want.items():
        assert got[what]["value"] == pytest.approx(value), what
        assert got[what]["met"] is met, what
    # A row that did not run leaves its targets unjudged, never met.
    rows = [r for r in rows if r["name"] != "brainevent"]
    got = {t["target"]: t for t in cpu.targets(rows, large)}
    assert got["chain: brainevent numba_kernel / numba_kernel"]["met"] is None
    record = {"config": vars(cpu.CpuConfig()), "tiny": False, "results": [
        dict(r, label=cpu.LABELS[r["name"]]) for r in rows], "large": [],
        "targets": cpu.targets(rows, large)}
    text = cpu.format_table(record)
    assert ("  chain: brainevent numba_kernel / numba_kernel" in text
            and text.splitlines()[-1].endswith("met"))
    assert "NOT met" in text and "n/a" in text


def test_the_pool_row_s_vmap_ratios_are_reported_but_judged_as_no_target():
    rows = [dict(name=n, status="ok", label=cpu.LABELS[n], **t) for n, t in [
        ("native", _timed(chain=0.40, vmap=60.0)),
        ("numba_kernel", _timed(chain=0.42, vmap=62.0)),
        ("numba_kernel_xla", _timed(chain=0.43, vmap=40.0)),
        ("brainevent", _timed(chain=8.3, vmap=800.0)),
    ]]
    targets = cpu.targets(rows, [])
    assert all("parallel='xla' the vmap" not in t["target"] for t in targets)
    text = cpu.format_table({"config": vars(cpu.CpuConfig()), "tiny": False,
                             "results": rows, "large": [],
                             "targets": targets})
    line = text.splitlines()[-1]
    assert "parallel='xla'" in line and "0.667x one C++" in line
    assert "'sequential' 20x slower" in line
    # Without the pool row there is no such line.
    text = cpu.format_table({"config": vars(cpu.CpuConfig()), "tiny": False,
                             "results": rows[:2] + rows[3:], "large": [],
                             "targets": targets})
    assert "XLA's pool" not in text


# ---------------------------------------------------------------------------
# The mode decision itself (every combination, in process).

def _select(cpu_smoke=False, simulator=False, platform="gpu", error=None,
            cpu=False):
    return mode.select(cpu_smoke=cpu_smoke, simulator=simulator,
                       backend=mode.Backend(platform, error), prog="P", cpu=cpu)


def test_a_gpu_without_the_simulator_runs_the_suite():
    m = _select()
    assert m.smoke is False and m.header is None


@pytest.mark.parametrize("cpu_smoke, how", [
    (False, "chosen automatically: NUMBA_ENABLE_CUDASIM=1 and JAX sees no GPU"),
    (True, "--cpu-smoke"),
])
def test_the_simulator_without_a_gpu_runs_the_smoke_configuration(cpu_smoke, how):
    m = _select(cpu_smoke=cpu_smoke, simulator=True, platform="cpu")
    assert m.smoke is True
    assert m.header.startswith(f"cpu smoke run ({how}):")
    assert "not performance figures" in m.header


def test_the_simulator_with_a_gpu_is_refused_with_both_ways_out():
    with pytest.raises(mode.Refused) as info:
        _select(simulator=True, platform="gpu")
    assert info.value.status == 2
    text = str(info.value)
    assert "NUMBA_ENABLE_CUDASIM=1 while JAX runs on the GPU" in text
    assert "Unset NUMBA_ENABLE_CUDASIM" in text and "`P --cpu-smoke`" in text


def test_no_gpu_chooses_the_cpu_rows_and_names_the_reason(monkeypatch):
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(mode, "_cuda_driver_loads", lambda: False)
    m = _select(platform="cpu")
    assert m.cpu is True and m.smoke is False
    assert m.header.startswith("cpu run: JAX sees no GPU here (JAX runs on the "
                               "cpu), so the suite times its CPU rows")
    assert "`P --cpu-smoke`" in m.header

    monkeypatch.setattr(mode, "_cuda_driver_loads", lambda: True)
    m = _select(platform="cpu")
    assert "a CUDA driver is installed but this jax has no GPU support" in \
        m.header
    assert "pip install -U 'jax[cuda12]'" in m.header

    # --cpu on a GPU machine (JAX put on the CPU by then) says so.
    m = _select(platform="cpu", cpu=True)
    assert m.cpu and m.header.startswith("cpu run (--cpu):")

    # No backend at all: nothing to time, status 3, both ways out named.
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    with pytest.raises(mode.Refused) as info:
        _select(platform=None, error="RuntimeError: Unable to initialize backend")
    assert ("JAX could not start a backend with JAX_PLATFORMS=cuda: "
            "RuntimeError: Unable to initialize backend") in str(info.value)
    assert "Set JAX_PLATFORMS=cpu for the CPU rows" in str(info.value)
    assert "`P --cpu-smoke`" in str(info.value)
    assert info.value.status == mode.EXIT_NO_GPU


def test_jax_backend_reports_instead_of_raising(monkeypatch):
    import jax

    def broken():
        raise AssertionError()
    monkeypatch.setattr(jax, "devices", broken)
    assert mode.jax_backend() == mode.Backend(None, "AssertionError")
    monkeypatch.undo()
    assert mode.jax_backend().error is None


@pytest.mark.gpu
def test_on_a_gpu_the_suite_runs_and_the_simulator_is_refused(gpu_only):
    m = mode.select(cpu_smoke=False, simulator=False, backend=mode.jax_backend(),
                    prog="P")
    assert m == mode.Mode(smoke=False, header=None)
    # The simulator switched on by mistake on a GPU machine: refused, status 2.
    proc = run_cli(["-m", "numbax", "bench", "--quick"],
                   env={"NUMBA_ENABLE_CUDASIM": "1"}, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "NUMBA_ENABLE_CUDASIM=1 while JAX runs on the GPU" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


# ---------------------------------------------------------------------------
# Simulator on, no GPU: the smoke run by itself, said so, no ratios.

@pytest.mark.parametrize("prog", COMMANDS)
def test_simulator_without_gpu_runs_smoke_by_itself(prog, tmp_path):
    out_json = tmp_path / "smoke.json"
    # --quick asks for the quick GPU configuration: the smoke one replaces it.
    # One row and one round keep the simulator's part to a few seconds.
    proc = run_cli([*COMMANDS[prog], "--quick", "--only", "numbax_kernel",
                    "--no-bandwidth", "--rounds", "1", "--no-progress",
                    "--json", str(out_json)], env=SIM_ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    lines = proc.stdout.rstrip().splitlines()
    assert lines[0].startswith("cpu smoke run (chosen automatically: "
                               "NUMBA_ENABLE_CUDASIM=1 and JAX sees no GPU)")

    record = json.loads(out_json.read_text())
    assert record["mode"] == {"smoke": True, "header": lines[0]}
    want = dict(vars(timing.Config.cpu_smoke()), rounds=1)
    assert record["config"] == want
    rows = {r["name"]: r for r in record["results"]}
    kernel = rows["numbax_kernel"]
    assert kernel["status"] == "ok" and kernel["chain"]["rounds"] == 1
    # The moving-buffers measurements ran too, each with its program length.
    smoke = timing.Config.cpu_smoke()
    for phase, ops in (("moving", smoke.moving_length),
                       ("donated", smoke.moving_length), ("single_moving", 1)):
        assert kernel[phase]["rounds"] == 1 and kernel[phase]["length"] == ops
        assert kernel[phase]["us_per_program"] == pytest.approx(
            kernel[phase]["us_per_call"] * ops)
    assert "moving_counters" not in kernel      # the capture row's alone
    assert rows["native"]["status"] == "skipped (no GPU)"
    for r in rows.values():
        assert r["ratios"] and all(v is None for v in r["ratios"].values()), r

    table = lines[lines.index("== table"):]
    assert "cpu smoke run: Numba's CUDA simulator, not performance figures" in table
    assert table[-1] == mode.SIMULATOR_NOTE
    assert report.MOVING_LEGEND in table
    kernel_line = next(x for x in table if x.startswith("numbax kernel "))
    # label (2 words), status, chain us, moving, donated, single us, 1-op mov,
    # BW "-": no ratio cells.
    cells = kernel_line.split()
    assert cells[:3] == ["numbax", "kernel", "ok"] and len(cells) == 9, kernel_line
    assert all(float(c) > 0 for c in cells[3:8]) and cells[8] == "-"


def test_ratios_stay_empty_for_simulator_timings():
    def row(name, chain, single, bw=None):
        return {"name": name, "label": name, "compare_to": "native",
                "status": "ok", "chain": {"us_per_call": chain},
                "single": {"us_per_call": single},
                "bandwidth": None if bw is None else {"gb_per_s": bw}}

    def rows():
        return [row("native", 2.0, 10.0, 100.0), row("native_cmdbuf", 1.0, 8.0),
                row("numbax_kernel", 3.0, 20.0, 50.0)]

    real, sim = rows(), rows()
    report.add_ratios(real)
    report.add_ratios(sim, comparable=False)
    assert real[2]["ratios"] == {
        "chain_vs_native": 1.5, "chain_vs_native_cmdbuf": 3.0,
        "single_vs_native": 2.0, "single_vs_native_cmdbuf": 2.5,
        "bandwidth_vs_native": 0.5,
        # Not measured (a run with --no-moving): the keys stay, None.
        **dict.fromkeys(f"{m}_vs_native{s}" for m in
                        ("moving", "donated", "single_moving")
                        for s in ("", "_cmdbuf"))}
    assert sim[2]["ratios"] == dict.fromkeys(real[2]["ratios"])   # same keys

    shown = report.format_table(real).splitlines()
    assert "1.50*" in shown[4] and "0.500" in shown[4]
    blank = report.format_table(sim, note=mode.SIMULATOR_NOTE).splitlines()
    assert blank[-1] == mode.SIMULATOR_NOTE
    assert blank[4].split() == ["numbax_kernel", "ok", "3.00", "-", "-", "20.0",
                                "-", "50.0"]
    assert blank[0] == shown[0]                   # the columns stay, empty
    # Without the moving measurements their columns and legend go.
    short = report.format_table(sim, note=mode.SIMULATOR_NOTE,
                                moving=False).splitlines()
    assert short[4].split() == ["numbax_kernel", "ok", "3.00", "20.0", "50.0"]
    assert "moving" not in short[0] and report.MOVING_LEGEND not in short


def _moving_row(name, compare_to, us, **counters):
    """A row with every time measured: `us` per op (single: 10x that)."""
    row = {"name": name, "label": name, "compare_to": compare_to, "status": "ok",
           "bandwidth": None}
    for key in report.TIMES:
        row[key] = {"us_per_call": us * (10 if key.startswith("single") else 1)}
    if counters:
        row["moving_counters"] = counters
    return row


def test_table_shows_the_moving_measurements_next_to_chain_and_single():
    rows = [_moving_row("native", "native", 7.0),
            _moving_row("native_cmdbuf", "native_cmdbuf", 2.0),
            _moving_row("numbax_capture", "native_cmdbuf", 3.0, op_calls=64,
                        calls=64, graph_misses=1, graph_hits=63,
                        graph_rebinds=5, graph_rebind_refusals=0)]
    rows[2]["moving"]["us_per_call"] = 5.0
    rows[2]["donated"]["us_per_call"] = 2.5
    report.add_ratios(rows)
    q = rows[2]["ratios"]
    assert q["moving_vs_native_cmdbuf"] == 2.5 and q["donated_vs_native_cmdbuf"] == 1.25
    assert q["single_moving_vs_native"] == pytest.approx(30 / 70)
    lines = report.format_table(rows).splitlines()
    head = lines[0].split()
    assert head[2:7] == ["chain", "us", "moving", "donated", "single"]
    assert head.index("1-op") < head.index("chain/nat")
    assert ["mov/cb", "don/cb"] == head[head.index("chain/nat-cb") + 1:][:2]
    capture = lines[4].split()
    # chain, moving, donated, single, 1-op mov, then the ratios.
    assert capture[2:7] == ["3.00", "5.00", "2.50", "30.0", "30.0"]
    assert capture[7:11] == ["0.43", "1.50*", "2.50", "1.25"]
    # The capture row's counters: one line under the rows, above the legend.
    assert lines[-3:-1] == [
        "numbax_capture, one op over 64 inputs: func ran 64 times in 64 calls; "
        "graph_misses 1, graph_hits 63, graph_rebinds 5, graph_rebind_refusals 0",
        report.MOVING_LEGEND]


# ---------------------------------------------------------------------------
# The moving-buffers measurements, with a jnp op (no simulator needed).

def _affine(x):
    return 2 * x + 1


def _which(inputs, xs):
    """The indices in `inputs` of the arrays `xs` (by identity)."""
    return [next(k for k, d in enumerate(inputs.device) if d is x) for x in xs]


def test_rotating_calls_take_every_input_in_turn():
    import jax
    inputs = timing.Inputs(np.random.default_rng(0), 4, 16)
    seen = []

    def op(x):
        seen.append(x)
        return _affine(x)
    rotating = timing.Rotating(op, inputs, 1, statistics.median)
    assert rotating.sample(6) > 0
    assert _which(inputs, seen) == [0, 1, 2, 3, 0, 1]
    assert all(isinstance(x, jax.Array) for x in inputs.device)
    rotating.check("rotating")                  # the first, middle, last input
    assert _which(inputs, seen[6:]) == [0, 1, 3]


def test_a_result_stuck_on_old_buffers_fails_the_moving_check():
    inputs = timing.Inputs(np.random.default_rng(1), 3, 16)
    first = []

    def stale(x):           # as a replay still reading its first input's buffer
        first.append(first[0] if first else x)
        return _affine(first[-1])
    rotating = timing.Rotating(stale, inputs, 1, statistics.median)
    rotating.warm(1)
    with pytest.raises(timing.CheckFailed, match="input 1"):
        rotating.check("single_moving")


def test_carried_state_is_restored_in_place_before_float32_overflows():
    import jax
    length = 30
    start = np.random.default_rng(2).uniform(-1, 1, 64).astype(np.float32)
    carried = timing.Carried(timing.chain_fn(_affine, length, donate=True),
                             start, length)
    address = carried.y.unsafe_buffer_pointer()
    for _ in range(4):                          # 40 calls: 1200 ops in all
        assert carried.sample(10) > 0
        assert carried.ops <= timing.MAX_CHECKED_OPS
        assert np.isfinite(np.asarray(carried.y)).all()
        carried.check("donated")
    # Donated and restored in place: XLA kept handing back the same buffer.
    assert carried.y.unsafe_buffer_pointer() == address
    assert not carried.start.is_deleted()
    assert isinstance(carried.y, jax.Array)
    carried.y = _affine(carried.y)              # one op more than counted
    with pytest.raises(timing.CheckFailed, match="state after"):
        carried.check("donated")


def _prepared(name, op):
    import jax
    row = {"name": name, "label": name, "compare_to": "native", "status": "ok",
           "chain": None, "single": None, "bandwidth": None,
           **dict.fromkeys(measure.MOVING)}
    return measure.Prepared(types.SimpleNamespace(name=name), row, None, jax.jit(op), op)


def test_measure_moving_records_each_measurement_and_the_counters():
    cfg = timing.Config.cpu_smoke()
    good = _prepared("numbax_capture", _affine)
    first = []

    def stale(x):           # a host op stuck on the first buffer it saw
        def host(v):
            first.append(first[0] if first else np.asarray(v))
            return 2 * first[-1] + np.float32(1)
        import jax
        return jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    bad = _prepared("stuck", stale)
    logged = []
    measure.measure_moving([good, bad], cfg, np.random.default_rng(3), timing,
                       progress.Progress(0, "", enabled=False), logged.append)
    row = good.row
    assert row["status"] == "ok", row.get("errors")
    assert row["moving"]["length"] == row["donated"]["length"] == cfg.moving_length
    assert row["single_moving"]["length"] == 1
    assert all(row[m]["rounds"] == cfg.rounds for m in measure.MOVING)
    # jnp runs no func: the counters moved by nothing, but are all there.
    assert row["moving_counters"] == {"op_calls": cfg.moving_inputs,
                                      **dict.fromkeys(timing.MOVING_COUNTERS, 0)}
    assert bad.row["status"].startswith("FAILED (")
    assert set(bad.row["errors"]) == set(measure.MOVING)
    assert all(bad.row[m] is None for m in measure.MOVING)


def test_no_moving_switch_skips_them(tmp_path):
    out_json = tmp_path / "no-moving.json"
    proc = run_cli(["-m", "numbax", "bench", "--cpu-smoke", "--only",
                    "numbax_kernel", "--no-bandwidth", "--no-workloads",
                    "--rounds", "1", "--no-progress", "--no-moving",
                    "--json", str(out_json)], env=SIM_ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    record = json.loads(out_json.read_text())
    kernel = next(r for r in record["results"] if r["name"] == "numbax_kernel")
    assert kernel["status"] == "ok" and kernel["chain"]["rounds"] == 1
    assert all(kernel[m] is None for m in measure.MOVING)
    table = proc.stdout[proc.stdout.index("== table"):]
    assert "no moving run" in table and "mov/cb" not in table
    assert report.MOVING_LEGEND not in table
    assert "--no-moving" in run.build_parser("P", None).format_help()
    assert "no_moving" in run._RUN_OPTIONS


# ---------------------------------------------------------------------------
# Charts: --plot-from, the committed H200 chart, what the chart shows.

def test_plot_from_redraws_a_saved_run_without_running(tmp_path, capsys):
    out = tmp_path / "chart.png"
    status = run.main(["--plot-from", str(H200_JSON), "--plot", str(out)])
    assert status == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


def test_plot_from_defaults_to_the_json_path_with_png(tmp_path):
    copy = tmp_path / "run.json"
    copy.write_text(H200_JSON.read_text())
    assert run.main(["--plot-from", str(copy)]) == 0
    assert (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_from_bad_input_is_one_line_and_status_2(tmp_path, capsys):
    assert run.main(["--plot-from", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert "--plot-from: cannot read" in err and "missing.json" in err
    assert len(err.strip().splitlines()) == 1

    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    assert run.main(["--plot-from", str(other)]) == 2
    assert "is not a record of this suite" in capsys.readouterr().err
    assert not (tmp_path / "other.png").exists()


def test_plot_from_refuses_run_options():
    proc = run_cli(["-m", "numbax", "bench", "--plot-from", str(H200_JSON),
                    "--cpu-smoke", "--rounds", "3"], timeout=120)
    assert proc.returncode == 2
    assert "--plot-from draws a saved record and runs nothing: leave out " \
        "--rounds, --cpu-smoke" in proc.stderr
    with pytest.raises(SystemExit) as info:
        run.parse_args(["--plot-from", str(H200_JSON), "--no-moving"])
    assert info.value.code == 2


def test_committed_chart_sits_next_to_its_json_and_docs_show_it():
    assert H200_PNG.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    images = re.findall(r"!\[[^\]]+\]\((images/[^)]+\.png)\)", docs)
    # Each of the page's images is a committed chart (a link into a run's
    # folder under benchmarks/results) next to the JSON it was drawn from;
    # the full run's chart is one of them.
    charts = [(ROOT / "docs" / image).resolve() for image in images]
    assert H200_PNG.resolve() in charts
    results = (ROOT / "benchmarks" / "results").resolve()
    for chart in charts:
        assert chart.parent.parent == results and chart.with_suffix(".json").is_file()
    # The README links it by its path in the repository (absolute links: the
    # README is also the package's page on the index).
    readme = (ROOT / "README.md").read_text()
    assert f"{H200_PNG.relative_to(ROOT).as_posix()})" in readme


def test_documented_redraw_command_works(tmp_path):
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    m = re.search(r"python -m numbax bench --plot-from (\S+) \\\n\s+--plot (\S+)",
                  docs)
    assert m, "docs/benchmarks.md lost the command that redraws the chart"
    json_path, png_path = m.groups()
    assert ROOT / json_path == H200_JSON and ROOT / png_path == H200_PNG
    out = tmp_path / "again.png"
    assert run.main(["--plot-from", str(ROOT / json_path), "--plot", str(out)]) == 0
    assert out.stat().st_size > 20_000


def _bars(ax):
    return [p for p in ax.patches if p.get_width() > 0]


def test_chart_shows_every_row_coloured_with_its_ratio():
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex
    record = json.loads(H200_JSON.read_text())
    # A row added to the suite later is drawn too, coloured by its name.
    extra = json.loads(json.dumps(record["results"][2]))
    extra.update(name="numbax_new_row", label="numbax new row")
    record["results"].append(extra)
    fig = plot.figure(record)
    try:
        chain, single, bandwidth = fig.axes[:3]
        labels = [t.get_text() for t in chain.get_yticklabels()]
        assert labels[-1] == "numbax new row" and len(labels) == 9
        assert len(_bars(chain)) == len(_bars(single)) == 9
        assert len(_bars(bandwidth)) == 6     # rows of the bandwidth benchmark
        colors = {to_hex(b.get_facecolor()) for b in _bars(chain)}
        assert colors == {c for _, _, c in plot.KINDS}
        assert chain.get_xscale() == "log"      # 2.3 to 160 us
        assert single.get_xscale() == "linear"  # 62 to 359 us
        texts = [t.get_text().strip() for t in chain.texts]
        assert "2.32  (0.85x cmd-buf)" in texts     # numbax kernel
        assert "30.2  (4.34x plain)" in texts       # plain callable
        assert "6.97" in texts                      # a baseline: no ratio
        assert "(0.996x)" in " ".join(t.get_text() for t in bandwidth.texts)
        assert "simulator" not in " ".join(t.get_text() for t in fig.texts)
    finally:
        plt.close(fig)


def test_chart_of_a_smoke_run_says_it_is_no_performance_figure():
    import matplotlib.pyplot as plt
    record = json.loads(H200_JSON.read_text())
    record["mode"] = {"smoke": True, "header": "cpu smoke run"}
    for r in record["results"]:
        r["ratios"] = dict.fromkeys(r["ratios"])
    fig = plot.figure(record)
    try:
        words = " ".join(t.get_text() for t in fig.texts)
        assert "these timings show that each path runs, not how fast" in words
        assert "x)" not in " ".join(t.get_text() for ax in fig.axes
                                    for t in ax.texts)
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------
# Bad arguments and environments: refused in one line, before any work.

# Options that keep a run short, should a check let it through: the refusal
# must come before any of it (nothing on stdout, no file written).
_SHORT_RUN = ["--only", "numbax_kernel", "--no-bandwidth", "--no-workloads",
              "--rounds", "1", "--no-progress"]


def _refused_in_one_line(proc, *words):
    assert proc.returncode == 2, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout == "", proc.stdout          # nothing built, checked or timed
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("python -m numbax bench: error: "), lines[0]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("case", ["under-a-file", "missing-directory",
                                  "a-directory"])
def test_unusable_json_path_is_refused_before_running(case, tmp_path):
    # Root may write anywhere it can name: a path under a regular file (as
    # /etc/passwd/x.json) and a missing directory are unusable for root too.
    regular = tmp_path / "regular"
    regular.write_text("")
    path, words = {
        "under-a-file": (regular / "x.json", ["is not a directory"]),
        "missing-directory": (tmp_path / "missing" / "x.json",
                              ["does not exist", "mkdir -p"]),
        "a-directory": (tmp_path, ["is a directory"]),
    }[case]
    proc = run_cli(["-m", "numbax", "bench", *_SHORT_RUN, "--json", str(path)],
                   env=SIM_ENV, timeout=60)
    line = _refused_in_one_line(proc, "--json", *words)
    assert str(path.parent if case != "a-directory" else path) in line
    assert not (tmp_path / "missing").exists()     # never created silently
    assert regular.read_text() == ""


def test_unusable_plot_path_is_refused_before_running(tmp_path):
    path = tmp_path / "missing" / "x.png"
    proc = run_cli(["-m", "numbax", "bench", *_SHORT_RUN, "--plot", str(path)],
                   env=SIM_ENV, timeout=60)
    _refused_in_one_line(proc, "--plot", "does not exist", "mkdir -p")
    assert not path.parent.exists()


@pytest.mark.parametrize("seed", ["-1", str(2**63)])
def test_seed_out_of_range_is_refused_before_running(seed):
    proc = run_cli(["-m", "numbax", "bench", *_SHORT_RUN, "--seed", seed],
                   env=SIM_ENV, timeout=60)
    _refused_in_one_line(proc, "--seed", seed, "from 0 to 2**63 - 1")


def test_a_jax_backend_that_cannot_start_is_refused_with_the_simulator_on():
    """JAX_PLATFORMS naming no backend, simulator on: before, the smoke run
    started and JAX's traceback ended it."""
    proc = run_cli(["-m", "numbax", "bench", *_SHORT_RUN],
                   env={"NUMBA_ENABLE_CUDASIM": "1",
                        "JAX_PLATFORMS": "nonsense"}, timeout=60)
    _refused_in_one_line(proc, "JAX_PLATFORMS=nonsense",
                         "JAX_PLATFORMS=cpu")


def test_select_refuses_a_backend_error_with_the_simulator_on(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "nonsense")
    with pytest.raises(mode.Refused) as info:
        _select(simulator=True, platform=None,
                error="RuntimeError: Unable to initialize backend 'nonsense'")
    assert info.value.status == mode.EXIT_BAD_ENVIRONMENT == 2
    text = str(info.value)
    assert len(text.splitlines()) == 1
    assert "JAX could not start a backend with JAX_PLATFORMS=nonsense" in text
    assert "set JAX_PLATFORMS=cpu" in text


@pytest.mark.parametrize("case", ["run", "plot-from", "plot-from-default"])
def test_chart_over_its_own_record_is_refused(tmp_path, capsys, case):
    """The chart written over the JSON record it is drawn from (the same
    path for --json and --plot, or --plot-from a record whose default chart
    path is itself) destroyed the record; refused before anything runs."""
    record = tmp_path / ("run.png" if case == "plot-from-default"
                         else "run.json")
    record.write_text(H200_JSON.read_text())
    argv = {"run": ["--cpu-smoke", "--json", str(record), "--plot",
                    str(tmp_path / "." / "run.json")],
            "plot-from": ["--plot-from", str(record), "--plot", str(record)],
            "plot-from-default": ["--plot-from", str(record)]}[case]
    with pytest.raises(SystemExit) as info:
        run.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "would overwrite" in err and str(record.name) in err
    assert record.read_text() == H200_JSON.read_text()

"""numbax.bench.compare: before/after tables from benchmark JSON runs."""

import json

from numbax.bench import compare


def _run(chain, single, bw, snn, moving=None):
    """`moving`: the numbax_kernel row's moving-buffers times (us per op of
    moving and donated, us per call of single_moving), or None: not taken."""
    taken = moving is not None
    return {
        "results": [
            {"name": "numbax_kernel", "status": "ok",
             "chain": {"us_per_call": chain}, "single": {"us_per_call": single},
             "bandwidth": {"gb_per_s": bw},
             **{m: ({"us_per_call": moving * k} if taken else None)
                for m, k in (("moving", 1), ("donated", 1), ("single_moving", 30))}},
            {"name": "native", "status": "ok",
             "chain": {"us_per_call": 7.0}, "single": {"us_per_call": 90.0},
             "bandwidth": None},
            {"name": "pure_callback", "status": "n/a", "chain": None,
             "single": None, "bandwidth": None},
        ],
        "workloads": {
            "vmap": [{"B": 8, "n": 16, "name": "jnp", "status": "ok",
                      "us_per_call": 50.0}],
            "snn": [{"name": "(d) kernel", "us_per_step": snn}],
        },
    }


def _rows(before, after, **kw):
    rows = compare.compare(compare.samples(before), compare.samples(after), **kw)
    return {(r["row"], r["metric"]): r for r in rows}


def test_only_separated_slowdowns_beyond_tolerance_are_flagged():
    before = [_run(3.0, 90, 1600, 45.0), _run(3.1, 110, 1500, 45.2)]
    after = [_run(3.5, 100, 1400, 45.3), _run(3.6, 95, 1450, 45.1)]
    rows = _rows(before, after)
    assert rows[("numbax_kernel", "chain")]["slower"]        # 3.5-3.6 > 3.0-3.1
    assert not rows[("numbax_kernel", "single")]["slower"]   # ranges overlap
    # Bandwidth: lower is slower; after/before is reported as before/after.
    bw = rows[("numbax_kernel", "bw")]
    assert bw["slower"] and bw["slowdown"] > 1
    # Within 3%, even if separated: not flagged.
    snn = rows[("snn: (d) kernel", "us/step")]
    assert not snn["slower"]
    assert ("pure_callback", "chain") not in rows  # not measured
    assert rows[("native", "chain")]["control"]
    assert rows[("vmap 8x16: jnp", "us")]["control"]
    assert not rows[("numbax_kernel", "chain")]["control"]


def test_cli_exit_status_and_table(tmp_path, capsys):
    paths = {}
    for name, run in [("b1", _run(3.0, 90, 1600, 45)), ("b2", _run(3.1, 91, 1600, 45)),
                      ("a1", _run(3.0, 90, 1600, 45)), ("a2", _run(3.05, 92, 1590, 45))]:
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(run))
    status = compare.main([str(paths["b1"]), str(paths["b2"]), "--",
                           str(paths["a1"]), str(paths["a2"])])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "| numbax_kernel | chain |" in out
    assert "slower beyond the spread of runs (>3%): none" in out
    slow = [tmp_path / "slow1.json", tmp_path / "slow2.json"]
    slow[0].write_text(json.dumps(_run(4.0, 90, 1600, 45)))
    slow[1].write_text(json.dumps(_run(4.2, 90, 1600, 45)))
    assert compare.main([str(paths["b1"]), str(paths["b2"]), "--",
                         *map(str, slow)]) == 1
    assert compare.main([str(paths["b1"])]) == 2  # no "--"


def test_one_run_a_side_flags_nothing():
    rows = _rows([_run(3.0, 90, 1600, 45)], [_run(9.0, 90, 1600, 45)])
    assert not rows[("numbax_kernel", "chain")]["slower"]


def test_a_row_measured_on_one_side_fails(tmp_path, capsys):
    ok = _run(3.0, 90, 1600, 45)
    broken = _run(3.0, 90, 1600, 45)
    broken["results"][0]["status"] = "FAILED"
    paths = []
    for i, run in enumerate([ok, ok, broken, broken]):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(run))
    status = compare.main([str(paths[0]), str(paths[1]), "--",
                           str(paths[2]), str(paths[3])])
    out = capsys.readouterr().out
    assert status == 1
    assert "measured before only: numbax_kernel chain" in out


def test_unreadable_runs_are_refused(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_run(3.0, 90, 1600, 45)))
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert compare.main([str(good), "--", str(bad)]) == 2
    assert "is not a `numbax bench --json` run" in capsys.readouterr().err
    assert compare.main([str(good), "--", str(tmp_path / "missing.json")]) == 2


def test_moving_measurements_are_compared():
    before = [_run(3.0, 90, 1600, 45, moving=3.0), _run(3.1, 91, 1600, 45, moving=3.1)]
    after = [_run(3.0, 90, 1600, 45, moving=4.0), _run(3.1, 91, 1600, 45, moving=4.2)]
    rows = _rows(before, after)
    for metric in ("moving", "donated", "single_moving"):
        assert rows[("numbax_kernel", metric)]["slower"], metric
    assert rows[("numbax_kernel", "single_moving")]["before"] == 30 * 3.05
    assert not rows[("numbax_kernel", "chain")]["slower"]


def test_moving_measurements_one_side_did_not_take_are_not_a_failure(tmp_path, capsys):
    paths = []
    for i, run in enumerate([_run(3.0, 90, 1600, 45), _run(3.0, 90, 1600, 45),
                             _run(3.0, 90, 1600, 45, moving=3.0),
                             _run(3.0, 90, 1600, 45, moving=3.0)]):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(run))
    # Before: a suite from before them (or --no-moving); after: taken.
    status = compare.main([str(paths[0]), str(paths[1]), "--",
                           str(paths[2]), str(paths[3])])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "not compared: donated, moving, single_moving (not measured on one " \
        "side" in out
    assert "measured after only" not in out
    # Taken on both sides but missing for one row on one side: a failure.
    def two_rows(broken):
        run = _run(3.0, 90, 1600, 45, moving=3.0)
        run["results"].append(dict(run["results"][0], name="numbax_capture"))
        if broken:
            run["results"][0]["donated"] = None
        return json.dumps(run)
    for i, path in enumerate(paths):
        path.write_text(two_rows(broken=i < 2))
    assert compare.main([str(paths[0]), str(paths[1]), "--",
                         str(paths[2]), str(paths[3])]) == 1
    assert "measured after only: numbax_kernel donated" in capsys.readouterr().out

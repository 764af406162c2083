"""Rendered run files without a browser: exports (CSV, JUnit, Markdown), baselines, harness cost, re-rendering."""

from __future__ import annotations

import csv
import xml.etree.ElementTree as ET

import pytest
from typer.testing import CliRunner

import synthetic
from attnbench.cli.app import app
from attnbench.report import render_all
from attnbench.report.common import fmt, repro
from attnbench.report.measure import harness_cost, measurement
from attnbench.report.ranking import speedups
from attnbench.store.results import read_results


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    d = synthetic.write_run(tmp_path_factory.mktemp("run"), synthetic.mixed_rows())
    render_all(d)
    return d


def test_every_export_is_written(run_dir):
    for name in ("report.html", "results.csv", "junit.xml", "summary.md"):
        assert (run_dir / name).stat().st_size > 100, name


def test_csv_has_timing_roofline_and_cost_columns(run_dir):
    rows = list(csv.DictReader(open(run_dir / "results.csv")))
    assert len(rows) == len(read_results(run_dir / "results.jsonl"))
    graph = next(r for r in rows if r["mode"] == "cuda-graph")
    assert float(graph["ci95_lo_us"]) <= float(graph["median_us"]) <= float(graph["ci95_hi_us"])
    timed = [r for r in rows if r["median_us"]]
    assert all(float(r["roofline_pct"]) > 0 and r["limiter"] == "memory" for r in timed)
    assert {r["status"] for r in rows} == {"pass", "fail", "skip", "error"}


def test_junit_one_testcase_per_row_with_reasons(run_dir):
    root = ET.parse(run_dir / "junit.xml").getroot()
    suite = root.find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == int(suite.get("tests")) == len(read_results(run_dir / "results.jsonl"))
    assert (suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("1", "1", "1")
    assert suite.find("properties/property[@name='complete']").get("value") == "true"
    failed = [c for c in cases if c.find("failure") is not None]
    assert failed[0].get("classname") == "decode.broken" and "max abs error" in failed[0].find("failure").get("message")
    assert cases[0].find("properties/property[@name='median_us']") is not None


def test_summary_md(run_dir):
    md = (run_dir / "summary.md").read_text()
    assert "| backend | pass | fail | xfail | xpass | skip | error |" in md
    assert "| torch | 10 | 0 | 0 | 0 | 0 | 1 |" in md
    assert md.index("FAILED: 2 failing rows (1 fail, 1 error)") < md.index("### What broke") < md.index("### Fastest")
    assert "`attnbench sweep --case decode/b4-l2048-h32x8-d128-bf16 --backend broken --device cuda" in md
    assert "### Speed over torch" in md and "| decode | flashinfer |" in md
    assert "Timing: 31 rows" in md and "CI target missed on 1" in md and "throttled samples on 1" in md
    assert "Wall 300.0 s" in md and "### Failing rows" in md and "RuntimeError: boom" in md


def test_speedups_against_a_chosen_baseline():
    rows = synthetic.mixed_rows()
    by_torch = {(s["op"], s["backend"]): s for s in speedups(rows, "torch")}
    assert by_torch["decode", "triton"]["speedup"] == pytest.approx(3.0, rel=0.02)
    assert by_torch["decode", "flashinfer"]["speedup"] == pytest.approx(3.75, rel=0.02)
    assert ("decode", "broken") not in by_torch  # a failing row is never a speedup
    by_fi = {(s["op"], s["backend"]): s for s in speedups(rows, "flashinfer")}
    assert by_fi["decode", "triton"]["speedup"] == pytest.approx(0.8, rel=0.02)
    assert by_fi["decode", "triton"]["wins"] == 0


def test_report_baseline_option(tmp_path):
    run_dir = synthetic.write_run(tmp_path / "run", synthetic.mixed_rows())
    res = CliRunner().invoke(app, ["report", str(run_dir), "--baseline", "flashinfer"])
    assert res.exit_code == 0, res.output
    html = (run_dir / "report.html").read_text()
    assert "Speedup over flashinfer" in html
    assert "### Speed over flashinfer" in (run_dir / "summary.md").read_text()
    bad = CliRunner().invoke(app, ["report", str(run_dir), "--baseline", "nope"])
    assert bad.exit_code == 2 and "not a backend of this run" in bad.output


def test_report_shows_prepare_breakdown(run_dir):
    assert "plan_s 1.00e-03" in (run_dir / "report.html").read_text()


def test_report_is_self_contained(run_dir):
    html = (run_dir / "report.html").read_text()
    assert "<script src" not in html and "<link" not in html and "url(http" not in html
    assert html.count('src="data:image/svg+xml,') >= 3 and 'src="data:image/png' not in html


def test_harness_cost_adds_up():
    rows = synthetic.mixed_rows()
    cost = harness_cost(rows, {"wall_s": 300.0, "complete": True})
    parts = {p["what"].split(" (")[0]: p["s"] for p in cost["parts"]}
    assert parts["float64 references"] == pytest.approx(0.5 * len({r.case_id for r in rows}))
    assert sum(parts.values()) == pytest.approx(300.0)
    assert cost["kernel_s"] > 0


def test_measurement_summary_counts_modes_and_throttling():
    m = measurement(synthetic.mixed_rows())
    assert dict(m["modes"]) == {"cuda-events / per-call": 30, "cuda-events / cuda-graph": 1}
    assert m["throttled_rows"] == 1 and m["unconverged"] == 1 and m["nvml"]
    assert m["sm"] == (1980, 1980, 1980) and m["temp"][2] == 58


def test_repro_command_reruns_the_row():
    r = synthetic.row("decode/b1-l1024-h32x8-d128-bf16", "triton")
    cmd = repro(r, {"device": "cuda:1", "argv": ["attnbench", "sweep", "--plugin", "my kernels.py"]})
    assert cmd == "attnbench sweep --case decode/b1-l1024-h32x8-d128-bf16 --backend triton --device cuda:1 " + (
        "--plugin 'my kernels.py'"
    )


def test_number_format():
    assert fmt(1980.0) == "1980" and fmt(12.345) == "12.3" and fmt(0.001234) == "1.23e-03" and fmt(None) == ""


def test_rerender_a_sweep_run(tmp_path):
    """A real (CPU, correctness-only) sweep, then `attnbench report` re-renders it."""
    out = tmp_path / "run"
    res = CliRunner().invoke(
        app, ["sweep", "smoke", "--op", "merge_state", "-b", "torch", "--out", str(out), "--no-timing"]
    )
    assert res.exit_code == 0, res.output
    (out / "report.html").unlink()
    assert CliRunner().invoke(app, ["report", str(out)]).exit_code == 0
    html = (out / "report.html").read_text()
    assert "merge_state" in html and "No peaks" in html
    import json

    run = json.loads((out / "run.json").read_text())
    assert run["complete"] and run["wall_s"] > 0 and run["finished"]
    assert all(r.check_s is not None and r.check_s >= 0 for r in read_results(out / "results.jsonl"))


def test_capability_matrix_is_compact():
    from attnbench.report import capmatrix

    rows = synthetic.mixed_rows()
    rows += [synthetic.row(r.case_id, "cute", status="skip", reason="cute needs nvidia-cutlass-dsl") for r in rows[:6]]
    rows += [synthetic.row(r.case_id, "fa4", status="skip", reason="cute needs nvidia-cutlass-dsl") for r in rows[:3]]
    m = capmatrix.build(rows)
    assert m.unavailable == [(["cute", "fa4"], "cute needs nvidia-cutlass-dsl")]  # one line, not a column each
    assert "cute" not in m.backends and "fa4" not in m.backends
    decode = dict((label, cells) for label, _, cells in m.rows)["decode"]
    by = dict(zip(m.backends, decode, strict=True))
    assert by["triton"].symbol == "●" and by["broken"].css == "bad"
    assert (
        by["flashinfer"].symbol == "◐" and m.notes[by["flashinfer"].notes[0] - 1] == "flashinfer has no sliding window"
    )
    assert len(m.notes) == len(set(m.notes))  # each reason once


def test_heatmaps_only_with_information():
    from attnbench.report import plots

    assert plots.error_heatmap([[0.5]], "t", "x", "y") is None  # one cell
    assert plots.error_heatmap([[0.1, 0.1], [0.1, 0.1]], "t", "x", "y") is None  # flat
    nan_map = plots.error_heatmap([[float("nan"), 0.1], [0.2, None]], "t", "x", "y")
    assert nan_map and "2 of 4 cells NaN/Inf" in nan_map.replace("%20", " ")
    assert plots.error_heatmap([[float("nan")] * 3] * 2, "t", "x", "y")  # all NaN: a map, not an empty plot


def test_svg_data_uris_are_small_and_safe_in_attributes():
    from attnbench.report import plots

    rows = synthetic.mixed_rows()
    uri, _ = plots.latency_panels(rows, "decode")
    assert uri.startswith("data:image/svg+xml,") and '"' not in uri and "&" not in uri and "#" not in uri
    assert len(uri) < 60_000


def test_a_large_run_stays_under_2_mb(tmp_path):
    """~2000 rows (200 cases x 10 backends, a tenth failing, a third skipped): report.html < 2 MB."""
    rows = []
    for i in range(200):
        b, l = (1, 4, 16, 64, 128)[i % 5], 512 * (1 + i // 5)
        cid = f"decode/b{b}-l{l}-h32x8-d128-bf16"
        for k in range(10):
            status = "skip" if (i + k) % 3 == 0 else ("fail" if (i + k) % 10 == 1 else "pass")
            rows.append(synthetic.row(cid, f"backend{k}", status=status, median_us=5.0 + b * l / 1000 * (1 + k / 5)))
    d = synthetic.write_run(tmp_path / "run", rows)
    render_all(d)
    assert (d / "report.html").stat().st_size < 2_000_000


def test_report_against_a_baseline_run_says_what_changed(tmp_path):
    rows = synthetic.mixed_rows()
    base = synthetic.write_run(tmp_path / "base", rows)
    slower = [
        synthetic.row(r.case_id, r.backend, median_us=r.timing["median_us"] * 1.2)
        if r.backend == "triton" and r.timing and r.case_id.startswith("decode/b64")
        else r
        for r in rows
    ]
    new = synthetic.write_run(tmp_path / "new", slower)
    res = CliRunner().invoke(app, ["report", str(new), "--against", str(base)])
    assert res.exit_code == 0, res.output
    md = (new / "summary.md").read_text()
    changed = md.split("### What changed", 1)[1].split("###", 1)[0]
    assert "slower: 3" in changed and "- **slower** `decode/b64-l1024-h32x8-d128-bf16` [triton]" in changed
    assert md.index("### What changed") < md.index("### What broke")
    html = (new / "report.html").read_text()
    assert "What changed" in html and 'href="#case/decode/b64-l1024-h32x8-d128-bf16"' in html
    bad = CliRunner().invoke(app, ["report", str(new), "--against", str(tmp_path / "nope")])
    assert bad.exit_code == 2 and "no results.jsonl" in bad.output

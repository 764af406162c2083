"""Speed verdicts a kernel engineer can act on (#31): ties are ties, a class's fastest is decided over all
its cases, known findings are ranked with their mark, the speedup baseline follows a stated rule."""

from __future__ import annotations

import re

import synthetic
from attnbench.plan import expectations as ex
from attnbench.report import ranking, render_all, winners
from attnbench.report.firstscreen import fastest_cells

CLASS = [f"decode/b{b}-l{l}-h32x8-d128-bf16" for b in (2, 4, 8) for l in (1024, 4096)]  # one class: gqa · b≤16


def coin_flip_rows():
    """triton-det beats its twin triton by 0.2% and fa4 by 1% on four cases (coin flips under the gate's
    threshold); fa4 beats both by 20% on the other two: fa4 is the class's fastest."""
    rows = []
    for i, cid in enumerate(CLASS):
        det = 100.0 + 10 * i
        fa4 = det * 1.01 if i < 4 else det / 1.2
        rows.append(synthetic.timed(cid, "triton-det", det))
        rows.append(synthetic.timed(cid, "triton", det * 1.002))
        rows.append(synthetic.timed(cid, "fa4", fa4))
    return rows


def test_tied_rows_by_ci_overlap_or_threshold():
    a = synthetic.row(CLASS[0], "a", median_us=100.0)
    assert ranking.tied(a, synthetic.row(CLASS[0], "b", median_us=100.5))  # 0.5%: under the 3% threshold
    assert ranking.tied(a, synthetic.row(CLASS[0], "b", median_us=102.0))
    assert not ranking.tied(a, synthetic.row(CLASS[0], "b", median_us=110.0))
    noisy = synthetic.row(CLASS[0], "b", median_us=110.0, timing=synthetic.timing(110.0, rel_noise=0.2))
    assert ranking.tied(a, noisy)  # CV 20%: 10% is noise (the gate would say "noisy")


def test_class_fastest_is_decided_over_all_cases_not_by_counting_coin_flips():
    rows = coin_flip_rows()
    (summary,) = ranking.class_summary(rows)
    assert summary["leaders"] == ["fa4"] and summary["best"] == "fa4"
    assert summary["score"] < 1.01 and summary["covered"] == 6
    cells = fastest_cells(summary)
    assert cells["margin"].endswith("over triton-det") and cells["margin"].startswith("1.06×")
    # per case, the coin flips are ties: triton-det "wins" but triton and fa4 are tied with it
    w = ranking.case_winners(rows)[CLASS[0]]
    assert w.best == "triton-det" and set(w.tied) == {"triton", "fa4"} and w.runner_up is None


def test_tied_leaders_are_shown_as_tied():
    rows = [
        synthetic.timed(c, b, 100.0 * (1.002 if b == "triton" else 1.0))
        for c in CLASS
        for b in ("triton", "triton-det")
    ]
    rows += [synthetic.timed(c, "torch", 300.0) for c in CLASS]
    (summary,) = ranking.class_summary(rows)
    assert summary["best"] == "triton-det ≈ triton" and summary["runner_up"] == "torch"
    assert fastest_cells(summary)["margin"].startswith("3.0")
    view = winners.view(rows)
    col = view["backends"].index("triton")
    assert all(c["cells"][col]["text"].startswith("≈") for c in view["cases"])


def test_an_lse_only_known_finding_is_ranked_with_its_mark():
    rows = [synthetic.row(c, "triton", median_us=100.0) for c in CLASS]
    rows += [synthetic.lse_finding(c, 50.0) for c in CLASS]
    assert ranking.known_finding(rows[-1]) == "o ✓, lse known finding"
    (summary,) = ranking.class_summary(rows)
    assert summary["best"] == "flashinfer-fa2 (o ✓, lse known finding)" and summary["failed"] == ""
    sp = ranking.speedups(rows, "triton")
    assert [s["backend"] for s in sp] == ["flashinfer-fa2 (o ✓, lse known finding)"]


def test_undeclared_failures_stay_unranked():
    for bad in (
        synthetic.lse_finding(CLASS[0], 50.0, outputs=None),  # the expectation declares no outputs
        synthetic.lse_finding(CLASS[0], 50.0, failed=("lse", "stale output: the second call returned the first's")),
    ):
        assert ranking.known_finding(bad) is None
        rows = [synthetic.row(CLASS[0], "triton", median_us=100.0), bad]
        (summary,) = ranking.class_summary(rows)
        assert summary["best"] == "triton" and "flashinfer-fa2" in summary["failed"]


def test_expectation_records_its_declared_outputs(tmp_path):
    p = tmp_path / "expect.yaml"
    p.write_text(
        "expect:\n  - backend: flashinfer-fa2\n    cases: ['decode/*']\n    outputs: [lse]\n    why: fa2 lse\n"
    )
    row = synthetic.lse_finding(CLASS[0], 50.0)
    row.status, row.expected = "fail", None
    out = ex.apply_one(row, ex.load(p))
    assert out.status == "xfail" and out.expected["outputs"] == "lse"
    assert ranking.known_finding(out) == "o ✓, lse known finding"


def test_speedup_baseline_rule(tmp_path):
    rows = coin_flip_rows()
    assert ranking.speed_baseline(rows) == "fa4"  # no torch: the most passing GPU-timed rows, then the name
    rows += [synthetic.row(c, "torch", median_us=500.0) for c in CLASS[:2]]
    assert ranking.speed_baseline(rows) == "torch"
    planted = [synthetic.row(c, "a-planted-wrong", status="fail", median_us=1.0) for c in CLASS]
    assert ranking.speed_baseline(planted + [synthetic.row(CLASS[0], "zz", median_us=9.0)]) == "zz"
    assert ranking.speed_baseline(planted) == ""
    d = synthetic.write_run(tmp_path / "run", planted + coin_flip_rows())
    render_all(d)
    html = (d / "report.html").read_text()
    assert "Speedup over fa4" in html and ranking.BASELINE_RULE in html
    assert "by the rule: " + ranking.BASELINE_RULE in (d / "summary.md").read_text()


# ---- plots that show every point ---------------------------------------------------------------------
def _panel(lines):
    import matplotlib.pyplot as plt

    from attnbench.report import plots

    fig, ax = plt.subplots(figsize=(3.1, 2.3))
    plots._latency_panel(ax, lines, sorted(lines))
    texts = [t.get_text() for t in ax.texts]
    ylim = ax.get_ylim()
    labels = [t.get_text() for t in ax.get_yticklabels()]
    plt.close(fig)
    return ylim, texts, labels


def test_each_latency_panel_shows_its_outliers():
    small = {"a": [(1024, 10.0), (4096, 20.0)], "b": [(1024, 10.5), (4096, 21.0)]}
    (lo, hi), _, labels = _panel(small)
    assert hi < 1.3 and labels[0] == "1×"  # a panel of close backends keeps its own, narrow range
    six = {"a": [(1024, 10.0), (4096, 20.0)], "fa4": [(1024, 59.0), (4096, 40.0)]}
    (lo, hi), texts, labels = _panel(six)
    assert hi > 5.9 and {"1×", "2×", "4×"} <= set(labels)  # 5.9× fully inside, readable ticks
    far = {"a": [(1024, 10.0), (4096, 20.0)], "slow": [(1024, 250.0), (4096, 40.0)]}
    (lo, hi), texts, _ = _panel(far)
    assert "25×" in texts  # above the cap: on the edge, with its value


def test_ticks_and_label_spreading():
    from attnbench.report import plots

    assert plots.ratio_ticks(1.1) == [1, 1.05, 1.1]
    assert plots.ratio_ticks(7.0)[:1] == [1] and {2, 4, 6} <= set(plots.ratio_ticks(7.0))
    assert len(plots.ratio_ticks(8.0)) <= 6
    out = plots.spread([0.5, 0.51, 0.2], 0.05)
    assert out[2] == 0.2 and out[1] - out[0] >= 0.05 - 1e-12


def test_heatmap_is_on_a_fixed_scale_of_error_over_bound():
    from urllib.parse import unquote

    from attnbench.report import plots

    uri = plots.error_heatmap([[0.1003, 0.1006], [0.1004, 0.1005]], "t", "x", "y", bound=0.05)
    svg = unquote(uri)
    assert "bound 0.05" in svg and "max abs error / bound" in svg


# ---- what changed, with sizes --------------------------------------------------------------------------
def _changed_runs(tmp_path):
    """base and new: triton 20% slower on the b64 cases, flashinfer 9x slower on one, and three
    cases only the base run planned."""
    rows = synthetic.mixed_rows()
    extra = [synthetic.row(f"decode/b2-l{l}-h32x8-d128-bf16", "torch", median_us=50.0) for l in (64, 128, 256)]
    base = synthetic.write_run(tmp_path / "base", rows + extra)
    new_rows = []
    for r in rows:
        if r.backend == "triton" and r.timing and r.case_id.startswith("decode/b64"):
            r = synthetic.row(r.case_id, r.backend, median_us=r.timing["median_us"] * 1.2)
        elif r.backend == "flashinfer" and r.case_id == "decode/b16-l8192-h32x8-d128-bf16":
            r = synthetic.row(r.case_id, r.backend, median_us=r.timing["median_us"] * 9.0)
        new_rows.append(r)
    new = synthetic.write_run(tmp_path / "new", new_rows)
    return base, new


def test_what_changed_has_sizes_order_and_the_same_spread(tmp_path):
    from typer.testing import CliRunner

    from attnbench.cli.app import app

    base, new = _changed_runs(tmp_path)
    res = CliRunner().invoke(app, ["report", str(new), "--against", str(base)])
    assert res.exit_code == 0, res.output
    md = (new / "summary.md").read_text()
    changed = md.split("### What changed", 1)[1].split("###", 1)[0]
    lines = [x for x in changed.splitlines() if x.startswith("- **")]
    assert lines[0].startswith("- **slower** `decode/b16-l8192-h32x8-d128-bf16` [flashinfer]")  # worst first
    assert re.search(r"\d → \d+ µs \(\+(79\d|80\d)\.\d%\)", lines[0]), lines[0]
    assert "same " in changed and "median change" in changed and "worst" in changed
    assert "plans differ: 3 rows of cases the new run did not plan" in changed
    assert not any("missing" in x for x in lines)  # plan differences are kept apart from regressions
    html = (new / "report.html").read_text()
    assert 'class="size"' in html and "plans differ" in html


def test_compare_outputs_sizes_plan_apart_and_no_none(tmp_path):
    from typer.testing import CliRunner

    from attnbench.cli.app import app

    base, new = _changed_runs(tmp_path)
    env = dict(synthetic.ENV, libraries={"torch": "2.11.0"})
    (new / "env.json").write_text(__import__("json").dumps(env))
    res = CliRunner().invoke(app, ["compare", str(base), str(new)])
    assert res.exit_code == 1
    out = " ".join(res.output.split())
    assert "slower decode/b16-l8192-h32x8-d128-bf16 [flashinfer]" in out
    assert re.search(r"\[flashinfer\] [\d.]+ → \d+ µs \(\+(79\d|80\d)\.\d%\)", out), out
    assert "plans differ: 3 rows" in out and "same " in out
    assert "-> None" not in out and "triton 3.6.0 -> not installed" in out
    md = (new / "compare" / "compare.md").read_text()
    assert md.startswith("## attnbench compare: REGRESSION: 4 rows (+ 3 rows absent because the plans differ)")
    assert "### Absent because the plans differ (3)" in md and "→" in md
    html = (new / "compare" / "compare.html").read_text()
    assert 'id="plan-rows"' in html and "None" not in html.split("<script>")[0]


# ---- nothing cut that matters; the terminal ends with the verdict -----------------------------------------
LONG = (
    "expected to fail (fa2 LSE summed from bf16 probabilities) but passed: remove the expectation at "
    "suites/expectations/findings.yaml:187 " + "x" * 300
)


def test_repro_carries_the_interpreter_and_causes_are_whole(tmp_path):
    from attnbench.report.common import repro
    from attnbench.report.firstscreen import broken

    r = synthetic.row(
        CLASS[0], "triton", status="fail", median_us=5.0, reason="o: bound 0.000608 of its (twin) " + LONG
    )
    r.env = {"device": "cpu", "triton_interpret": True}
    assert repro(r, {}).startswith("TRITON_INTERPRET=1 attnbench sweep --case")
    assert not repro(synthetic.row(CLASS[0], "triton"), {}).startswith("TRITON_INTERPRET")
    (g,) = broken([r], {})
    assert "findings.yaml:187" in g.summary and g.repro.startswith("TRITON_INTERPRET=1 ")
    d = synthetic.write_run(tmp_path / "run", [r, synthetic.row(CLASS[1], "torch")])
    render_all(d)
    assert "findings.yaml:187" in (d / "summary.md").read_text().split("### What broke", 1)[1].split("###")[0]
    assert '"ti":1' in (d / "report.html").read_text()


def test_gate_md_keeps_whole_reasons_and_the_terminal_ends_with_the_verdict(tmp_path):
    from typer.testing import CliRunner

    from attnbench.cli.app import app

    rows = [synthetic.row(c, "planted", status="fail", median_us=5.0, reason=LONG) for c in CLASS]
    rows += [synthetic.timed(c, "triton", 100.0) for c in CLASS] + [
        synthetic.timed(c, "triton-det", 100.2) for c in CLASS
    ]
    d = synthetic.write_run(tmp_path / "run", rows)
    res = CliRunner().invoke(app, ["gate", str(d)])
    assert res.exit_code == 1
    assert "findings.yaml:187 " + "x" * 300 in (d / "gate" / "gate.md").read_text()
    out = " ".join(res.output.split())
    assert "what broke" in out and "6 × planted fail" in out and out.count("× planted fail") == 1  # collapsed
    assert "attnbench sweep --case" in out and "fastest" in out and "≈" in out


def test_a_long_cause_keeps_its_start_and_its_end():
    """A replay failure names the batch change before the problem; a 2 KB slot list cut at its end left
    the first screen without the problem (h100-session14's default sweep): the middle goes instead."""
    from attnbench.report.firstscreen import CAUSE_CHARS, broken

    reason = (
        "replay: captured on one batch (slots " + ", ".join(map(str, range(400))) + "): state_pool: abs error 8.9e-07"
    )
    (g,) = broken([synthetic.row(CLASS[0], "triton", status="fail", median_us=5.0, reason=reason)], {})
    assert len(g.summary) == CAUSE_CHARS and " … " in g.summary
    assert g.summary.startswith("replay: captured on one batch") and g.summary.endswith("abs error 8.9e-07")

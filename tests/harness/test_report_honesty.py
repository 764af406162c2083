"""Summaries that do not mislead (#17): only passing GPU-timed rows are ranked, non-GPU timings are
labelled and never compared, an incomplete run says so everywhere, xfail/xpass are rendered, and the
console, junit.xml and summary.md agree on the counts."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import synthetic
from attnbench.cli import app as cli
from attnbench.report import render_all, rowdata, winners
from attnbench.report.ranking import HOST, INTERPRETER, class_summary, speedups, timing_kind
from attnbench.store.counts import STATUSES, count

CASES = [f"decode/b{b}-l{l}-h32x8-d128-bf16" for b in (1, 64) for l in (1024, 4096, 8192)]


def _gpu_rows():
    """triton and torch pass; 'wrong' returns garbage 30x faster; 'nan' returns NaN 70x faster."""
    rows = []
    for i, cid in enumerate(CASES):
        rows.append(synthetic.row(cid, "torch", median_us=300.0 + i))
        rows.append(synthetic.row(cid, "triton", median_us=100.0 + i))
        rows.append(synthetic.row(cid, "wrong", status="fail", median_us=10.0))
        nan = synthetic.row(
            cid, "nan", status="fail", median_us=4.0, reason="o: 4096 NaN/Inf where the reference is finite"
        )
        rows.append(nan)
    return rows


def _md_section(md: str, title: str) -> str:
    return md.split(title, 1)[1].split("\n### ", 1)[0]


def test_failing_backends_are_never_ranked(tmp_path):
    rows = _gpu_rows()
    best = {c["cls"]: c["best"] for c in class_summary(rows)}
    assert set(best.values()) == {"triton"}
    assert {s["backend"] for s in speedups(rows, "torch")} == {"triton"}
    view = winners.view(rows)
    col = {b: i for i, b in enumerate(view["backends"])}
    for case in view["cases"]:
        assert case["best"] == "triton"
        for b in ("wrong", "nan"):
            cell = case["cells"][col[b]]
            assert cell["css"] == "w-bad" and "style" not in cell  # marked, never coloured as fast
    payload = rowdata.payload(rows, {})
    names = payload["backends"]
    assert all("x" not in r for r in payload["rows"] if names[r["b"]] in ("wrong", "nan"))
    d = synthetic.write_run(tmp_path / "run", rows)
    render_all(d)
    md = (d / "summary.md").read_text()
    fastest = _md_section(md, "### Fastest passing backend per shape class")
    table = [line.split(" | ") for line in fastest.splitlines() if line.startswith("| decode")]
    assert len(table) == 2 and all(cells[1] == "**triton**" for cells in table)
    assert all("wrong" not in " ".join(cells[:-1]) and "nan" not in " ".join(cells[:-1]) for cells in table)
    assert all(cells[-1] == "❌ nan ×3, wrong ×3 |" for cells in table)  # shown beside the winner, never ranked
    speed = _md_section(md, "### Speed over torch")
    assert "| decode | triton |" in speed and "wrong" not in speed and "nan" not in speed
    broke = _md_section(md, "### What broke")
    assert re.search(r"\| 6 \| wrong \| fail \|", broke) and re.search(r"\| 6 \| nan \| fail \|", broke)


def _host(row, clock="host", **env):
    row.timing["clock"] = clock
    row.env = {"device": "cpu", **env}
    return row


def test_non_gpu_timings_are_labelled_and_never_compared(tmp_path):
    rows = [_host(synthetic.row(c, "torch", median_us=900.0)) for c in CASES]
    rows += [_host(synthetic.row(c, "triton", median_us=90.0), triton_interpret=True) for c in CASES]
    assert timing_kind(rows[0]) == HOST and timing_kind(rows[-1]) == INTERPRETER
    assert class_summary(rows) == [] and speedups(rows, "torch") == []
    assert all(c["css"] == "w-host" for case in winners.view(rows)["cases"] for c in case["cells"])
    d = synthetic.write_run(tmp_path / "run", rows, env={"device": "cpu", "cpu": "x86_64"})
    render_all(d)
    md = (d / "summary.md").read_text()
    assert "No case has a passing GPU-timed row: nothing is ranked." in md
    assert f"6 rows were timed with a **{HOST}**: not GPU timings" in md
    assert f"6 rows were timed with a **{INTERPRETER}**" in md
    assert "### Speed over" not in md
    html = (d / "report.html").read_text()
    assert f"timed with a <b>{HOST}</b>: not GPU timings" in html
    data = json.loads(re.search(r'<script id="rows-data" type="application/json">(.*?)</script>', html, re.S)[1])
    assert {r["k"] for r in data["rows"]} == {"host", "interp"} and all("x" not in r for r in data["rows"])


def test_gpu_and_interpreter_timings_are_not_compared(tmp_path):
    rows = [synthetic.row(c, "torch", median_us=900.0) for c in CASES]
    rows += [
        _host(synthetic.row(c, "triton", median_us=1.0), clock="cuda-events", triton_interpret=True) for c in CASES
    ]
    assert speedups(rows, "torch") == []
    assert {c["best"] for c in class_summary(rows)} == {"torch"}


def test_an_incomplete_run_says_so_everywhere(tmp_path):
    run = {"argv": ["attnbench", "sweep"], "device": "cuda", "complete": False, "stopped_by": "SIGTERM"}
    d = synthetic.write_run(tmp_path / "run", synthetic.mixed_rows()[:5], run=run)
    render_all(d)
    md = (d / "summary.md").read_text()
    assert "INCOMPLETE RUN" in md.splitlines()[2] and "**Incomplete run** (SIGTERM)" in md
    suite = ET.parse(d / "junit.xml").getroot().find("testsuite")
    assert suite.find("properties/property[@name='complete']").get("value") == "false"
    assert "INCOMPLETE RUN (SIGTERM)" in suite.find("system-err").text
    html = (d / "report.html").read_text()
    assert "Incomplete run</b> (SIGTERM)" in html and "INCOMPLETE RUN" in html


def _six_status_rows():
    rows = synthetic.mixed_rows()
    rows.append(synthetic.row(CASES[0], "fla", status="fail", reason="known: state layout", median_us=50.0))
    rows[-1].status = "xfail"
    rows.append(synthetic.row(CASES[1], "fla", median_us=50.0, reason="expected to fail (expectations/x.yaml:3)"))
    rows[-1].status = "xpass"
    return rows


def test_xfail_and_xpass(tmp_path):
    rows = _six_status_rows()
    c = count(rows)
    assert [c.total[s] for s in STATUSES] == [30, 1, 1, 1, 1, 1]
    assert c.failing == 3 and c.verdict().startswith("FAILED: 3 failing rows (1 fail, 1 xpass, 1 error)")
    d = synthetic.write_run(tmp_path / "run", rows)
    render_all(d)
    md = (d / "summary.md").read_text()
    assert "### Known failures (xfail: not counted as failures)" in md and "known: state layout" in md
    assert re.search(r"\| 1 \| fla \| xpass \|", md)
    assert "| fla | 0 | 0 | 1 | 1 | 0 | 0 |" in md
    root = ET.parse(d / "junit.xml").getroot()
    xfail = root.find(".//testcase[@classname='decode.fla']/skipped")
    assert xfail is not None and xfail.get("message").startswith("xfail (known failure): known: state layout")
    assert any(f.get("message", "").startswith("xpass") for f in root.iter("failure"))
    html = (d / "report.html").read_text()
    for st in STATUSES:
        assert f'<span class="chip st-{st}">{c.total[st]} {st}</span>' in html
    view = winners.view(rows)
    fla = view["backends"].index("fla")
    assert [case["cells"][fla]["text"] for case in view["cases"] if case["id"] in CASES[:2]] == ["✗ xfail", "✗ xpass"]


def test_console_junit_and_summary_agree(tmp_path, capsys):
    rows = _six_status_rows()
    d = synthetic.write_run(tmp_path / "run", rows)
    render_all(d)
    c = count(rows)
    with cli.console.capture() as cap:
        cli._print_summary(rows)
    console = cap.get()
    md = (d / "summary.md").read_text()
    suite = ET.parse(d / "junit.xml").getroot().find("testsuite")
    junit = {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")}
    assert junit == c.junit() == {"tests": 35, "failures": 2, "errors": 1, "skipped": 2}
    assert c.verdict() in console and f"**❌ {c.verdict()}**" in md and c.line() in md
    for backend, counts in c.by_backend.items():
        cells = [str(counts[s]) for s in STATUSES]
        assert f"| {backend} | " + " | ".join(cells) + " |" in md
        assert re.search(rf"{re.escape(backend)}\s*│\s*" + r"\s*│\s*".join(cells), console), backend


def test_rows_record_the_triton_interpreter(monkeypatch):
    from attnbench.store import env

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert env.short(env.capture("cpu"))["triton_interpret"] is True
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "triton_interpret" not in env.short(env.capture("cpu"))


def test_markup_in_a_backend_name_or_reason_shows_as_written(tmp_path):
    """A plugin's name and an exception message are text: escaped in report.html (its embedded JSON
    cannot end the <script> element or open a comment) and in summary.md and gate.md, round-tripping."""
    from attnbench.report.gate import decide, render_md

    name, why = "x<b>bold</b>", "RuntimeError: <!--<script>alert(1)</script> & <img src=x onerror=alert(2)> | cell"
    rows = [synthetic.row(CASES[0], "torch"), synthetic.row(CASES[0], name, status="error", reason=why)]
    d = synthetic.write_run(tmp_path / "run", rows)
    render_all(d)
    html = (d / "report.html").read_text()
    for raw in ("<b>bold</b>", "<script>alert", "<img src=x", "<!--<script>"):
        assert raw not in html, raw
    data = re.search(r'<script id="rows-data" type="application/json">(.*?)</script>', html, re.S).group(1)
    payload = json.loads(data)
    assert name in payload["backends"] and any(why in r for r in payload["reasons"])
    md = (d / "summary.md").read_text() + render_md(decide(d))
    prose = re.sub(r"`[^`]*`", "", md)  # code spans (repro commands) show their text as written
    assert "<b>" not in prose and "<img" not in prose and "<script" not in prose
    assert "x&lt;b&gt;bold&lt;/b&gt;" in md and "&lt;img src=x onerror=alert(2)&gt; \\| cell" in md

"""The command line end to end: sweep -> run directory, exit codes, errors without tracebacks."""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.plan.suite import load
from attnbench.store.results import read_results

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "smoke"
    res = invoke("sweep", "--out", str(out), "--device", "cpu", "--backend", "torch")
    return res, out


def test_default_sweep_runs_smoke_on_cpu_and_writes_the_run_directory(smoke_run):
    res, out = smoke_run
    assert res.exit_code == 0, res.output
    rows = read_results(out / "results.jsonl")
    assert len(rows) == len(load("smoke").cases)
    assert {r.status for r in rows if r.op != "gdn_chain"} == {"pass"}
    assert all(r.status == "skip" for r in rows if r.op == "gdn_chain")  # the `chain` backend runs those
    for name in ("report.html", "results.csv", "junit.xml", "summary.md", "env.json", "run.json"):
        assert (out / name).is_file(), name
    html = (out / "report.html").read_text()
    for section in ('id="verdict"', 'id="capability"', 'id="op-decode"', 'id="op-extend"', 'id="op-merge_state"'):
        assert section in html
    assert not re.search(r"(src|href)=[\"']?https?:|url\(https?:|@import", html)  # self-contained: nothing loaded
    r = rows[0]
    assert r.timing is None and "correctness only on cpu (no GPU)" in res.output  # host-clock timing on request
    assert r.derived["flops"] > 0 and r.derived["bytes"] > 0
    assert r.prepare_s is not None and r.reference_s is not None


def test_report_rerenders_from_results_alone(smoke_run, tmp_path):
    _, out = smoke_run
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "results.jsonl").write_text((out / "results.jsonl").read_text())
    res = invoke("report", str(copy))
    assert res.exit_code == 0, res.output
    assert "decode/" in (copy / "report.html").read_text()
    assert (copy / "junit.xml").read_text().count("<testcase") == len(read_results(copy / "results.jsonl"))


def test_filters_case_ids_and_dry_run(tmp_path):
    n = sum(c.op_name == "merge_state" for c in load("smoke").cases)
    res = invoke("sweep", "smoke", "--op", "merge_state", "--dry-run", "--device", "cpu")
    assert res.exit_code == 0 and f"smoke/merge_state: {n}" in res.output
    res = invoke("sweep", "smoke", "-k", "mla", "--dry-run", "--device", "cpu")
    n = sum("mla" in c.id and c.op_name == "decode" for c in load("smoke").cases)
    assert f"smoke/decode: {n}" in res.output
    out = tmp_path / "one"
    res = invoke("sweep", "--case", "decode/b2-l33-h4x2-d64-p16-swa5-bf16", "--backend", "torch", "--out", str(out),
                 "--device", "cpu", "--no-timing")  # fmt: skip
    assert res.exit_code == 0, res.output
    (row,) = read_results(out / "results.jsonl")
    assert row.case_id == "decode/b2-l33-h4x2-d64-p16-swa5-bf16" and row.status == "pass" and row.timing is None


def test_bad_suite_exits_2_with_file_line_and_writes_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("cases:\n  - op: decode\n    params: {heads_q: 12, heads_kv: 8}\n")
    out = tmp_path / "out"
    res = invoke("sweep", str(bad), "--out", str(out), "--device", "cpu")
    assert res.exit_code == 2
    assert f"{bad}:3:" in res.output and "multiple of heads_kv" in res.output
    assert "Traceback" not in res.output
    assert not out.exists()


@pytest.mark.parametrize(
    "args, words",
    [
        (("sweep", "nope"), "no such suite"),
        (("sweep", "smoke", "--backend", "nope"), "unknown backend 'nope'"),
        (("sweep", "smoke", "--device", "tpu"), "unknown device"),
        (("sweep", "--case", "decode/b2-zz9"), "cannot parse case id"),
        (("sweep", "smoke", "-k", "no-such-case"), "no cases selected"),
    ],
)
def test_usage_errors_exit_2_without_traceback(args, words, tmp_path):
    res = invoke(*args, "--out", str(tmp_path / "o"))
    assert res.exit_code == 2, res.output
    assert words in res.output and "Traceback" not in res.output


def test_a_failing_plugin_backend_makes_exit_1_and_a_broken_named_plugin_exits_2(tmp_path):
    plugin = tmp_path / "myplugin.py"
    plugin.write_text(
        textwrap.dedent("""
        import attnbench

        @attnbench.register_backend("wrong-sign")
        class WrongSign(attnbench.Backend):
            def prepare_merge_state(self, case, x):
                def run():
                    x.o.copy_(-x.v_a)
                    x.lse.copy_(x.s_a)
                    return {"o": x.o, "lse": x.lse}
                return run
    """)
    )
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_anywhere\n")
    out = tmp_path / "out"
    args = ("sweep", "smoke", "--op", "merge_state", "--plugin", str(plugin), "--backend", "wrong-sign",
            "--backend", "torch", "--out", str(out), "--device", "cpu", "--no-timing")  # fmt: skip
    res = invoke(*args, "--plugin", str(broken))  # the user named it: an error, not a warning
    assert res.exit_code == 2, res.output
    assert res.output.count("No module named") == 1 and "broken.py" in res.output and "Traceback" not in res.output
    assert not out.exists()
    res = invoke(*args)
    assert res.exit_code == 1, res.output
    rows = read_results(out / "results.jsonl")
    assert {r.status for r in rows if r.backend == "wrong-sign"} == {"fail"}
    assert {r.status for r in rows if r.backend == "torch"} == {"pass"}


def test_list_commands():
    for what in ("suites", "ops", "models"):
        res = invoke("list", what)
        assert res.exit_code == 0, res.output
    res = invoke("list", "backends", "--device", "cpu")
    assert res.exit_code == 0 and "torch" in res.output and "capability matrix" in res.output
    res = invoke("env", "--device", "cpu")
    assert res.exit_code == 0 and json.loads(res.output)["device"] == "cpu"

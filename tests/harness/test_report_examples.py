"""A run whose rows are stored gzipped (results.jsonl.gz, as reports/examples keeps its larger runs) reads
exactly as one with results.jsonl, in every command that reads a run; every example run under
reports/examples that keeps its rows re-renders."""

from __future__ import annotations

import csv
import gzip
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import synthetic
from attnbench.cli.app import app
from attnbench.report import render_all
from attnbench.store.results import read_results, read_run_results

EXAMPLES = Path(__file__).resolve().parents[2] / "reports" / "examples"


def _gzip_rows(run: Path) -> Path:
    """Store a run's rows as results.jsonl.gz only (what reports/examples does), return the run."""
    plain = run / "results.jsonl"
    (run / "results.jsonl.gz").write_bytes(gzip.compress(plain.read_bytes()))
    plain.unlink()
    return run


def _pair(tmp_path: Path, name: str, slower: float = 1.0) -> tuple[Path, Path]:
    """The same synthetic run twice: one plain, one gzipped (triton's decode/b64 rows `slower` times slower)."""
    rows = [
        synthetic.row(r.case_id, r.backend, median_us=r.timing["median_us"] * slower)
        if r.backend == "triton" and r.timing and r.case_id.startswith("decode/b64")
        else r
        for r in synthetic.mixed_rows()
    ]
    run = {"device": "cuda", "wall_s": 300.0, "complete": True, "rows": len(rows)}
    plain = synthetic.write_run(tmp_path / "plain" / name, rows, run=run)
    gz = _gzip_rows(synthetic.write_run(tmp_path / "gz" / name, rows, run=run))
    return plain, gz


def _invoke(*args) -> tuple[int, str]:
    res = CliRunner().invoke(app, [str(a) for a in args])
    return res.exit_code, res.output


def test_every_command_reads_a_gzipped_run_as_its_jsonl(tmp_path):
    base_plain, base_gz = _pair(tmp_path, "base")
    new_plain, new_gz = _pair(tmp_path, "new", slower=1.3)
    assert read_run_results(new_gz) == read_results(new_plain / "results.jsonl")

    # report: the same exports from either
    assert _invoke("report", new_plain)[0] == 0
    code, out = _invoke("report", new_gz, "--against", base_gz)
    assert code == 0, out
    assert _invoke("report", new_plain, "--against", base_plain)[0] == 0
    for name in ("results.csv", "summary.md"):
        assert (new_gz / name).read_text() == (new_plain / name).read_text().replace(str(base_plain), str(base_gz))
    assert "slower: 3" in (new_gz / "summary.md").read_text()

    # compare and gate: the same verdicts, reading gzipped runs as baselines and as the run judged
    plain = _invoke("compare", base_plain, new_plain, "--out", tmp_path / "cmp-plain")
    gz = _invoke("compare", base_gz, new_gz, "--out", tmp_path / "cmp-gz")
    assert plain[0] == gz[0] == 1 and "slower" in gz[1]
    cmp_plain = json.loads((tmp_path / "cmp-plain" / "compare.json").read_text())
    cmp_gz = json.loads((tmp_path / "cmp-gz" / "compare.json").read_text())
    assert cmp_gz["changes"] == cmp_plain["changes"]
    plain = _invoke("gate", new_plain, "--baseline", base_plain, "--out", tmp_path / "gate-plain")
    gz = _invoke("gate", new_gz, "--baseline", base_gz, "--out", tmp_path / "gate-gz")
    assert plain[0] == gz[0] == 1
    assert (
        json.loads((tmp_path / "gate-gz" / "gate.json").read_text())["reasons"]
        == json.loads((tmp_path / "gate-plain" / "gate.json").read_text())["reasons"]
    )

    # merge reads gzipped runs too (and writes a plain one)
    code, out = _invoke("merge", base_gz, "--out", tmp_path / "merged")
    assert code == 1 and "FAILED: 2 failing rows" in out, out  # the run's own failing rows, as from the plain one
    assert read_results(tmp_path / "merged" / "results.jsonl") == read_run_results(base_gz)
    code, out = _invoke("merge", base_plain, "--out", new_gz)  # a run kept gzipped is never merged into
    assert code == 2 and "already holds results.jsonl.gz" in out


def test_a_damaged_gzip_is_one_line_naming_the_file(tmp_path):
    _, gz = _pair(tmp_path, "run")
    data = (gz / "results.jsonl.gz").read_bytes()
    (gz / "results.jsonl.gz").write_bytes(data[: len(data) // 2])
    code, out = _invoke("report", gz)
    assert code == 2 and "results.jsonl.gz: not a whole gzip file" in out and "Traceback" not in out
    code, out = _invoke("report", tmp_path / "nothing-here")
    assert code == 2 and "no results.jsonl here" in out


def test_resume_refuses_rows_kept_only_compressed(tmp_path):
    suite = tmp_path / "tiny.yaml"
    suite.write_text("cases:\n  - op: merge_state\n    sweep: {tokens: [3, 5]}\n    dtypes: [fp32]\n")
    out = tmp_path / "run"
    args = ["sweep", suite, "-b", "torch", "--device", "cpu", "--out", out, "--ref-cache", "off"]
    code, text = _invoke(*args)
    assert code == 0, text
    _gzip_rows(out)
    code, text = _invoke(*args, "--resume")
    assert code == 2 and "gunzip" in text and "results.jsonl.gz" in text, text
    assert (out / "results.jsonl.gz").exists() and not (out / "results.jsonl").exists()


def _example_runs() -> list[Path]:
    return sorted(
        d for d in EXAMPLES.glob("**/") if (d / "results.jsonl").is_file() or (d / "results.jsonl.gz").is_file()
    )


def test_reports_examples_has_runs_to_render():
    runs = _example_runs()
    assert len(runs) >= 5 and any((d / "results.jsonl.gz").is_file() for d in runs), runs


@pytest.mark.parametrize("example", _example_runs(), ids=lambda d: str(d.relative_to(EXAMPLES)))
def test_every_example_run_with_rows_renders(example, tmp_path):
    """Each one in full (all ten take about 15 s on one core): its rows, run.json and env.json as kept."""
    run = shutil.copytree(example, tmp_path / example.name)
    render_all(run)
    rows = read_run_results(run)
    html = (run / "report.html").read_text()
    assert len(html) > 10_000 and "Traceback" not in html
    with open(run / "results.csv", newline="") as f:  # a reason may hold newlines (quoted fields)
        assert sum(1 for _ in csv.reader(f)) == len(rows) + 1
    assert (run / "summary.md").read_text().startswith("#")

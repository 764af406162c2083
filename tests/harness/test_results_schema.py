"""The result schema: typed rows with a status enum, versions checked on read, nothing dropped silently."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.run.sweep import exit_code
from attnbench.store.results import SCHEMA_VERSION, Result, ResultWriter, SchemaError, Status, read_results
from attnbench.store.runinfo import read_run
from synthetic import row, write_run

EXAMPLES = Path(__file__).resolve().parents[2] / "reports" / "examples"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_status_enum_and_the_one_failure_rule():
    assert [s.value for s in Status] == ["pass", "fail", "xfail", "xpass", "skip", "error"]
    assert {s.value for s in Status if s.is_failure} == {"fail", "error", "xpass"}
    assert {s.value for s in Status if s.checks_passed} == {"pass", "xpass"}
    assert Status("pass") == "pass" and f"{Status.XFAIL}" == "xfail"
    assert exit_code([row("decode/b1-l16", "torch", "xfail")]) == 0
    assert exit_code([row("decode/b1-l16", "torch", "xpass")]) == 1
    with pytest.raises(ValueError):
        Result(case_id="c", op="decode", backend="b", status="passed")


def test_rows_written_before_versioning_read_and_round_trip_unchanged():
    path = EXAMPLES / "h200-timed-targets-2" / "results.jsonl.gz"  # gzipped: reports/ stays under 3 MB
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    rows = read_results(path)
    assert len(rows) == len(lines) and all(isinstance(r.status, Status) for r in rows)
    for line, r in zip(lines, rows, strict=True):
        written, before = json.loads(r.to_json()), json.loads(line)
        assert written.pop("schema_version") == SCHEMA_VERSION
        assert {k: written[k] for k in before} == before  # every field name and value as before
        assert set(written) - set(before) <= set(Result.model_fields)  # plus fields added since, at defaults


def test_every_row_written_carries_the_schema_version(tmp_path):
    with ResultWriter(tmp_path / "results.jsonl") as w:
        w.append(row("decode/b1-l16", "torch"))
    assert json.loads((tmp_path / "results.jsonl").read_text())["schema_version"] == SCHEMA_VERSION


def test_a_row_of_a_newer_schema_is_refused_with_one_line(tmp_path):
    run = write_run(tmp_path / "run", [row("decode/b1-l16", "torch")])
    d = json.loads((run / "results.jsonl").read_text())
    (run / "results.jsonl").write_text(json.dumps(d | {"schema_version": SCHEMA_VERSION + 1}) + "\n")
    with pytest.raises(SchemaError, match=r"results.jsonl:1: row was written by a newer attnbench"):
        read_results(run / "results.jsonl")
    res = invoke("report", str(run))
    assert res.exit_code == 2 and "newer attnbench" in res.output and "Traceback" not in res.output


def test_a_run_json_of_a_newer_schema_is_refused(tmp_path):
    run = write_run(tmp_path / "run", [row("decode/b1-l16", "torch")], run={"schema_version": 99, "device": "cuda"})
    with pytest.raises(SchemaError, match="run.json was written by a newer attnbench"):
        read_run(run)
    assert invoke("report", str(run)).exit_code == 2


def test_a_torn_last_line_is_a_warning_naming_file_and_line(tmp_path):
    path = write_run(tmp_path / "run", [row("decode/b1-l16", "torch"), row("decode/b1-l32", "torch")])
    path = path / "results.jsonl"
    text = path.read_text()
    path.write_text(text + text.splitlines()[0][:40])  # a crash mid-write of the third row
    warnings = []
    rows = read_results(path, on_warning=warnings.append)
    assert len(rows) == 2
    assert len(warnings) == 1 and f"{path}:3: torn last line" in warnings[0]
    res = invoke("report", str(path.parent))
    assert res.exit_code == 0 and f"{path}:3" in res.output.replace("\n", "")


@pytest.mark.parametrize(
    ("bad", "what"),
    [
        ("{not json", "not a JSON row"),
        ('{"case_id": "x", "op": "decode", "backend": "b", "status": "bogus"}', "status"),
    ],
)
def test_an_unreadable_line_before_the_last_is_an_error_naming_file_and_line(tmp_path, bad, what):
    path = write_run(tmp_path / "run", [row("decode/b1-l16", "torch"), row("decode/b1-l32", "torch")])
    path = path / "results.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], bad, lines[1]]) + "\n")
    with pytest.raises(SchemaError, match=f"results.jsonl:2: .*{what}"):
        read_results(path)
    res = invoke("report", str(path.parent))
    assert res.exit_code == 2 and "results.jsonl:2" in res.output.replace("\n", "") and "Traceback" not in res.output
    base = write_run(tmp_path / "base", [row("decode/b1-l16", "torch")])
    res = invoke("compare", str(base), str(path.parent))
    assert res.exit_code == 2 and "results.jsonl:2" in res.output.replace("\n", "")


def test_the_writer_sets_a_torn_tail_aside_before_appending(tmp_path):
    path = tmp_path / "results.jsonl"
    with ResultWriter(path) as w:
        w.append(row("decode/b1-l16", "torch"))
    full = path.read_text()
    path.write_text(full + '{"case_id": "decode/b1-l3')
    with ResultWriter(path) as w:
        w.append(row("decode/b1-l32", "torch"))
    assert [r.case_id for r in read_results(path)] == ["decode/b1-l16", "decode/b1-l32"]
    assert (tmp_path / "results.jsonl.torn").read_text() == '{"case_id": "decode/b1-l3\n'  # kept, not lost


def test_sweep_writes_one_run_metadata_shape_with_version_commit_and_device(tmp_path):
    out = tmp_path / "run"
    res = invoke("sweep", "smoke", "--op", "merge_state", "--backend", "torch", "--device", "cpu", "--no-timing",
                 "--no-isolate", "--shard", "1/2", "--out", str(out))  # fmt: skip
    assert res.exit_code == 0, res.output
    run = json.loads((out / "run.json").read_text())
    assert run["schema_version"] == SCHEMA_VERSION and run["kind"] == "sweep"
    assert run["device"] == "cpu" and run["shard"] == {"k": 1, "n": 2} and run["timing"] is False
    assert run["executor"] == "in-process" and run["complete"] is True
    assert len(run["git"]["commit"]) == 40 and isinstance(run["git"]["dirty"], bool)  # tests run in a checkout
    assert json.loads((out / "env.json").read_text())["schema_version"] == SCHEMA_VERSION


def test_resume_refuses_a_run_with_an_unreadable_row_and_touches_nothing(tmp_path):
    out = tmp_path / "run"
    args = ["sweep", "smoke", "--op", "merge_state", "--backend", "torch", "--device", "cpu", "--no-timing",
            "--no-isolate", "--out", str(out)]  # fmt: skip
    assert invoke(*args).exit_code == 0
    lines = (out / "results.jsonl").read_text().splitlines()
    (out / "results.jsonl").write_text("\n".join([lines[0], "garbage", *lines[1:]]) + "\n")
    before = (out / "results.jsonl").read_bytes()
    res = invoke(*args, "--resume")
    assert res.exit_code == 2 and "results.jsonl:2" in res.output.replace("\n", "") and "Traceback" not in res.output
    assert (out / "results.jsonl").read_bytes() == before
    run = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps(run | {"schema_version": SCHEMA_VERSION + 1}))
    (out / "results.jsonl").write_text("\n".join(lines) + "\n")
    res = invoke(*args, "--resume")
    assert res.exit_code == 2 and "newer attnbench" in res.output


def test_a_copy_without_git_takes_its_commit_from_the_environment(tmp_path, monkeypatch):
    from attnbench.store.runinfo import git_info

    (tmp_path / "pyproject.toml").write_text("")  # a tree copied without .git (a GPU runner's copy)
    monkeypatch.delenv("ATTNBENCH_GIT_COMMIT", raising=False)
    assert git_info(tmp_path) is None
    monkeypatch.setenv("ATTNBENCH_GIT_COMMIT", "c69e167")
    monkeypatch.setenv("ATTNBENCH_GIT_DIRTY", "1")
    got = git_info(tmp_path)
    assert got.commit == "c69e167" and got.dirty is True
    monkeypatch.delenv("ATTNBENCH_GIT_DIRTY")
    assert git_info(tmp_path).dirty is None  # unknown, not clean


def test_the_source_fingerprint_names_the_files_a_dirty_run_used(tmp_path):
    """A tree copied over an older .git (a GPU machine's copy) reads `dirty` at the old commit; its
    `source` fingerprint equals the fingerprint of the commit whose files it holds, and of no other."""
    import subprocess

    from attnbench.store.runinfo import commit_fingerprint, git_info

    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "a.py").write_text("A = 1\n")
    (tmp_path / "notes.txt").write_text("outside the source paths\n")
    git("add", "-A")
    git("commit", "-qm", "one")
    one = git_info(tmp_path)
    assert one.dirty is False and one.source == commit_fingerprint(tmp_path, "HEAD")
    (tmp_path / "notes.txt").write_text("changed, but no source\n")
    assert git_info(tmp_path).source == one.source
    (tmp_path / "harness" / "a.py").write_text("A = 2\n")  # the next commit's files, uncommitted
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text("K = 1\n")  # a new file, untracked
    dirty = git_info(tmp_path)
    assert dirty.dirty is True and dirty.commit == one.commit and dirty.source != one.source
    git("add", "-A")
    git("commit", "-qm", "two")
    assert dirty.source == commit_fingerprint(tmp_path, "HEAD") != commit_fingerprint(tmp_path, "HEAD~1")

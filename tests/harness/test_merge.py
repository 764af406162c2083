"""`attnbench merge`: shards back into one run, with the run metadata of a sweep; mixed inputs refused."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.report import render_all
from attnbench.store.results import read_results
from synthetic import ENV, row, write_run

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


def _shard(tmp_path, k, n=3, device="cuda", timing=True, env=None):
    cid = f"decode/b{k}-l1024-h32x8-d128-bf16"
    rows = [
        row(cid, "torch", median_us=100.0 if timing else None),
        row(cid, "triton", median_us=50.0 if timing else None),
    ]
    run = {"schema_version": 2, "kind": "sweep", "argv": ["attnbench", "sweep", "decode", "--shard", f"{k}/{n}"],
           "device": device, "shard": {"k": k, "n": n}, "timing": timing, "complete": True, "wall_s": 10.0,
           "git": {"commit": "a" * 40, "dirty": False}}  # fmt: skip
    return write_run(tmp_path / f"s{k}", rows, env=env, run=run)


def _repro_devices(html: str) -> set[str]:
    return set(re.findall(r"--device (\S+?)[\"\\<\s]", html))


def test_merged_gpu_shards_keep_the_device_in_run_json_and_repro_commands(tmp_path):
    runs = [str(_shard(tmp_path, k)) for k in (1, 2, 3)]
    res = invoke("merge", *runs, "--out", str(tmp_path / "all"))
    assert res.exit_code == 0, res.output
    run = json.loads((tmp_path / "all" / "run.json").read_text())
    assert run["kind"] == "merge" and run["device"] == "cuda" and run["timing"] is True and run["complete"] is True
    assert [s["shard"] for s in run["merged_from"]] == [{"k": k, "n": 3} for k in (1, 2, 3)]
    assert run["git"]["commit"] == "a" * 40 and run["rows"] == 6
    assert _repro_devices((tmp_path / "all" / "report.html").read_text()) == {"cuda"}


def test_a_merge_written_before_versioning_renders_repro_commands_for_its_device(tmp_path):
    old = write_run(tmp_path / "old", [row("decode/b1-l1024-h32x8-d128-bf16", "torch")], env=ENV,
                    run={"merged": ["/tmp/a", "/tmp/b"], "rows": 1})  # fmt: skip
    render_all(old)
    assert _repro_devices((old / "report.html").read_text()) == {"cuda"}  # from env.json, never "cpu"


def test_a_merge_of_merges_lists_the_original_shards(tmp_path):
    assert invoke("merge", str(_shard(tmp_path, 1)), str(_shard(tmp_path, 2)), "--out", str(tmp_path / "m12"),
                  "--partial").exit_code == 0  # fmt: skip
    assert json.loads((tmp_path / "m12" / "run.json").read_text())["missing_shards"] == ["3/3"]
    res = invoke("merge", str(tmp_path / "m12"), str(_shard(tmp_path, 3)), "--out", str(tmp_path / "all"))
    assert res.exit_code == 0, res.output
    run = json.loads((tmp_path / "all" / "run.json").read_text())
    assert [s["path"] for s in run["merged_from"]] == [str(tmp_path / f"s{k}") for k in (1, 2, 3)]
    assert "missing_shards" not in run or run["missing_shards"] == []
    assert len(read_results(tmp_path / "all" / "results.jsonl")) == 6


def _refused(res, *words):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    for w in words:
        assert w in res.output.replace("\n", " "), (w, res.output)


def test_missing_shards_are_named_and_refused_unless_partial(tmp_path):
    runs = [str(_shard(tmp_path, k, n=4)) for k in (1, 3)]
    _refused(invoke("merge", *runs, "--out", str(tmp_path / "all")), "shards 2/4, 4/4 missing", "--partial")
    assert not (tmp_path / "all").exists()
    res = invoke("merge", *runs, "--out", str(tmp_path / "all"), "--partial")
    assert res.exit_code == 0, res.output
    run = json.loads((tmp_path / "all" / "run.json").read_text())
    assert run["missing_shards"] == ["2/4", "4/4"] and run["complete"] is False


def test_an_output_that_is_an_input_or_holds_results_is_refused(tmp_path):
    s1, s2 = _shard(tmp_path, 1, n=2), _shard(tmp_path, 2, n=2)
    before = (s1 / "results.jsonl").read_bytes()
    _refused(invoke("merge", str(s1), str(s2), "--out", str(s1)), "one of the runs being merged")
    assert (s1 / "results.jsonl").read_bytes() == before
    _refused(invoke("merge", str(s1), str(s2), "--out", str(s2 / ".." / "s2")), "one of the runs being merged")
    assert invoke("merge", str(s1), str(s2), "--out", str(tmp_path / "all")).exit_code == 0
    _refused(invoke("merge", str(s1), str(s2), "--out", str(tmp_path / "all")), "already holds results.jsonl")
    assert len(read_results(tmp_path / "all" / "results.jsonl")) == 4  # not appended twice


@pytest.mark.parametrize(
    ("second", "words"),
    [
        ({"device": "cpu", "env": {"device": "cpu", "cpu": "x86_64"}}, ["different devices", "cpu (x86_64)"]),
        ({"env": ENV | {"gpu": "NVIDIA H200"}}, ["different devices", "NVIDIA H200"]),
        ({"timing": False}, ["different timing modes", "untimed"]),
        ({"n": 4}, ["different splits"]),
    ],
)
def test_runs_of_different_devices_timing_modes_or_splits_are_refused(tmp_path, second, words):
    first = _shard(tmp_path, 1, n=2, env=ENV)
    other = _shard(tmp_path, 2, **({"n": 2, "env": ENV} | second))
    _refused(invoke("merge", str(first), str(other), "--out", str(tmp_path / "all")), *words)
    assert not (tmp_path / "all").exists()


def test_same_gpu_model_on_other_gpu_indices_merges(tmp_path):
    first = _shard(tmp_path, 1, n=2, device="cuda:0", env=ENV)
    other = _shard(tmp_path, 2, n=2, device="cuda:1", env=ENV)
    assert invoke("merge", str(first), str(other), "--out", str(tmp_path / "all")).exit_code == 0

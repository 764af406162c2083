"""Replayed traces (docs/trace.md): JSONL batches -> cases with explicit lengths -> sweep -> report."""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli.app import app
from attnbench.errors import SuiteError
from attnbench.plan import trace
from attnbench.plan.suite import load
from attnbench.report import ranking
from attnbench.report.common import repro
from attnbench.store.results import read_results
from attnbench.store.runinfo import read_run

TINY = Path(__file__).parents[1] / "support" / "tiny_trace.jsonl"
HEADS = '"heads_q": 4, "heads_kv": 2, "head_dim": 16, "page_size": 4'
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_lines_become_cases_with_exactly_their_lengths():
    batches = trace.read(TINY)
    assert [b.line for b in batches] == [1, 2, 4, 5]  # the blank line is skipped; line 6 repeats line 1
    first = batches[0]
    assert first.count == 5 and first.case.count == 5  # identical batches: one case, counts summed
    assert first.case.op.request_lengths(first.case.params, 0) == ([5, 40, 17, 1], [1, 1, 1, 1])
    swa = batches[1].case
    assert (swa.dtype, swa.params.window, swa.params.sinks, swa.params.page_size) == ("fp16", 7, True, 1)
    assert batches[2].case.op.request_lengths(batches[2].case.params, 0) == ([9, 31, 13, 8], [9, 1, 1, 3])
    shared = batches[3].case  # extend given keys (prefix + new, as FlashInfer's paged prefill counts them)
    assert shared.params.prefix_lens == (0, 19) and shared.params.new_kv == "shared"


def test_a_model_preset_gives_the_head_config(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"op": "decode", "model": "gpt-oss-20b", "kv_lens": [300, 7]}\n')
    (b,) = trace.read(f)
    p = b.case.params
    assert (p.heads_q, p.heads_kv, p.head_dim, p.sinks, p.window, p.batch, p.kv_len) == (64, 8, 64, True, 127, 2, 300)


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "a batch is a JSON object"),
        ('{"kv_lens": [3]}', "no op: a trace replays decode or extend"),
        ('{"op": "merge_state", "tokens": 3}', "op 'merge_state': a trace replays"),
        ('{"op": "decode", "kv_lens": [3], "dtype": "fp12"}', "dtype 'fp12'"),
        ('{"op": "decode", "kv_lens": [3], "count": 0}', "count 0: a positive integer"),
        ('{"op": "decode", "kv_lens": [3], "model": "gpt-9"}', "unknown model 'gpt-9'"),
        ('{"op": "decode", "kv_lens": [3], "widow": 7}', "decode has no parameter 'widow'"),
        ('{"op": "decode", "batch": 3, "kv_len": 9}', "without 'kv_lens'"),
        ('{"op": "decode", "kv_lens": [3, 0]}', "kv_lens holds integers >= 1"),
        ('{"op": "decode", "kv_lens": [3, 5], "batch": 3}', "batch 3 contradicts kv_lens"),
        ('{"op": "decode", "kv_lens": [3], "heads_q": 6, "heads_kv": 4}', "multiple of heads_kv"),
        ('{"op": "extend", "q_lens": [3, 1], "prefix_lens": [0]}', "differ in length"),
        ('{"op": "extend", "q_lens": [3], "kv_lens": [2]}', "every kv_lens\\[i\\] >= q_lens"),
        ('{"op": "extend", "q_lens": [3], "kv_lens": [9], "prefix_lens": [6]}', "not both"),
    ],
)
def test_a_malformed_line_names_file_line_and_what_is_wrong(tmp_path, line, message):
    f = tmp_path / "bad.jsonl"
    f.write_text(f'{{"op": "decode", {HEADS}, "kv_lens": [4]}}\n\n{line}\n')
    with pytest.raises(SuiteError, match=message) as e:
        trace.read(f)
    assert str(e.value).startswith(f"{f}:3: ")


def test_sweep_refuses_a_bad_trace_with_exit_2_and_writes_nothing(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(f'{{"op": "decode", {HEADS}, "kv_lens": [4]}}\n{{"op": "decode", "kv_lens": []}}\n')
    out = tmp_path / "run"
    res = invoke("sweep", "--trace", str(f), "--device", "cpu", "--out", str(out), "-b", "torch")
    assert res.exit_code == 2
    assert f"{f}:2: kv_lens is empty" in res.output and "Traceback" not in res.output
    assert not out.exists()


def test_too_many_batches_are_refused_before_parsing(tmp_path):
    f = tmp_path / "big.jsonl"
    f.write_text("garbage\n" * 30)
    with pytest.raises(SuiteError, match="30 batches, more than 10"):
        trace.read(f, max_cases=10)


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    out = tmp_path_factory.mktemp("replay") / "run"
    res = invoke("sweep", "--trace", str(TINY), "--device", "cpu", "--out", str(out),
                 "-b", "torch", "-b", "triton", "-b", "flashinfer", "--allow-skipped")  # fmt: skip
    return res, out


def test_sweep_replays_a_trace_end_to_end(replay):
    res, out = replay
    assert res.exit_code == 0, res.output
    rows = read_results(out / "results.jsonl")
    assert len(rows) == 4 * 3
    by = {(r.case_id, r.backend): r for r in rows}
    assert {r.status.value for r in rows if r.backend in ("torch", "triton")} == {"pass"}
    assert all(r.status.value == "skip" and r.reason for r in rows if r.backend == "flashinfer")
    first = next(r for r in rows if r.backend == "torch")
    assert first.params["kv_lens"] == [5, 40, 17, 1] and first.count == 5 and first.suite == "tiny_trace"
    assert read_run(out).traces == [str(TINY)]
    assert len(by) == len(rows)
    summary = (out / "summary.md").read_text()
    assert "nothing failing" in summary
    assert "extend/b4-q9-pre30-lens" in (out / "report.html").read_text()


def test_a_rows_repro_command_reruns_its_replayed_case(replay, tmp_path):
    _, out = replay
    row = next(r for r in read_results(out / "results.jsonl") if r.op == "extend" and r.backend == "triton")
    cmd = shlex.split(repro(row, json.loads((out / "run.json").read_text())))
    env = [w for w in cmd if "=" in w and w.split("=", 1)[0].isupper()][: cmd.index("attnbench")]
    assert env == ["TRITON_INTERPRET=1"]  # an interpreted Triton row: the command sets the interpreter
    cmd = cmd[len(env) :]
    assert cmd[:2] == ["attnbench", "sweep"] and "--trace" in cmd
    res = invoke(*cmd[1:], "--out", str(tmp_path / "again"))
    assert res.exit_code == 0, res.output
    (again,) = read_results(tmp_path / "again" / "results.jsonl")  # only that case: the trace only resolves it
    assert (again.case_id, again.backend, again.status.value) == (row.case_id, "triton", "pass")
    assert again.params == row.params


def test_a_replayed_id_without_its_trace_is_a_clear_usage_error(replay, tmp_path):
    _, out = replay
    cid = read_results(out / "results.jsonl")[0].case_id
    res = invoke("sweep", "--case", cid, "--device", "cpu", "--out", str(tmp_path / "x"))
    assert (
        res.exit_code == 2
        and "no trace given (nor a built-in one) holds" in res.output
        and "--trace FILE" in res.output
    )
    assert not (tmp_path / "x").exists()


def test_replayed_extend_batches_are_classed_by_their_mix(replay):
    _, out = replay
    classes = {ranking.shape_class(r) for r in read_results(out / "results.jsonl") if r.backend == "torch"}
    assert classes == {"decode · gqa · b≤16", "decode · gqa · b=1", "extend · gqa · mixed q · b≤16",
                       "extend · mha · mixed q · b≤16"}  # fmt: skip


def test_a_suite_replays_a_trace_entry_beside_it(tmp_path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "t.jsonl").write_text(TINY.read_text())
    suite = tmp_path / "s.yaml"
    suite.write_text("name: mine\ncases:\n  - trace: traces/t.jsonl\n    require: [deterministic]\n")
    s = load(str(suite))
    assert len(s.cases) == 4 and {c.suite for c in s.cases} == {"mine"}
    assert all(c.require == {"deterministic"} for c in s.cases)
    assert s.traces == [tmp_path / "traces" / "t.jsonl"]


@pytest.mark.parametrize(
    "entry, line, message",
    [
        ("  - trace: nope.jsonl\n", 3, "no such trace file"),
        ("  - trace: t.jsonl\n    op: decode\n", 3, "not both or neither"),
        ("  - trace: t.jsonl\n    dtypes: [fp16]\n", 3, "dtypes belong in its lines"),
    ],
)
def test_a_bad_trace_entry_names_the_suite_line(tmp_path, entry, line, message):
    (tmp_path / "t.jsonl").write_text(TINY.read_text())
    suite = tmp_path / "s.yaml"
    suite.write_text(textwrap.dedent("name: mine\ncases:\n") + entry)
    with pytest.raises(SuiteError, match=message) as e:
        load(str(suite))
    assert str(e.value).startswith(f"{suite}:{line}: ")


def test_a_bad_line_in_a_suites_trace_names_the_trace_line(tmp_path):
    (tmp_path / "t.jsonl").write_text(TINY.read_text() + '{"op": "decode", "kv_lens": [1], "window": -5}\n')
    suite = tmp_path / "s.yaml"
    suite.write_text("cases:\n  - trace: t.jsonl\n")
    with pytest.raises(SuiteError, match="window") as e:
        load(str(suite))
    assert str(e.value).startswith(f"{tmp_path / 't.jsonl'}:7: ")


def test_the_shipped_trace_is_what_its_generator_writes():
    import subprocess
    import sys

    tool = Path(__file__).parents[2] / "tools" / "traces" / "make_serving_trace.py"
    done = subprocess.run([sys.executable, str(tool), "--check"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_serving_suite_replays_the_shipped_trace_in_sensible_classes():
    from types import SimpleNamespace

    s = load("serving", "cuda")
    assert s.spec.device == "cuda" and 250 <= len(s.cases) <= 400
    assert {c.suite for c in s.cases} == {"serving"} and {c.count for c in s.cases} == {5}
    assert [trace.label(t) for t in s.traces] == ["serving"]
    classes = {ranking.shape_class(SimpleNamespace(op=c.op_name, features=c.features, params=c.params.model_dump()))
               for c in s.cases}  # fmt: skip
    assert classes == {"decode · gqa · b≤16", "decode · gqa · b>16", "extend · gqa · mixed q · b≤16",
                       "extend · gqa · mixed q · b>16"}  # fmt: skip
    with pytest.raises(SuiteError, match="sized for a GPU"):
        load("serving", "cpu")


def test_ids_of_the_shipped_trace_resolve_without_naming_it():
    from attnbench.run.sweep import Selection, plan

    case = load("serving", "cuda").cases[7]
    p = plan(Selection(device="cpu", backends=("torch",), case_ids=(case.id,)))
    assert [c.id for c in p.cases] == [case.id] and p.cases[0].params == case.params
    assert p.traces == ()  # only the traces named or replayed are recorded


def _row(case_id, backend, status, median_us, count, suite="tiny", lens=(3, 4)):
    from attnbench.store.results import Result

    timing = {"clock": "cuda-events", "median_us": median_us} if median_us else None
    return Result(case_id=case_id, op="decode", backend=backend, status=status, params={"kv_lens": list(lens)} if lens else {"batch": 2},
                  suite=suite, count=count, timing=timing)  # fmt: skip


def test_summary_totals_a_replayed_trace_per_backend_over_common_batches(tmp_path):
    from attnbench.report.exports import write_summary_md

    rows = [
        _row("a", "fast", "pass", 10.0, 5), _row("a", "slow", "pass", 30.0, 5),
        _row("b", "fast", "pass", 100.0, 1), _row("b", "slow", "fail", 50.0, 1),  # a failing row is never summed
        _row("c", "fast", "pass", 7.0, 2), _row("c", "slow", "skip", None, 2),
        _row("g", "fast", "pass", 1.0, 1, suite="generated", lens=None),  # not replayed: no explicit lengths
    ]  # fmt: skip
    (t,) = ranking.replay_totals(rows)
    assert (t["suite"], t["batches"], t["common"]) == ("tiny", 3, 1)
    fast, slow = t["backends"]
    assert fast == {"backend": "fast", "batches": 3, "total_ms": (50 + 100 + 14) / 1e3, "common_ms": 0.05}
    assert slow == {"backend": "slow", "batches": 1, "total_ms": 0.15, "common_ms": 0.15}
    write_summary_md(rows, tmp_path / "summary.md", {})
    text = (tmp_path / "summary.md").read_text()
    assert "### Replayed trace `tiny`" in text and "| fast | 3 | 0.164 | 0.050 |" in text


def test_a_pytest_rerun_hint_names_the_trace(tmp_path):
    from attnbench.cli.pytest_plugin import rerun_command

    case = trace.read(TINY)[0].case
    assert rerun_command(case, "torch", []).endswith(f"--trace {TINY}")


def test_every_backend_runs_or_declares_why_not_for_replayed_batches():
    """No backend finds out in prepare what its declared limits could have said (a late Unsupported)."""
    from attnbench.backend import all_backends, load_builtin
    from attnbench.errors import Unsupported

    load_builtin()
    ran = []
    for b in all_backends().values():
        for batch in trace.read(TINY):
            case = batch.case
            if reason := b.supports(case):
                assert reason.strip(), (b.name, case.id)
                continue
            try:
                b.prepare(case, case.make_inputs())
            except Unsupported as e:
                pytest.fail(f"{b.name} declares it runs {case.id} but prepare skips it: {e}")
            ran.append(b.name)
    assert {"torch", "triton", "triton-det"} <= set(ran)


def test_merged_shards_keep_the_traces_their_repro_commands_need(tmp_path):
    runs = []
    for k in (1, 2):
        out = tmp_path / f"shard{k}"
        res = invoke("sweep", "--trace", str(TINY), "--device", "cpu", "--out", str(out), "-b", "torch",
                     "--shard", f"{k}/2", "--no-timing")  # fmt: skip
        assert res.exit_code == 0, res.output
        runs.append(str(out))
    res = invoke("merge", *runs, "--out", str(tmp_path / "merged"))
    assert res.exit_code == 0, res.output
    assert read_run(tmp_path / "merged").traces == [str(TINY)]


def test_case_from_id_resolves_replayed_ids_through_the_traces_given():
    from attnbench.case import Case

    batch = trace.read(TINY)[2]
    again = trace.case_from_id(batch.case.id, "cpu", [TINY])
    assert (again.op_name, again.params, again.dtype) == (batch.case.op_name, batch.case.params, batch.case.dtype)
    with pytest.raises(ValueError, match="no trace given"):
        trace.case_from_id(batch.case.id, "cpu")
    with pytest.raises(ValueError, match="no trace given"):  # Case.from_id only parses: it reads no trace
        Case.from_id(batch.case.id, "cpu")

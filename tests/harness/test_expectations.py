"""Expected failures: validation (file:line), xfail / xpass / not covered, version pins, the shipped file."""

from __future__ import annotations

import pytest

import synthetic
from attnbench.check.checks import subjects
from attnbench.errors import SuiteError
from attnbench.plan import expectations as ex

GOOD = """\
expect:
  - backend: flashinfer
    cases: ["decode/*", "extend/b2-*"]
    outputs: [lse]
    versions: {flashinfer-python: "==0.7.2.post1"}
    why: fa2 LSE summed from bf16 probabilities
    link: https://example.org/finding
  - backend: "triton*"
    cases: decode/b1-*
    why: a whole-row finding
"""


def _write(tmp_path, text, name="expect.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def _fail_on(case_id, backend, outputs):
    """A fail row whose listed outputs are over their bounds."""
    r = synthetic.row(case_id, backend, status="fail")
    for name in outputs:
        r.metrics[name]["max_abs"] = 10 * r.metrics[name]["bound"]
    for name in {"o", "lse"} - set(outputs):
        r.metrics[name]["max_abs"] = 0.1 * r.metrics[name]["bound"]
    r.failed = sorted(outputs)
    return r


def test_load_both_forms(tmp_path):
    es = ex.load(_write(tmp_path, GOOD))
    assert [e.backend for e in es] == ["flashinfer", "triton*"]
    assert es[0].cases == ("decode/*", "extend/b2-*") and es[0].outputs == {"lse"}
    assert es[0].where.endswith("expect.yaml:2") and es[1].where.endswith("expect.yaml:8")
    assert es[1].cases == ("decode/b1-*",) and es[1].outputs is None
    bare = ex.load(_write(tmp_path, "- {backend: torch, cases: '*', why: because}\n", "bare.yaml"))
    assert bare[0].backend == "torch"


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("expect:\n  - backend: x\n    cases: '*'\n", 2, "why: required key missing"),
        ("expect:\n  - backend: x\n    cases: '*'\n    why: ok ok\n    typo: 1\n", 5, "unknown key"),
        ("expect:\n  - backend: x\n    cases: '*'\n    why: ok ok\n    versions: {fi: '=>1'}\n", 5, "not a version"),
        ("expect:\n  - backend: x\n    cases: 3\n    why: ok ok\n", 3, "cases"),
        ("expect:\n  - backend: x\n    cases: '*'\n    why: ok ok\n    outputs: []\n", 5, "outputs"),
        ("expect: {backend: x}\n", 1, "a list of expectations"),
        ("cases: []\n", 1, "`expect:` list"),
        ("expect: []\nbackends: [x]\n", 2, "unknown key"),
        ("expect:\n  - backend: x\n    backend: y\n", 3, "duplicate key"),
    ],
)
def test_invalid_files_name_file_and_line(tmp_path, text, line, words):
    p = _write(tmp_path, text)
    with pytest.raises(SuiteError) as e:
        ex.load(p)
    assert e.value.line == line and words in str(e.value), str(e.value)
    assert str(e.value).startswith(f"{p}:{line}: ")


def test_missing_file(tmp_path):
    with pytest.raises(SuiteError, match="no such expectations file"):
        ex.load(tmp_path / "nope.yaml")


def test_covered_failure_is_xfail_with_its_reason(tmp_path):
    es = ex.load(_write(tmp_path, GOOD))
    row = _fail_on("decode/b8-l1024-h32x8-d128-bf16", "flashinfer", ["lse"])
    out = ex.apply_one(row, es)
    assert out.status == "xfail" and "fa2 LSE summed from bf16 probabilities" in out.reason
    assert row.reason in out.reason  # the failure itself stays visible
    assert out.expected["where"].endswith("expect.yaml:2") and out.expected["link"] == "https://example.org/finding"


def test_another_output_failing_is_still_a_failure(tmp_path):
    es = ex.load(_write(tmp_path, GOOD))
    row = _fail_on("decode/b8-l1024-h32x8-d128-bf16", "flashinfer", ["lse", "o"])
    out = ex.apply_one(row, es)
    assert out.status == "fail" and "allows only lse, and lse, o failed" in out.reason
    stale = _fail_on("decode/b8-l1024-h32x8-d128-bf16", "flashinfer", ["lse"])
    stale.failed = ["lse", "stale output: outputs did not change when the inputs did"]
    assert ex.apply_one(stale, es).status == "fail"


def test_expected_failure_that_passes_is_xpass(tmp_path):
    es = ex.load(_write(tmp_path, GOOD))
    out = ex.apply_one(synthetic.row("extend/b2-q512-bf16", "flashinfer"), es)
    assert out.status == "xpass" and "remove the expectation at" in out.reason and "expect.yaml:2" in out.reason


def test_unmatched_skipped_and_errored_rows_are_untouched(tmp_path):
    es = ex.load(_write(tmp_path, GOOD))
    for row in (
        _fail_on("extend/b4-q512-bf16", "flashinfer", ["lse"]),  # glob does not match
        _fail_on("decode/b8-l1024-h32x8-d128-bf16", "flashinfer-fa3", ["lse"]),  # other backend
        synthetic.row("decode/b8-l1024-h32x8-d128-bf16", "flashinfer", status="skip"),
        synthetic.row("decode/b8-l1024-h32x8-d128-bf16", "flashinfer", status="error"),
    ):
        assert ex.apply_one(row, es) is row


CRASHES = """\
expect:
  - backend: sglang
    cases: gdn_decode/*slots4224*
    outputs: [o, state_pool]
    errors: ["*illegal memory access*"]
    why: int32 slot offsets wrap past 2^31 elements
"""


def test_an_expected_crash_is_xfail_and_another_error_stays_an_error(tmp_path):
    es = ex.load(_write(tmp_path, CRASHES))
    case = "gdn_decode/b64-h16x32-d128x128-pad4-slots4224-bf16"
    crash = synthetic.row(case, "sglang", status="error")
    crash.reason = "AcceleratorError: CUDA error: an illegal memory access was encountered"
    out = ex.apply_one(crash, es)
    assert out.status == "xfail" and "int32 slot offsets wrap" in out.reason and crash.reason in out.reason
    other = synthetic.row(case, "sglang", status="error")
    other.reason = "TypeError: unexpected keyword argument 'pool'"
    assert ex.apply_one(other, es) is other  # an error the expectation does not name
    elsewhere = synthetic.row("gdn_decode/b64-h16x32-d128x128-bf16", "sglang", status="error")
    elsewhere.reason = crash.reason
    assert ex.apply_one(elsewhere, es) is elsewhere  # the case glob still applies
    assert ex.apply_one(_fail_on(case, "sglang", ["o"]), es).status == "xfail"  # the other outcome, as before
    assert ex.apply_one(synthetic.row(case, "sglang"), es).status == "xpass"


def test_whole_row_expectation_and_backend_glob(tmp_path):
    es = ex.load(_write(tmp_path, GOOD))
    row = _fail_on("decode/b1-l1024-h32x8-d128-bf16", "triton-det", ["o", "lse"])
    row.failed = ["input q was modified"]
    assert ex.apply_one(row, es).status == "xfail"


def test_version_pins(tmp_path):
    es = ex.load(_write(tmp_path, GOOD))
    at = {"flashinfer-python": "0.7.2.post1"}
    assert len(ex.applicable(es, at.get)) == 2
    assert [e.backend for e in ex.applicable(es, {"flashinfer-python": "0.7.3"}.get)] == ["triton*"]
    assert [e.backend for e in ex.applicable(es, {}.get)] == ["triton*"]  # not installed: does not apply
    rng = ex.Expectation("b", ("*",), "why", versions=(("lib", ">=0.7,<0.8"),))
    assert rng.applies({"lib": "0.7.5"}.get) and not rng.applies({"lib": "0.8.0"}.get)
    assert rng.applies({"lib": "0.7.6rc1"}.get)  # a pre-release inside the range is inside it
    env = ex.versions_from_env({"libraries": {"flashinfer-python": "0.7.2.post1"}})
    assert len(ex.applicable(es, env)) == 2


def test_failed_parts_falls_back_to_metrics():
    row = synthetic.row("decode/b1-l1024-h32x8-d128-bf16", "triton", status="fail")
    assert ex.failed_parts(row) == {"o"}
    row.metrics["o"]["max_abs"] = 0.0
    assert ex.failed_parts(row) is None  # metrics do not explain the failure: unknown, never covered
    assert not ex.Expectation("triton", ("*",), "w", outputs=frozenset({"o"})).covers(None)


def test_replay_failures_covered_only_where_the_output_failed_eagerly_too():
    """A known failure of `o` seen again on the replayed batch (`replay:o`) is still that known
    failure; a replay failure on an output that passed on the case's own batch is what the graph got
    wrong, and no `outputs:` list covers it."""
    from attnbench.check.checks import Problem

    known = ex.Expectation("sglang", ("*",), "w", outputs=frozenset({"state_pool"}))
    assert known.covers({"state_pool", "replay:state_pool"})
    assert not known.covers({"replay:state_pool"})  # passed eagerly, failed on replay
    assert not known.covers({"state_pool", "replay:o"})  # another output on replay
    assert ex.Expectation("sglang", ("*",), "w").covers({"replay:o"})  # no outputs list: any failure
    # named as such: a numerical edge of the replay batch's inputs (diagnosed), that output on that batch only
    edge = ex.Expectation("flashinfer", ("*",), "w", outputs=frozenset({"replay:state_pool"}))
    assert edge.covers({"replay:state_pool"})
    assert not edge.covers({"state_pool"}) and not edge.covers({"state_pool", "replay:state_pool"})
    assert not edge.covers({"replay:state_pool", "replay:o"})
    p = Problem("replay: captured on one batch ... o: 3 NaN", ["replay:o"])
    assert subjects([p, "state_pool: abs error 1 > bound 0"], ["o", "state_pool"]) == ["replay:o", "state_pool"]
    assert subjects(["replay: the closure could not be captured"], ["o"]) == [
        "replay: the closure could not be captured"
    ]


def test_subjects():
    problems = [
        "lse: max abs error 1e-4 > bound 6e-6 at token 0 head 11; 100% of elements over",
        "o: wrote outside the output (canary padding changed)",
        "input k_cache was modified",
        "missing output 'lse'",
    ]
    assert subjects(problems, ["o", "lse"]) == ["input k_cache was modified", "lse", "missing output 'lse'", "o"]


def test_builtin_expectations_are_pinned_and_name_real_cases():
    """Every shipped expectation pins its library version, says why, and each glob matches a case of a
    built-in suite (a glob matching nothing documents nothing)."""
    from attnbench.plan.suite import builtin_names, load

    ids = {c.id for n in builtin_names() for c in load(n, "cuda").cases}
    es = ex.builtin()
    assert es, "no built-in expectations"
    for e in es:
        assert e.versions and all(spec.startswith("==") for _, spec in e.versions), e.where
        assert len(e.why) > 20, e.where
        for g in e.cases:
            assert any(ex.fnmatch.fnmatchcase(i, g) for i in ids), f"{e.where}: {g} matches no built-in case"


@pytest.mark.parametrize(
    "base, new, verdict",
    [
        ("pass", "fail", "broke"),
        ("pass", "xfail", "expected"),  # newly failing, but an expectation covers it
        ("xfail", "fail", "broke"),  # the expectation no longer covers it (versions moved, another output fails)
        ("xfail", "xfail", "still failing"),
        ("fail", "xfail", "still failing"),
        ("xfail", "error", "broke"),
        ("fail", "fail", "still failing"),
        ("xfail", "xpass", "xpass"),
        ("pass", "xpass", "xpass"),
        ("xfail", "pass", "fixed"),
        ("xpass", "pass", "same"),
    ],
)
def test_compare_treats_expectations_consistently(base, new, verdict):
    from attnbench.report.compare import GateRule, compare_pair

    cid = "decode/b8-l1024-h32x8-d128-bf16"
    ch = compare_pair(synthetic.row(cid, "flashinfer", status=base, median_us=None),
                      synthetic.row(cid, "flashinfer", status=new, median_us=None), GateRule())  # fmt: skip
    assert ch.verdict == verdict
    assert ch.regression == (verdict in ("broke", "xpass"))


def test_suite_expect_entries(tmp_path):
    """`expect:` in a suite: loaded with the suite, and its errors name the suite's file and line."""
    from attnbench.plan.suite import load

    body = "name: mine\ncases:\n  - op: merge_state\n    params: {tokens: 5, heads: 2, head_dim: 16}\n"
    good = _write(
        tmp_path, body + "expect:\n  - {backend: torch, cases: 'merge_state/*', why: a known one}\n", "s.yaml"
    )
    (e,) = load(str(good)).expectations
    assert e.backend == "torch" and e.where.endswith("s.yaml:6")
    bad = _write(tmp_path, body + "expect:\n  - backend: torch\n    cases: '*'\n", "bad.yaml")
    with pytest.raises(SuiteError, match=r"bad\.yaml:6: expect\[0\]\.why: required key missing"):
        load(str(bad))


def test_cli_expect_errors_exit_2(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from attnbench.cli.app import app

    bad = _write(tmp_path, "expect:\n  - backend: torch\n    cases: '*'\n    why: ok ok\n    outputs: lse\n")
    monkeypatch.chdir(tmp_path)  # nothing may be written (the default run directory is under ./reports)
    r = CliRunner().invoke(app, ["sweep", "smoke", "--op", "merge_state", "-b", "torch", "--expect", str(bad)])
    assert r.exit_code == 2 and f"{bad}:5" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, ["sweep", "smoke", "--expect", str(bad), "--no-expect"])
    assert r.exit_code == 2 and "contradict" in r.output
    assert not (tmp_path / "reports").exists()

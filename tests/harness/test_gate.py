"""The CI gate end to end on the CPU: `attnbench sweep` runs of a plugin backend with planted faults,
then `attnbench gate` against the first run as the baseline.

The baseline has a known finding (a wrong `lse` on two cases) covered by an expectations file: its
sweep exits 0 with two xfail rows. Against it, a clean second run passes the gate, and each planted
fault fails it: a 3x slowdown, a newly broken output, an expected failure that passes (xpass), and an
expected failure that now also breaks another output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import synthetic

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tests" / "support" / "planted_backend.py"
KNOWN = "merge_state/t33-h4-d64-fp32,merge_state/t17-h2-d32-peaked-bf16"
EXPECT = """\
expect:
  - backend: planted
    cases: [merge_state/t33-h4-d64-fp32, merge_state/t17-h2-d32-peaked-bf16]
    outputs: [lse]
    versions: {torch: ">=2"}
    why: planted lse shift (the test's known finding)
"""


def _attnbench(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = os.environ | {"COLUMNS": "200"} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "attnbench", *args], cwd=ROOT, env=full, capture_output=True, text=True, timeout=300
    )


def _sweep(out: Path, expect: Path, sleep_s: float, lse: str = KNOWN, o: str = "", timing: bool = True):
    env = {"ATTNBENCH_PLANTED_SLEEP_S": str(sleep_s), "ATTNBENCH_PLANTED_LSE": lse, "ATTNBENCH_PLANTED_O": o}
    args = ["sweep", "smoke", "--op", "merge_state", "-b", "planted", "--plugin", str(PLUGIN), "--no-isolate"]
    args += ["--expect", str(expect), "--out", str(out)] + (["--timing"] if timing else ["--no-timing"])
    return _attnbench(*args, env=env)


def _statuses(run: Path) -> dict[str, str]:
    return {json.loads(line)["case_id"]: json.loads(line)["status"] for line in open(run / "results.jsonl")}


def _gate(run: Path, base: Path | None):
    r = _attnbench("gate", str(run), *(["--baseline", str(base)] if base else []))
    return r.returncode, (run / "gate" / "gate.md").read_text() if (run / "gate" / "gate.md").exists() else r.stderr


@pytest.mark.slow
def test_gate_end_to_end_on_cpu(tmp_path):
    expect = tmp_path / "expect.yaml"
    expect.write_text(EXPECT)
    base = tmp_path / "base"
    r = _sweep(base, expect, 0.004)
    assert r.returncode == 0, r.stdout + r.stderr  # the known finding is xfail: the run passes
    st = _statuses(base)
    assert [c for c, s in st.items() if s == "xfail"] == KNOWN.split(",") and set(st.values()) == {"pass", "xfail"}
    assert "planted lse shift" in r.stderr  # the xfail rows are shown with their reason
    code, md = _gate(base, None)
    assert code == 0 and "gate passed" in md and "2 expected failures" in md and "planted lse shift" in md

    # the same run without the expectations fails (the finding is real), and --no-expect says so
    raw = _attnbench("sweep", "smoke", "--op", "merge_state", "-b", "planted", "--plugin", str(PLUGIN),
                     "--no-isolate", "--no-timing", "--no-expect", "--out", str(tmp_path / "raw"),
                     env={"ATTNBENCH_PLANTED_LSE": KNOWN})  # fmt: skip
    assert raw.returncode == 1 and set(_statuses(tmp_path / "raw").values()) == {"pass", "fail"}

    # each planted fault fails the gate; the clean rerun passes it (timings retaken once if off).
    # Host-clock timings are correctness-only: a 3x slower CPU run passes; relabelled as GPU-clock
    # timings, its real samples reach the speed rule.
    for attempt in range(2):
        clean, slow = tmp_path / f"clean{attempt}", tmp_path / f"slow{attempt}"
        assert _sweep(clean, expect, 0.004).returncode == 0
        assert _sweep(slow, expect, 0.012).returncode == 0  # 3x slower: not a failure of the run itself
        if attempt == 0:
            assert _gate(slow, base)[0] == 0
            synthetic.relabel_as_gpu_clock(base)
        for run in (clean, slow):
            synthetic.relabel_as_gpu_clock(run)
        (clean_code, clean_md), (slow_code, slow_md) = _gate(clean, base), _gate(slow, base)
        gate = json.loads((slow / "gate" / "gate.json").read_text())
        if clean_code == 0 and slow_code == 1 and gate["compare"].get("slower", 0) >= 3:
            break
    assert clean_code == 0, clean_md
    assert slow_code == 1 and "slower" in slow_md and "FAILED" in slow_md, slow_md
    assert gate["verdict"] == "fail" and gate["compare"]["slower"] >= 3, slow_md  # of the 5 passing rows

    broken = tmp_path / "broken"
    assert _sweep(broken, expect, 0.0, o="merge_state/t33-h4-d64-bf16", timing=False).returncode == 1
    code, md = _gate(broken, base)
    assert code == 1 and "1 broke" in md and "merge_state/t33-h4-d64-bf16" in md, md

    xpass = tmp_path / "xpass"  # one known finding fixed: its row passes against the expectation
    assert _sweep(xpass, expect, 0.0, lse=KNOWN.split(",")[0], timing=False).returncode == 1
    assert _statuses(xpass)["merge_state/t17-h2-d32-peaked-bf16"] == "xpass"
    code, md = _gate(xpass, base)
    assert code == 1 and "1 xpass" in md and "remove the expectation" in md, md

    worse = tmp_path / "worse"  # an expected failure now also breaks `o`: not covered, and broke
    assert _sweep(worse, expect, 0.0, o=KNOWN.split(",")[0], timing=False).returncode == 1
    assert _statuses(worse)[KNOWN.split(",")[0]] == "fail"
    code, md = _gate(worse, base)
    assert code == 1 and "1 broke" in md, md


def test_gate_refuses_an_unfinished_run_and_a_missing_one(tmp_path):
    import synthetic

    run = synthetic.write_run(tmp_path / "run", [synthetic.row("decode/b1-l1024-h32x8-d128-bf16", "triton")])
    (run / "run.json").write_text(json.dumps({"complete": False, "stopped_by": "KeyboardInterrupt"}))
    code, md = _gate(run, None)
    assert code == 1 and "did not finish (KeyboardInterrupt)" in md
    r = _attnbench("gate", str(tmp_path / "nothing"))
    assert r.returncode == 2 and "no results.jsonl here" in r.stderr and "Traceback" not in r.stderr

"""The CI gate behind `attnbench gate RUN [--baseline BASE ...]`: one verdict for a CI job, and its text.

The verdict fails when, and only when:
- the sweep did not finish (run.json `complete` is false: a crash, a cancel; rows would be missing);
- a row is `xpass`: an expected failure passed, so its expectation must go (strict);
- with baselines: `compare` finds a regression: a row that passed (or failed as expected) now fails
  or errors ("broke"), got slower beyond noise ("slower"), or is missing or newly skipped (unless
  allowed), or nothing could be compared. Rows that failed in the baseline too ("still failing"),
  and new failures that an expectation covers ("expected"), do not fail it;
- without a baseline (the first run of a GPU model, or a nightly on main): any `fail` or `error` row;
- results.jsonl of the run (or of a baseline) holds other rows than run.json recorded: a torn or emptied
  file, or rows written twice (attnbench.store.verified.missing_rows);
- nothing ran (every row skipped, or no rows), or a backend named with -b skipped every case
  (attnbench.store.verified.unverified), unless `--allow-skipped`.

`gate.md` (for a job summary or a pull-request comment) states the verdict and why, the run (GPU,
libraries, wall time, precompile time), the expected failures with their reasons, and compare's table;
`gate.json` holds the same for scripts.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from attnbench.errors import AttnbenchError
from attnbench.report.common import md_text
from attnbench.report.compare import Comparison, GateRule, compare_runs
from attnbench.report.comparison import write_comparison
from attnbench.store.results import Result, check_version, read_run_results, results_file
from attnbench.store.verified import missing_rows, unverified

MARKER = "<!-- attnbench-gate -->"  # the one pull-request comment the workflow updates carries it


@dataclass
class Gate:
    verdict: str  # pass | fail
    reasons: list[str]
    statuses: Counter
    rows: list[Result] = field(default_factory=list)
    comparison: Comparison | None = None
    run: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "reasons": self.reasons,
            "statuses": dict(self.statuses),
            "compare": dict(self.comparison.counts()) if self.comparison else None,
            "baseline": self.comparison.base if self.comparison else None,
        }


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def decide(
    run: Path, baselines: list[Path] | None = None, rule: GateRule | None = None, allow_skipped: bool = False
) -> Gate:
    """The gate's verdict for the run directory `run`, against `baselines` (pooled) when given.
    `allow_skipped`: a run that skipped everything, or a -b backend that skipped every case, passes."""
    run = Path(run)
    if results_file(run) is None:
        raise AttnbenchError(f"{run}: no results.jsonl here (did the sweep start?)")
    rows = read_run_results(run)
    info, env = _json(run / "run.json"), _json(run / "env.json")
    if not isinstance(info, dict):
        raise AttnbenchError(f"{run / 'run.json'}: not a JSON object")
    check_version(info.get("schema_version", 1), str(run / "run.json"))  # a newer run.json: refused, as report does
    statuses = Counter(r.status for r in rows)
    reasons = []
    if not info.get("complete", False):
        why = info.get("stopped_by") or "run.json does not say it completed"
        reasons.append(f"the sweep did not finish ({why}): rows may be missing")
    reasons += missing_rows(info, rows)
    for base in baselines or ():
        base_dir = Path(base) if Path(base).is_dir() else Path(base).parent
        if results_file(base_dir) is not None:
            base_rows = read_run_results(base_dir)
            reasons += [f"baseline {base}: {why}" for why in missing_rows(_json(base_dir / "run.json"), base_rows)]
    if not allow_skipped:
        reasons += unverified(rows, info.get("named_backends") or [])
    if statuses["xpass"]:
        reasons.append(f"{statuses['xpass']} xpass: expected failures that passed (remove their expectations)")
    cmp = None
    if baselines:
        cmp = compare_runs(list(baselines), run, rule or GateRule())
        counts = Counter(c.verdict for c in cmp.regressions if c.verdict != "xpass")
        reasons += [f"{n} {v}" for v, n in counts.items()]
        if why := cmp.nothing_compared():
            reasons.append(why)
    else:
        reasons += [f"{statuses[s]} {s}" for s in ("fail", "error") if statuses[s]]
    return Gate("fail" if reasons else "pass", reasons, statuses, rows, cmp, info, env)


def render_md(g: Gate, compare_md: str = "") -> str:
    """The job summary / pull-request comment."""
    head = "passed" if g.passed else "FAILED: " + "; ".join(g.reasons)
    lines = [MARKER, f"## attnbench gate {head}", ""]
    env, info = g.env, g.run
    libs = ", ".join(f"{k} {v}" for k, v in sorted(env.get("libraries", {}).items()))
    lines.append(f"- run: {env.get('gpu') or env.get('cpu') or env.get('device', '?')}; {libs}")
    if info.get("wall_s") is not None:
        lines.append(f"- sweep wall time: {info['wall_s']:.0f} s")
    for rec in info.get("precompile", []):
        what = rec.get("error") or f"{rec.get('keys', '?')} items"
        lines.append(f"- precompile ({', '.join(rec.get('backends', []))}): {what} in {rec.get('s', 0):.0f} s")
    lines.append("- rows: " + ", ".join(f"{n} {s}" for s, n in sorted(g.statuses.items())))
    if g.comparison is None:
        lines.append("- no baseline: the verdict is the run's own (any fail or error fails it)")
    else:
        lines.append(f"- baseline: {g.comparison.base}")
    bad = [r for r in g.rows if r.status in ("xpass", "fail", "error")]
    if bad and g.comparison is None:
        lines += ["", "| case | backend | status | reason |", "|---|---|---|---|"]
        lines += [f"| `{r.case_id}` | {md_text(r.backend)} | {r.status} | {md_text(r.reason)} |" for r in bad[:50]]
        if len(bad) > 50:
            lines.append(f"| … and {len(bad) - 50} more in results.jsonl | | | |")
    xfail = [r for r in g.rows if r.status == "xfail"]
    if xfail:
        by = Counter((r.backend, (r.expected or {}).get("why", ""), (r.expected or {}).get("where", "")) for r in xfail)
        lines += ["", f"<details><summary>{len(xfail)} expected failures (xfail)</summary>", ""]
        lines += ["| backend | rows | why | where |", "|---|---|---|---|"]
        lines += [f"| {md_text(b)} | {n} | {md_text(why)} | {where} |" for (b, why, where), n in by.most_common()]
        lines += ["", "</details>"]
    if compare_md:
        lines += ["", compare_md]
    return "\n".join(lines) + "\n"


def write(g: Gate, out: Path) -> list[Path]:
    """gate.md and gate.json (and compare.* when there is a baseline) in `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    compare_md = ""
    files = []
    if g.comparison is not None:
        files += write_comparison(g.comparison, out)
        compare_md = (out / "compare.md").read_text(encoding="utf-8")
    (out / "gate.md").write_text(render_md(g, compare_md), encoding="utf-8")
    (out / "gate.json").write_text(json.dumps(g.to_dict(), indent=1), encoding="utf-8")
    return [out / "gate.md", out / "gate.json", *files]

"""`attnbench selftest`: the default suites must catch every built-in mutant, and the torch backend pass.

The mutants (kernels/mutants) are broken backends, one realistic bug each. The self-test walks the
cases of the default CPU suite (`smoke`) in order; on each case it runs the torch backend and every
mutant that supports the op and is not caught yet (the reference is computed once per case), and
records, per mutant, the first case whose row failed while the reference passed. Mutants caught this way had no case written
for them: the suite found them. A mutant that also names `cases` (where its bug must show) is run on
those too, so a regression of a named case is seen even when the suite catches the mutant elsewhere.

The mutation score is caught / total. The self-test passes when every mutant is caught, except those
marked as a known escape (a detection gap, named with its cause and shown as such), and torch passed
every case it ran. A mutant only a GPU can catch (`Mutant.cuda_only`: the CUDA-graph replay check's)
is not run on a CPU and counts there as a known escape, with that reason. A known escape that is caught fails the self-test, like an xpass: remove the mark.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.run.runner import RunOptions

DEFAULT_SUITES = ("smoke",)
# On a GPU the self-test adds `large`: its pools past 2^31 elements are where the int32-offset mutants show
# (no CPU holds them). Smoke runs first, so only the mutants it missed reach those cases.
GPU_SUITES = ("smoke", "large")


@dataclass
class Outcome:
    mutant: str
    bug: str
    case_id: str = ""  # the first case that caught it ("" when none did)
    reason: str = ""  # why that row failed (not caught: the first error it raised, if any)
    cases_run: int = 0  # cases it ran before (and including) the one that caught it
    named_misses: list[str] = field(default_factory=list)  # named cases where it was not caught
    known_escape: str = ""  # why the default suites are known to miss it

    @property
    def caught(self) -> bool:
        return bool(self.case_id) and not self.named_misses

    @property
    def as_expected(self) -> bool:
        """Caught, or a known escape that is still not caught."""
        return self.caught != bool(self.known_escape)


@dataclass
class Report:
    outcomes: list[Outcome]
    reference_backend: str
    reference_failures: list[tuple[str, str, str]]  # (case id, status, reason) where the reference did not pass
    cases_run: int
    suites: tuple[str, ...]

    @property
    def caught(self) -> int:
        return sum(o.caught for o in self.outcomes)

    @property
    def score(self) -> float:
        return self.caught / len(self.outcomes) if self.outcomes else 1.0

    @property
    def known_escapes(self) -> int:
        return sum(bool(o.known_escape) and not o.caught for o in self.outcomes)

    @property
    def ok(self) -> bool:
        return all(o.as_expected for o in self.outcomes) and not self.reference_failures


def _supports(backend, case: Case) -> bool:
    try:
        return not backend.supports(case)
    except Exception:
        return False


REFERENCES = ("torch", "chain")  # the chain backend runs gdn_chain cases (their steps name torch)


def run(
    device: str = "cpu", reference: str | tuple[str, ...] = REFERENCES, suites: tuple[str, ...] | None = None
) -> Report:
    """The session of a sweep of `suites` (attnbench.run.session) with the reference backends, the mutants run
    beside them. `reference`: the backends that must pass, in order: each case is run by the first that
    implements its op (torch for every op; the chain backend for gdn_chain, whose steps the case names).
    No expectations: a mutant's fail must stay a fail, never become a known failure."""
    from attnbench.kernels.mutants import MUTANTS
    from attnbench.run.session import Session
    from attnbench.run.sweep import Selection

    gpu = device.startswith("cuda")
    suites = suites or (GPU_SUITES if gpu else DEFAULT_SUITES)
    names = [reference] if isinstance(reference, str) else list(reference)
    session = Session.open(Selection(suites=tuple(suites), device=device, backends=tuple(names), expect=False))
    refs = [get_backend(r) for r in names]
    outcomes = {m.name: Outcome(m.name, m.bug, known_escape=m.known_escape or ("" if gpu else m.cuda_only))
                for m in MUTANTS}  # fmt: skip
    mutants = {m.name: m.backend() for m in MUTANTS if gpu or not m.cuda_only}  # a CPU cannot catch the others
    failures: list[tuple[str, str, str]] = []
    cases = session.plan.cases
    opts = RunOptions(timing=False)
    n_run = 0
    for case in cases:
        todo = [n for n, o in outcomes.items() if not o.case_id and n in mutants and _supports(mutants[n], case)]
        if not todo:
            continue
        n_run += 1
        good = _reference_for(refs, case)
        rows = session.run_case(case, opts, [good, *(mutants[n] for n in todo)])
        if rows[0].status != "pass":  # a case the reference fails proves nothing about the mutants
            failures.append((case.id, rows[0].status, rows[0].reason))
            continue
        for name, row in zip(todo, rows[1:]):
            o = outcomes[name]
            o.cases_run += 1
            if row.status == "fail":
                o.case_id, o.reason = case.id, row.reason
                mutants[name] = _fresh(MUTANTS, name)  # stateful mutants start clean on named cases
            elif row.status == "error" and not o.reason:  # an error is not a catch; say why it was missed
                o.reason = f"{row.status} (not a catch) on {case.id}: {row.reason}"
        if all(o.case_id for n, o in outcomes.items() if n in mutants):
            break
    for m in MUTANTS:  # named cases: each must still catch its mutant
        for cid in m.cases if m.name in mutants else ():
            case = Case.from_id(cid, device)
            ref_row, bad_row = session.run_case(case, opts, [_reference_for(refs, case), m.backend()])
            if ref_row.status != "pass":
                failures.append((cid, ref_row.status, ref_row.reason))
            if bad_row.status != "fail":
                outcomes[m.name].named_misses.append(f"{cid} ({bad_row.status})")
    names = ", ".join(b.name for b in refs)
    return Report(list(outcomes.values()), names, failures, n_run, tuple(suites))


def _reference_for(refs: list, case: Case):
    """The first reference backend that implements the case's op (the first one when none does: its
    skip row then counts as the reference not passing)."""
    return next((b for b in refs if case.op_name in b.ops), refs[0])


def _fresh(mutants, name: str):
    return next(m for m in mutants if m.name == name).backend()

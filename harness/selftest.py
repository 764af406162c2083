"""`attnbench selftest`: the checks must flag every built-in mutant and pass the correct backends.

Each mutant (kernels/mutants) carries the cases where its bug must show. A mutant that passes any of
them, or a correct backend that fails one, makes the self-test fail.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.runner import RunOptions, run_case


@dataclass
class Outcome:
    mutant: str
    bug: str
    case_id: str
    mutant_status: str
    mutant_reason: str
    reference_backend: str
    reference_status: str

    @property
    def ok(self) -> bool:
        return self.mutant_status == "fail" and self.reference_status == "pass"


def run(device: str = "cpu", reference: str = "torch") -> list[Outcome]:
    from attnbench.kernels.mutants import MUTANTS

    good = get_backend(reference)
    out = []
    for m in MUTANTS:
        for cid in m.cases:
            case = Case.from_id(cid, device)
            bad_row, good_row = run_case(case, [m.backend(), good], RunOptions(timing=False))
            out.append(Outcome(m.name, m.bug, cid, bad_row.status, bad_row.reason, reference, good_row.status))
    return out

"""The closure hooks of harness/backend.py: `finalize` (native layouts converted back after the call,
untimed) and `absent` (outputs a library's kernel does not produce).

Backends here hold the GDN state pool in a transposed layout from `prepare` on (as the FlashInfer,
FLA and SGLang adapters do) or leave out the LSE; the runner must check what `finalize` gives back,
never call it inside the timed window, and record what is absent.
"""

from __future__ import annotations

import dataclasses

from attnbench.backend import Backend
from attnbench.case import Case
from attnbench.kernels.torch import gdn as torch_gdn
from attnbench.kernels.torch.merge import merge_state
from attnbench.run.runner import RunOptions, run_case
from attnbench.run.timing import TimingConfig

GDN_CASE = "gdn_decode/b4-h2x4-d16x16-pad1-fp32"


class _NativeState(Backend):
    """gdn_decode on a K-last copy of the pool made in prepare; `finalize` writes it back."""

    name = "native-state"
    calls: dict[str, int]

    def __init__(self, finalize: bool = True):
        self.with_finalize = finalize
        self.calls = {"run": 0, "finalize": 0}

    def prepare_gdn_decode(self, case, x):
        native = x.state_pool.transpose(-1, -2).contiguous()  # [N, HV, V, K], like SGLang's pool

        def run():
            self.calls["run"] += 1
            # the "kernel" updates the native pool in place (through a canonical-shaped view of it)
            return torch_gdn.gdn_decode(dataclasses.replace(x, state_pool=native.transpose(-1, -2)))

        def finalize(outputs):
            self.calls["finalize"] += 1
            x.state_pool.copy_(native.transpose(-1, -2))
            return outputs

        if self.with_finalize:
            run.finalize = finalize
        return run


def test_finalize_makes_the_native_state_checkable():
    b = _NativeState()
    (row,) = run_case(Case.from_id(GDN_CASE), [b], RunOptions(timing=False))
    assert row.status == "pass", row.reason
    assert b.calls["finalize"] == b.calls["run"] > 0  # every checked call was finalized


def test_without_finalize_the_state_check_fails():
    (row,) = run_case(Case.from_id(GDN_CASE), [_NativeState(finalize=False)], RunOptions(timing=False))
    assert row.status == "fail" and "state_pool" in row.reason


def test_timed_calls_do_not_finalize():
    b = _NativeState()
    cfg = TimingConfig(warmup_s=0.0, warmup_calls=1, min_samples=3, max_samples=3, round_size=3)
    (row,) = run_case(Case.from_id(GDN_CASE), [b], RunOptions(timing=True, timing_config=cfg))
    assert row.status == "pass", row.reason
    assert b.calls["run"] > b.calls["finalize"]  # the timed calls ran the closure alone


class _NoLse(Backend):
    name = "no-lse"

    def __init__(self, declare: bool):
        self.declare = declare

    def prepare_merge_state(self, case, x):
        def run():
            return {"o": merge_state(x)["o"]}

        if self.declare:
            run.absent = {"lse": "this kernel writes no LSE"}
        return run


def test_absent_outputs_are_recorded_not_checked():
    case = Case.from_id("merge_state/t8-h2-d16-fp32")
    (row,) = run_case(case, [_NoLse(declare=True)], RunOptions(timing=False))
    assert row.status == "pass", row.reason
    assert row.prepare_info["absent"] == {"lse": "this kernel writes no LSE"}
    (row,) = run_case(case, [_NoLse(declare=False)], RunOptions(timing=False))
    assert row.status == "error" and "no 'lse'" in row.reason

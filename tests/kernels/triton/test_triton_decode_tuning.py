"""The decode tuner under a split-rule knob: `triton:fill_keys=...` keeps the tuner on, its candidates
planned under the knob's rule and cached apart from the default rule's, so a knob variant differs from
`triton` in the rule alone (h200-session24/split: B64 L1024 ran 78-79 us under every split-rule knob,
the heuristic tile, against the tuned 70.8)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from attnbench.backend import get_backend  # noqa: E402
from attnbench.case import Case  # noqa: E402
from attnbench.kernels.triton import decode as d  # noqa: E402
from attnbench.kernels.triton import tune  # noqa: E402

CASE = "decode/b16-l1024-h32x8-d128-p16-bf16"


@pytest.fixture
def picks(monkeypatch):
    """The tuner as if on a GPU: every pick recorded (key, the splits its first candidate plans), the
    heuristic's candidate kept."""
    seen = []
    monkeypatch.setattr(tune, "enabled", lambda device: True)
    monkeypatch.setattr(d, "TUNE_MIN_WORK", 0)
    monkeypatch.setattr(d, "pdl_supported", lambda device: True)
    plans = []
    monkeypatch.setattr(d, "bind_decode", lambda x, plan: plans.append(plan) or (lambda: None))

    def pick(key, candidates, build):
        build(candidates[0])
        seen.append((key, max(plans[-1].splits)))
        return candidates[0], {"autotune": "recorded"}

    monkeypatch.setattr(tune, "pick", pick)
    return seen


@pytest.mark.parametrize("knobs, splits", [("", 2), ("fill_keys=1024", 1), ("min_split=512,fill_keys=2048", 1)])
def test_a_split_rule_knob_keeps_the_tuner_on_under_its_rule(picks, knobs, splits):
    x = Case.from_id(CASE).make_inputs()
    backend = get_backend(f"triton:{knobs}" if knobs else "triton")
    backend.prepare_decode(Case.from_id(CASE), x)
    assert len(picks) == 1
    key, planned = picks[0]
    assert planned == splits  # planned under the knob's rule (B16 L1024 on ASSUMED_SMS = 132, the merge overlapped)
    rules = [k for k in key if isinstance(k, d.SplitPolicy)]  # the cache key names a rule other than the default
    assert rules == ([backend_policy(knobs)] if knobs else []), key


def backend_policy(knobs: str) -> d.SplitPolicy:
    values = {k: int(v) for k, v in (kv.split("=") for kv in knobs.split(","))}
    if "fill_keys" in values:
        values["fill_keys_overlapped"] = values["fill_keys"]
    return d.SplitPolicy(**values)


def test_a_tiling_knob_still_turns_the_tuner_off(picks):
    x = Case.from_id(CASE).make_inputs()
    get_backend("triton:split_keys=256").prepare_decode(Case.from_id(CASE), x)
    get_backend("triton:block_n=32").prepare_decode(Case.from_id(CASE), x)
    assert picks == []

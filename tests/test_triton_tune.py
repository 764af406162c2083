"""Prepare-time autotuning's choice rule (kernels/triton/tune.py), with the GPU timer replaced."""

from __future__ import annotations

import pytest

from attnbench.kernels.triton import tune


@pytest.fixture
def timed(monkeypatch):
    """Candidate launches are names; `_times_us` returns the us given for each name."""
    speeds: dict[str, float] = {}
    monkeypatch.setattr(tune.torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(tune, "_times_us", lambda fn, reps: [speeds[fn()]] * reps)
    monkeypatch.setattr(tune, "_BEST", {})
    return speeds


def build(name):
    if name == "broken":
        raise RuntimeError("out of shared memory")
    return lambda: name


def test_the_heuristic_choice_survives_near_ties(timed):
    timed.update(default=100.0, other=98.0)  # 2% faster: noise-level, not a reason to switch
    best, info = tune.pick("k1", ["default", "other"], build)
    assert best == "default" and info["autotune_us"] == {"'default'": 100.0, "'other'": 98.0}


def test_a_clearly_faster_config_wins_and_failures_drop_out(timed):
    timed.update(default=100.0, other=90.0)
    best, info = tune.pick("k2", ["default", "broken", "other"], build)
    assert best == "other" and info["autotune_us"]["'broken'"].startswith("RuntimeError: out of shared memory")
    assert tune.pick("k2", ["default", "other"], build) == ("other", {"autotune": "cached"})


def test_a_broken_default_leaves_the_fastest_working_config(timed):
    timed.update(a=50.0, b=40.0)
    assert tune.pick("k3", ["broken", "a", "b"], build)[0] == "b"

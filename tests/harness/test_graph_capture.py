"""A failed CUDA-graph capture must not leave the default CUDA generators marked as capturing
(harness/graph_capture.py). On the CPU machine torch.cuda.graph and the generators are stood in for;
the GPU side is in test_timing_gpu.py (a random op after a failed capture)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from attnbench import graph_capture


class _Gen:
    def __init__(self):
        self.state, self.set_to = object(), None

    def clone_state(self):
        return ("copy of", self.state)

    def graphsafe_set_state(self, state):
        self.set_to = state


@pytest.fixture
def gens(monkeypatch):
    made = [_Gen(), _Gen()]
    monkeypatch.setattr(torch.cuda, "default_generators", tuple(made))
    return made


def _fake_graph(fail_at_exit: bool):
    @contextlib.contextmanager
    def graph(g, **kw):
        yield
        if fail_at_exit:
            raise RuntimeError("operation failed due to a previous error during capture")

    return graph


@pytest.mark.parametrize("where", ["body", "end of capture"])
def test_a_failed_capture_resets_every_default_generator(monkeypatch, gens, where):
    monkeypatch.setattr(torch.cuda, "graph", _fake_graph(fail_at_exit=where != "body"))
    with pytest.raises(RuntimeError):
        with graph_capture.capturing(object()):
            if where == "body":
                raise RuntimeError("operation not permitted when stream is capturing")
    assert [g.set_to for g in gens] == [("copy of", g.state) for g in gens]


def test_a_capture_that_succeeds_leaves_the_generators_alone(monkeypatch, gens):
    monkeypatch.setattr(torch.cuda, "graph", _fake_graph(fail_at_exit=False))
    with graph_capture.capturing(object()):
        pass
    assert all(g.set_to is None for g in gens)

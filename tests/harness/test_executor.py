"""One executor per sweep, chosen once from `Execution`; the plan is immutable; worker messages are records."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from attnbench.case import Case
from attnbench.errors import AttnbenchError
from attnbench.run.executor import Execution, InProcess, Isolated, Sanitized, choose
from attnbench.run.messages import Lost, Ready, RunJob, Stop
from attnbench.run.runner import RunOptions
from attnbench.run.sweep import Selection, plan


@pytest.fixture(scope="module")
def p():
    return plan(Selection(("smoke",), "cpu", ("torch",), ("merge_state",)))


def test_the_executor_is_chosen_once_from_what_the_user_asked(p, tmp_path):
    opts = RunOptions(timing=False)
    args = ("cpu", list(p.backends), opts, {"device": "cpu"}, tmp_path)
    assert isinstance(choose(Execution(isolate=False), *args), InProcess)
    iso = choose(Execution(timeout_s=5.0), *args)
    assert isinstance(iso, Isolated) and iso.devices == ("cpu",) and iso.timeout_s == 5.0
    assert iso.launch.wrapper == () and not iso.launch.fresh_per_job
    san = choose(Execution(sanitize="memcheck", sanitizer="/x/compute-sanitizer"), *args)
    assert isinstance(san, Sanitized) and san.workers.launch.fresh_per_job
    assert san.workers.launch.wrapper[:3] == ("/x/compute-sanitizer", "--tool", "memcheck")
    assert dict(san.workers.launch.env) == {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}
    assert [Execution(isolate=False).mode, Execution().mode, Execution(sanitize="racecheck").mode] == [
        "in-process",
        "isolated",
        "sanitizer",
    ]
    with pytest.raises(AttnbenchError, match="cannot be combined with --no-isolate"):
        Execution(sanitize="memcheck", isolate=False).check()


def test_the_plan_is_immutable(p):
    assert isinstance(p.cases, tuple) and isinstance(p.backends, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.cases = ()
    with pytest.raises(TypeError):
        p.filters["ops"] = ["decode"]
    narrower = dataclasses.replace(p, cases=p.cases[:1])
    assert len(narrower.cases) == 1 and len(p.cases) > 1


def test_worker_messages_are_small_picklable_records(p):
    job = RunJob(p.cases[0], ("torch",), RunOptions(timing=False))
    again = pickle.loads(pickle.dumps(job))
    assert again == job and isinstance(again.case, Case)
    assert pickle.loads(pickle.dumps(Ready(1, ("a plugin did not load",)))) == Ready(1, ("a plugin did not load",))
    assert pickle.loads(pickle.dumps(Stop())) == Stop()
    assert pickle.loads(pickle.dumps(Lost("timing", ("a", "b")))).alone == ("a", "b")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.backends = ()

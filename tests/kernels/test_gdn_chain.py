"""gdn_chain (docs/chain.md): one state pool, several ops by several backends, checked after every step.

- smoke's chains (torch steps, pools kv and vk) pass; a chain of torch and triton steps (the interpreter
  on a CPU) and one of SGLang's Triton kernels (vk) with torch pass where those are installed.
- a pool handed raw to a backend of the other layout fails at that step (what the chain exposes).
- the chain mutants pass every per-op smoke case of the ops they implement and fail the chain.
- ids round-trip, steps are validated with one-line errors, and limits name the step.
"""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from attnbench.backend import all_backends, get_backend, load_builtin
from attnbench.case import Case
from attnbench.kernels.mutants.chain import CHAIN_MUTANTS, chain_with
from attnbench.ops.gdn_chain import ChainParams
from attnbench.plan.suite import load
from attnbench.run.runner import RunOptions, run_case

load_builtin()
OPTS = RunOptions(timing=False)
CHAINS = [c for c in load("smoke", "cpu").cases if c.op_name == "gdn_chain"]


def _chain(steps: str, **kw) -> Case:
    params = {"batch": 4, "pad": 1, "head_dim_k": 32, "head_dim_v": 16, "seq_len": 20} | kw
    return Case("gdn_chain", ChainParams(steps=steps, **params), kw.pop("dtype", "bf16"))


def _run(case: Case, backend=None):
    return run_case(case, [backend or get_backend("chain")], OPTS)[0]


def test_smoke_has_chains_over_both_layouts():
    assert {c.params.layout for c in CHAINS} == {"kv", "vk"}


@pytest.mark.parametrize("case", CHAINS[:4], ids=lambda c: c.id)
def test_torch_chains_pass(case):
    row = _run(case)
    assert row.status == "pass", row.reason
    steps = row.prepare_info["steps"]
    assert len(steps) == len(case.params.parsed)
    want = "the pool itself" if case.params.layout == "kv" else "converted vk -> kv -> vk"
    assert all(want in s for s in steps), steps


def test_raw_handoff_of_the_other_layout_fails_at_the_first_step():
    row = _run(_chain("extend@torch > decode@torch", layout="vk", handoff="raw"))
    assert row.status == "fail"
    assert row.reason.startswith("o@1:"), row.reason
    assert "memory as it is" in row.prepare_info["steps"][0]


def test_ids_round_trip_and_normalise():
    case = _chain("extend@sglang-cute>decode@torch", layout="vk")
    assert case.params.steps == "gdn_extend@sglang-cute > gdn_decode@torch"
    assert "extend@sglang.cute" in case.id
    assert Case.from_id(case.id) == case


@pytest.mark.parametrize(
    "steps, message",
    [
        ("decode@torch > commit@torch", "a commit directly follows a verify"),
        ("prefill@torch", "write OP@BACKEND"),
        ("decode@triton:splits=2", "write OP@BACKEND"),
    ],
)
def test_bad_steps_are_one_line_errors(steps, message):
    with pytest.raises(ValidationError, match=message):
        ChainParams(steps=steps)


def test_limits_name_the_step():
    chain = get_backend("chain")
    assert "step 2 (gdn_decode@nosuch)" in chain.supports(_chain("extend@torch > decode@nosuch"))
    assert "step 1 (gdn_extend@sglang-cute): sglang-cute has no gdn_extend kernel" in chain.supports(
        _chain("extend@sglang-cute")
    )


def test_every_gdn_state_implementation_declares_its_layout():
    for b in all_backends().values():
        for op in ("gdn_extend", "gdn_decode", "gdn_verify", "gdn_commit"):
            if op in b.implementations and b.name != "chain":
                assert b.state_layout(op) in ("kv", "vk"), f"{b.name} {op}"


PER_OP = [c for c in load("smoke", "cpu").cases if c.op_name in ("gdn_extend", "gdn_decode", "gdn_verify")]


@pytest.mark.parametrize("name, bug, stand_in", CHAIN_MUTANTS, ids=[m[0] for m in CHAIN_MUTANTS])
def test_chain_mutants_pass_per_op_and_fail_the_chain(name, bug, stand_in):
    b = stand_in()
    for case in PER_OP[::7]:  # a spread of smoke's per-op cases: the checks cannot tell
        row = run_case(case, [b], OPTS)[0]
        assert row.status in ("pass", "xfail"), f"{case.id}: {row.status} {row.reason}"
    caught = [c.id for c in CHAINS[:4] if _run(c, chain_with(name, stand_in())).status == "fail"]
    assert caught, f"{name}: no smoke chain caught it"


TRITON = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1 on a CPU")


@TRITON
@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_torch_and_triton_share_a_pool(layout):
    if why := get_backend("triton").available():
        pytest.skip(why)
    row = _run(_chain("extend@triton > decode@torch > verify@triton > commit@triton > decode@triton", layout=layout))
    assert row.status == "pass", row.reason


@TRITON
@pytest.mark.parametrize("layout, status", [("kv", "fail"), ("vk", "pass")])
def test_triton_family_on_one_k_last_pool(layout, status):
    """Our four GDN state kernels over one K-last pool handed raw, as a server keeps one pool: the
    default (canonical addressing) fails at the first step, `gdn_layout=vk` (K-last) passes every step."""
    from attnbench.kernels.chain import ChainBackend

    chain = ChainBackend()
    chain.substitutes = {"triton": get_backend(f"triton:gdn_layout={layout}")}
    case = _chain("extend@triton > decode@triton > verify@triton > commit@triton > decode@triton", layout="vk",
                  handoff="raw")  # fmt: skip
    row = _run(case, chain)
    assert row.status == status, row.reason
    if status == "pass":
        assert all("the pool itself" in s for s in row.prepare_info["steps"]), row.prepare_info["steps"]
    else:
        assert row.reason.startswith("o@1:"), row.reason


@TRITON
def test_sglang_triton_kernels_on_their_own_layout():
    sg = get_backend("sglang")
    if why := sg.available():
        pytest.skip(why)
    # no extend@sglang here: SGLang's chunked extend asks torch.cpu for a device under the interpreter
    # (GPU only, tests/kernels/sglang/test_sglang_interpreter.py); suites/chain.yaml runs it on the GPU
    row = _run(_chain("extend@torch > decode@sglang > verify@sglang > commit@torch > decode@torch", layout="vk"))
    assert row.status == "pass", row.reason
    assert "the pool itself" in row.prepare_info["steps"][1]

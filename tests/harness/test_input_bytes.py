"""`Op.input_bytes` (what `--dry-run` sizes cases by) against the tensors `make_inputs` really builds."""

from __future__ import annotations

import pytest

from attnbench.buffers import storage_bytes
from attnbench.case import Case
from attnbench.ops import OPS
from attnbench.plan.suite import load


def _smoke_cases():
    by_op: dict[str, list] = {}
    for c in load("smoke").cases:
        by_op.setdefault(c.op.name, []).append(c)
    return by_op


SMOKE = _smoke_cases()


def test_every_op_has_smoke_cases_to_check():
    assert set(SMOKE) == set(OPS), set(OPS) ^ set(SMOKE)


@pytest.mark.parametrize("op", sorted(SMOKE))
def test_input_bytes_match_the_built_inputs(op):
    """Exact, byte for byte, for every smoke case of the op (pairwise over its parameters)."""
    for case in SMOKE[op]:
        built = storage_bytes(case.make_inputs())
        estimate = case.op.input_bytes(case.params, case.torch_dtype, case.seed)
        assert estimate == built, f"{case.id}: input_bytes {estimate} B, built {built} B"


def test_input_bytes_scale_without_building():
    """A case far too large to build here is sized from its parameters alone (no tensor is made)."""
    case = Case.from_id("decode/b4096-l131072-h64x8-d128-p16-bf16")
    est = case.op.input_bytes(case.params, case.torch_dtype, case.seed)
    kv = 4096 * 131072 * 8 * 128 * 2 * 2  # keys and values, bf16
    assert kv <= est <= 1.2 * kv

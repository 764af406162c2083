"""Case ids are short (no long floats) and re-create their case exactly."""

from __future__ import annotations

import re

from attnbench.case import Case
from attnbench.plan.suite import builtin_names, load
from attnbench.plan.trace import case_from_id


def test_every_builtin_case_id_is_short_and_recreates_the_same_case():
    for name in builtin_names():
        for c in load(name, "cuda").cases:  # listing only: nothing runs
            assert not re.search(r"\d\.\d{7,}", c.id), c.id
            again = case_from_id(c.id, "cuda")  # a replayed batch's id resolves through the built-in traces
            assert (again.op_name, again.params, again.dtype, again.seed) == (c.op_name, c.params, c.dtype, c.seed)


def test_a_long_float_parameter_is_kept_to_six_significant_digits():
    case = Case.from_id("decode/b1-l1024-h128x1-d576x512-p64-mla-bf16")
    long = Case(case.op_name, case.params.model_copy(update={"sm_scale": (128 + 64) ** -0.5 * 1.3689**2}))
    assert "scale0.135236-" in long.id  # not scale0.13523275...
    assert Case.from_id(long.id).params == long.params
    assert long.params.sm_scale == 0.135236

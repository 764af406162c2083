"""One declared implementation per (backend, op): `@implements` records the prepare method with its
limits and JIT keys, and `supports()`, `limits()`, `jit_keys()` and `precompile_keys()` read it."""

from __future__ import annotations

import pytest

from attnbench import Backend, Case
from attnbench.backend import all_of, implements

DECODE = Case.from_id("decode/b1-l8-h4x4-d64-p16-bf16")
DECODE_128 = Case.from_id("decode/b1-l8-h4x4-d128-p16-bf16")
MERGE = Case.from_id("merge_state/t8-h2-d16-bf16")


def _d64_only(backend, case):
    return None if case.params.head_dim == 64 else f"head_dim {case.params.head_dim}: 64 only"


class Declared(Backend):
    name = "declared"

    @implements("decode", "extend", limits=_d64_only, jit_keys=lambda b, c: [("attn", c.params.head_dim)])
    def prepare_attention(self, case, x):
        return lambda: {"o": "ran " + case.op_name}


def test_the_declaration_is_what_supports_and_precompile_read():
    b = Declared()
    assert b.ops == {"decode", "extend"}
    assert b.supports(DECODE) is None
    assert b.supports(DECODE_128) == "head_dim 128: 64 only" == b.limits(DECODE_128)
    assert b.supports(MERGE) == "declared has no merge_state kernel"
    assert b.precompile_keys([DECODE, DECODE]) == [("attn", 64), ("attn", 64)]
    assert b.jit_keys(MERGE) == []
    assert b.prepare(DECODE, None)() == {"o": "ran decode"}


def test_backend_limits_come_first_and_machine_limits_before_them():
    class OnCuda(Declared):
        backend_limits = staticmethod(lambda b, c: None if c.on_cuda else "CUDA cases only")

    assert OnCuda().supports(DECODE_128) == "CUDA cases only"

    class Missing(OnCuda):
        def available(self):
            return "libfoo not installed"

    assert Missing().supports(DECODE) == "libfoo not installed"
    assert Missing().limits(DECODE) == "CUDA cases only"  # limits: the case alone, no machine


def test_a_plain_prepare_method_still_declares_its_op():
    class Plugin(Backend):
        def prepare_merge_state(self, case, x):
            return lambda: {"o": 1}

    assert Plugin().ops == {"merge_state"} and Plugin().supports(MERGE) is None


def test_the_most_derived_declaration_wins():
    class Narrower(Declared):
        @implements("decode", limits=lambda b, c: "not today")
        def prepare_decode(self, case, x):
            return lambda: {}

    b = Narrower()
    assert b.supports(DECODE) == "not today"
    assert b.implementations["extend"].method == "prepare_attention"


def test_an_unknown_op_is_an_error_when_the_class_is_defined():
    with pytest.raises(TypeError, match="names no op"):

        class Typo(Backend):
            @implements("decoed")
            def prepare_decoed(self, case, x):
                return lambda: {}


def test_all_of_returns_the_first_reason():
    rule = all_of(lambda b, c: None, lambda b, c: "second", lambda b, c: "third")
    assert rule(None, DECODE) == "second"
    assert all_of(lambda b, c: None)(None, DECODE) is None

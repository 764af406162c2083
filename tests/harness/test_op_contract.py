"""The Op base refuses, when the class is defined, a concrete op (one with a `name`) that lacks a hook:
a missing hook is an import error, not error rows at run time."""

from __future__ import annotations

import pytest

from attnbench.ops import OPS, Op
from attnbench.ops.attention import MergeStateOp


def test_every_registered_op_defines_every_hook():
    for op in OPS.values():
        for hook in ("build_inputs", "expected", "perturbations"):
            assert getattr(type(op), hook) is not getattr(Op, hook), (op.name, hook)


def test_a_missing_method_is_an_error_at_class_definition():
    with pytest.raises(TypeError, match=r"op 'half' .* lacks input_bytes\(\), perturbations\(\)"):

        class Half(Op):
            name = "half"
            family = "attention"
            Params = MergeStateOp.Params
            id_fields = ()
            outputs = {}

            def build_inputs(self, p, dtype, seed, device):
                return None

            def expected(self, p, inputs, precision):
                return {}


def test_a_missing_attribute_is_an_error_and_shared_bases_are_not_checked():
    class Shared(Op):  # no name: a base for ops of one family
        family = "attention"

    with pytest.raises(TypeError, match="lacks Params, id_fields, outputs"):

        class NoSchema(Shared):
            name = "no-schema"

            def build_inputs(self, p, dtype, seed, device):
                return None

            def expected(self, p, inputs, precision):
                return {}

            def perturbations(self, p):
                return ()

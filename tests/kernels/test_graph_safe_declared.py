"""Every built-in backend says whether its closures of the ops a server captures in CUDA graphs (decode,
MLA decode included, gdn_decode, gdn_verify: `Op.graph_captured`) may be replayed on another batch
(docs/replay.md): True, or why not. An undeclared one would be a silent `skip: not declared graph-safe`
in every replay sweep."""

from __future__ import annotations

from attnbench.backend import all_backends, load_builtin
from attnbench.ops import OPS


def test_every_built_in_graph_captured_op_is_declared():
    load_builtin()
    captured = {name for name, op in OPS.items() if getattr(op, "graph_captured", False)}
    assert {"decode", "gdn_decode", "gdn_verify"} <= captured
    undeclared = []
    for name, backend in all_backends().items():
        for op, impl in backend.implementations.items():
            if op in captured and not (
                impl.graph_safe is True or isinstance(impl.graph_safe, str) or callable(impl.graph_safe)
            ):
                undeclared.append(f"{name}: {op}")
    assert not undeclared, undeclared


def test_reasons_are_sentences_not_placeholders():
    load_builtin()
    for name, backend in all_backends().items():
        for op, impl in backend.implementations.items():
            if isinstance(impl.graph_safe, str):
                assert len(impl.graph_safe) > 30, (name, op, impl.graph_safe)

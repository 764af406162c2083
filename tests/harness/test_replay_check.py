"""The CUDA-graph replay check (harness/check/replay.py, docs/replay.md) on a CPU, through the stand-in graph.

The stand-in runs the same sequence as a CUDA graph (capture on batch A, batch B written in place,
replay, compare with B's float64 reference); what a closure took on the host at prepare stays frozen,
as in a graph. The GPU half is tests/harness/test_replay_gpu.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attnbench.backend import Backend, get_backend, implements
from attnbench.buffers import bitwise_equal, tensor_fields
from attnbench.case import Case
from attnbench.check.checklist import CHECKS, OutputsCheck, ReplayCheck
from attnbench.check.replay import StandInGraph
from attnbench.kernels.mutants.replay import BakedLengthDecode, GraphSafeDecode
from attnbench.kernels.torch import gdn as torch_gdn
from attnbench.ops.replay_batches import other_lengths, same_shapes
from attnbench.run.runner import RunOptions, run_case

STAND_IN = tuple(c for c in CHECKS if c.name != "replay") + (ReplayCheck(StandInGraph),)
DECODES = (
    "decode/b3-l37-mixed-h8x2-d128-p16-bf16",
    "decode/b3-l70-skewed-h8x2-d64-p16-sink-bf16",
    "decode/b3-l70-mixed-h8x2-d64-p16-swa7-bf16",
    "decode/b2-l40-h16x1-d576x512-p16-mla-scale0.1352337788608801-bf16",
    "decode/b4-l50-mixed-h4x2-d32-p16-cap5-fp8_e4m3-fp16",
    "decode/b3-l33-mixed-h4x2-d32-p8-pages400-fp32",
)


def _rows(case_id, backends, checks=STAND_IN, **opts):
    return run_case(Case.from_id(case_id, "cpu"), backends, RunOptions(timing=False, checks=checks, **opts))


@pytest.mark.parametrize(
    "lens,page", [([22, 37, 37], 16), ([4, 4, 70], 16), ([40], 16), ([1, 1, 1], 1), ([5, 60, 70], 16), ([9, 3], 4)]
)
def test_other_lengths_keep_the_pages_and_grow_the_longest(lens, page):
    out = other_lengths(lens, page)
    pages = lambda ls: sum(-(-n // page) for n in ls)  # noqa: E731
    assert len(out) == len(lens) and min(out) >= 1
    assert pages(out) == pages(lens)
    if lens != [1, 1, 1]:
        assert max(out) > max(lens), (lens, out)
    assert out != lens or len(set(lens)) == 1


@pytest.mark.parametrize(
    "case_id",
    [
        *DECODES,
        "gdn_decode/b5-h2x4-d16x16-packed-bf16",
        "gdn_decode/b3-h2x4-d16x16-pad2-fp32",
        "gdn_verify/b5-t3-h2x4-d16x16-tree-pad1-fp32",
        "gdn_verify/b2-t3-h2x4-d16x16-slots40-bf16",
    ],
)
def test_batch_b_fits_batch_a_and_differs_where_a_server_rewrites(case_id):
    case = Case.from_id(case_id, "cpu")
    x = case.make_inputs()
    got = case.op.replay_batch(case.params, x, case.torch_dtype, case.seed)
    assert not isinstance(got, str), got
    pb, b = got
    assert same_shapes(x, b) is None
    fa, fb = tensor_fields(x), tensor_fields(b)
    for name in case.op.held:  # model weights stay the layer's
        if case.op.held[name].startswith("model weights") and name in fa:
            assert torch.equal(fa[name], fb[name]), name
    if case.op.name == "decode":
        assert max(b.seq_lens_host) > max(x.seq_lens_host)
        assert b.seq_lens.tolist() == list(b.seq_lens_host) == list(pb.kv_lens)
        assert not torch.equal(x.kv_page_indices, b.kv_page_indices)
    else:
        assert int((b.state_indices < 0).sum()) >= 1  # a padding request
        assert not torch.equal(x.state_indices, b.state_indices)
        assert bool(bitwise_equal(x.state_pool, b.state_pool).all())  # the pool as A's calls left it


@pytest.mark.parametrize("case_id", DECODES)
def test_a_decode_that_baked_its_longest_length_fails_replay_and_the_capacity_one_passes(case_id):
    good, bad = _rows(case_id, [GraphSafeDecode(), BakedLengthDecode()])
    assert (good.status, good.replay) == ("pass", "pass"), good.reason
    assert (bad.status, bad.replay) == ("fail", "fail"), bad.reason
    assert bad.reason.startswith("replay: captured on one batch, replayed on another of the same shapes (lengths")
    assert bad.failed and all(f.startswith("replay:") for f in bad.failed)  # what failed on batch B
    assert "replay:o" in bad.failed, bad.failed
    assert "check_parts" in bad.model_fields_set or bad.check_parts.get("replay") is not None


def test_the_mutant_passes_every_other_check():
    """Only the replay check catches it: with the default checks on a CPU (replay skipped) it passes."""
    for case_id in DECODES:
        (row,) = _rows(case_id, [BakedLengthDecode()], checks=None, invariance=True)
        assert row.status == "pass", (case_id, row.reason)
        assert row.replay == "skip: no CUDA graphs on cpu"
        assert row.deterministic is True  # (batch invariance is recorded, not required: its sums vary with the keys)


def test_declarations_skip_with_their_reason():
    case_id = DECODES[0]
    (torch_row,) = _rows(case_id, [get_backend("torch")])
    assert torch_row.status == "pass"
    assert torch_row.replay.startswith("skip: not graph-safe: gathers each request's keys by the batch's host-side")

    class Undeclared(Backend):
        name = "undeclared-decode"

        def prepare_decode(self, case, x):
            return get_backend("torch").prepare(case, x)

    (row,) = _rows(case_id, [Undeclared()])
    assert (row.status, row.replay) == ("pass", "skip: not declared graph-safe")
    (off,) = _rows(case_id, [BakedLengthDecode()], replay=False)
    assert (off.status, off.replay) == ("pass", "skip: off (--no-replay)")


def test_ops_servers_do_not_capture_record_nothing():
    (row,) = _rows("extend/b2-q7-pre19-h4x2-d64-p16-bf16", [get_backend("torch")])
    assert row.status == "pass" and "replay" not in row.check_parts and getattr(row, "replay", None) is None


class _BakedSlots(Backend):
    """gdn_verify that reads the state slots as they were at prepare (declared graph-safe: wrongly)."""

    name = "gdn-verify-baked-slots"

    @implements("gdn_verify", graph_safe=True)
    def prepare_gdn_verify(self, case, x):
        frozen = dataclasses.replace(x, state_indices=x.state_indices.clone())
        return lambda: torch_gdn.gdn_verify(frozen)


def test_gdn_verify_replays_other_slots_and_padding():
    case_id = "gdn_verify/b5-t3-h2x4-d16x16-tree-pad1-fp32"
    checks = (OutputsCheck(), ReplayCheck(StandInGraph))
    good, bad = _rows(case_id, [get_backend("torch"), _BakedSlots()], checks=checks)
    assert (good.status, good.replay) == ("pass", "pass"), good.reason
    assert (bad.status, bad.replay) == ("fail", "fail"), bad.reason
    assert "(slots [" in bad.reason and "-1" in bad.reason.split("->")[1]


def test_gdn_decode_pool_moves_on_through_the_replay():
    """An op that writes its pool: batch B starts from the pool the warm-up call left, and the replay's
    writes are checked (a graph-safe torch-like decode writing with index_put, no boolean mask)."""

    case_id = "gdn_decode/b5-h2x4-d16x16-packed-bf16"
    (row,) = _rows(case_id, [_IndexedDecode()])
    assert (row.status, row.replay) == ("pass", "pass"), row.reason


@pytest.mark.parametrize(
    "flag,outcome", [(None, "skip: no CUDA graphs on cpu"), ("--no-replay", "skip: off (--no-replay)")]
)
def test_sweep_records_the_outcome_in_rows_and_results_csv(tmp_path, flag, outcome):
    import csv
    import json

    from typer.testing import CliRunner

    from attnbench.cli.app import app

    plugin = tmp_path / "graph_safe_plugin.py"
    plugin.write_text(
        "from attnbench.backend import register_backend\n"
        "from attnbench.kernels.mutants.replay import GraphSafeDecode\n"
        "register_backend('graph-safe-decode-plugin')(type('P', (GraphSafeDecode,), {}))\n"
    )
    out = tmp_path / "run"
    args = ["sweep", "--device", "cpu", "--no-isolate", "--plugin", str(plugin), "-b", "graph-safe-decode-plugin",
            "--case", DECODES[0], "--out", str(out), *([flag] if flag else [])]  # fmt: skip
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output[-2000:]
    (row,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert row["replay"] == outcome
    (csv_row,) = list(csv.DictReader((out / "results.csv").open()))
    assert csv_row["replay"] == outcome


def test_what_changed_names_long_slot_lists_by_their_start_and_length():
    """A 256-request batch's slots would bury the replay's problem (the message's point) under 2 KB."""
    from types import SimpleNamespace

    from attnbench.check.replay import what_changed

    a = SimpleNamespace(state_indices=torch.arange(256))
    b = SimpleNamespace(state_indices=torch.arange(256).flip(0))
    said = what_changed(a, b)
    assert said == "slots [0, 1, 2, 3, 4, 5, … (256 in all)] -> [255, 254, 253, 252, 251, 250, … (256 in all)]"
    short = SimpleNamespace(seq_lens_host=(3, 5)), SimpleNamespace(seq_lens_host=(7, 5))
    assert what_changed(*short) == "lengths [3, 5] -> [7, 5]"


class _IndexedDecode(Backend):
    """A graph-safe torch-like gdn_decode writing its pool with index_put (no boolean mask, no host sync);
    `frozen_slots`: the slots are a copy taken at prepare (a replay on batch B's slots misses them)."""

    name = "gdn-decode-indexed"
    frozen_slots = False

    @implements("gdn_decode", graph_safe=True)
    def prepare_gdn_decode(self, case, x):
        slots = x.state_indices.clone() if self.frozen_slots else x.state_indices

        def run():
            HV = x.v.shape[1]
            g, beta = torch_gdn._gates(x.A_log, x.a, x.dt_bias, x.b)
            qh, kh = torch_gdn._norm_qk(x.q, x.k, HV, x.scale)
            S, valid = torch_gdn._load_states(x.state_pool, slots)
            S, o = torch_gdn._step(S, qh, kh, x.v.float(), g, beta)
            x.o.copy_(o)
            idx = slots.long()
            keep = x.state_pool[idx.clamp(min=0)]
            x.state_pool[idx.clamp(min=0)] = torch.where(valid[:, None, None, None], S, keep)
            return {"o": x.o}

        return run


def test_batch_b_is_drawn_once_per_case_and_each_row_keeps_its_own_pool(monkeypatch):
    """gdn_decode writes its pool: B is drawn once for the case (slots, data, gates depend on the case
    alone), each row's B takes the pool from its own inputs (`Op.replay_kept`), and a row whose B is
    bitwise the first row's reuses its float64 expectation. A closure with baked slots still fails."""
    from attnbench.ops.gdn.delta import GDNDecodeOp

    again = type("Again", (_IndexedDecode,), {"name": "gdn-decode-again"})()
    baked = type("Baked", (_IndexedDecode,), {"name": "gdn-decode-baked-slots", "frozen_slots": True})()

    class NudgedPool(_IndexedDecode):
        name = "gdn-decode-nudged-pool"

        @implements("gdn_decode", graph_safe=True)
        def prepare_gdn_decode(self, case, x):
            x.state_pool.view(torch.uint8).view(-1)[::4].bitwise_xor_(1)  # its pool is not the others'
            return super().prepare_gdn_decode(case, x)

    draws, refs = [], []
    real_draw, real_expected = GDNDecodeOp.replay_batch, GDNDecodeOp.expected
    monkeypatch.setattr(GDNDecodeOp, "replay_batch", lambda self, *a: draws.append(1) or real_draw(self, *a))
    monkeypatch.setattr(GDNDecodeOp, "expected", lambda self, p, x, d: refs.append(d) or real_expected(self, p, x, d))
    case_id = "gdn_decode/b5-h2x4-d16x16-packed-bf16"
    checks = (OutputsCheck(), ReplayCheck(StandInGraph))
    good, bad, same, nudged = _rows(case_id, [_IndexedDecode(), baked, again, NudgedPool()], checks=checks)
    assert (good.status, good.replay) == ("pass", "pass"), good.reason
    assert (bad.status, bad.replay) == ("fail", "fail"), bad.reason
    assert (same.status, same.replay) == ("pass", "pass"), same.reason
    assert len(draws) == 1
    # the case's reference and twin, B's for the first row (the baked and the second row's calls left
    # the pool bitwise as the first row's did), B's for the row whose pool differs
    assert len(refs) == 2 + 2 + 2 and nudged.replay in ("pass", "fail")


def test_batch_b_reference_of_an_op_that_writes_nothing_comes_from_the_reference_cache(monkeypatch, tmp_path):
    """Decode writes nothing: B is a function of the case alone, so its float64 reference and twin are kept
    in the reference cache (variant "replay batch B"): a second run computes none, with the same outcomes,
    the mutant that baked its longest length still failing."""
    from attnbench.ops.attention.op import DecodeOp

    refs: list = []
    real = DecodeOp.expected
    monkeypatch.setattr(DecodeOp, "expected", lambda self, p, x, d: refs.append(d) or real(self, p, x, d))
    backends = [GraphSafeDecode(), BakedLengthDecode()]
    runs = []
    for _ in range(2):
        refs.clear()
        rows = _rows(DECODES[0], backends, checks=(OutputsCheck(), ReplayCheck(StandInGraph)), ref_cache=str(tmp_path))
        runs.append(([(r.status, r.replay) for r in rows], len(refs)))
    assert runs[0][0] == runs[1][0] == [("pass", "pass"), ("fail", "fail")], runs
    assert runs[0][1] == 2 + 2  # the case's own, and B's
    assert runs[1][1] == 0, runs  # both from the cache


def test_rows_sharing_batch_b_compute_what_its_comparison_takes_from_b_reference_once(monkeypatch):
    """A later row whose B is the first row's (bitwise the same pool) reuses what comparing with B's
    reference takes from the reference alone (`checks.reference_side`, the written pool's untouched
    mask), as the outputs check does for the case's own reference: a second such row computes none."""
    from attnbench.check import checks

    made = []
    for name in ("reference_side", "_written_side"):
        real = getattr(checks, name)
        monkeypatch.setattr(checks, name, lambda *a, _real=real, **k: made.append(1) or _real(*a, **k))
    again = type("Again", (_IndexedDecode,), {"name": "gdn-decode-again"})()
    case_id = "gdn_decode/b5-h2x4-d16x16-packed-bf16"
    checks_ = (OutputsCheck(), ReplayCheck(StandInGraph))
    (one,) = _rows(case_id, [_IndexedDecode()], checks=checks_)
    alone = len(made)
    made.clear()
    first, second = _rows(case_id, [_IndexedDecode(), again], checks=checks_)
    assert (one.replay, first.replay, second.replay) == ("pass", "pass", "pass")
    assert first.metrics == one.metrics and second.metrics == one.metrics
    assert alone > 0 and len(made) == alone  # the second row: neither the case's nor B's computed again


@pytest.mark.parametrize(
    "graph,replay,max_bytes",
    [(StandInGraph, True, None), (None, True, None), (StandInGraph, False, None), (StandInGraph, True, 0)],
    ids=["stand-in", "no-graph-on-cpu", "no-replay", "over-the-size-cap"],
)
@pytest.mark.parametrize(
    "case_id,backend",
    [
        (DECODES[0], GraphSafeDecode),
        ("gdn_decode/b5-h2x4-d16x16-packed-bf16", _IndexedDecode),
        ("extend/b2-q7-pre19-h4x2-d64-p16-bf16", lambda: get_backend("torch")),
    ],
    ids=["decode", "gdn_decode-writes", "extend-not-captured"],
)
def test_what_the_runner_prepares_ahead_follows_whether_the_check_replays(
    monkeypatch, graph, replay, max_bytes, case_id, backend
):
    """`ReplayCheck.build_ahead` (batch B from the CPU inputs) and `reference_variants` (B's cache entry,
    an op that writes nothing) prepare for a replay exactly where the check then replays the row; the
    entry is named before the inputs exist, so past the size cap it is still named (a miss costs nothing)."""
    from attnbench.check import replay as replay_mod
    from attnbench.check.replay import REPLAY_VARIANT

    if max_bytes is not None:
        monkeypatch.setattr(replay_mod, "REPLAY_MAX_BYTES", max_bytes)  # the one place the cap is read
    check = ReplayCheck(graph)
    case = Case.from_id(case_id, "cpu")
    opts = RunOptions(timing=False, checks=(OutputsCheck(), check), replay=replay)
    (row,) = run_case(case, [backend()], opts)
    outcome = getattr(row, "replay", None)  # None: an op servers do not capture records none
    replays = outcome in ("pass", "fail")
    over_cap = (outcome or "").startswith("skip: inputs of")
    assert replays == (graph is not None and replay and max_bytes is None and case.op.graph_captured), outcome
    cpu = case.op.build_inputs(case.params, case.torch_dtype, case.seed, torch.device("cpu"))
    assert (check.build_ahead(case, cpu, opts) is not None) == replays
    pure = not case.op.writes_for(case.params)
    assert check.reference_variants(case, opts) == ((REPLAY_VARIANT,) if (replays or over_cap) and pure else ())

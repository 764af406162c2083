"""SGLang's other extend kernels as backends, under TRITON_INTERPRET=1 on tiny cases:

- `sglang-unified`: `build_unified_kv_indices` + `extend_attention_fwd_unified`, the extend SGLang's
  Triton backend runs when deterministic inference is on (`_forward_extend_unified`);
- `sglang-prefill`: `prefill_attention.context_attention_fwd` (extend without a prefix).

Every row goes through the harness (`run_one`): float64 verdicts, untouched inputs, canaries, stale
outputs. fp16/fp32 cases, as in test_sglang_interpreter.py. The limit tests need no sglang; the
kernel tests skip with the reason where sglang is not installed (tools/install-deployed.sh sglang).
"""

from __future__ import annotations

import pytest

from attnbench.backend import get_backend
from attnbench.case import Case
from attnbench.run.runner import RunOptions, run_case
from helpers import KERNEL, KERNEL_REPEATS, run_one
from kernel_only import watch_kernels
from sglang_env import sglang_backend_or_skip


def _backend(name):
    return sglang_backend_or_skip(name)


@pytest.fixture(scope="module")
def unified():
    return _backend("sglang-unified")


@pytest.fixture(scope="module")
def prefill():
    return _backend("sglang-prefill")


# ---- what each declares (the case alone decides; no sglang needed) --------------------------------
@pytest.mark.parametrize(
    "backend, case_id, reason",
    [
        ("sglang-unified", "extend/b2-q6-pre5-h4x2-d16-p4-kvattend-fp16", "reads the new tokens from the cache"),
        ("sglang-unified", "extend/b2-q6-pre5-h4x2-d16-p4-swa0-fp16", "sliding_window_size 0"),
        ("sglang-unified", "extend/b2-q6-pre5-h4x2-d16-p4-fp8_e4m3-kvscalehead-fp16", "one k and one v scale"),
        ("sglang-prefill", "extend/b2-q6-pre5-h4x2-d16-p4-fp16", "prefix must be 0"),
        ("sglang-prefill", "extend/b2-q6-pre5-mixed-h4x2-d16-p4-kvattend-fp16", "prefix must be 0"),
        ("sglang-prefill", "extend/b2-q6-pre0-h4x2-d16-p4-kvshared-fp16", "new_kv shared"),
        ("sglang-prefill", "extend/b2-q6-pre0-h4x2-d16-p4-custom-fp16", "no custom masks"),
        ("sglang-prefill", "extend/b2-q6-pre0-h4x2-d16-p4-swa5-fp16", "no sliding window"),
        ("sglang-prefill", "extend/b2-q6-pre0-h4x2-d16-p4-cap5-fp16", "no soft cap"),
        ("sglang-prefill", "extend/b2-q6-pre0-h4x2-d16-p4-sink-fp16", "no sinks"),
        ("sglang-prefill", "extend/b2-q6-pre0-h4x2-d16x8-p4-fp16", "one head dim"),
        ("sglang-prefill", "extend/b2-q6-pre0-h4x2-d16-p4-scale0.5-fp16", "fixed at head_dim ** -0.5"),
    ],
)
def test_limits_say_why(backend, case_id, reason):
    why = get_backend(backend).limits(Case.from_id(case_id, "cuda"))
    assert why is not None and reason in why, why


@pytest.mark.parametrize(
    "backend, case_id",
    [
        ("sglang-unified", "extend/b2-q6-pre5-h4x2-d16-p4-kvshared-fp16"),
        ("sglang-unified", "extend/b2-q6-pre21-h4x2-d16-p1-custom-swa6-poolswa-fp16"),
        ("sglang-unified", "extend/b2-q5-pre9-h4x1-d576x512-p1-mla-fp16"),
        ("sglang-prefill", "extend/b2-q6-pre0-mixed-h4x2-d16-p4-kvattend-fp16"),
        ("sglang-prefill", "extend/b2-q6-pre0-h4x2-d16-p4-bidirectional-fp16"),
    ],
)
def test_limits_let_supported_cases_run(backend, case_id):
    assert get_backend(backend).limits(Case.from_id(case_id, "cuda")) is None


def test_unified_declares_itself_deterministic():
    """A row whose two calls differ fails (harness/run/runner.py): SGLang's deterministic path promises that."""
    assert get_backend("sglang-unified").deterministic is True


# ---- the kernels under the interpreter ---------------------------------------------------------------
UNIFIED = [
    "extend/b2-q9-pre13-mixed-h4x2-d16-p4-fp16",
    "extend/b3-q70-pre20-mixed-h4x2-d24-p4-fp16",  # two query blocks, a head dim not a power of two
    "extend/b2-q6-pre5-h4x2-d16-p4-custom-fp16",
    "extend/b2-q5-pre7-h2x2-d16-p4-kvshared-fp16",  # the new tokens already in the cache
    "extend/b1-q8-pre0-h2x1-d16-p2-bidirectional-fp32",
    "extend/b2-q7-pre11-h2x2-d16-p4-swa5-cap5-sink-fp16",
    # a sliding-window layer's own pool (pages before each window freed): the windowed prefix table
    "extend/b3-q7-pre30-mixed-h4x2-d16-p4-swa5-poolswa-cap5-sink-fp16",
    "extend/b2-q5-pre9-h4x1-d576x512-p1-mla-fp16",
]


@pytest.mark.interpreter
@pytest.mark.parametrize("case_id", UNIFIED)
def test_unified_case_passes(unified, case_id):
    r = run_one(case_id, unified, **KERNEL)
    assert r.status == "pass", f"{r.status}: {r.reason}"
    assert "lse" in r.prepare_info["absent"]
    assert r.deterministic is True


@pytest.mark.interpreter
def test_unified_is_batch_invariant(unified):
    """What the deterministic path is for: request 0 alone and the batch reversed give the same bits."""
    case = Case.from_id("extend/b3-q9-pre13-mixed-h4x2-d16-p4-fp16")
    r = run_case(case, [unified], RunOptions(timing=False, determinism_repeats=KERNEL_REPEATS, invariance=True))[0]
    assert r.status == "pass", f"{r.status}: {r.reason}"
    assert r.batch_invariant is True


PREFILL = [
    "extend/b3-q9-pre0-mixed-h4x2-d16-p4-fp16",
    "extend/b2-q70-pre0-h2x2-d16-p4-kvattend-fp16",  # two 64-query blocks
    "extend/b3-q40-pre0-mixed-h4x4-d24-p4-bidirectional-fp16",
    "extend/b1-q8-pre0-h2x1-d16-p2-bidirectional-fp32",
]


@pytest.mark.interpreter
@pytest.mark.parametrize("case_id", PREFILL)
def test_prefill_case_passes(prefill, case_id):
    r = run_one(case_id, prefill, **KERNEL)
    assert r.status == "pass", f"{r.status}: {r.reason}"
    assert "lse" in r.prepare_info["absent"]


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "backend, case_id, kernels, saves",
    [
        (
            "sglang-unified",
            "extend/b2-q6-pre5-h4x2-d16-p4-custom-fp16",
            ["build_unified_kv_indices", "extend_attention_fwd_unified"],
            2,
        ),
        (
            "sglang-unified",
            "extend/b2-q6-pre5-h4x2-d16-p4-kvshared-fp16",
            ["build_unified_kv_indices", "extend_attention_fwd_unified"],
            0,
        ),
        ("sglang-prefill", "extend/b2-q6-pre0-h4x2-d16-p4-fp16", ["context_attention_fwd"], 2),
        ("sglang-prefill", "extend/b2-q6-pre0-h4x2-d16-p4-kvattend-fp16", ["context_attention_fwd"], 0),
    ],
)
def test_timed_closure_is_sglangs_calls_alone(backend, case_id, kernels, saves, monkeypatch):
    """Token tables built in prepare: the timed call runs SGLang's functions (the unified table is
    built per call, as `_forward_extend_unified` does on every layer) and, for `new_kv: save`, the two
    stores of the new K/V that SGLang's forward_extend makes first."""
    from attnbench.kernels.sglang import _lib

    b = _backend(backend)
    module = "prefill_attention" if backend == "sglang-prefill" else "extend_attention"
    rec = watch_kernels(monkeypatch, [(_lib.module(module), k) for k in kernels])
    case = Case.from_id(case_id)
    fn = b.prepare(case, case.make_inputs())
    with rec:
        fn()
    assert rec.outside == ["index_put_"] * saves


# ---- what SGLang's deterministic extend does differently (findings; the rows fail, with these reasons) --
SWA_CUSTOM = "extend/b2-q6-pre21-h4x2-d16-p4-custom-swa6-fp16"


@pytest.mark.interpreter
def test_unified_reads_custom_mask_rows_with_the_windowed_length(unified, monkeypatch):
    """docs/findings.md: with a window, `extend_attention_fwd_unified` reads the custom mask rows with
    the unified table's length (windowed prefix + new tokens) from column 0, while SGLang's server
    builds them over the whole prefix (`seq_mask_len = draft * (seq_lens + draft)`; the two-stage kernel
    skips `window_kv_offsets` columns). The same inputs pass through the two-stage `extend_attention_fwd`,
    and pass here once the mask rows are cut to the window (so the rest of the call is right)."""
    import torch

    from attnbench.kernels.sglang import _lib
    from attnbench.kernels.sglang import conventions as conv

    r = run_one(SWA_CUSTOM, unified, **KERNEL)
    assert r.status == "fail" and r.reason.startswith("o:"), f"{r.status}: {r.reason}"
    assert run_one(SWA_CUSTOM, _backend("sglang"), **KERNEL).status == "pass"

    p = Case.from_id(SWA_CUSTOM).params
    mod = _lib.module("extend_attention")
    kernel = mod.extend_attention_fwd_unified

    def windowed_rows(*args, custom_mask, mask_indptr, **kwargs):
        """The mask SGLang hands the kernel, each request's rows cut to its windowed table's columns."""
        offsets, rows = mask_indptr.tolist(), []
        for b in range(len(offsets) - 1):
            L = p.prefix_len + p.q_len
            start, _ = conv.extend_prefix_range(p.prefix_len, p.window)
            rows.append(custom_mask[offsets[b] : offsets[b + 1]].view(p.q_len, L)[:, start:].reshape(-1))
        indptr = torch.tensor([0] + [t.numel() for t in rows]).cumsum(0)
        return kernel(*args, custom_mask=torch.cat(rows), mask_indptr=indptr, **kwargs)

    monkeypatch.setattr(mod, "extend_attention_fwd_unified", windowed_rows)
    r = run_one(SWA_CUSTOM, unified, **KERNEL)
    assert r.status == "pass", f"{r.status}: {r.reason}"


@pytest.mark.interpreter
def test_unified_empty_mask_rows_are_nan(unified):
    """As SGLang's two-stage extend (docs/findings.md, a limit: its masks let a token see itself): a
    custom-mask row that sees no key is acc / deno = 0 / 0."""
    r = run_one("extend/b2-q6-pre5-h4x2-d16-p4-custom-emptyrows-fp16", unified, **KERNEL)
    assert r.status == "fail" and "NaN" in r.reason, f"{r.status}: {r.reason}"


# ---- causal_conv1d verify through causal_conv1d_update -----------------------------------------------
def test_eagle_links_by_hand():
    """Tree 0 -> {1, 2}, 1 -> {3}, 2 -> {4, 5}: first children and next siblings, -1 for none."""
    import torch

    from attnbench.kernels.sglang.conventions import eagle_links

    nxt, sib = eagle_links(torch.tensor([[-1, 0, 0, 1, 2, 2]], dtype=torch.int32))
    assert nxt.tolist() == [[1, 3, 4, -1, -1, -1]]
    assert sib.tolist() == [[-1, 2, -1, -1, 5, -1]]


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "case_id",
    [
        "causal_conv1d/b3-t4-c16-verify-fp16",
        "causal_conv1d/b3-t4-c16-verify-tree-fp16",
        "causal_conv1d/b3-t5-c48-verify-tree-pad1-fp32",
    ],
)
def test_conv_verify_writes_the_pool_and_nothing_else_is_wrong(case_id):
    """docs/findings.md: SGLang's verify writes the conv pool (its server restores it at commit); y and
    the intermediate windows (a tree's through the next-token/sibling links) pass."""
    r = run_one(case_id, _backend("sglang"), **KERNEL)
    assert r.status == "fail" and r.reason == "input conv_states was modified", f"{r.status}: {r.reason}"

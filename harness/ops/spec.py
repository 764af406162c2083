"""Spec-family op contracts: `tree_verify`, `eagle_build_tree`, `verify_greedy`.

- `tree_verify`: each request's draft tree (root + drafts, packed by `qo_indptr`) attends to its
  paged prefix plus the tree under the tree mask. The inputs are `AttentionInputs` of a custom-mask
  extend with `save` (new K/V written into their slots first): `custom_mask` is per request
  `[n, prefix + n]`, the prefix all visible and the tree part from the tree mask, so a backend with
  custom-mask extend runs tree_verify unchanged.
- `eagle_build_tree`: SGLang `build_tree_kernel_efficient` (references/spec.py `build_eagle_tree`).
- `verify_greedy`: SGLang `verify_tree_greedy` (references/spec.py `verify_tree_greedy`).

The integer ops compare bit for bit. Their output buffers hold junk before the call (random bits in
the masks, -9 in index outputs), so a kernel must write every element the contract defines.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

import torch
from pydantic import Field, model_validator

from attnbench.buffers import alloc_output, output_bytes
from attnbench.ops.attention.inputs import AttentionInputs, _generators, _lengths, build_paged_inputs, paged_input_bytes
from attnbench.ops.attention.op import ExtendOp
from attnbench.ops.attention.params import _ATTN_ID, AttentionParams
from attnbench.ops.attention.smoke import ATTENTION_SMOKE, LARGE_POOLS
from attnbench.ops.base import IdField, Op, OutputSpec, Params, Perturbation, SmokeSpace, rolled, tensor_bytes
from attnbench.ops.trees import DRAFT_VOCAB, NAMED, TreeFields, request_parents, simulate_eagle_draft
from attnbench.references import spec as ref

UNWRITTEN = -9  # what index outputs hold before the kernel runs (legal values are -1 and >= 0)

_TREE_ID = (
    IdField("tree", ("tree",), always=True),
    IdField("depth", ("depth",), always=True),
    IdField("k", ("topk",)),
    IdField("n", ("draft_tokens",)),
)


def _tree_seed(seed: int) -> torch.Generator:
    """The generator of a case's draft trees and tokens (apart from the attention data's)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + 104_729)


def _parse_tree_tokens(op: Op, tokens: list[str]) -> dict:
    """`parse_id_tokens` that also reads `tree<shape or compact choices>` tokens."""
    tree = [t for t in tokens if t.startswith("tree")]
    out = Op.parse_id_tokens(op, [t for t in tokens if not t.startswith("tree")])
    if tree:
        out["tree"] = tree[-1][len("tree") :]
    return out


# ---- tree_verify ------------------------------------------------------------------------------------
class TreeVerifyParams(TreeFields, AttentionParams):
    """Attention parameters (presets apply) plus the tree; every request has `nodes` tree tokens."""

    prefix_len: int = Field(1024, ge=1, description="verified tokens before the tree (the most, for mixed)")

    @model_validator(mode="after")
    def _no_window(self):
        if self.window >= 0:
            raise ValueError(
                "tree_verify does not take a window: tree tokens sit at prefix + depth, not at their packed "
                "order, so the extend window rule would be wrong"
            )
        return self

    # What an extend-aware backend's supports() reads: tree verification is a custom-mask extend with save.
    @property
    def mask(self) -> str:
        return "custom"

    @property
    def new_kv(self) -> str:
        return "save"

    @property
    def q_len(self) -> int:
        return self.nodes

    @property
    def keys(self) -> int:
        return self.prefix_len + self.nodes

    @property
    def empty_rows(self) -> bool:
        return False


@dataclass
class TreeVerifyInputs(AttentionInputs):
    """`AttentionInputs` of a custom-mask extend (save), plus the tree mask it was built from."""

    tree_mask: torch.Tensor | None = None  # [B, n, n] bool, True = visible (node 0 = root)
    tree_positions: torch.Tensor | None = None  # [T] int64, prefix + depth of every tree token


class TreeVerifyOp(ExtendOp):
    """Tree tokens of each request over its paged prefix plus the tree, under the tree mask."""

    name = "tree_verify"
    smoke = SmokeSpace(
        space=ATTENTION_SMOKE | {
            "heads_q,heads_kv": [(8, 2), (16, 1)], "head_dim,head_dim_v": [(64, None), (576, 512)],
            "tree,depth,topk,draft_tokens": [("chain", 4, None, None), ("0_1_0.0_0.1_1.0", 2, None, None),
                                             ("eagle", 3, 2, 6), ("chain", 0, None, None)],
            "batch": [2, 5], "prefix_len": [1, 21, 100], "window": [-1], "page_size": [1, 16]},
        held={"pool_pages": (None, LARGE_POOLS)},
    )  # fmt: skip
    family = "spec"
    preset_key = "attention"
    Params = TreeVerifyParams
    id_fields = tuple(f for f in _ATTN_ID if f.fields[0] in TreeVerifyParams.model_fields and f.fields[0] != "window")
    id_fields += _TREE_ID

    held = ExtendOp.held | {
        "custom_mask": "the tree's mask: another mask would be another tree than tree_mask and tree_positions name",
        "tree_mask": "the tree the custom mask was built from (a kernel taking custom_mask need not read it)",
        "tree_positions": "the tree tokens' positions, fixed by the tree and the prefix lengths",
    }

    def perturbations(self, p: TreeVerifyParams) -> tuple[Perturbation, ...]:
        """Extend's, but the mask: the tree is the case's (`held`)."""
        return tuple(q for q in super().perturbations(p) if q.name != "custom mask")

    def parse_id_tokens(self, tokens: list[str]) -> dict:
        return _parse_tree_tokens(self, tokens)

    def features(self, p: TreeVerifyParams) -> tuple[str, ...]:
        shape = p.tree if p.tree in NAMED else "choices"
        return super().features(p) + ("tree", f"tree-{shape}")

    def input_bytes(self, p: TreeVerifyParams, dtype, seed: int) -> int:
        host, _ = _generators(seed, None)
        prefix, n, B = _lengths(p.batch, p.prefix_len, p.lens, host), p.nodes, p.batch
        extend = paged_input_bytes(p, dtype, [a + n for a in prefix], [n] * B, "save", mask=True)
        return extend + B * n * n + 8 * B * n  # tree_mask (bool), tree_positions (int64)

    def build_inputs(self, p: TreeVerifyParams, dtype, seed, device) -> TreeVerifyInputs:
        host, _ = _generators(seed, device)
        prefix = _lengths(p.batch, p.prefix_len, p.lens, host)
        parents, _ = request_parents(p, p.batch, _tree_seed(seed))
        n = p.nodes
        # extend's build (same tensors as the extend case); the random custom mask it draws last is replaced
        x = build_paged_inputs(p, dtype, seed, device, [a + n for a in prefix], [n] * p.batch, "save")
        masks = torch.stack([ref.tree_mask_from_parents(par) for par in parents])
        x.custom_mask, x.mask_indptr = (t.to(device) for t in ref.tree_custom_mask(masks, prefix))
        positions = [a + d for a, par in zip(prefix, parents, strict=True) for d in ref.depths_from_parents(par)]
        base = {f.name: getattr(x, f.name) for f in fields(AttentionInputs)}
        return TreeVerifyInputs(
            **base,
            tree_mask=masks.to(device),
            tree_positions=torch.tensor(positions, dtype=torch.int64, device=device),
        )


# ---- eagle_build_tree ---------------------------------------------------------------------------------
class EagleBuildTreeParams(Params):
    batch: int = Field(1, ge=1)
    prefix_len: int = Field(1024, ge=1, description="verified tokens per request (the most, for mixed)")
    lens: Literal["equal", "mixed"] = "equal"
    topk: int = Field(4, ge=1, description="branches per draft step")
    depth: int = Field(3, ge=1, description="draft steps")
    draft_tokens: int = Field(8, ge=2, description="tree tokens per request, root included")
    mask_mode: Literal["full", "qlen", "qlen_packed"] = Field(
        "full", description="full: [n, prefix + n] per request; qlen: [n, n]; qlen_packed: bit-packed rows"
    )

    @model_validator(mode="after")
    def _sizes(self):
        most = self.topk + (self.depth - 1) * self.topk**2
        if self.draft_tokens - 1 > most:
            raise ValueError(
                f"draft_tokens {self.draft_tokens}: {self.depth} steps of topk {self.topk} draft at most "
                f"{most} candidates (draft_tokens <= {most + 1})"
            )
        if self.mask_mode == "qlen_packed" and self.draft_tokens > 32:
            raise ValueError(f"qlen_packed holds at most 32 tree tokens per row, got draft_tokens {self.draft_tokens}")
        return self


@dataclass
class EagleBuildTreeInputs:
    """Inputs and outputs of `eagle_build_tree` (SGLang `build_tree_kernel_efficient`)."""

    parent_list: torch.Tensor  # [B, topk * (depth - 1) + 1] int64
    selected_index: torch.Tensor  # [B, n - 1] int64, ascending
    seq_lens: torch.Tensor  # [B] int64, verified tokens per request
    tree_mask: torch.Tensor  # output: full bool [sum_b n (L_b + n)]; qlen bool [B n n]; packed uint8 [B n, nbytes]
    positions: torch.Tensor  # output: [B * n] int64
    retrive_index: torch.Tensor  # output: [B, n] int64
    retrive_next_token: torch.Tensor  # output: [B, n] int64
    retrive_next_sibling: torch.Tensor  # output: [B, n] int64
    topk: int
    depth: int
    draft_tokens: int
    mask_mode: str


def _junk_mask(shape, dtype, gen: torch.Generator, device) -> torch.Tensor:
    """A canary-padded mask output filled with random bits (elements a kernel skips are then wrong)."""
    out = alloc_output(shape, dtype, device)
    bits = torch.randint(0, 256 if dtype == torch.uint8 else 2, shape, generator=gen, dtype=torch.uint8)
    out.copy_(bits.to(dtype))
    return out


def _unwritten(shape, dtype, device) -> torch.Tensor:
    return alloc_output(shape, dtype, device).fill_(UNWRITTEN)


def _int_bytes(x) -> float:
    return float(sum(t.numel() * t.element_size() for t in vars(x).values() if isinstance(t, torch.Tensor)))


def _redraft(p: EagleBuildTreeParams, x: EagleBuildTreeInputs) -> None:
    """Another EAGLE draft of the same shape, seeded from the current one (deterministic)."""
    seed = int(x.parent_list.sum()) * 31 + int(x.selected_index.sum()) + 1
    draft = simulate_eagle_draft(p.batch, p.topk, p.depth, p.draft_tokens, torch.Generator().manual_seed(seed))
    x.parent_list.copy_(draft.parent_list)
    x.selected_index.copy_(draft.selected_index)


class EagleBuildTreeOp(Op):
    """SGLang build_tree_kernel_efficient: tree mask, positions and retrieve links of EAGLE drafts."""

    name = "eagle_build_tree"
    smoke = SmokeSpace(
        space={"batch": [1, 3], "prefix_len": [1, 40],
               "topk,depth,draft_tokens": [(1, 5, 6), (2, 3, 6), (4, 4, 16), (8, 2, 8)]},
    )  # fmt: skip
    family = "spec"
    Params = EagleBuildTreeParams
    id_fields = (
        IdField("b", ("batch",), always=True),
        IdField("pre", ("prefix_len",), always=True),
        IdField("", ("lens",)),
        IdField("k", ("topk",), always=True),
        IdField("depth", ("depth",), always=True),
        IdField("n", ("draft_tokens",), always=True),
        IdField("mask", ("mask_mode",), always=True),
    )
    outputs = {
        "tree_mask": OutputSpec(("element",), exact=True),
        "positions": OutputSpec(("token",), exact=True),
        "retrive_index": OutputSpec(("request", "node"), exact=True),
        "retrive_next_token": OutputSpec(("request", "node"), exact=True),
        "retrive_next_sibling": OutputSpec(("request", "node"), exact=True),
    }

    def features(self, p: EagleBuildTreeParams) -> tuple[str, ...]:
        return (f"mask-{p.mask_mode}",) + (("topk1-chain",) if p.topk == 1 else ())

    def input_bytes(self, p: EagleBuildTreeParams, dtype, seed: int) -> int:
        host, _ = _generators(seed, None)
        B, n, i64 = p.batch, p.draft_tokens, torch.int64
        lens = _lengths(B, p.prefix_len, p.lens, host)
        if p.mask_mode == "full":  # only the mode's own shape: packed_mask_bytes refuses n > 32
            mask = ((sum(lens) * n + B * n * n,), torch.bool)
        elif p.mask_mode == "qlen":
            mask = ((B * n * n,), torch.bool)
        else:
            mask = ((B * n, ref.packed_mask_bytes(n)), torch.uint8)
        draft = tensor_bytes((B, p.topk * (p.depth - 1) + 1), i64) + tensor_bytes((B, n), i64)  # parents, selected
        return draft + output_bytes(*mask) + output_bytes((B * n,), i64) + 3 * output_bytes((B, n), i64)

    def build_inputs(self, p: EagleBuildTreeParams, dtype, seed, device) -> EagleBuildTreeInputs:
        host, _ = _generators(seed, device)
        lens = _lengths(p.batch, p.prefix_len, p.lens, host)
        gen = _tree_seed(seed)
        draft = simulate_eagle_draft(p.batch, p.topk, p.depth, p.draft_tokens, gen)
        B, n = p.batch, p.draft_tokens
        if p.mask_mode == "full":
            mask = _junk_mask((sum(lens) * n + B * n * n,), torch.bool, gen, device)
        elif p.mask_mode == "qlen":
            mask = _junk_mask((B * n * n,), torch.bool, gen, device)
        else:
            mask = _junk_mask((B * n, ref.packed_mask_bytes(n)), torch.uint8, gen, device)
        return EagleBuildTreeInputs(
            parent_list=draft.parent_list.to(device),
            selected_index=draft.selected_index.to(device),
            seq_lens=torch.tensor(lens, dtype=torch.int64, device=device),
            tree_mask=mask,
            positions=_unwritten((B * n,), torch.int64, device),
            retrive_index=_unwritten((B, n), torch.int64, device),
            retrive_next_token=_unwritten((B, n), torch.int64, device),
            retrive_next_sibling=_unwritten((B, n), torch.int64, device),
            topk=p.topk,
            depth=p.depth,
            draft_tokens=n,
            mask_mode=p.mask_mode,
        )

    def expected(self, p, x: EagleBuildTreeInputs, precision):
        tree = ref.build_eagle_tree(
            x.parent_list, x.selected_index, x.seq_lens, x.topk, x.depth, x.draft_tokens, x.mask_mode
        )
        return tree._asdict()

    def perturbations(self, p: EagleBuildTreeParams) -> tuple[Perturbation, ...]:
        """Another draft (a new simulated one: parent_list and selected_index together), and the prefix
        lengths rotated among the requests (`lens: mixed`; their sum, and so a full mask's size, stays)."""
        return (
            Perturbation("draft", ("parent_list", "selected_index"), _redraft),
            rolled("prefix lengths", ("seq_lens",)),
        )

    def bytes(self, p, x: EagleBuildTreeInputs) -> float:
        return _int_bytes(x)


# ---- verify_greedy -------------------------------------------------------------------------------
class VerifyGreedyParams(TreeFields):
    batch: int = Field(1, ge=1)
    accept: float = Field(0.7, ge=0.0, le=1.0, description="chance that the target's token at a node is a child's")


@dataclass
class VerifyGreedyInputs:
    """Inputs and outputs of `verify_greedy` (SGLang `verify_tree_greedy`)."""

    candidates: torch.Tensor  # [B, n] int64, node tokens (the root's: the verified token)
    retrive_index: torch.Tensor  # [B, n] int64, flat node index b * n + i
    retrive_next_token: torch.Tensor  # [B, n] int64, first child, -1 = none
    retrive_next_sibling: torch.Tensor  # [B, n] int64, next sibling, -1 = none
    target_predict: torch.Tensor  # [B, n] int64, the target model's argmax at every node
    predicts: torch.Tensor  # in/out [B * n] int32: written on the accepted path only
    accept_index: torch.Tensor  # output [B, num_spec_steps] int32
    accept_length: torch.Tensor  # output [B] int32


def _shift_drafts(p, x: VerifyGreedyInputs) -> None:
    x.candidates[:, 1:].add_(2 * DRAFT_VOCAB)  # the root's token is the verified one: kept


def _rotate_rows(p, x: VerifyGreedyInputs) -> None:
    """Node i of request b moves from flat row b n + j to b n + (j + 1) % n; its target token with it."""
    B, n = x.retrive_index.shape
    first = torch.arange(B, device=x.retrive_index.device)[:, None] * n
    x.retrive_index.copy_(first + (x.retrive_index - first + 1) % n)
    x.target_predict.copy_(x.target_predict.view(B, n).roll(1, 1).view_as(x.target_predict))


class VerifyGreedyOp(Op):
    """SGLang verify_tree_greedy: accept the longest tree path that agrees with the target's argmax."""

    name = "verify_greedy"
    smoke = SmokeSpace(
        space={"tree,depth,topk,draft_tokens": [("chain", 4, None, None), ("binary", 2, None, None),
                                                ("typical", 3, 4, None), ("0_1_0.0_0.1_1.0", 2, None, None),
                                                ("eagle", 3, 2, 6), ("eagle", 5, 4, 32), ("chain", 0, None, None)],
               "batch": [1, 4], "accept": [0.0, 0.7, 1.0]},
    )  # fmt: skip
    family = "spec"
    Params = VerifyGreedyParams
    id_fields = (IdField("b", ("batch",), always=True),) + _TREE_ID + (IdField("acc", ("accept",)),)
    outputs = {
        "predicts": OutputSpec(("token",), exact=True),
        "accept_index": OutputSpec(("request", "step"), exact=True),
        "accept_length": OutputSpec(("request",), exact=True),
    }

    def parse_id_tokens(self, tokens: list[str]) -> dict:
        return _parse_tree_tokens(self, tokens)

    def features(self, p: VerifyGreedyParams) -> tuple[str, ...]:
        return (f"tree-{p.tree if p.tree in NAMED else 'choices'}",)

    def input_bytes(self, p: VerifyGreedyParams, dtype, seed: int) -> int:
        B, n = p.batch, p.nodes
        if p.tree == "eagle":
            steps = p.depth + 1
        else:  # one accept_index column per tree level; a named or choices tree is the same for every request
            steps = max(ref.depths_from_parents(request_parents(p, 1, _tree_seed(seed))[0][0])) + 1
        outputs = output_bytes((B * n,), torch.int32) + output_bytes((B, steps), torch.int32)
        outputs += output_bytes((B,), torch.int32)
        return 5 * tensor_bytes((B, n), torch.int64) + outputs

    def build_inputs(self, p: VerifyGreedyParams, dtype, seed, device) -> VerifyGreedyInputs:
        gen = _tree_seed(seed)
        B, n = p.batch, p.nodes
        parents, draft = request_parents(p, B, gen)
        candidates = torch.randint(0, DRAFT_VOCAB, (B, n), generator=gen)
        if draft is not None:
            candidates[:, 1:] = draft.draft_tokens
        target = torch.randint(0, DRAFT_VOCAB, (B, n), generator=gen)
        links = [ref.retrieve_links(par) for par in parents]
        for b, (next_token, next_sibling) in enumerate(links):
            for i in range(n):
                children = []
                c = next_token[i]
                while c != -1:
                    children.append(c)
                    c = next_sibling[c]
                if children and float(torch.rand((), generator=gen)) < p.accept:
                    pick = children[int(torch.randint(len(children), (), generator=gen))]
                    target[b, i] = candidates[b, pick]
        steps = max(ref.depths_from_parents(parents[0])) + 1 if p.tree != "eagle" else p.depth + 1

        def dev(t):
            return t.to(device=device, dtype=torch.int64)

        return VerifyGreedyInputs(
            candidates=dev(candidates),
            retrive_index=dev(torch.arange(B * n).view(B, n)),
            retrive_next_token=dev(torch.tensor([nt for nt, _ in links])),
            retrive_next_sibling=dev(torch.tensor([ns for _, ns in links])),
            target_predict=dev(target),
            predicts=_unwritten((B * n,), torch.int32, device),
            accept_index=_unwritten((B, steps), torch.int32, device),
            accept_length=_unwritten((B,), torch.int32, device),
        )

    def expected(self, p, x: VerifyGreedyInputs, precision):
        v = ref.verify_tree_greedy(
            x.candidates, x.retrive_index, x.retrive_next_token, x.retrive_next_sibling, x.target_predict,
            num_spec_steps=x.accept_index.shape[1], predicts=x.predicts,
        )  # fmt: skip
        return v._asdict()

    def perturbations(self, p: VerifyGreedyParams) -> tuple[Perturbation, ...]:
        """Target tokens no draft holds (nothing accepted, the root's bonus changes); draft tokens moved
        out of the target's range likewise; every node's row in the flat buffers rotated within its
        request (retrive_index, and target_predict with it); whole trees rotated among the requests."""
        trees = ("candidates", "retrive_next_token", "retrive_next_sibling", "target_predict")
        return (
            Perturbation("target tokens", ("target_predict",), lambda p, x: x.target_predict.add_(DRAFT_VOCAB)),
            Perturbation("draft tokens", ("candidates",), _shift_drafts),
            Perturbation("retrieve index", ("retrive_index", "target_predict"), _rotate_rows),
            rolled("trees", trees),
        )

    def bytes(self, p, x: VerifyGreedyInputs) -> float:
        return _int_bytes(x)

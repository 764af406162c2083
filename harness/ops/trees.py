"""Draft trees for the spec ops: named vLLM tree shapes, choices strings, and simulated EAGLE drafts.

A tree is given by `TreeFields.tree`:

- `chain`: one path of `depth` drafts (depth 0: the root alone, i.e. plain decode);
- `binary`: the full binary tree of `depth` levels (2 + 4 + ... + 2**depth drafts);
- `typical`: a wide, shallow, top-heavy tree like the hand-tuned Medusa/EAGLE trees: the root has
  `topk` children, and a node at depth k whose path sums to s has `max(0, topk - k - s)` children
  (its first children, the likelier ones, branch most), cut at `depth` levels;
- `eagle`: SGLang EAGLE drafts: `depth` draft steps of `topk` branches, the best `draft_tokens - 1`
  candidates kept (`simulate_eagle_draft`), a different tree per request;
- vLLM choices, as vLLM's literal (`"[(0,), (1,), (0, 0)]"`) or compactly, paths joined by `_` and
  path elements by `.` (`"0_1_0.0"`); the compact form is the canonical one (it goes into case ids).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
from pydantic import Field, model_validator

from attnbench.ops.base import Params
from attnbench.references import spec as ref

NAMED = ("chain", "binary", "typical", "eagle")
_NEEDS = {"typical": ("topk",), "eagle": ("topk", "draft_tokens")}  # fields a shape needs
DRAFT_VOCAB = 256  # vocabulary of simulated drafts: small, so that target tokens sometimes match


def compact(paths: list[tuple[int, ...]]) -> str:
    """`[(0,), (1,), (0, 0)]` -> `"0_1_0.0"`."""
    return "_".join(".".join(str(c) for c in path) for path in paths)


def expand(text: str) -> list[tuple[int, ...]]:
    """Tree choices from a vLLM literal or the compact form (validated)."""
    text = text.strip()
    if text.startswith("[") or text.startswith("("):
        return ref.parse_choices(text)
    try:
        paths = [tuple(int(c) for c in part.split(".")) for part in text.split("_")] if text else []
    except ValueError:
        raise ValueError(
            f"tree {text!r}: expected one of {', '.join(NAMED)}, a vLLM choices literal "
            "such as '[(0,), (1,), (0, 0)]', or its compact form '0_1_0.0'"
        ) from None
    return ref.parse_choices(paths)


def named_choices(shape: str, depth: int, topk: int | None = None) -> list[tuple[int, ...]]:
    """The choices (breadth first) of a named vLLM-style shape: chain, binary or typical."""
    if shape == "chain":
        return [(0,) * k for k in range(1, depth + 1)]
    if shape == "binary":
        return [p for k in range(1, depth + 1) for p in itertools.product((0, 1), repeat=k)]
    if shape == "typical":
        level, out = [()], []
        for _ in range(depth):
            fan = [(p, topk if not p else max(0, topk - len(p) - sum(p))) for p in level]
            level = [p + (c,) for p, f in fan for c in range(f)]
            out += level
        return out
    raise ValueError(f"no named tree shape {shape!r}")


class TreeFields(Params):
    """Parameters that choose a draft tree (the module docstring lists the shapes)."""

    tree: str = Field("chain", description="chain | binary | typical | eagle | vLLM choices ('0_1_0.0')")
    depth: int = Field(3, ge=0, description="tree levels below the root (eagle: draft steps)")
    topk: int | None = Field(None, ge=1, description="typical: the root's fan-out; eagle: branches per step")
    draft_tokens: int | None = Field(None, ge=2, description="eagle: tree tokens, root included")

    @model_validator(mode="before")
    @classmethod
    def _canonical_tree(cls, data):
        if not isinstance(data, dict) or data.get("tree", "chain") in NAMED:
            return data
        data = dict(data)
        paths = expand(str(data["tree"]))
        data["tree"] = compact(paths) if paths else "chain"
        depth = max((len(p) for p in paths), default=0)
        if "depth" in data and data["depth"] is not None and int(data["depth"]) != depth:
            raise ValueError(f"depth {data['depth']} differs from the depth of the tree choices ({depth})")
        data["depth"] = depth
        return data

    @model_validator(mode="after")
    def _tree_fields(self):
        needs = _NEEDS.get(self.tree, ())
        for name in ("topk", "draft_tokens"):
            value = getattr(self, name)
            if name in needs and value is None:
                raise ValueError(f"tree {self.tree} needs {name}")
            if name not in needs and value is not None:
                users = " and ".join(t for t, fields in _NEEDS.items() if name in fields)
                raise ValueError(f"{name} applies to {users} trees only, not to {self.tree}")
        if self.tree == "eagle":
            if self.depth < 1:
                raise ValueError("an eagle tree needs depth >= 1 draft steps")
            most = self.topk + (self.depth - 1) * self.topk**2
            if self.draft_tokens - 1 > most:
                raise ValueError(
                    f"draft_tokens {self.draft_tokens}: {self.depth} steps of topk {self.topk} draft at most "
                    f"{most} candidates (draft_tokens <= {most + 1})"
                )
        return self

    @property
    def nodes(self) -> int:
        """Tree tokens per request, the root included."""
        if self.tree == "eagle":
            return self.draft_tokens
        return len(self.choices()) + 1

    def choices(self) -> list[tuple[int, ...]]:
        """The vLLM choices of a non-eagle tree."""
        if self.tree == "eagle":
            raise ValueError("an eagle tree has no fixed choices; see simulate_eagle_draft")
        if self.tree in NAMED:
            return named_choices(self.tree, self.depth, self.topk)
        return expand(self.tree)


@dataclass
class EagleDraft:
    """One batch of simulated EAGLE drafts (CPU tensors), as SGLang's organize_draft_results returns them."""

    parent_list: torch.Tensor  # [B, topk * (depth - 1) + 1] int64
    selected_index: torch.Tensor  # [B, n - 1] int64, ascending
    draft_tokens: torch.Tensor  # [B, n - 1] int64, the token of each selected candidate


def simulate_eagle_draft(batch: int, topk: int, depth: int, n: int, gen: torch.Generator) -> EagleDraft:
    """EAGLE drafting with seeded random draft-model distributions, kept exactly as SGLang keeps it.

    Step 0 takes the topk tokens of the draft distribution after the root (scores = their
    probabilities). Each later step expands the topk current nodes by their topk tokens, scores the
    topk**2 children by (parent score x probability), and keeps the topk best as the next nodes; the
    indices of the kept ones (in the flattened scores of all steps) become the next `parent_list`
    entries. At the end the best n - 1 of all candidates are selected and sorted by index.
    """
    probs, tokens = _draft_step(batch, topk, gen)  # [B, topk]
    scores = probs
    score_list, token_list = [probs[:, None, :]], [tokens]
    parents = [torch.arange(-1, topk, dtype=torch.int64).repeat(batch, 1)]
    for step in range(1, depth):
        p, t = _draft_step(batch * topk, topk, gen)
        expanded = scores[:, :, None] * p.view(batch, topk, topk)  # child c of current node j
        scores, keep = expanded.flatten(1).topk(topk, dim=-1)
        score_list.append(expanded)
        token_list.append(t.view(batch, topk * topk))
        parents.append(keep + topk**2 * (step - 1) + topk)
    flat = torch.cat([s.flatten(1) for s in score_list], dim=1)
    selected = flat.topk(n - 1, dim=-1).indices.sort(dim=-1).values
    drafts = torch.cat(token_list, dim=1).gather(1, selected)
    parent_list = torch.cat(parents[:-1], dim=1) if depth > 1 else parents[0][:, :1]
    for b in range(batch):  # products of probabilities < 1 keep every parent above its children
        ref.eagle_parents(parent_list[b].tolist(), selected[b].tolist(), topk)
    return EagleDraft(parent_list, selected, drafts)


def _draft_step(rows: int, topk: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The topk (probability, token) of `rows` random draft distributions over DRAFT_VOCAB tokens."""
    logits = torch.randn(rows, DRAFT_VOCAB, generator=gen) * 2.0
    probs, tokens = logits.softmax(-1).topk(topk, dim=-1)
    return probs, tokens


def request_parents(p: TreeFields, batch: int, gen: torch.Generator) -> tuple[list[list[int]], EagleDraft | None]:
    """Each request's parent list `[n]` (root -1), and the EAGLE draft they came from (eagle trees)."""
    if p.tree != "eagle":
        parents = ref.parents_from_choices(p.choices())
        return [list(parents) for _ in range(batch)], None
    draft = simulate_eagle_draft(batch, p.topk, p.depth, p.draft_tokens, gen)
    parents = [
        ref.eagle_parents(draft.parent_list[b].tolist(), draft.selected_index[b].tolist(), p.topk) for b in range(batch)
    ]
    return parents, draft

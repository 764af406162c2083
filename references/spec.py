"""References for the spec (speculative decoding) family: tree masks, EAGLE tree building, greedy verify.

Written from the semantics of vLLM's tree attention and SGLang's EAGLE utilities (see docs/spec.md),
independent of every backend. Everything here is integer / boolean bookkeeping, so it is exact: the
float64 part of tree verification is the ordinary extend reference (`attention.paged_attention`) with
the custom mask that `tree_custom_mask` builds.

A tree has `n` nodes; node 0 is the root (the last verified token), and every other node has a parent
with a smaller index. A node sees the root, its ancestors and itself.

vLLM tree choices (`speculative_token_tree`): a list of tuple paths from the root, breadth first, e.g.
``[(0,), (1,), (0, 0)]``: node i + 1 is `choices[i]`, its parent is the node of `choices[i][:-1]`
(the root for a path of length 1).

    >>> tree_mask_from_choices([(0,), (1,), (0, 0)]).int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]]

SGLang EAGLE drafts: `build_eagle_tree` (the `build_tree_kernel_efficient` kernel) and
`verify_tree_greedy` (the `verify_tree_greedy` kernel), documented below with worked examples.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch

__all__ = [
    "parse_choices",
    "parents_from_choices",
    "tree_mask_from_choices",
    "tree_mask_from_parents",
    "depths_from_parents",
    "retrieve_links",
    "tree_custom_mask",
    "eagle_parents",
    "build_eagle_tree",
    "EagleTree",
    "packed_mask_bytes",
    "verify_tree_greedy",
    "GreedyVerdict",
]

Choices = Sequence[Sequence[int]]
MaskMode = Literal["full", "qlen", "qlen_packed"]


# ---- vLLM tree choices -----------------------------------------------------------------------------
def parse_choices(choices: str | Choices) -> list[tuple[int, ...]]:
    """Tree choices as a list of tuples, from a Python literal string (vLLM's format) or a sequence.

    Validates them: non-empty paths of non-negative ints, no duplicates, and every proper prefix of a
    path listed before it (so node indices follow the list, parents first). vLLM expects breadth-first
    order; the mask rule itself only needs the prefixes.

    Raises:
        ValueError: on a malformed tree, saying which path is wrong.
    """
    if isinstance(choices, str):
        choices = ast.literal_eval(choices) if choices.strip() else []
    paths = [tuple(int(c) for c in path) for path in choices]
    seen: dict[tuple[int, ...], int] = {}
    for i, path in enumerate(paths):
        if not path or any(c < 0 for c in path):
            raise ValueError(f"tree choice {i} {path}: paths are non-empty tuples of non-negative ints")
        if path in seen:
            raise ValueError(f"tree choice {i} {path} is listed twice")
        if len(path) > 1 and path[:-1] not in seen:
            raise ValueError(f"tree choice {i} {path}: its parent {path[:-1]} is not listed before it")
        seen[path] = i
    return paths


def parents_from_choices(choices: str | Choices) -> list[int]:
    """Parent node of every node `[n]` (n = len(choices) + 1); the root's parent is -1.

    >>> parents_from_choices([(0,), (1,), (0, 0), (0, 1), (1, 0)])
    [-1, 0, 0, 1, 1, 2]
    """
    paths = parse_choices(choices)
    index = {path: i + 1 for i, path in enumerate(paths)}
    return [-1] + [index[path[:-1]] if len(path) > 1 else 0 for path in paths]


def tree_mask_from_parents(parents: Sequence[int]) -> torch.Tensor:
    """Bool `[n, n]`: row i is True at the root, at i's ancestors and at i itself.

    `parents[0]` must be -1 and `parents[i] < i` for i > 0.
    """
    n = len(parents)
    _check_parents(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def tree_mask_from_choices(choices: str | Choices) -> torch.Tensor:
    """vLLM `_prepare_tree_attn_bias` as a bool mask `[n + 1, n + 1]` (True = visible, row/col 0 = root).

    A node sees the root, its ancestors and itself; vLLM's additive bias is 0 where this is True and
    -inf elsewhere. A chain is lower-triangular:

    >>> tree_mask_from_choices("[(0,), (0, 0), (0, 0, 0)]").int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    """
    return tree_mask_from_parents(parents_from_choices(choices))


def depths_from_parents(parents: Sequence[int]) -> list[int]:
    """Depth of every node (root 0). Positions of tree tokens are `prefix_len + depth`."""
    _check_parents(parents)
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


def retrieve_links(parents: Sequence[int]) -> tuple[list[int], list[int]]:
    """(next_token, next_sibling) `[n]` each, SGLang's child/sibling lists of a tree, -1 = none.

    `next_token[p]` is p's smallest-index child; `next_sibling[i]` the next larger-index child of i's
    parent. Walking next_token then next_sibling visits a node's children in increasing index.

    >>> retrieve_links([-1, 0, 0, 1, 1, 2])
    ([1, 3, 5, -1, -1, -1], [-1, 2, -1, 4, -1, -1])
    """
    _check_parents(parents)
    n = len(parents)
    next_token, next_sibling = [-1] * n, [-1] * n
    for i in range(n - 1, 0, -1):  # prepend children from the largest index down
        p = parents[i]
        next_sibling[i] = next_token[p]
        next_token[p] = i
    return next_token, next_sibling


def _check_parents(parents: Sequence[int]) -> None:
    if not parents or parents[0] != -1:
        raise ValueError(f"node 0 is the root: parents[0] must be -1, got {list(parents)[:1]}")
    for i, p in enumerate(parents[1:], start=1):
        if not 0 <= p < i:
            raise ValueError(f"node {i} has parent {p}; parents must precede their children")


# ---- tree verification attention masks -------------------------------------------------------------
def tree_custom_mask(
    tree_masks: torch.Tensor | Sequence[torch.Tensor], prefix_lens: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The extend `custom_mask` of tree verification: per request `[n_b, prefix_b + n_b]`, flattened.

    Args:
        tree_masks: bool `[B, n, n]` (or `[n, n]`, shared by every request), or one `[n_b, n_b]` per
            request (trees of different sizes in one batch), True = visible. A causal request (a
            prefill beside tree requests) is the chain of its new tokens: `ones(n_b, n_b).tril()`.
        prefix_lens: `[B]` cached tokens before each request's tree.
    Returns:
        (custom_mask bool `[sum_b n_b * (prefix_b + n_b)]`, mask_indptr int64 `[B + 1]`): every prefix
        column visible, the tree columns from the tree mask, rows flattened row-major per request.
    """
    B = len(prefix_lens)
    if isinstance(tree_masks, torch.Tensor) and tree_masks.dim() == 2:
        tree_masks = tree_masks.expand(B, *tree_masks.shape)
    if len(tree_masks) != B:
        raise ValueError(f"{len(tree_masks)} tree masks for {B} requests")
    blocks, sizes = [], []
    for tree, prefix in zip(tree_masks, prefix_lens):
        n = tree.shape[-1]
        if tuple(tree.shape) != (n, n):
            raise ValueError(f"a tree mask is square [n, n], got {tuple(tree.shape)}")
        block = torch.ones(n, prefix + n, dtype=torch.bool, device=tree.device)
        block[:, prefix:] = tree
        blocks.append(block.flatten())
        sizes.append(n * (prefix + n))
    indptr = torch.tensor([0] + sizes, dtype=torch.int64).cumsum(0)
    return torch.cat(blocks), indptr.to(blocks[0].device)


# ---- SGLang EAGLE trees ----------------------------------------------------------------------------
class EagleTree(NamedTuple):
    """Outputs of `build_eagle_tree` (SGLang `build_tree_kernel_efficient`), all on the inputs' device.

    tree_mask: "full": bool `[sum_b n * (seq_len_b + n)]` (per request `[n, seq_len_b + n]` row-major:
        every prefix column True, then the draft columns), directly the extend custom mask;
        "qlen": bool `[B * n * n]` (the draft columns only); "qlen_packed": uint8 `[B * n, nbytes]`,
        bit j of row i (little-endian bytes) = draft column j, nbytes = 1, 2 or 4 for n <= 8, 16, 32.
    positions: int64 `[B * n]`, `seq_len_b + depth` (the root at depth 0).
    retrive_index: int64 `[B, n]`, `b * n + i` (flat index of node i of request b).
    retrive_next_token, retrive_next_sibling: int64 `[B, n]`, see `retrieve_links`.
    """

    tree_mask: torch.Tensor
    positions: torch.Tensor
    retrive_index: torch.Tensor
    retrive_next_token: torch.Tensor
    retrive_next_sibling: torch.Tensor


def packed_mask_bytes(n: int) -> int:
    """Bytes per row of the "qlen_packed" mask: 1, 2 or 4 (SGLang's uint8/16/32); n <= 32."""
    if n > 32:
        raise ValueError(f"the bit-packed tree mask holds at most 32 draft tokens, got {n}")
    return 1 if n <= 8 else 2 if n <= 16 else 4


def eagle_parents(parent_list: Sequence[int], selected_index: Sequence[int], topk: int) -> list[int]:
    """Parent node of every node `[n]` of one request's EAGLE tree (n = len(selected_index) + 1).

    Node i >= 1 is the draft candidate `selected_index[i - 1]` (an index into the flattened scores of
    all draft steps, sorted ascending). Its parent is found as SGLang's kernel does:
    `t = selected_index[i - 1] // topk`; `t == 0` means the root; otherwise the parent is the node
    whose candidate index is `parent_list[t]` (first match in `selected_index`, plus one).

    Raises:
        ValueError: when a parent was not selected (SGLang's kernel warns and drops the node).
    """
    sel = [int(s) for s in selected_index]
    where = {}
    for pos, s in enumerate(sel):
        where.setdefault(s, pos)
    parents = [-1]
    for i, s in enumerate(sel, start=1):
        t = s // topk
        if t == 0:
            parents.append(0)
            continue
        if not 0 <= t < len(parent_list):
            raise ValueError(f"node {i}: candidate {s} // topk {topk} = {t} is outside parent_list")
        token = int(parent_list[t])
        if token not in where:
            raise ValueError(f"node {i} (candidate {s}): its parent candidate {token} was not selected")
        parents.append(where[token] + 1)
    if any(not 0 <= p < i for i, p in enumerate(parents) if i):
        raise ValueError(f"invalid EAGLE tree: parents {parents} do not precede their children")
    return parents


def build_eagle_tree(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    depth: int,
    num_draft_tokens: int,
    mask_mode: MaskMode = "full",
) -> EagleTree:
    """SGLang `build_tree_kernel_efficient`: the verification tree of each request's EAGLE draft.

    Args:
        parent_list: int64 `[B, topk * (depth - 1) + 1]`: `[-1, 0 .. topk-1]`, then for each draft
            step 1 .. depth - 2 the candidate indices of the topk nodes that step expanded.
        selected_index: int64 `[B, n - 1]`, the candidates kept (top n - 1 scores), ascending.
        seq_lens: `[B]` verified tokens per request (the tree's prefix).
        topk, depth: draft branching and number of draft steps; n = `num_draft_tokens` (root included).
        mask_mode: "full", "qlen" or "qlen_packed" (see `EagleTree`).
    Returns:
        EagleTree(tree_mask, positions, retrive_index, retrive_next_token, retrive_next_sibling).

    Worked example (one request, topk 2, depth 3, n 6, 4 verified tokens). The candidates of step 0
    are 0, 1 (children of the root); step 1 expands them into 2 + 2j + c (child c of node j); it
    keeps candidates 2 and 4, so parent_list = [-1, 0, 1, 2, 4] and step 2's candidates 6 + 2j + c
    are children of parent_list[3 + j]. Keeping [0, 1, 2, 3, 6]: nodes 1, 2 hang off the root
    (0 // 2 = 1 // 2 = 0), nodes 3, 4 off node 1 (parent_list[1] = 0 is node 1's candidate), node 5
    off node 3 (6 // 2 = 3, parent_list[3] = 2 is node 3's candidate):

    >>> t = build_eagle_tree(torch.tensor([[-1, 0, 1, 2, 4]]), torch.tensor([[0, 1, 2, 3, 6]]),
    ...                      torch.tensor([4]), topk=2, depth=3, num_draft_tokens=6, mask_mode="qlen")
    >>> for row in t.tree_mask.view(6, 6).int().tolist():
    ...     print(row)
    [1, 0, 0, 0, 0, 0]
    [1, 1, 0, 0, 0, 0]
    [1, 0, 1, 0, 0, 0]
    [1, 1, 0, 1, 0, 0]
    [1, 1, 0, 0, 1, 0]
    [1, 1, 0, 1, 0, 1]
    >>> t.positions.tolist(), t.retrive_next_token.tolist(), t.retrive_next_sibling.tolist()
    ([4, 5, 5, 6, 6, 7], [[1, 3, -1, 5, -1, -1]], [[-1, 2, -1, 4, -1, -1]])
    """
    B = selected_index.shape[0]
    n = num_draft_tokens
    if selected_index.shape != (B, n - 1):
        raise ValueError(f"selected_index must be [B, n - 1] = [{B}, {n - 1}], got {list(selected_index.shape)}")
    if parent_list.shape != (B, topk * (depth - 1) + 1):
        raise ValueError(
            f"parent_list must be [B, topk * (depth - 1) + 1] = [{B}, {topk * (depth - 1) + 1}], "
            f"got {list(parent_list.shape)}"
        )
    device = selected_index.device
    lens = [int(v) for v in seq_lens.tolist()]
    sel, plist = selected_index.tolist(), parent_list.tolist()
    masks, positions, next_token, next_sibling = [], [], [], []
    for b in range(B):
        parents = eagle_parents(plist[b], sel[b], topk)
        masks.append(tree_mask_from_parents(parents))
        positions += [lens[b] + d for d in depths_from_parents(parents)]
        nt, ns = retrieve_links(parents)
        next_token.append(nt)
        next_sibling.append(ns)
    tree = torch.stack(masks) if masks else torch.zeros(0, n, n, dtype=torch.bool)
    if mask_mode == "full":
        mask = tree_custom_mask(tree, lens)[0] if B else torch.zeros(0, dtype=torch.bool)
    elif mask_mode == "qlen":
        mask = tree.flatten()
    elif mask_mode == "qlen_packed":
        nbytes = packed_mask_bytes(n)
        bits = torch.zeros(B * n, nbytes * 8, dtype=torch.int64)
        bits[:, :n] = tree.view(B * n, n)
        weights = 1 << torch.arange(8, dtype=torch.int64)
        mask = (bits.view(B * n, nbytes, 8) * weights).sum(-1).to(torch.uint8)
    else:
        raise ValueError(f"mask_mode must be full, qlen or qlen_packed, got {mask_mode!r}")

    def i64(v):
        return torch.tensor(v, dtype=torch.int64).view(B, n) if B else torch.zeros(0, n, dtype=torch.int64)

    return EagleTree(
        mask.to(device),
        torch.tensor(positions, dtype=torch.int64, device=device),
        (torch.arange(B * n, dtype=torch.int64).view(B, n)).to(device),
        i64(next_token).to(device),
        i64(next_sibling).to(device),
    )


# ---- greedy verification ---------------------------------------------------------------------------
class GreedyVerdict(NamedTuple):
    """Outputs of `verify_tree_greedy`.

    predicts: int32 `[B * n]`, the input buffer with the accepted path written: at each accepted
        node's flat index the target token that accepted its child, at the last one the bonus token.
    accept_index: int32 `[B, num_spec_steps]`, flat indices of the root and the accepted nodes, -1 after.
    accept_length: int32 `[B]`, accepted draft tokens (root and bonus not counted).
    """

    predicts: torch.Tensor
    accept_index: torch.Tensor
    accept_length: torch.Tensor


def verify_tree_greedy(
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    num_spec_steps: int,
    predicts: torch.Tensor | None = None,
) -> GreedyVerdict:
    """SGLang `verify_tree_greedy`: walk each request's tree, accepting drafts equal to the target.

    Starting at the root, step j = 1 .. num_spec_steps - 1 looks at the children of the last accepted
    node (next_token, then next_sibling) and accepts the first whose candidate token equals
    `target_predict.flat[last]` (the target model's argmax after `last`); no match ends the walk. The
    target token at the last accepted node is the bonus token.

    Args:
        candidates: int64 `[B, n]`, the token of every node (the root's is the verified token).
        retrive_index: int64 `[B, n]`, flat index of every node into `target_predict` and `predicts`.
        retrive_next_token, retrive_next_sibling: int64 `[B, n]` child / sibling links, -1 = none.
        target_predict: int64 `[B, n]`, the target model's argmax at every node.
        num_spec_steps: columns of accept_index (SGLang: draft steps + 1).
        predicts: int32 `[B * n]` buffer to write into (copied; default all -1).
    Returns:
        GreedyVerdict(predicts, accept_index, accept_length).

    Worked example: root 0 with children 1, 2; node 1 with child 3. Target argmax after the root is
    7 (node 1's token): accepted; after node 1 it is 5, but node 3 holds 9: rejected. One accepted
    token, the bonus is the target's 5 at node 1:

    >>> v = verify_tree_greedy(torch.tensor([[100, 7, 8, 9]]), torch.tensor([[0, 1, 2, 3]]),
    ...                        torch.tensor([[1, 3, -1, -1]]), torch.tensor([[-1, 2, -1, -1]]),
    ...                        torch.tensor([[7, 5, 6, 4]]), num_spec_steps=3)
    >>> v.accept_index.tolist(), v.accept_length.tolist(), v.predicts.tolist()
    ([[0, 1, -1]], [1], [7, 5, -1, -1])
    """
    B, n = candidates.shape
    device = candidates.device
    out = torch.full((B * n,), -1, dtype=torch.int32) if predicts is None else predicts.detach().cpu().clone()
    cand, ridx = candidates.tolist(), retrive_index.tolist()
    nxt, sib = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    target = target_predict.flatten().tolist()
    accept_index = torch.full((B, num_spec_steps), -1, dtype=torch.int32)
    accept_length = torch.zeros(B, dtype=torch.int32)
    for b in range(B):
        last = ridx[b][0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, num_spec_steps):
            cur = nxt[b][cur]
            while cur != -1 and cand[b][cur] != target[last]:
                cur = sib[b][cur]
            if cur == -1:
                break
            out[last] = target[last]
            accepted += 1
            last = ridx[b][cur]
            accept_index[b, accepted] = last
        accept_length[b] = accepted
        out[last] = target[last]
    return GreedyVerdict(out.to(device), accept_index.to(device), accept_length.to(device))

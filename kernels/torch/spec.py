"""EAGLE tree building and greedy tree verification in plain PyTorch, vectorised over requests and nodes.

Semantics: SGLang `build_tree_kernel_efficient` and `verify_tree_greedy` (attnbench docs/spec.md). Tree
verification attention needs nothing here: it is the custom-mask extend of `attention.py`.
"""

from __future__ import annotations

import torch


def build_eagle_tree(x) -> dict[str, torch.Tensor]:
    """Writes `x.tree_mask`, `x.positions`, `x.retrive_*` from `x.parent_list`, `selected_index`, `seq_lens`.

    Node i >= 1 is candidate `selected_index[i - 1]`; its parent is the root when that // topk is 0,
    else the node whose candidate is `parent_list[candidate // topk]` (first match). Ancestors come
    from `depth` rounds of pointer jumping; children and siblings from index comparisons.
    """
    sel, plist, lens = x.selected_index, x.parent_list, x.seq_lens
    B, n, device = sel.shape[0], x.draft_tokens, sel.device
    node = torch.arange(n, device=device)

    tb = sel // x.topk  # [B, n-1]
    parent_cand = plist.gather(1, tb.clamp(max=plist.shape[1] - 1))
    first = (sel[:, None, :] == parent_cand[:, :, None]).int().argmax(-1)  # first match per node
    parent = torch.cat(
        [torch.full((B, 1), -1, device=device, dtype=torch.int64), torch.where(tb == 0, 0, first + 1)], 1
    )

    anc = node[:, None] == node[None, :]  # [n, n] self
    anc = anc.expand(B, n, n).clone()
    depth = torch.zeros(B, n, dtype=torch.int64, device=device)
    cur = parent.clone()
    for _ in range(x.depth):
        live = cur >= 0
        anc |= (cur[..., None] == node) & live[..., None]
        depth += live
        cur = torch.where(live, parent.gather(1, cur.clamp(min=0)), cur)

    is_child = (parent[:, None, :] == node[None, :, None]) & (node > 0)  # [B, p, i]: i is a child of p
    first_child = torch.where(is_child, node, n).amin(-1)
    x.retrive_next_token.copy_(torch.where(first_child == n, -1, first_child))
    later = (parent[:, :, None] == parent[:, None, :]) & (node[None, :] > node[:, None]) & (node[:, None] > 0)
    sibling = torch.where(later, node, n).amin(-1)
    x.retrive_next_sibling.copy_(torch.where(sibling == n, -1, sibling))
    x.retrive_index.copy_(torch.arange(B * n, device=device).view(B, n))
    x.positions.copy_((lens[:, None] + depth).flatten())

    if x.mask_mode == "qlen":
        x.tree_mask.copy_(anc.flatten())
    elif x.mask_mode == "full":  # [n, L + n] per request: prefix columns True, then the tree
        row = lens + n
        start = torch.cumsum(row * n, 0) - row * n
        where = start[:, None, None] + node[None, :, None] * row[:, None, None] + lens[:, None, None] + node
        x.tree_mask.fill_(True)
        x.tree_mask[where.flatten()] = anc.flatten()
    else:  # qlen_packed: bit j of row i (little-endian bytes) = draft column j
        nbytes = x.tree_mask.shape[1]
        bits = torch.zeros(B * n, nbytes * 8, dtype=torch.int32, device=device)
        bits[:, :n] = anc.view(B * n, n)
        weights = 1 << torch.arange(8, dtype=torch.int32, device=device)
        x.tree_mask.copy_((bits.view(B * n, nbytes, 8) * weights).sum(-1))
    return {
        "tree_mask": x.tree_mask,
        "positions": x.positions,
        "retrive_index": x.retrive_index,
        "retrive_next_token": x.retrive_next_token,
        "retrive_next_sibling": x.retrive_next_sibling,
    }


def verify_greedy(x) -> dict[str, torch.Tensor]:
    """Writes `x.accept_index`, `x.accept_length` and the accepted path of `x.predicts`.

    Steps run in order, all requests at once; within a step each request walks its sibling chain
    until a candidate matches the target token after its last accepted node (a host check per
    sibling hop ends the walk when no request is still searching).
    """
    B, n = x.candidates.shape
    S = x.accept_index.shape[1]
    device = x.candidates.device
    rows = torch.arange(B, device=device)
    target = x.target_predict.flatten()
    last = x.retrive_index[:, 0].clone()
    accept_index = torch.full((B, S), -1, dtype=torch.int64, device=device)
    accept_index[:, 0] = last
    accepted = torch.zeros(B, dtype=torch.int64, device=device)
    active = torch.ones(B, dtype=torch.bool, device=device)
    cur = torch.zeros(B, dtype=torch.int64, device=device)
    for _ in range(1, S):
        cur = torch.where(active, x.retrive_next_token[rows, cur.clamp(min=0)], -1)
        want = target[last]
        found = torch.zeros(B, dtype=torch.bool, device=device)
        while True:
            searching = (cur != -1) & ~found
            at = cur.clamp(min=0)
            hit = searching & (x.candidates[rows, at] == want)
            found |= hit
            hop = searching & ~hit
            if not bool(hop.any()):
                break
            cur = torch.where(hop, x.retrive_next_sibling[rows, at], cur)
        x.predicts[last[found]] = want[found].to(x.predicts.dtype)
        accepted += found
        new_last = x.retrive_index[rows, cur.clamp(min=0)]
        accept_index[rows[found], accepted[found]] = new_last[found]
        last = torch.where(found, new_last, last)
        active &= found
        if not bool(active.any()):
            break
    x.predicts[last] = target[last].to(x.predicts.dtype)
    x.accept_index.copy_(accept_index)
    x.accept_length.copy_(accepted)
    return {"predicts": x.predicts, "accept_index": x.accept_index, "accept_length": x.accept_length}

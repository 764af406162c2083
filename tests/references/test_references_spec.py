"""The spec references (tree masks, EAGLE tree building, greedy verification) against hand-worked cases."""

from __future__ import annotations

import doctest

import pytest
import torch

from attnbench.ops.trees import TreeFields, expand, named_choices, simulate_eagle_draft
from attnbench.references import spec
from attnbench.references.spec import (
    build_eagle_tree,
    eagle_parents,
    parents_from_choices,
    retrieve_links,
    tree_custom_mask,
    tree_mask_from_choices,
    verify_tree_greedy,
)


def rows(*lines: str) -> list[list[bool]]:
    """'1100' -> [True, True, False, False] per row."""
    return [[c == "1" for c in line] for line in lines]


def test_docstring_examples_run():
    failed, _ = doctest.testmod(spec)
    assert failed == 0


# ---- vLLM tree choices -----------------------------------------------------------------------------
def test_chain_is_lower_triangular():
    mask = tree_mask_from_choices([(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)])
    assert torch.equal(mask, torch.ones(5, 5, dtype=torch.bool).tril())


def test_binary_depth_two_by_hand():
    # nodes: 1 (0), 2 (1), 3 (0,0), 4 (0,1), 5 (1,0), 6 (1,1); each sees the root, its parent, itself
    mask = tree_mask_from_choices("[(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)]")
    assert mask.tolist() == rows(
        "1000000",
        "1100000",
        "1010000",
        "1101000",
        "1100100",
        "1010010",
        "1010001",
    )


def test_choices_out_of_breadth_first_order():
    # the article's order: (0,0), (0,1) listed before (1,); node indices follow the list
    mask = tree_mask_from_choices([(0,), (0, 0), (0, 1), (1,), (1, 0)])
    assert mask.tolist() == rows(
        "100000",
        "110000",
        "111000",
        "110100",
        "100010",
        "100011",
    )


def test_three_levels_see_every_ancestor():
    # (0,0,1) is node 4: root, (0,) = 1, (0,0) = 3, itself; not its sibling-branch (1,) = 2
    mask = tree_mask_from_choices([(0,), (1,), (0, 0), (0, 0, 1)])
    assert mask[4].tolist() == [True, True, False, True, True]
    assert parents_from_choices([(0,), (1,), (0, 0), (0, 0, 1)]) == [-1, 0, 0, 1, 3]


def test_root_alone():
    assert tree_mask_from_choices([]).tolist() == [[True]]
    assert tree_mask_from_choices("[]").tolist() == [[True]]


@pytest.mark.parametrize(
    "bad, why",
    [
        ([(0,), (0, 0), (0,)], "listed twice"),
        ([(0, 1)], "parent"),
        ([()], "non-empty"),
        ([(0,), (-1,)], "non-negative"),
    ],
)
def test_malformed_choices_raise(bad, why):
    with pytest.raises(ValueError, match=why):
        tree_mask_from_choices(bad)


@pytest.mark.parametrize("shape, depth, topk", [("chain", 3, None), ("binary", 3, None), ("typical", 4, 4)])
def test_mask_matches_vllm_prefix_rule(shape, depth, topk):
    # vLLM's rule: -inf everywhere, 0 on the diagonal and column 0, 0 at index(path[:c+1]) + 1
    choices = named_choices(shape, depth, topk)
    n = len(choices) + 1
    bias = torch.full((n, n), float("-inf"))
    bias.fill_diagonal_(0)
    bias[:, 0] = 0
    for i, path in enumerate(choices):
        for c in range(len(path) - 1):
            bias[i + 1, choices.index(path[: c + 1]) + 1] = 0
    assert torch.equal(tree_mask_from_choices(choices), bias == 0)


def test_typical_shape_by_hand():
    # topk 3, depth 3: root fans out 3; (0,): 3-1-0 = 2 children, (1,): 1, (2,): 0; (0,0): 3-2-0 = 1
    assert named_choices("typical", 3, 3) == [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]


def test_compact_choices_round_trip():
    assert expand("0_1_0.0_0.1_1.0") == [(0,), (1,), (0, 0), (0, 1), (1, 0)]
    assert TreeFields(tree="[(0,), (1,), (0, 0)]") == TreeFields(tree="0_1_0.0", depth=2)
    with pytest.raises(ValueError, match="depth"):
        TreeFields(tree="0_1_0.0", depth=3)


def test_retrieve_links_by_hand():
    # root -> 1, 2, 3; 1 -> 4, 5; 3 -> 6
    nt, ns = retrieve_links([-1, 0, 0, 0, 1, 1, 3])
    assert nt == [1, 4, -1, 6, -1, -1, -1]
    assert ns == [-1, 2, 3, -1, 5, -1, -1]


def test_tree_custom_mask_by_hand():
    tree = torch.tensor(rows("10", "11"))
    mask, indptr = tree_custom_mask(torch.stack([tree, tree]), [2, 1])
    # request 0: rows [1 1 | 1 0], [1 1 | 1 1]; request 1: [1 | 1 0], [1 | 1 1]
    assert indptr.tolist() == [0, 8, 14]
    assert mask.tolist() == [bool(c == "1") for c in "11101111" + "110111"]


def test_tree_custom_mask_per_request_sizes_by_hand():
    """A mixed batch: a 3-token tree (root, two siblings) over 1 prefix key, then a causal request of 2 new
    tokens (the chain) over 2 prefix keys."""
    tree, causal = torch.tensor(rows("100", "110", "101")), torch.tensor(rows("10", "11"))
    mask, indptr = tree_custom_mask([tree, causal], [1, 2])
    # request 0: [1 | 1 0 0], [1 | 1 1 0], [1 | 1 0 1]; request 1: [1 1 | 1 0], [1 1 | 1 1]
    assert indptr.tolist() == [0, 12, 20]
    assert mask.tolist() == [bool(c == "1") for c in "1100" + "1110" + "1101" + "1110" + "1111"]
    with pytest.raises(ValueError, match="2 tree masks for 3 requests"):
        tree_custom_mask([tree, causal], [1, 2, 3])


# ---- SGLang EAGLE trees ----------------------------------------------------------------------------
# Two requests, topk 2, depth 3 (draft steps), n = 6. Candidate indices: step 0: 0, 1 (children of the
# root); step 1: 2 + 2j + c = child c of the step-0 node j; step 2: 6 + 2j + c = child c of the j-th
# node step 1 kept, whose candidate index is parent_list[3 + j].
#   request 0: step 1 kept 2 and 4 -> parent_list [-1, 0, 1, 2, 4]; selected [0, 1, 2, 3, 6]
#     node 1 = cand 0 (root), node 2 = cand 1 (root), node 3 = cand 2 (2//2 = 1 -> parent_list[1] = 0 ->
#     node 1), node 4 = cand 3 (-> node 1), node 5 = cand 6 (6//2 = 3 -> parent_list[3] = 2 -> node 3)
#   request 1: step 1 kept 5 then 3 -> parent_list [-1, 0, 1, 5, 3]; selected [0, 1, 3, 5, 8]
#     node 3 = cand 3 (-> cand 0 = node 1), node 4 = cand 5 (5//2 = 2 -> parent_list[2] = 1 -> node 2),
#     node 5 = cand 8 (8//2 = 4 -> parent_list[4] = 3 -> node 3)
PARENT_LIST = torch.tensor([[-1, 0, 1, 2, 4], [-1, 0, 1, 5, 3]])
SELECTED = torch.tensor([[0, 1, 2, 3, 6], [0, 1, 3, 5, 8]])
SEQ_LENS = torch.tensor([3, 2])
TREE_0 = rows("100000", "110000", "101000", "110100", "110010", "110101")
TREE_1 = rows("100000", "110000", "101000", "110100", "101010", "110101")


def test_eagle_parents_by_hand():
    assert eagle_parents(PARENT_LIST[0].tolist(), SELECTED[0].tolist(), 2) == [-1, 0, 0, 1, 1, 3]
    assert eagle_parents(PARENT_LIST[1].tolist(), SELECTED[1].tolist(), 2) == [-1, 0, 0, 1, 2, 3]


def test_eagle_tree_by_hand_every_output():
    t = build_eagle_tree(PARENT_LIST, SELECTED, SEQ_LENS, topk=2, depth=3, num_draft_tokens=6, mask_mode="qlen")
    assert t.tree_mask.view(2, 6, 6).tolist() == [TREE_0, TREE_1]
    assert t.positions.tolist() == [3, 4, 4, 5, 5, 6] + [2, 3, 3, 4, 4, 5]
    assert t.retrive_index.tolist() == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    assert t.retrive_next_token.tolist() == [[1, 3, -1, 5, -1, -1], [1, 3, 4, 5, -1, -1]]
    assert t.retrive_next_sibling.tolist() == [[-1, 2, -1, 4, -1, -1], [-1, 2, -1, -1, -1, -1]]
    assert all(v.dtype == torch.int64 for v in t[1:])


def test_eagle_full_mask_by_hand():
    t = build_eagle_tree(PARENT_LIST, SELECTED, SEQ_LENS, topk=2, depth=3, num_draft_tokens=6, mask_mode="full")
    # request 0: 6 rows of 3 prefix + 6 tree columns; request 1: 6 rows of 2 + 6
    want = [[True] * 3 + r for r in TREE_0] + [[True] * 2 + r for r in TREE_1]
    assert t.tree_mask.dtype == torch.bool and t.tree_mask.numel() == 5 * 6 + 2 * 6 * 6
    assert t.tree_mask.tolist() == [v for r in want for v in r]


def test_eagle_packed_mask_by_hand():
    t = build_eagle_tree(PARENT_LIST, SELECTED, SEQ_LENS, topk=2, depth=3, num_draft_tokens=6, mask_mode="qlen_packed")
    # bit j = column j: request 0 row 3 sees 0, 1, 3 -> 0b1011 = 11; row 5 sees 0, 1, 3, 5 -> 43
    assert t.tree_mask.dtype == torch.uint8
    assert t.tree_mask.view(2, 6).tolist() == [[1, 3, 5, 11, 19, 43], [1, 3, 5, 11, 21, 43]]


def test_eagle_packed_mask_is_little_endian_over_bytes():
    # a chain of 12 tokens: row 11 sees columns 0..11 -> bytes 0xFF, 0x0F (two bytes per row)
    n = 12
    t = build_eagle_tree(
        torch.tensor([[-1] + list(range(10))]), torch.arange(n - 1)[None], torch.tensor([0]),
        topk=1, depth=n - 1, num_draft_tokens=n, mask_mode="qlen_packed",
    )  # fmt: skip
    assert t.tree_mask.shape == (n, 2)
    assert t.tree_mask[11].tolist() == [255, 15] and t.tree_mask[3].tolist() == [15, 0]


def test_topk_one_is_a_chain():
    t = build_eagle_tree(
        torch.tensor([[-1, 0, 1, 2]]), torch.tensor([[0, 1, 2, 3]]), torch.tensor([7]),
        topk=1, depth=4, num_draft_tokens=5, mask_mode="qlen",
    )  # fmt: skip
    assert torch.equal(t.tree_mask.view(5, 5), torch.ones(5, 5, dtype=torch.bool).tril())
    assert t.positions.tolist() == [7, 8, 9, 10, 11]
    assert t.retrive_next_token.tolist() == [[1, 2, 3, 4, -1]]


def test_unselected_parent_is_an_error():
    # candidate 6 hangs off parent_list[3] = 2, which was not selected
    with pytest.raises(ValueError, match="not selected"):
        eagle_parents([-1, 0, 1, 2, 4], [0, 1, 3, 4, 6], 2)


def test_simulated_drafts_have_sglang_layout():
    g = torch.Generator().manual_seed(3)
    d = simulate_eagle_draft(batch=3, topk=4, depth=4, n=16, gen=g)
    assert d.parent_list.shape == (3, 4 * 3 + 1) and d.selected_index.shape == (3, 15)
    assert d.parent_list[:, :5].tolist() == [[-1, 0, 1, 2, 3]] * 3
    # step s (1, 2) keeps candidates of its own block: [4 + 16 (s - 1), 4 + 16 s)
    for s in (1, 2):
        block = d.parent_list[:, 1 + 4 * s : 5 + 4 * s]
        assert ((block >= 4 + 16 * (s - 1)) & (block < 4 + 16 * s)).all()
    assert torch.equal(d.selected_index, d.selected_index.sort(-1).values)
    chain = simulate_eagle_draft(batch=2, topk=1, depth=5, n=6, gen=g)
    assert chain.selected_index.tolist() == [[0, 1, 2, 3, 4]] * 2


# ---- greedy verification ---------------------------------------------------------------------------
# Request 0 uses tree 0 (root -> 1, 2; 1 -> 3, 4; 3 -> 5), request 1 tree 1 (root -> 1, 2; 1 -> 3; 2 -> 4;
# 3 -> 5) at flat indices 6..11.
NEXT_TOKEN = torch.tensor([[1, 3, -1, 5, -1, -1], [1, 3, 4, 5, -1, -1]])
NEXT_SIBLING = torch.tensor([[-1, 2, -1, 4, -1, -1], [-1, 2, -1, -1, -1, -1]])
RETRIVE_INDEX = torch.arange(12).view(2, 6)
CANDIDATES = torch.tensor([[100, 7, 8, 9, 3, 5], [200, 4, 6, 8, 10, 12]])


def greedy(target, steps=4, predicts=None):
    return verify_tree_greedy(
        CANDIDATES, RETRIVE_INDEX, NEXT_TOKEN, NEXT_SIBLING, torch.tensor(target), steps, predicts=predicts
    )


def test_greedy_full_accept_and_first_step_rejection():
    # request 0: after the root the target says 7 (node 1), after node 1 it says 9 (node 3, node 1's first
    # child), after node 3 it says 5 (node 5): three accepted, the bonus is the target's 11 at node 5.
    # request 1: the target says 42 after the root; no child holds it: nothing accepted, bonus 42.
    v = greedy([[7, 9, 0, 5, 0, 11], [42, 0, 0, 0, 0, 0]])
    assert v.accept_length.tolist() == [3, 0]
    assert v.accept_index.tolist() == [[0, 1, 3, 5], [6, -1, -1, -1]]
    want = [-1] * 12
    want[0], want[1], want[3], want[5] = 7, 9, 5, 11
    want[6] = 42
    assert v.predicts.tolist() == want
    assert v.predicts.dtype == v.accept_index.dtype == v.accept_length.dtype == torch.int32


def test_greedy_walks_siblings_and_stops_with_the_bonus():
    # request 0: target 3 after node 1: node 3 holds 9 (no), its sibling node 4 holds 3 (yes); node 4 has
    # no children, so the walk ends with the bonus 77 at node 4.
    # request 1: target 6 after the root: node 1 holds 4, node 2 holds 6 (accepted); target 99 after node 2,
    # its child node 4 holds 10: rejected; bonus 99 at node 2 (flat 8).
    v = greedy([[7, 3, 0, 0, 77, 0], [6, 0, 99, 0, 0, 0]], predicts=torch.full((12,), -5, dtype=torch.int32))
    assert v.accept_length.tolist() == [2, 1]
    assert v.accept_index.tolist() == [[0, 1, 4, -1], [6, 8, -1, -1]]
    want = [-5] * 12  # entries off the accepted paths keep what the buffer held
    want[0], want[1], want[4] = 7, 3, 77
    want[6], want[8] = 6, 99
    assert v.predicts.tolist() == want


def test_greedy_stops_at_num_spec_steps():
    # with 2 columns only one step runs: node 1 accepted, its child is not looked at; bonus at node 1
    v = greedy([[7, 9, 0, 5, 0, 11], [42, 0, 0, 0, 0, 0]], steps=2)
    assert v.accept_index.tolist() == [[0, 1], [6, -1]]
    assert v.accept_length.tolist() == [1, 0]
    assert v.predicts[:2].tolist() == [7, 9]

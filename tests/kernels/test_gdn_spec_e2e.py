"""GDN speculative decoding end to end: decode -> verify (conv verify + gdn_verify) -> commit -> decode
ends in the same pools as decoding the accepted tokens one at a time (conv update + gdn_decode).

For every backend that implements all of gdn_decode, gdn_verify, causal_conv1d (update and verify) and
gdn_commit (torch and triton at least; the Triton kernels run in the interpreter on a CPU), for chains
and trees, with and without padding requests, on the CPU and (skipped without one) on a CUDA device.

Tolerance of the recurrent states: both paths run the same fp32 recurrence on the same inputs; they may
differ only in how a kernel orders the fp32 sums of one step (S^T k and S^T q are K-long dot products,
the update is elementwise). A reordered sum of K terms is off by at most K u sum|terms| (u = 2^-24),
and with |k^| = 1, sum_i |S_ij k_i| <= sqrt(K) max|S|; a step's delta-rule map is a contraction
(decay <= 1, I - beta k k^T with 0 < beta < 1), so the errors of the steps add up at most. Hence
atol = steps * K^1.5 * u * max|S|, rtol 0 (about 1e-5 here; a wrong committed step is off by O(1)).
Conv states are copies of raw inputs in both paths: compared bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from attnbench.backend import all_backends, load_builtin
from attnbench.buffers import alloc_output
from attnbench.case import Case
from attnbench.check.prepared import call_untimed
from attnbench.ops.gdn import CommitInputs, ConvInputs, GDNInputs

B, T, H, HV, K, V, W = 4, 4, 1, 2, 16, 16, 4
D = 2 * H * K + HV * V  # conv channels, as a GDN layer's [q | k | v]
N = B + 3  # spare slots stay bitwise untouched
DT = torch.bfloat16
U32 = 2.0**-24
# cases of the same shapes: what each op's declared limits are asked about
NEEDED = {
    "gdn_decode": f"gdn_decode/b{B}-h{H}x{HV}-d{K}x{V}-bf16",
    "gdn_verify": f"gdn_verify/b{B}-t{T}-h{H}x{HV}-d{K}x{V}-tree-bf16",
    "conv update": f"causal_conv1d/b{B}-t1-c{D}-update-bf16",
    "conv verify": f"causal_conv1d/b{B}-t{T}-c{D}-tree-verify-bf16",
    "gdn_commit": f"gdn_commit/b{B}-t{T}-h{HV}-d{K}x{V}-c{D}-bf16",
}
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])]
load_builtin()


def _backend(name: str, device: str):
    b = all_backends()[name]
    if why := b.available():
        pytest.skip(why)
    cases = {what: Case.from_id(cid, device) for what, cid in NEEDED.items()}
    for what, case in cases.items():
        if why := b.supports(case):
            if name == "torch":
                raise AssertionError(f"torch must implement every op of the flow; {what}: {why}")
            pytest.skip(f"{name} {what}: {why}")
    return b, cases


class Layer:
    """One GDN layer's weights and pools, and the ops of one backend over them."""

    def __init__(self, backend, cases, device, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.b, self.cases, self.dev, self.g = backend, cases, device, g
        self.A_log = torch.log(torch.rand(HV, generator=g) * 15 + 1).to(device)
        self.dt_bias = (torch.rand(HV, generator=g) * 0.5 - 3).to(DT).to(device)
        self.weight = (torch.randn(D, W, generator=g) * W**-0.5).to(DT).to(device)
        self.bias = (torch.randn(D, generator=g) * 0.5).to(DT).to(device)
        self.pool = (torch.randn(N, HV, K, V, generator=g) * 0.5).to(device)
        self.conv = torch.randn(N, D, W - 1, generator=g).to(DT).to(device)

    def tokens(self, n: int) -> dict[str, torch.Tensor]:
        """n tokens' inputs of both ops (q, k, v, raw gates; the conv input x)."""
        g, dev = self.g, self.dev
        t = {
            "q": torch.randn(n, H, K, generator=g),
            "k": torch.randn(n, H, K, generator=g),
            "v": torch.randn(n, HV, V, generator=g),
            "a": torch.randn(n, HV, generator=g),
            "b": torch.randn(n, HV, generator=g) * 1.5,
            "x": torch.randn(n, D, generator=g),
        }
        return {k: v.to(DT).to(dev) for k, v in t.items()}

    def _gdn(self, tok, indices, **extra) -> GDNInputs:
        n = tok["q"].shape[0]
        return GDNInputs(
            q=tok["q"], k=tok["k"], v=tok["v"], a=tok["a"], b=tok["b"], A_log=self.A_log, dt_bias=self.dt_bias,
            state_pool=self.pool, state_indices=indices, o=alloc_output((n, HV, V), DT, self.dev), scale=K**-0.5,
            lens_host=(n // indices.shape[0],) * indices.shape[0], **extra,
        )  # fmt: skip

    def _conv(self, x, indices, **extra) -> ConvInputs:
        n, nb = x.shape[0], indices.shape[0]
        return ConvInputs(
            x=x, weight=self.weight, bias=self.bias, conv_states=self.conv, cache_indices=indices,
            has_initial_state=torch.ones(nb, dtype=torch.bool, device=self.dev),
            query_start_loc=(torch.arange(nb + 1, dtype=torch.int32) * (n // nb)).to(self.dev),
            y=alloc_output((n, D), DT, self.dev), lens_host=(n // nb,) * nb, **extra,
        )  # fmt: skip

    def run(self, what: str, x):
        out = call_untimed(self.b.prepare(self.cases[what], x))  # with its finalize, as a sweep calls it
        if self.dev == "cuda":
            torch.cuda.synchronize()
        return out

    def decode(self, tok, indices):
        """One decode step over the whole batch, padding rows (-1) included as a server's CUDA graph runs
        them: conv update + gdn_decode."""
        self.run("conv update", self._conv(tok["x"], indices, update=True))
        self.run("gdn_decode", self._gdn(tok, indices))

    def verify(self, tok, indices, parents):
        """conv verify + gdn_verify over T draft tokens per request; returns (inter_states, windows)."""
        windows = alloc_output((B, T, D, W - 1), DT, self.dev)
        self.run("conv verify", self._conv(tok["x"], indices, verify=True, parents=parents,
                                           intermediate_conv_windows=windows))  # fmt: skip
        inter = alloc_output((B, T, HV, K, V), torch.float32, self.dev)
        self.run("gdn_verify", self._gdn(tok, indices, parents=parents, inter_states=inter))
        return inter, windows

    def commit(self, inter, windows, last, indices):
        self.run("gdn_commit", CommitInputs(inter, windows, last, self.pool, self.conv, indices))


def _accepted(tree: bool, g: torch.Generator) -> tuple[torch.Tensor | None, list[int], list[list[int]]]:
    """(parents or None, last accepted node per request, the accepted path of each request).

    Requests accept 0, 2, T and 1 tokens (chain); a tree accepts the path to a random node, one request
    none, and one the deepest node (every other branch rejected)."""
    if not tree:
        lengths = [0, 2, T, 1]
        return None, [n - 1 for n in lengths], [list(range(n)) for n in lengths]
    parents = torch.full((B, T), -1, dtype=torch.int32)
    for t in range(1, T):
        parents[:, t] = torch.randint(-1, t, (B,), generator=g, dtype=torch.int32)
    parents[2, 1:] = torch.arange(T - 1, dtype=torch.int32)  # request 2: a chain inside the tree
    parents[3, 1:] = torch.tensor([-1, 0, 0][: T - 1], dtype=torch.int32)  # request 3: siblings
    last = [-1, int(torch.randint(0, T, (1,), generator=g)), T - 1, T - 1]
    paths = []
    for b, node in enumerate(last):
        path = []
        while node >= 0:
            path.append(node)
            node = int(parents[b, node])
        paths.append(path[::-1])
    return parents, last, paths


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pad", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("tree", [False, True], ids=["chain", "tree"])
@pytest.mark.parametrize("backend", sorted(all_backends()))
def test_verify_commit_equals_decoding_the_accepted_tokens(backend, tree, pad, device):
    b, cases = _backend(backend, device)
    g = torch.Generator().manual_seed(11 + 2 * tree + pad)
    slots = torch.randperm(N, generator=g)[:B].to(torch.int32)
    if pad:
        slots[1] = -1  # request 1 is padding: its tokens go through the ops, the pools never see them
    idx = slots.to(device)
    parents, last, paths = _accepted(tree, g)

    spec = Layer(b, cases, device, seed=5)
    first, draft, after = spec.tokens(B), spec.tokens(B * T), spec.tokens(B)
    spec.decode(first, idx)
    pool0, conv0 = spec.pool.clone(), spec.conv.clone()  # the pre-verify pools

    # decode -> verify -> commit -> decode
    inter, windows = spec.verify(draft, idx, None if parents is None else parents.to(device))
    assert torch.equal(spec.pool, pool0) and torch.equal(spec.conv, conv0), "verify changed a pool"
    last_t = torch.tensor(last, dtype=torch.int32, device=device)
    spec.commit(inter, windows, last_t, idx)
    committed = spec.pool.clone()
    spec.decode(after, idx)

    # the same layer decoding only the accepted tokens, one step per token
    base = Layer(b, cases, device, seed=5)
    base.pool, base.conv = pool0.clone(), conv0.clone()
    for step in range(T):
        reqs = [r for r in range(B) if slots[r] >= 0 and len(paths[r]) > step]
        if not reqs:
            continue
        rows = torch.tensor([r * T + paths[r][step] for r in reqs], device=device)
        base.decode({k: v[rows] for k, v in draft.items()}, idx[reqs])
    base.decode(after, idx)

    real = [int(s) for s in slots if s >= 0]
    spare = [s for s in range(N) if s not in real]
    for name, got, before in (("state", spec.pool, pool0), ("conv", spec.conv, conv0)):
        for s in spare:
            assert torch.equal(got[s], before[s]), f"{name} pool: spare slot {s} changed"
    assert torch.equal(spec.conv, base.conv), "conv states differ from decoding the accepted tokens"
    steps = T + 2
    atol = steps * K**1.5 * U32 * float(base.pool.abs().max())
    torch.testing.assert_close(spec.pool, base.pool, rtol=0, atol=atol)
    # the comparison can tell: every request that accepted a token moved its state further than atol
    for r, s in enumerate(slots.tolist()):
        if s >= 0 and paths[r]:
            assert float((committed[s] - pool0[s]).abs().max()) > 100 * atol, f"request {r} committed nothing"
        elif s >= 0:
            assert torch.equal(committed[s], pool0[s]), f"request {r} accepted nothing but its slot changed"

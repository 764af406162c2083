"""GDN-family op contracts: `gdn_gating`, `causal_conv1d`, `gdn_decode`, `gdn_extend`, `gdn_verify`,
`gdn_commit`.

Canonical semantics (docs/conventions.md; the math is in `attnbench.references.gdn`):

- Heads: `H` q/k heads, `HV` v-heads (GVA: v-head `hv` reads q/k head `hv // (HV / H)`), head dims
  `K` (q/k) and `V`. q and k arrive raw (not normalised); kernels L2-normalise them
  (`x / sqrt(sum x^2 + 1e-6)`) and scale q by `scale` (default `K**-0.5`).
- Gates: raw `a`, `b` `[T, HV]` (case dtype), `A_log [HV]` fp32, `dt_bias [HV]` (case dtype);
  `g = -exp(A_log) * softplus(a + dt_bias)` (threshold 20), `beta = sigmoid(b)`, both fp32.
  `gdn_decode` and `gdn_verify` take the raw gates (the gating is fused); `gdn_extend` takes `g`,
  `beta` as `gdn_gating` makes them.
- States: a pool `[N, HV, K, V]` fp32 addressed by `state_indices [B]` int32; per step decay first,
  then the delta against the decayed state, then the output from the updated state. A negative
  index is padding: the pool is neither read nor written for it, and its output rows are
  unspecified (SGLang computes them from a zero state, FlashInfer writes zeros).
- Tokens are packed token-major: `q [T, H, K]`, `v [T, HV, V]`, `o [T, HV, V]`. Extend packs requests
  by `cu_seqlens [B+1]`; verify packs `draft` tokens per request (token `b * draft + t`).
- causal_conv1d: token-major `x [T, dim]` (SGLang's `causal_conv1d_fn` takes the `[dim, T]` transposed
  view of this same memory, `mixed_qkv.transpose(0, 1)`), `weight [dim, W]`, `bias [dim]`, conv
  states `[N, dim, W-1]` addressed by `cache_indices [B]`, SiLU. `mode: prefill` is the varlen form
  (`query_start_loc [B+1]`, `has_initial_state [B]`); `mode: update` is one decode token per request
  (`x [B, dim]`). Both write the new states (the last W-1 raw inputs, bit-exact copies). Update mode
  takes padding rows as a server's CUDA-graph-padded decode batch has them (`pad`; `cache_indices`
  -1, as verify's): no slot is read or written for them (every slot of the pool stays bitwise as it
  was, -1 is not the last slot) and their output rows are unspecified.
  `mode: verify` is speculative verify: `seq_len` draft tokens per request packed like gdn_verify's
  (token `b * draft + t`, `x [B * draft, dim]`), a chain or a tree (`parents [B, draft]`, -1 = the
  pool state), every request from its pool state (`cache_indices`, -1 = padding: nothing read, its
  outputs unspecified). Each token's output continues its parent's window, and the window after each
  token (the W-1 most recent raw inputs along its path, root to token via parents, not the packed
  order) goes to `intermediate_conv_windows [B, draft, dim, W-1]` (case dtype, exact copies). The pool
  is NOT written in verify mode.
- Speculative decoding, verify -> commit (docs/conventions.md "GDN speculative verify and commit"):
  gdn_verify and causal_conv1d's verify mode keep the recurrent state and the conv window after every
  draft token and leave both pools alone; once the draft is judged, `gdn_commit` copies the state and
  the window after each request's last accepted token into its pool slots (none accepted: the pools
  keep the pre-verify state; rejected branches leave no trace). Decoding the accepted tokens one at a
  time (conv update + gdn_decode) ends in the same pools.

Inputs are realistic: pool slots hold random states, slots are shuffled, spare slots exist (and must
stay bitwise untouched), gates span strong and weak decay (`exp(g)` from ~0.02 to ~1), and some raw
gates `a` sit beyond the softplus threshold (20) and beyond float32 `exp` overflow (88.7).

Cost model (what `flops()` and `bytes()` count; per v-head, summed over heads and requests):

- gdn_decode / gdn_verify: FLOPs = 6 K V per token (S^T k, k u^T, S^T q at 2 FLOPs per
  multiply-add; the decay scaling, gating and normalisation are not counted). Bytes = the fp32 state
  read once per request and written once (decode) or written after every step to `inter_states`
  (verify) + q, k, v, o, raw gates, A_log, dt_bias, indices (and parents). Padding rows count for
  their q/k/v/o bytes but not for state traffic or FLOPs.
- gdn_extend: FLOPs of the chunked form at chunk size c = 64, per chunk of n <= c tokens:
  6 n K V (W S, (Gamma q) S, k^T U') + 4 n^2 (K + V) (k k^T, q k^T, T (beta Gamma k), P U')
  + n^3 / 3 (the triangular solve). Bytes = q, k, v, o + g, beta (fp32) + initial states read (requests
  with one) + final states written.
- gdn_gating: elementwise, no FLOPs counted. Bytes = a, b read, g, beta written, A_log, dt_bias.
- causal_conv1d: FLOPs = 2 W dim per token of a real request. Bytes = x read, y written (all rows),
  weight, bias, states read (the real requests with an initial state) and written (the real
  requests'), indices. Verify mode: FLOPs of the real requests' tokens;
  bytes = x, y (all rows), weight, bias, the real requests' states read and their windows written
  (draft per request), indices and parents.
- gdn_commit: no FLOPs. Bytes = per real request that accepted a token, its state and conv window read
  from the verify buffers and written to the pools, + indices and accepted indices of every request.

One module per concern: params.py (parameters), inputs.py (the inputs dataclasses and the helpers that
draw them, shared with gdn_chain), gating.py, conv.py, delta.py (gdn_decode, gdn_extend, gdn_verify and
their shared contract) and commit.py, one per op. The ops are registered in harness/ops/__init__.py.
"""

from attnbench.ops.gdn.commit import GDNCommitOp
from attnbench.ops.gdn.conv import CausalConv1dOp
from attnbench.ops.gdn.delta import GDNDecodeOp, GDNExtendOp, GDNVerifyOp
from attnbench.ops.gdn.gating import GDNGatingOp
from attnbench.ops.gdn.inputs import CommitInputs, ConvInputs, GatingInputs, GDNInputs
from attnbench.ops.gdn.params import (
    ConvParams,
    GatingParams,
    GDNCommitParams,
    GDNDecodeParams,
    GDNExtendParams,
    GDNParams,
    GDNVerifyParams,
)

__all__ = [
    "CausalConv1dOp",
    "CommitInputs",
    "ConvInputs",
    "ConvParams",
    "GDNCommitOp",
    "GDNCommitParams",
    "GDNDecodeOp",
    "GDNDecodeParams",
    "GDNExtendOp",
    "GDNExtendParams",
    "GDNInputs",
    "GDNParams",
    "GDNVerifyOp",
    "GDNVerifyParams",
    "GatingInputs",
    "GatingParams",
    "GDNGatingOp",
]

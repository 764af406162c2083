"""The bundled pure-PyTorch backend: every op, CPU and GPU, the baseline present in every suite."""

from __future__ import annotations

from attnbench.backend import Backend, implements, register_backend
from attnbench.kernels.torch import gdn
from attnbench.kernels.torch.attention import prepare_paged_attention
from attnbench.kernels.torch.merge import merge_state
from attnbench.kernels.torch.spec import build_eagle_tree, verify_greedy

# why its closures may not be replayed in a CUDA graph on another batch (the replay check, docs/replay.md)
HOST_LENGTHS = "gathers each request's keys by the batch's host-side lengths (seq_lens_host), read in prepare"


@register_backend("torch")
class TorchBackend(Backend):
    description = "plain PyTorch in the case dtype with float32 accumulation (vectorised, CPU and GPU)"

    @implements("decode", graph_safe=HOST_LENGTHS)
    def prepare_decode(self, case, x):
        return prepare_paged_attention(x)

    # tree verification is a custom-mask extend with save: its inputs are extend's, converted by nothing
    @implements("extend", "tree_verify")
    def prepare_extend(self, case, x):
        return prepare_paged_attention(x)

    prepare_tree_verify = prepare_extend

    @implements("merge_state")
    def prepare_merge_state(self, case, x):
        return lambda: merge_state(x)

    @implements("eagle_build_tree")
    def prepare_eagle_build_tree(self, case, x):
        return lambda: build_eagle_tree(x)

    @implements("verify_greedy")
    def prepare_verify_greedy(self, case, x):
        return lambda: verify_greedy(x)

    @implements("gdn_gating")
    def prepare_gdn_gating(self, case, x):
        return lambda: gdn.gdn_gating(x)

    @implements("causal_conv1d")
    def prepare_causal_conv1d(self, case, x):
        return lambda: gdn.causal_conv1d(x)

    @implements("gdn_decode", state_layout="kv", graph_safe=True)  # no host sync (gdn._write_slots)
    def prepare_gdn_decode(self, case, x):
        return lambda: gdn.gdn_decode(x)

    @implements("gdn_extend", state_layout="kv")
    def prepare_gdn_extend(self, case, x):
        return lambda: gdn.gdn_extend(x)

    @implements("gdn_verify", state_layout="kv", graph_safe=True)
    def prepare_gdn_verify(self, case, x):
        return lambda: gdn.gdn_verify(x)

    @implements("gdn_commit", state_layout="kv")
    def prepare_gdn_commit(self, case, x):
        return lambda: gdn.gdn_commit(x)

"""Plugin reproducing a Triton 3.6 miscompile on Hopper (docs/findings.md): our GDN chunked extend with
the output kernel forced to BV=32, num_warps=4, num_stages=2, as backend `triton-gdn-bv32`.

    attnbench sweep --case gdn_extend/b1-t16384-h32x32-d128x128-bf16 -b triton-gdn-bv32 -b triton \\
        --plugin tools/probes/triton_gdn_out_bv32.py --sanitize memcheck --sanitize-max 0

Without attnbench (torch + triton only, the kernel trimmed to its dots): docs/findings/repro/triton_gdn_out_bv32.py.
"""

import triton

import attnbench
from attnbench.kernels.triton import TritonBackend, gdn_chunk

BV32 = triton.Config({"BV": 32, "BVI": 32}, num_warps=4, num_stages=2)


@attnbench.register_backend("triton-gdn-bv32")
class TritonGdnBV32(TritonBackend):
    description = "our Triton GDN extend with its output kernel forced to BV=32, 4 warps (Triton miscompile repro)"

    def prepare_gdn_extend(self, case, x):
        fn, kernel = super().prepare_gdn_extend(case, x), gdn_chunk.OUT_TUNED[""]

        def run():  # the forced config for this call only; the `triton` backend keeps its own
            saved = kernel.configs
            kernel.configs = [BV32]
            kernel.cache.clear()
            try:
                return fn()
            finally:
                kernel.configs = saved
                kernel.cache.clear()

        return run

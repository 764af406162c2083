"""Plugin: the Triton GDN extend with one _chunk_out_kernel config forced (gdn-out0..3)."""
import attnbench
from attnbench.kernels.triton import TritonBackend
from attnbench.kernels.triton import gdn_chunk

ALL = list(gdn_chunk._chunk_out_kernel.configs)


def make(i):
    class Forced(TritonBackend):
        def prepare_gdn_extend(self, case, x):
            gdn_chunk._chunk_out_kernel.configs = [ALL[i]]
            gdn_chunk._chunk_out_kernel.cache.clear()
            return super().prepare_gdn_extend(case, x)
    Forced.__name__ = f"GdnOut{i}"
    attnbench.register_backend(f"gdn-out{i}")(Forced)


for i in range(len(ALL)):
    make(i)
print("configs:", [str(c) for c in ALL])

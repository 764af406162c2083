"""Run one MLA decode case (argv: B L [impl ...]) twice on each MLA kernel (default: ws wgmma triton), for
Nsight Compute (`ncu --kernel-name regex:ws_kernel --launch-skip 1 --launch-count 1 python
tools/probes/mla_gluon_once.py 128 8192 ws`)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from mla_gluon_gpu import bind_launches, decode_mla, make, plan_for  # noqa: E402

B, L = int(sys.argv[1]), int(sys.argv[2])
x = make(B, L)
for impl in sys.argv[3:] or ["ws", "wgmma", "triton"]:
    f = bind_launches(decode_mla._launches(x, plan_for(x, impl)), {"o": x.o})
    f()
    f()
torch.cuda.synchronize()

"""Run one MLA decode case (argv: B L) twice through the Gluon and the Triton MLA kernels, for Nsight Compute
(`ncu --kernel-name regex:gluon --launch-skip 1 --launch-count 1 python tools/probes/mla_gluon_once.py 128 8192`)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
from mla_gluon_gpu import bind_launches, decode_mla, decode_mla_gluon, make  # noqa: E402

B, L = int(sys.argv[1]), int(sys.argv[2])
x = make(B, L)
plan = decode_mla.plan_mla_decode(x)
gluon = bind_launches(decode_mla_gluon.gluon_launches(x, plan), {"o": x.o})
plan = decode_mla.plan_mla_decode(x, config=decode_mla.MLAConfig(64, 64, 8, 2, False))  # the Triton MLA kernel
triton_mla = bind_launches(decode_mla._launches(x, plan), {"o": x.o})
for f in (gluon, gluon, triton_mla, triton_mla):
    f()
torch.cuda.synchronize()

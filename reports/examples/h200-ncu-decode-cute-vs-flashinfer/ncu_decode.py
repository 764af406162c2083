"""Profile target for ncu: one backend's decode on the issue-5 case, inside an NVTX range "prof".

    ncu --nvtx --nvtx-include "prof/" --set full -o X python .gpurun/ncu_decode.py BACKEND [CASE]
"""

import sys

import torch

from attnbench.backend import get_backend, load_builtin
from attnbench.case import Case

load_builtin()
name = sys.argv[1]
case = Case.from_id(sys.argv[2] if len(sys.argv) > 2 else "decode/b64-l4096-h32x8-d128-p16-bf16", "cuda")
x = case.make_inputs()
run = get_backend(name).prepare(case, x)
for _ in range(3):
    run()
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("prof")
run()
torch.cuda.synchronize()
torch.cuda.nvtx.range_pop()
print("ok", name)

"""Built-in backends, one sub-package each. Importing this registers every one of them.

Each package imports without its optional library; its `available()` then says what is missing.

Triton's autotuner keeps its choices on disk here (`TRITON_CACHE_AUTOTUNING=1`, unless the environment
sets it): the Triton kernels of several backends (FLA's chunked GDN, SGLang's, our GDN kernels) time
every candidate configuration on their first call in each process, and with the cache a second run or
a new worker launches the choice of the first. Triton keys a choice by its own version, the GPU
architecture, the kernel's source, the environment it reads, the tuning key and the candidates, so a
changed kernel tunes again; `TRITON_CACHE_AUTOTUNING=0` turns it off (docs/measurement.md).
"""

import os

os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")  # before any library defines its autotuners

from attnbench.kernels import chain, cute, fla, flashinfer, sglang, torch, triton, vllm  # noqa: E402, F401

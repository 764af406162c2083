"""CuTe DSL backends. `fa4.py`: FlashAttention-4 (`flash_attn.cute`) as the `fa4` backend;
`backend.py`: attnbench's own CuTe DSL kernels as the `cute` backend, one module per op family
(`decode.py`: split-KV paged decode; `gdn_decode.py`: GDN decode; `common.py`: availability, compile
cache, stream). Nothing in this package
imports cutlass or flash_attn at import time: without them (or without an sm_90+ GPU) every case
is a skip that says what is missing.
"""

from attnbench.kernels.cute import backend, fa4  # noqa: F401  (registers `cute` and `fa4`)

"""CuTe DSL backends. `fa4.py`: FlashAttention-4 (`flash_attn.cute`) as the `fa4` backend.

attnbench's own CuTe DSL kernels belong here too, one module per op family. Nothing in this package
imports cutlass or flash_attn at import time: without them (or without an sm_90+ GPU) every case
is a skip that says what is missing.
"""

from attnbench.kernels.cute import fa4  # noqa: F401  (registers `fa4`)

"""Built-in backends, one sub-package each. Importing this registers every one of them.

Each package imports without its optional library; its `available()` then says what is missing.
"""

from attnbench.kernels import chain, cute, fla, flashinfer, sglang, torch, triton, vllm  # noqa: F401

"""FlashInfer 0.7.2 backends: paged decode (tensor-core fa2/fa3, CUDA-core), extend (paged, ragged +
paged cascade), attention sinks, absorbed MLA and merge_state, with canonical conventions.

Importing this package registers the backends (see `backends.py` for the table) and never imports
FlashInfer: without the package or a CUDA GPU every case is a skip that says so. Conversions to and
from FlashInfer's conventions live in `conventions.py`, one small function each; the per-path limits
(skip reasons) in `limits.py`; `prebuild.py` compiles the JIT modules a list of cases needs in one
parallel build (a sweep runs it before its cases, through `Backend.precompile`).
"""

from attnbench.kernels.flashinfer import backends  # noqa: F401  (registers the backends)

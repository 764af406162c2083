"""attnbench: benchmark and validate LLM attention kernels against float64 references.

Public API (stable): `Backend`, `register_backend`, `Case`, and the op names of `attnbench.ops.OPS`.
"""

from attnbench.backend import Backend, register_backend
from attnbench.case import Case

__version__ = "0.1.0"
__all__ = ["Backend", "register_backend", "Case", "__version__"]

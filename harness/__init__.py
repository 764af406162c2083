"""attnbench: benchmark and validate LLM attention kernels against float64 references.

Public API (stable): `Backend`, `register_backend`, `Case`, and the op names of `attnbench.ops.OPS`.
`Case` (and with it torch) is imported on first use, so `attnbench --help` starts without torch.
"""

from attnbench.backend import Backend, register_backend

__version__ = "0.1.0"
__all__ = ["Backend", "register_backend", "Case", "__version__"]


def __getattr__(name: str):
    if name == "Case":
        from attnbench.case import Case

        return Case
    raise AttributeError(f"module 'attnbench' has no attribute {name!r}")

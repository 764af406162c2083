"""attnbench: benchmark and validate LLM attention kernels against float64 references.

Public API (stable): `Backend`, `register_backend`, `Case`, `register_check`, and the op names of
`attnbench.ops.OPS`; the core modules at the top of the package (`backend`, `case`, `errors`, `buffers`,
`dtypes`, `ops`) keep their names, the stages live in subpackages (docs/architecture.md).
`Case` and `register_check` (and with them torch) are imported on first use, so `attnbench --help` starts
without torch.
"""

from attnbench.backend import Backend, register_backend

__version__ = "0.1.0"
__all__ = ["Backend", "register_backend", "Case", "register_check", "__version__"]


def __getattr__(name: str):
    if name == "Case":
        from attnbench.case import Case

        return Case
    if name == "register_check":
        from attnbench.check.checklist import register_check

        return register_check
    raise AttributeError(f"module 'attnbench' has no attribute {name!r}")

"""What clock a row's timing came from: only a GPU's clock is ranked, compared or gated.

Read by the regression gate (attnbench.report.compare) and the report (attnbench.report.ranking re-exports
these names), so it sits below both.
"""

from __future__ import annotations

GPU = "gpu"
HOST = "host clock (CPU)"
INTERPRETER = "host clock under TRITON_INTERPRET=1 (Triton kernels interpreted)"


def timing_kind(r) -> str | None:
    """What clock a row's timing came from: GPU, HOST or INTERPRETER (None when untimed)."""
    t = r.timing
    if not t:
        return None
    env = r.env or {}
    interp = t.get("interpreter") or env.get("triton_interpret") or str(env.get("TRITON_INTERPRET", "")) == "1"
    if interp or "interpret" in str(t.get("clock", "")):
        return INTERPRETER
    return GPU if t.get("clock") == "cuda-events" else HOST

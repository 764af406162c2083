"""What a timed closure does besides calling its library's kernels: the torch ops (not views) it runs
outside them, recorded with a TorchDispatchMode. Used to show that adapters holding native layouts
(harness/backend.py `finalize`) time the kernel, not gathers, transposes and scatters."""

from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class OpsOutsideKernels(TorchDispatchMode):
    """`with rec: closure()` records in `rec.outside` the non-view torch ops run outside the kernels."""

    def __init__(self):
        super().__init__()
        self.inside = 0
        self.outside: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside and not func.is_view:
            self.outside.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def watch_kernels(monkeypatch, kernels: list[tuple[object, str]]) -> OpsOutsideKernels:
    """Patch the library functions `kernels` names (`(module, attribute)` pairs) so that what runs
    inside them is not recorded; call before `prepare` (adapters look kernels up there)."""
    rec = OpsOutsideKernels()
    for mod, name in kernels:
        fn = getattr(mod, name)

        def inside(*args, _fn=fn, **kwargs):
            rec.inside += 1
            try:
                return _fn(*args, **kwargs)
            finally:
                rec.inside -= 1

        monkeypatch.setattr(mod, name, inside)
    return rec

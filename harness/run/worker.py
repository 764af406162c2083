"""A worker process: runs cases on one device for a supervisor (pool.py), one case at a time.

    python -m attnbench.run.worker FD DEVICE [--plugin P ...] [--warm BACKEND ...]

It talks to the supervisor over the inherited socket FD with the records of messages.py: it loads
the backends (built-in, entry points, plugins), asks each `--warm` backend `available()` (the import
of its library, seconds for some: SGLang, CuTe DSL; without it the first case paid them inside its
triage), and sends `Ready`, then answers each `RunJob` with
`Stage` messages while it works and `Rows` when done, until `Stop`. When a backend breaks the CUDA
context it sends the rows it has (less those of backends the supervisor is to run alone), then `Lost`,
and exits: the supervisor starts a fresh worker.
"""

from __future__ import annotations

import os
import sys
from multiprocessing.connection import Connection


def main(argv: list[str]) -> None:
    fd, device, *rest = argv
    plugins = [rest[i + 1] for i, a in enumerate(rest) if a == "--plugin"]
    warm = [rest[i + 1] for i, a in enumerate(rest) if a == "--warm"]
    conn = Connection(int(fd))
    from attnbench import backend as registry
    from attnbench.run.messages import Lost, Ready, Rows, Stage, Stop
    from attnbench.run.runner import ContextLost, run_case
    from attnbench.store import env as envmod

    registry.load_builtin()
    registry.load_entry_points()
    for p in plugins:
        registry.load_plugin(p)
    if device.startswith("cuda:"):  # plain "cuda" is the current device already
        import torch

        torch.cuda.set_device(torch.device(device))
    env = envmod.short(envmod.capture(device))
    _warm(registry, warm)
    conn.send(Ready(os.getpid(), tuple(registry.LOAD_PROBLEMS)))
    while True:
        msg = conn.recv()
        if isinstance(msg, Stop):
            break
        backends = [registry.get_backend(n) for n in msg.backends]
        try:
            rows = run_case(msg.case, backends, msg.opts, env, on_stage=lambda s: conn.send(Stage(s)), ahead=msg.ahead)
        except ContextLost as e:  # rows of its `alone` backends are not their verdicts: the supervisor reruns them
            conn.send(Rows(tuple(r for r in e.rows if r.backend not in e.alone)))
            conn.send(Lost(e.reason, e.alone))
            conn.close()
            os._exit(3)
        conn.send(Rows(tuple(rows)))
    conn.close()


def _warm(registry, names: list[str]) -> None:
    """Each named backend's `available()`, once, before `Ready`: its library's import is then worker
    start-up, which the supervisor overlaps with its precompile, not the first case's time. A failure
    here is left to that case's triage, which reports it as the row's error."""
    for name in names:
        try:
            registry.get_backend(name).available()
        except Exception:
            pass


if __name__ == "__main__":
    main(sys.argv[1:])

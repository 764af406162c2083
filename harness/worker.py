"""A worker process: runs cases on one device for a supervisor (pool.py), one case at a time.

    python -m attnbench.worker FD DEVICE [--plugin P ...]

It talks to the supervisor over the inherited socket FD, loads the backends (built-in, entry points, plugins),
then answers each ("case", Case, backend names, RunOptions) with ("stage", name) messages while it
works and ("rows", [Result]) when done. When a backend breaks the CUDA context it sends the rows it
has, ("lost", reason), and exits: the supervisor starts a fresh worker for the rest.
"""

from __future__ import annotations

import os
import sys
from multiprocessing.connection import Connection


def main(argv: list[str]) -> None:
    fd, device, *rest = argv
    plugins = [rest[i + 1] for i, a in enumerate(rest) if a == "--plugin"]
    conn = Connection(int(fd))
    from attnbench import backend as registry
    from attnbench import env as envmod
    from attnbench.runner import ContextLost, run_case

    registry.load_builtin()
    registry.load_entry_points()
    for p in plugins:
        registry.load_plugin(p)
    if device.startswith("cuda:"):  # plain "cuda" is the current device already
        import torch

        torch.cuda.set_device(torch.device(device))
    env = envmod.short(envmod.capture(device))
    conn.send(("ready", os.getpid(), list(registry.LOAD_PROBLEMS)))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        _, case, names, opts = msg
        backends = [registry.get_backend(n) for n in names]
        try:
            rows = run_case(case, backends, opts, env, on_stage=lambda s: conn.send(("stage", s)))
        except ContextLost as e:
            conn.send(("rows", e.rows))
            conn.send(("lost", e.reason))
            conn.close()
            os._exit(3)
        conn.send(("rows", rows))
    conn.close()


if __name__ == "__main__":
    main(sys.argv[1:])

"""`--plugin` for a GPU sweep of the replay check (docs/replay.md): registers the replay check's mutant and
its control as backends, so a sweep shows the check catching one and passing the other beside the real
kernels. Not built in: mutants never run in a sweep by default (kernels/mutants).

    attnbench sweep decode --op decode --plugin tools/bench/replay_plugin.py \
        -b triton -b graph-safe-decode -b replay-baked-max-len --no-timing
"""

from attnbench.backend import register_backend
from attnbench.kernels.mutants.replay import BakedLengthDecode, GraphSafeDecode

register_backend("graph-safe-decode")(type("GraphSafeDecodePlugin", (GraphSafeDecode,), {}))
register_backend("replay-baked-max-len")(type("BakedLengthDecodePlugin", (BakedLengthDecode,), {}))

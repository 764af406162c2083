"""Write suites/traces/serving.jsonl: the batches a continuous-batching server forms from Azure LLM traffic.

    python tools/traces/make_serving_trace.py [--out suites/traces/serving.jsonl] [--check]

Source of the length mix: the Azure LLM inference trace 2023 (github.com/Azure/AzurePublicDataset,
AzureLLMInferenceDataset2023.md: per request ContextTokens and GeneratedTokens of two production
services), described in Patel et al., "Splitwise: Efficient generative LLM inference using phase
splitting", ISCA 2024, section III: median prompt 1500 tokens and median output 13 tokens for the
coding service, median prompt 1020 and median output 129 for the conversation service.

What is ours (assumptions, stated in docs/trace.md): lengths are log-normal around those medians
(sigma 1.0 for prompts, 1.2 for outputs; prompts clipped to [16, 8192], outputs to [1, 1024]); the
server is a continuous-batching one with chunked prefill as SGLang and vLLM run it: a step's token
budget is 2048; the running decodes go first (one token each), then waiting prompts in arrival order
are cut into the rest of the budget; a new request is admitted whenever fewer than the target
concurrency are in flight, and the target steps through 4, 16 and 48 so that every batch regime is
seen. A step of decodes only is a `decode` batch; a step with prefill chunks is an `extend` batch
(its decodes as q_len 1, SGLang's mixed chunked prefill). After a warm-up, every k-th step is kept
(`count` k), 150 batches per service, as llama3-8b (GQA 32/8, head dim 128), page size 16, bf16.

Deterministic (seeded): running it again writes the same file; `--check` fails when the committed
file differs from what it would write.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

SERVICES = {  # name: (median prompt tokens, median output tokens), Splitwise section III
    "coding": (1500, 13),
    "conversation": (1020, 129),
}
SIGMA_PROMPT, SIGMA_OUTPUT = 1.0, 1.2
PROMPT_RANGE, OUTPUT_RANGE = (16, 8192), (1, 1024)
TOKEN_BUDGET = 2048
TARGETS = (4, 16, 48)  # concurrency targets, each held for PHASE steps
PHASE = 300
WARMUP = 100
PER_SERVICE = 150
MODEL = {"model": "llama3-8b", "page_size": 16, "dtype": "bf16"}
OUT = Path(__file__).resolve().parents[2] / "suites" / "traces" / "serving.jsonl"


@dataclass
class Request:
    prompt: int
    output: int
    cached: int = 0  # tokens in the KV cache
    emitted: int = 0  # output tokens produced (the first comes with the end of the prefill)

    @property
    def decoding(self) -> bool:
        return self.cached >= self.prompt


def _lognormal(rng: random.Random, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(min(hi, max(lo, round(math.exp(rng.gauss(math.log(median), sigma))))))


def simulate(service: str, seed: int) -> list[dict]:
    """Every step of one service's server: batches as trace lines (op, lengths), in order."""
    rng = random.Random(seed)
    med_p, med_o = SERVICES[service]
    active: list[Request] = []
    steps: list[dict] = []
    for step in range(len(TARGETS) * PHASE):
        target = TARGETS[step // PHASE]
        while len(active) < target:
            active.append(Request(_lognormal(rng, med_p, SIGMA_PROMPT, *PROMPT_RANGE),
                                  _lognormal(rng, med_o, SIGMA_OUTPUT, *OUTPUT_RANGE)))  # fmt: skip
        budget = TOKEN_BUDGET
        q_lens, prefix = [], []
        work: list[tuple[Request, int]] = []
        for r in (r for r in active if r.decoding):
            q_lens.append(1)
            prefix.append(r.cached)
            work.append((r, 1))
            budget -= 1
        for r in (r for r in active if not r.decoding):
            if budget <= 0:
                break
            chunk = min(r.prompt - r.cached, budget)
            q_lens.append(chunk)
            prefix.append(r.cached)
            work.append((r, chunk))
            budget -= chunk
        if all(q == 1 for q in q_lens):
            steps.append({"op": "decode", "kv_lens": [p + 1 for p in prefix]})
        else:
            steps.append({"op": "extend", "q_lens": q_lens, "prefix_lens": prefix})
        for r, n in work:
            r.cached += n
            r.emitted += 1 if r.decoding else 0  # a decode step, or the prefill's last chunk
        active = [r for r in active if r.emitted < r.output]
    return steps


def batches() -> list[dict]:
    out = []
    for i, service in enumerate(SERVICES):
        steps = [s for j, s in enumerate(simulate(service, seed=i)) if j >= WARMUP]
        every = len(steps) // PER_SERVICE
        for s in steps[::every][:PER_SERVICE]:
            out.append({**s, **MODEL, "count": every, "source": f"sim azure-2023-{service}"})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="exit 1 when --out differs from what would be written")
    args = ap.parse_args()
    text = "".join(json.dumps(b, separators=(", ", ": ")) + "\n" for b in batches())
    if args.check:
        same = args.out.is_file() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'differs: run without --check'}")
        return 0 if same else 1
    args.out.write_text(text)
    print(f"wrote {text.count(chr(10))} batches to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

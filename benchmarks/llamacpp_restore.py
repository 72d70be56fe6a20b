"""Does a restored prompt state change what llama-server generates or drafts? The llama.cpp backend
processes each prompt once and restores its saved slot state into every other server that measures
it (measure.llamacpp.states). Here each config answers one long-context prompt twice, in a fresh
server that processes the prompt itself (cache off) and in one where the state saved by the plain
server was restored, and the two replies' tokens and draft counters are compared.

    python benchmarks/llamacpp_restore.py [--context-length 2048] [-n 64] [--workload long-code-edit]

Prints one line per config (seconds each way, tokens equal, draft_n / accepted each way) and exits 1
when any speculative config's tokens or counters differ (plain decoding's are reported: its first
token after a restored prompt comes from the last prompt token evaluated alone).
"""

from __future__ import annotations

import argparse
import sys
import time

from specdec_tune.backends.base import Models, Purpose, open_session
from specdec_tune.domain import Config
from specdec_tune.measure.llamacpp.args import engine_default_configs, parse_llamacpp_draft


def _parts(a: object, b: object) -> int | None:
    """The first position where two replies' tokens differ (None: equal)."""
    x, y = a.tokens, b.tokens  # type: ignore[attr-defined]
    at = next((i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q), None)
    return at if at is not None or len(x) == len(y) else min(len(x), len(y))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context-length", type=int, default=2048)
    ap.add_argument("-n", "--max-new-tokens", type=int, default=64)
    ap.add_argument("--workload", default="long-code-edit")
    a = ap.parse_args()
    models = Models(
        target="smollm2-135m", workload=a.workload, backend="llamacpp", context_length=a.context_length,
        max_new_tokens=a.max_new_tokens,
    )  # fmt: skip
    configs = [None, Config(parse_llamacpp_draft("ngram-simple:4"), 8), *engine_default_configs()]
    differ = 0
    plain: list = []
    with open_session(models, Purpose("tune")) as s:
        b, prompt = s.backend, s.case.prompts[0]
        print(f"L={a.context_length}: prompt of {s.prompt_tokens} tokens, {a.max_new_tokens} new")
        b.restore(b.plain(1), prompt)  # processed once in the plain server, its state saved
        for config in configs:
            replies, took = [], []
            for restored in (False, True):
                server = b._server(config, 1)
                try:
                    t0 = time.monotonic()
                    if restored:
                        replies.append(b.ask(server, prompt, a.max_new_tokens, 0.0))
                    else:
                        replies.append(b.complete(server, prompt, a.max_new_tokens, 0.0))
                    took.append(time.monotonic() - t0)
                finally:
                    server.stop()
            fresh, kept = replies
            plain = plain or replies
            same = fresh.tokens == kept.tokens and (fresh.draft_n, fresh.draft_accepted) == (
                kept.draft_n,
                kept.draft_accepted,
            )
            differ += config is not None and not same
            label = config.label if config else "plain"
            print(
                f"{label:28s} fresh {took[0]:6.1f} s  restored {took[1]:5.1f} s  tokens equal "
                f"{fresh.tokens == kept.tokens}  drafted {fresh.draft_n}/{fresh.draft_accepted} vs "
                f"{kept.draft_n}/{kept.draft_accepted}; parts from plain at {_parts(plain[0], fresh)} "
                f"vs {_parts(plain[1], kept)}; fresh and restored part at {_parts(fresh, kept)}"
            )
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())

"""Exactness at temperature 0 in llama.cpp: a config's tokens against the plain server's, per
prompt, checked once per (config, prompt, budget) and kept; where they part, the plain top-2 gap
says whether it was a near-tie. A mixin of `backend.LlamaCppBackend`, which gives it `complete`, `ask`,
`reference`, `restore`, `plain`, `_server` and the `_exact` record."""

from __future__ import annotations

from typing import Any

from ...domain import Config
from .cases import NEAR_TIE, TextCase
from .server import LlamaServer


class ExactnessChecks:
    _exact: dict[tuple, dict[str, Any]]

    def _checked(self, config: Config, case: TextCase) -> bool:
        """Whether every prompt of `case` had its T = 0 exactness checked for `config`."""
        return all(
            (config.key, p, n) in self._exact for p, n in zip(case.prompts, case.max_new_tokens, strict=True)
        )

    def exactness(self, config: Config, case: TextCase, server: LlamaServer | None = None) -> dict[str, Any]:
        """Per prompt at T = 0: are the speculative server's tokens the plain server's? Where they
        part, was the plain top-2 a near-tie? Each prompt is checked once per config (kept);
        uses `server` (B = 1) when given, else starts one."""
        todo = [
            (p, n)
            for p, n in zip(case.prompts, case.max_new_tokens, strict=True)
            if (config.key, p, n) not in self._exact
        ]
        if todo:
            ref = self.reference(TextCase([p for p, _ in todo], [n for _, n in todo], 0.0))
            own = server is None
            server = server or self._server(config, 1)
            try:
                got = [self.ask(server, p, n, 0.0) for p, n in todo]
            finally:
                if own:
                    server.stop()
            for (text, n), a, b in zip(todo, ref, got, strict=True):
                at = next(
                    (i for i, (x, y) in enumerate(zip(a.tokens, b.tokens, strict=False)) if x != y), None
                )
                if at is None and len(a.tokens) != len(b.tokens):
                    at = min(len(a.tokens), len(b.tokens))
                gap = None
                if at is not None and at < len(a.tokens):
                    gap = self._top2_gap(text, a.tokens[:at])
                self._exact[(config.key, text, n)] = {"diverges_at": at, "top2_gap": gap}
        return self._exactness_of(config, case)

    def _exactness_of(self, config: Config, case: TextCase) -> dict[str, Any]:
        """The kept per-prompt checks of `config` over `case`, summed up ({} before any)."""
        prompts = [
            self._exact[k]
            for k in ((config.key, p, n) for p, n in zip(case.prompts, case.max_new_tokens, strict=True))
            if k in self._exact
        ]
        if not prompts:
            return {}
        diverged = [p for p in prompts if p["diverges_at"] is not None]
        ties = [p for p in diverged if p["top2_gap"] is not None and p["top2_gap"] < NEAR_TIE]
        return {
            "prompts": len(prompts),
            "mismatches": len(diverged),
            "near_ties": len(ties),
            "first_divergence": [p["diverges_at"] for p in prompts],
            "top2_gap": [None if p["top2_gap"] is None else round(p["top2_gap"], 4) for p in prompts],
        }

    def _top2_gap(self, prompt: str, prefix: list[int]) -> float | None:
        """The plain server's top-1 minus top-2 probability after `prompt` + `prefix` (one
        request at the position where the outputs part; probabilities on every token would slow
        the server down many times). The prompt's state is restored first (`restore`: the plain
        server's one slot may hold another prompt by now), so only the prefix is processed: at
        6 144 tokens a prompt processed again took about 45 s, for every prompt where a config's
        output parts from the plain one."""
        ask = [prompt, *prefix] if prefix else prompt
        plain = self.plain(1)
        self.restore(plain, prompt)
        reply = self.complete(plain, ask, 1, 0.0, probs=True, cache=True)
        if reply.probs and len(reply.probs[0]) == 2:
            return reply.probs[0][0] - reply.probs[0][1]
        return None

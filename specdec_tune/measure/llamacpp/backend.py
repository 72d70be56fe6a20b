"""The llama.cpp measuring backend: configs measured inside `llama-server` against a plain server
of the same build, side by side, their passes alternating.

- One plain server lives for the whole backend; a config's server starts with its flags, is warmed up by
  one untimed pass (its tokens give the exactness check) and is stopped when the config is done.
- A final round's configs share one plain side: 1 + k passes a repeat, ABBA, not 2k.
- A trial may be screened (measure.seam.Screen): its first prompts measured first, every repeat,
  and reported before the rest, so the tuner's pruner can stop a config that is clearly losing.
- B = 1: per repeat, the prompts in turn, plain then speculative (ABBA across repeats); tokens/s
  from the server's own `timings` (decode only). B > 1: `-np B` slots and a closed loop of B
  requests in flight, client k on slot k, each slot holding its prompt before the clock starts;
  wall-clock tokens/s of each side.
- Acceptance from `draft_n` / `draft_n_accepted`; tokens per target forward = predicted_n / (predicted_n - draft_n_accepted).- Every timed request's counters are kept (`counters.RequestStats`, both sides), and how long the
  servers' threads waited for a CPU per pass (measure.preemption: `check` judges under load on the
  pass pairs no other process preempted).
- Exactness at temperature 0: the plain server's tokens and top-2 probabilities are taken once;
  each config's tokens are compared per prompt (first position where they part, and whether the
  plain top-2 there was a near-tie).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...domain import Config, Metrics
from ...measurement import Measurement
from ...measurepolicy import MEASURE_POLICY
from ..planted import planted_pass
from ..preemption import PartLog, accounted, watched
from ..seam import Screen
from ..timing import median, spread
from .args import server_args
from .cases import NEAR_TIE, STATEFUL_KINDS, WARMUP_PROMPT, TextCase, _Reply
from .closedloop import closed_loop, prime, slot_lanes
from .counters import request_stats
from .exactness import ExactnessChecks
from .pairs import ServerPairs, warm_up
from .server import LlamaServer, ServerError, build_info, find_server
from .states import PromptStates

# re-exported: callers import the case and measurement types from the backend
__all__ = ["NEAR_TIE", "STATEFUL_KINDS", "WARMUP_PROMPT", "LlamaCppBackend", "TextCase"]


class LlamaCppBackend(ExactnessChecks, ServerPairs):
    """Measures configs in llama-server. Use as a context manager: servers stop at its end."""

    name = "llamacpp"

    def __init__(
        self,
        model: str | Path,
        binary: str | Path | None = None,
        threads: int | None = None,
        context: int = 2048,
        draft_paths: dict[str, str] | None = None,
        request_timeout_s: float = 120.0,
    ) -> None:
        self.binary = find_server(binary)
        self.model = str(model)
        self.threads = threads
        self.context = context
        self.draft_paths = draft_paths or {}  # draft name -> GGUF (layer-skip cuts)
        self.request_timeout_s = request_timeout_s
        self.build = build_info(self.binary)
        self._plain: dict[int, LlamaServer] = {}
        self._reference: dict[tuple[int, str], _Reply] = {}
        self._exact: dict[tuple, dict[str, Any]] = {}  # (config, prompt, budget) -> exact at T = 0?
        self.states = PromptStates()  # each prompt processed once per slot layout, then restored
        # Each repeat after the first in a new server pair (`_measure_together`): what `check` and
        # its reference set, so that one server's level is one repeat's, not a whole check's.
        self.pair_per_repeat = False

    # -- lifecycle
    def __enter__(self) -> LlamaCppBackend:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for server in self._plain.values():
            server.stop()
        self._plain.clear()
        self.states.close()

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "build": dict(self.build), "threads": self.threads}

    def flags(self, config: Config, batch_size: int = 1) -> list[str]:
        """The exact llama-server flags that measured `config` (model and all)."""
        return server_args(
            self.model, self.context, batch_size, config, self.draft_paths.get(config.draft.name)
        )

    def _server(self, config: Config | None, batch_size: int) -> LlamaServer:
        args = server_args(
            self.model,
            self.context,
            batch_size,
            config,
            self.draft_paths.get(config.draft.name) if config else None,
        )
        server = LlamaServer(self.binary, args + self.states.flags(), self.threads)
        server.start()
        return server

    def plain(self, batch_size: int = 1) -> LlamaServer:
        server = self._plain.get(batch_size)
        if server is None or not server.alive:
            # One plain server at a time: it holds the target's weights and KV cache.
            for b in list(self._plain):
                self._plain.pop(b).stop()
            server = self._plain[batch_size] = self._server(None, batch_size)
        return server

    # -- requests
    def complete(
        self,
        server: LlamaServer,
        prompt: str | list[Any],
        n_predict: int,
        temperature: float,
        probs: bool = False,
        cache: bool = False,
        slot: int | None = None,
    ) -> _Reply:
        """One completion. `cache`: the server may reuse a prompt it has seen (its prompt cache
        in host memory, on by default in llama-server) instead of processing it again. `slot`:
        the slot that runs it (`id_slot`), else the server picks one."""
        body: dict[str, Any] = {
            "prompt": prompt,
            "n_predict": n_predict,
            "temperature": temperature,
            "seed": 0,
            "cache_prompt": cache,
            "return_tokens": True,
            "stream": False,
        }
        if probs:
            body["n_probs"] = 2
        if slot is not None:
            body["id_slot"] = slot
        data = server.post("/completion", body, self.request_timeout_s)
        t = data.get("timings") or {}
        top2 = []
        for entry in data.get("completion_probabilities") or []:
            if "top_probs" in entry:  # post-sampling format
                ps = [float(p.get("prob", 0.0)) for p in entry["top_probs"]]
            else:
                ps = [math.exp(float(p.get("logprob", -math.inf))) for p in entry.get("top_logprobs") or []]
            top2.append(ps[:2])
        return _Reply(
            tokens=[int(x) for x in data.get("tokens") or []],
            predicted_n=int(t.get("predicted_n", 0)),
            predicted_ms=float(t.get("predicted_ms", 0.0)),
            draft_n=int(t.get("draft_n", 0)),
            draft_accepted=int(t.get("draft_n_accepted", 0)),
            probs=top2,
            n_predict=n_predict,
            prompt_n=int(t.get("prompt_n", 0)),
        )

    def restore(self, server: LlamaServer, prompt: str | list[Any]) -> None:
        """`prompt`'s state into `server`'s one slot (B = 1), processed once per backend (`states`)."""
        self.states.restore(server, prompt, self._process)

    def _process(self, server: LlamaServer, prompt: str | list[Any], n: int, slot: int) -> _Reply:
        """`prompt` processed into `slot` (the prompt cache on), `n` tokens generated: how a state
        is made (`states`)."""
        return self.complete(server, prompt, n, 0.0, cache=True, slot=slot)

    def _request(self, temperature: float) -> Any:
        """A closed loop's request: (server, prompt, n, slot) -> reply, the prompt cache on."""

        def send(server: LlamaServer, prompt: str | list[Any], n: int, slot: int) -> _Reply:
            return self.complete(server, prompt, n, temperature, cache=True, slot=slot)

        return send

    def ask(
        self,
        server: LlamaServer,
        prompt: str | list[Any],
        n_predict: int,
        temperature: float,
        probs: bool = False,
    ) -> _Reply:
        """A B = 1 completion as every side sends it: the prompt's state restored, then the prompt
        with the cache on (measure.llamacpp.states)."""
        self.restore(server, prompt)
        return self.complete(server, prompt, n_predict, temperature, probs=probs, cache=True)

    def reference(self, case: TextCase) -> list[_Reply]:
        """The plain server's replies (tokens, top-2 probabilities), taken once per prompt."""
        server = self.plain(1)
        out = []
        for prompt, n in zip(case.prompts, case.max_new_tokens, strict=True):
            key = (n, prompt)
            if key not in self._reference:
                self._reference[key] = self.ask(server, prompt, n, case.temperature)
            out.append(self._reference[key])
        return out

    # -- measuring
    screens = True  # measures a config's first prompts first when asked (seam.Screen)

    def measure(
        self,
        configs: list[Config],
        case: TextCase,
        batch_size: int = 1,
        repeats: int = 3,
        seed: int = 0,
        on_repeat: Callable[[int, float], None] | None = None,
        screen: Screen | None = None,
    ) -> list[Measurement]:
        """The configs against one plain side, interleaved (`_measure_together`); a config whose
        server fails raises `ServerError` (the caller fails that trial alone). With `screen`, a config's first prompts
        are measured first (every repeat) and reported before the rest."""
        if (screen is not None or on_repeat is not None) and len(configs) != 1:
            raise ValueError("a screen or on_repeat watches a single config")
        spec = [c for c in configs if c.gamma > 0]
        if not spec:
            return [self._baseline(self.plain(batch_size), case, batch_size, repeats) for _ in configs]
        measured = self._measure_together(spec, case, batch_size, repeats, on_repeat, screen)
        by_key = {c.key: m for c, m in zip(spec, measured, strict=True)}
        return [by_key[c.key] if c.gamma > 0 else self._plain_of(measured[0], repeats) for c in configs]

    def _measure_together(
        self,
        configs: list[Config],
        case: TextCase,
        batch_size: int,
        repeats: int,
        on_repeat: Callable[[int, float], None] | None = None,
        screen: Screen | None = None,
    ) -> list[Measurement]:
        """Speculative `configs` against one plain side: per repeat a plain pass and each config's
        pass, in turn (reversed every other repeat: ABBA), every config's server alive for the
        whole measurement (llama-server maps the GGUF, so they share the weights' pages). A
        finalist round of k configs takes (1 + k) passes per repeat, not 2k. With `screen` (one
        config) the first prompts are measured first, every repeat, then reported."""
        plain = self.plain(batch_size)
        n = len(case.prompts)
        cut = screen.prompts if screen is not None and 0 < screen.prompts < n else n
        parts = [(0, cut)] + ([(cut, n)] if cut < n else [])
        k = len(configs)
        # per repeat: [tokens, ms] of the plain side (key -1) and of each config, over the parts so far
        sums = {i: [[0, 0.0] for _ in range(repeats)] for i in range(-1, k)}
        passes: dict[int, list[dict[str, Any]]] = {i: [] for i in range(-1, k)}
        speedups: list[list[float]] = [[] for _ in configs]
        logs: dict[int, PartLog] = {i: [[] for _ in range(repeats)] for i in range(-1, k)}  # preemption

        def rate(i: int, r: int) -> float:
            t, ms = sums[i][r]
            return t / ms

        servers: dict[int, LlamaServer] = {}
        try:
            for i, config in enumerate(configs):
                servers[i] = self._server(config, batch_size)
            for j, (a, b) in enumerate(parts):
                part = case.part(a, b)
                for i, config in enumerate(configs):
                    # The warm-up pass is never timed; at T = 0 and B = 1 it is the exactness check
                    # of the prompts not checked before (per config; a racing final round measures
                    # a config again, and one prompt warms it up then).
                    if case.temperature == 0 and batch_size == 1 and not self._checked(config, part):
                        self.exactness(config, part, servers[i])
                    elif batch_size > 1:
                        self._pass(servers[i], warm_up(part), batch_size)
                    else:
                        warm = part.head(1) if self._checked(config, part) else part
                        self._pass(servers[i], warm, batch_size)
                last = j == len(parts) - 1
                for r in range(repeats):
                    if r > 0 and self.pair_per_repeat:
                        # One server's level is then one repeat's: on the check slice a plain
                        # llama-server read 71 tokens/s in one check where others read 79-81, and
                        # that check's speedup read 9 % high in every repeat.
                        plain = self._new_pair(servers, configs, part, batch_size)
                    order = [-1, *range(k)]
                    if r % 2:
                        order.reverse()  # ABBA: drift hits both sides alike
                    for i in order:
                        if i >= 0 and configs[i].draft.kind in STATEFUL_KINDS:
                            # a draft that learns across requests must not have seen these prompts'
                            # answers in an earlier pass: a fresh server, warmed up on other text
                            servers[i].stop()
                            servers[i] = self._server(configs[i], batch_size)
                            self.complete(servers[i], WARMUP_PROMPT, 8, 0.0)
                        p = self._watched_pass(plain if i < 0 else servers[i], part, batch_size)
                        logs[i][r].append((p["ms"] / 1000.0, p["waited_s"], p["tokens"]))
                        passes[i].append(p)
                        sums[i][r][0] += p["tokens"]
                        sums[i][r][1] += p["ms"]
                    if last:
                        for i in range(k):
                            speedups[i].append(rate(i, r) / rate(-1, r))
                        if on_repeat is not None:
                            on_repeat(r, speedups[0][-1])
                if not last and screen is not None:
                    screen.report(b, median([rate(0, r) / rate(-1, r) for r in range(repeats)]))
        finally:
            for server in servers.values():
                server.stop()
        base = median([1000.0 * rate(-1, r) for r in range(repeats)])
        out = []
        for i, config in enumerate(configs):
            own = passes[i]
            proposed = sum(p["draft_n"] for p in own)
            accepted = sum(p["draft_accepted"] for p in own)
            tokens = sum(p["tokens"] for p in own)
            metrics = Metrics(
                tokens_per_s=median([1000.0 * rate(i, r) for r in range(repeats)]),
                baseline_tokens_per_s=base,
                speedup=median(speedups[i]),
                speedup_spread=spread(speedups[i]),
                acceptance_rate=accepted / proposed if proposed else 0.0,
                mean_accepted_len=tokens / max(1, tokens - accepted),
                repeats=repeats,
            )
            exact = self._exactness_of(config, case) if case.temperature == 0 and batch_size == 1 else {}
            out.append(
                Measurement(
                    metrics,
                    tokens // max(1, repeats),
                    exact.get("mismatches", 0),
                    speedups[i],
                    **accounted(logs[i], logs[-1], MEASURE_POLICY.clean_wait_share),
                    requests=[q for p in passes[-1] + own for q in p["requests"]],
                    flags=self.flags(config, batch_size),
                    exactness=exact,
                )
            )
        return out

    def _plain_of(self, m: Measurement, repeats: int) -> Measurement:
        """The baseline's measurement in a round of configs: the shared plain side, 1.0 a repeat."""
        rate = m.metrics.baseline_tokens_per_s
        metrics = Metrics(rate, rate, 1.0, 0.0, 0.0, 1.0, repeats=repeats)
        plain = [q for q in m.requests if q.side == "plain"]
        tokens = sum(q.predicted_n for q in plain) // max(1, repeats)
        return Measurement(metrics, tokens, 0, [1.0] * repeats, requests=plain)

    def _baseline(self, plain: LlamaServer, case: TextCase, batch_size: int, repeats: int) -> Measurement:
        passes = [self._pass(plain, case, batch_size) for _ in range(max(1, repeats))]
        tok_s = median([p["tok_s"] for p in passes])
        metrics = Metrics(tok_s, tok_s, 1.0, 0.0, 0.0, 1.0, repeats=repeats)
        requests = [r for p in passes for r in p["requests"]]
        return Measurement(metrics, passes[0]["tokens"], 0, [1.0] * len(passes), requests=requests)

    def _watched_pass(self, server: LlamaServer, case: TextCase, batch_size: int) -> dict[str, Any]:
        """`_pass` and the seconds its server's threads waited for a CPU (`waited_s`, preemption)."""
        p, waited = watched(lambda: self._pass(server, case, batch_size), getattr(server.proc, "pid", 0))
        p["waited_s"] = min(p["ms"] / 1000.0, waited)
        return planted_pass(p) if "--spec-type" in server.args else p

    def _pass(self, server: LlamaServer, case: TextCase, batch_size: int) -> dict[str, Any]:
        """One pass over the prompts: B = 1 one request at a time (decode tokens/s from the
        server's timings); B > 1 a closed loop of B requests in flight (wall-clock tokens/s).

        At B = 1 each prompt's state is restored (processed once per backend, `states`): the
        decode tokens/s the server reports do not depend on how the prompt got into its cache,
        and at a long context a prefill costs more than the pass. At B > 1 client k sends its
        requests to slot k, and before the clock starts every slot holds its first prompt
        (`closedloop.prime`): a timed request processes its prompt's last token only, or, when
        its slot held another prompt, has that prompt's state restored first (milliseconds; the
        clock runs). Both sides send the same requests to the same slots, so they meet the
        prompts alike."""
        jobs = list(zip(case.prompts, case.max_new_tokens, strict=True))
        if batch_size == 1:
            replies = [self.ask(server, p, n, case.temperature) for p, n in jobs]
            ms = sum(r.predicted_ms for r in replies)
            n = sum(r.predicted_n for r in replies)
        else:
            lanes = slot_lanes(jobs, batch_size)
            prime(server, lanes, batch_size, self.states, self._process)
            started = time.perf_counter()
            replies = closed_loop(server, lanes, batch_size, self.states, self._request(case.temperature))
            ms = 1000.0 * (time.perf_counter() - started)
            n = sum(r.predicted_n for r in replies)
        tok_s = 1000.0 * n / ms if ms > 0 else 0.0
        if n == 0:
            raise ServerError("llama-server generated no tokens")
        return {
            "tok_s": tok_s,
            "ms": ms,
            "tokens": n,
            "draft_n": sum(r.draft_n for r in replies),
            "draft_accepted": sum(r.draft_accepted for r in replies),
            "requests": request_stats(
                replies, "spec" if "--spec-type" in server.args else "plain", batch_size
            ),
        }

"""Configs measured inside vLLM: a plain server and each config's server side by side on loopback,
their passes alternating (ABBA), every server kept for all it can measure.

- A server's speculative settings are fixed at its start, and a start costs tens of seconds (a CPU
  build imports and compiles; a GPU captures CUDA graphs), so each config's server is started once
  and kept (the plain one for the whole session, `MAX_SERVERS` at most side by side) for its trial,
  the final round and every batch size.
- B = 1: per repeat the prompts in turn; tokens/s from vLLM's own decode time (its
  `request_decode_time_seconds`, first token to last, read from /metrics around each request) as
  llama.cpp's from its timings, so prefill and HTTP never enter the ratio. B > 1: B clients in a
  closed loop (each finished request replaced at once), wall-clock tokens/s of each side.
- Acceptance from vLLM's spec-decode counters (drafts, draft tokens, accepted, accepted per
  position) around each pass; each B = 1 request's counters are kept (`RequestStats`) for the
  engine's cost model.
- Exactness at T = 0: the plain server's token ids per prompt, taken once; each config's first
  (untimed) pass is compared with them, prompt by prompt.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...domain import Config, Metrics
from ...measure.llamacpp.cases import TextCase
from ...measure.llamacpp.closedloop import slot_lanes
from ...measure.planted import planted_pass
from ...measure.seam import Screen
from ...measure.servers import ServerError, wait_groups_idle
from ...measure.timing import median, spread
from ...measurement import Measurement, RequestStats
from .args import measure_only_args, server_args
from .server import ENTRYPOINT, VllmServer, closed_loop, counters_since, kept_accepted, server_env

MAX_SERVERS = 4  # servers alive side by side: the plain one and the last three configs'
# A vLLM worker polls its queue for a second after its last step (its shared-memory broadcast's busy
# loop), on the core every CPU worker is pinned to: a pass on another server started at once runs
# beside it. Measured here: 0.5 s after a request a small matmul ran at 16.8 GFLOP/s, from 1.0 s on
# at 197-200. A pass on another server than the last one waits this long first (the loop's second,
# counted from the worker's last read, which comes before the client's reply).
SETTLE_S = 1.2
DECODE_S = "vllm:request_decode_time_seconds_sum"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
DRAFTS = "vllm:spec_decode_num_drafts_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


class VllmBackend:
    """Measures configs in vLLM servers. Use as a context manager: servers stop at its end."""

    name = "vllm"
    screens = False  # a config's server measures every prompt of a trial

    def __init__(
        self,
        python: Path,
        target: str,
        *,
        max_model_len: int,
        build: dict[str, Any],
        dtype: str | None = None,
        extra: list[str] | None = None,
        memory_share: float | None = None,
        start_timeout_s: float | None = None,
    ) -> None:
        self.python = python
        self.target = target
        self.max_model_len = max_model_len
        self.build = dict(build)
        self.dtype = dtype
        self.extra = list(extra or [])
        self.memory_share = memory_share
        self.start_timeout_s = start_timeout_s
        self._servers: dict[Any, VllmServer] = {}  # config key (or "plain") -> its server, LRU order
        self._reference: dict[tuple[tuple[int, ...], int], list[int]] = {}  # plain T = 0 tokens
        self._exact: dict[tuple[Any, tuple[int, ...], int], int | None] = {}  # first divergence
        self.start_seconds: list[float] = []  # every server start's wall time (the budget plans on it)
        self.schedules: dict[Any, list[list[int]]] = {}  # config key -> its batch-size schedule
        self._last: tuple[VllmServer | None, float] = (None, 0.0)  # the server that last ran, and when
        self.env = server_env(self.build)  # what every server starts with beside the user's environment

    def settle(self, server: VllmServer | None = None) -> None:
        """SETTLE_S after the last server to run answered, unless `server` is that one (its own poll
        is no one else's cost); then until every other server is idle by /proc's CPU time."""
        last, ended = self._last
        if last is not None and last is not server:
            time.sleep(max(0.0, SETTLE_S - (time.monotonic() - ended)))
        procs = [getattr(s, "proc", None) for s in self._servers.values() if s is not server and s.alive]
        others = {p.pid for p in procs if p is not None}
        wait_groups_idle(others)

    def stop(self, configs: list[Config]) -> None:
        """Stop these configs' servers (not the plain one): their next measurement starts new ones."""
        for c in configs:
            server = self._servers.pop(c.key, None) if c.gamma > 0 else None
            if server is not None:
                server.stop()

    def close(self) -> None:
        """Stop every server it started (the session calls it at its end)."""
        for server in self._servers.values():
            server.stop()
        self._servers.clear()

    def info(self) -> dict[str, Any]:
        build = dict(self.build)
        fingerprint = next((s.fingerprint for s in self._servers.values() if s.fingerprint), None)
        if fingerprint:
            build["system_fingerprint"] = fingerprint
        if self.env:  # how the servers started (a start-time setting: export leaves it out)
            build["server_env"] = " ".join(f"{k}={v}" for k, v in sorted(self.env.items()))
        return {
            "name": self.name,
            "build": build,
            "engine_args": list(self.extra),
            # what export emits before a config's arguments, and what it leaves out (serving.measured)
            "launcher": [str(self.python), *ENTRYPOINT],
            "measure_only_args": measure_only_args(self.memory_share),
        }

    def flags(self, config: Config | None, batch_size: int = 1) -> list[str]:
        """The exact server arguments that measured `config` (host, port and the measurement's
        memory share aside): what `export --to vllm` emits. A batch-size schedule is part of them."""
        schedule = self.schedules.get(config.key) if config is not None else None
        return server_args(
            self.target, config, max_model_len=self.max_model_len, dtype=self.dtype, extra=self.extra,
            schedule=schedule,
        )  # fmt: skip

    def server(self, config: Config | None, pinned: tuple[Any, ...] = ()) -> VllmServer:
        """The server of `config` (None or gamma 0: the plain one), started on first use and kept.
        Beyond MAX_SERVERS the least recently used config's server stops, never one `pinned` (the
        configs of the round being measured: a round restarting its own servers every pass would
        time start-ups, not decoding)."""
        key = "plain" if config is None or config.gamma <= 0 else config.key
        server = self._servers.pop(key, None)
        if server is None or not server.alive:
            spec = config if key != "plain" else None
            args = self.flags(spec) + measure_only_args(self.memory_share)
            server = VllmServer(python=self.python, args=args, model=self.target, extra_env=self.env)
            spare = [k for k in self._servers if k != "plain" and k not in pinned]
            while spare and len(self._servers) >= MAX_SERVERS:  # room for it: the least recently used goes
                self._servers.pop(spare.pop(0)).stop()
            started = time.monotonic()
            server.start(self.start_timeout_s)
            self.start_seconds.append(time.monotonic() - started)
        self._servers[key] = server
        return server

    def held(self, config: Config | None) -> bool:
        """Whether `config`'s server is up already (measuring it costs no start)."""
        key = "plain" if config is None or config.gamma <= 0 else config.key
        server = self._servers.get(key)
        return server is not None and server.alive

    # -- passes
    def _pass(self, server: VllmServer, case: TextCase, batch_size: int, side: str) -> dict[str, Any]:
        """One pass over the prompts: B = 1 one request at a time (decode time from the engine's
        counters), B > 1 a closed loop of B requests in flight (wall clock)."""
        jobs = list(zip(case.prompts, case.max_new_tokens, strict=True))
        self.settle(server)
        before = server.counters()
        requests: list[RequestStats] = []
        replies: list[dict[str, Any]] = []
        if batch_size == 1:
            ms = 0.0
            for prompt, n in jobs:
                c0 = server.counters()
                reply = server.complete(prompt, n, case.temperature)
                d = counters_since(c0, server.counters())
                decode_ms = 1000.0 * d.get(DECODE_S, 0.0)
                ms += decode_ms
                replies.append(reply)
                kept = kept_accepted(max(0, reply["n"] - 1), int(d.get(DRAFTS, 0)), int(d.get(ACCEPTED, 0)))
                requests.append(
                    RequestStats(side, reply["n"], decode_ms, int(d.get(DRAFT_TOKENS, 0)), kept, n, 1)
                )
            tokens = sum(max(0, r["n"] - 1) for r in replies)  # the first token is the prompt's
        else:
            started = time.perf_counter()
            replies = closed_loop(server, slot_lanes(jobs, batch_size), case.temperature)
            ms = 1000.0 * (time.perf_counter() - started)
            tokens = sum(r["n"] for r in replies)
        d = counters_since(before, server.counters())
        self._last = (server, time.monotonic())
        if ms <= 0 or tokens <= 0:
            raise ServerError(f"{server.label} reported no decode time over a pass: {server.log_tail()}")
        per_pos = [d.get(f"{PER_POS}[{i}]", 0.0) for i in range(64) if f"{PER_POS}[{i}]" in d]
        measured = {
            "tok_s": 1000.0 * tokens / ms,
            "ms": ms,
            "tokens": tokens,
            "draft_n": int(d.get(DRAFT_TOKENS, 0)),
            "draft_accepted": int(d.get(ACCEPTED, 0)),  # as vLLM counts them (the acceptance rate)
            "kept": kept_accepted(
                tokens if batch_size == 1 else tokens - len(replies),
                int(d.get(DRAFTS, 0)),
                int(d.get(ACCEPTED, 0)),
            ),
            "drafts": int(d.get(DRAFTS, 0)),
            "per_position": per_pos,
            "requests": requests,
            "replies": replies,
        }
        return planted_pass(measured) if side == "spec" else measured  # a test-only hook (measure.planted)

    def _untimed(self, server: VllmServer, prompt: list[int], n: int, temperature: float) -> dict[str, Any]:
        """A request outside any timed pass (reference, exactness, warm-up), marked as the last to
        run, so the next timed pass on another server settles after it (docs/vllm.md)."""
        reply = server.complete(prompt, n, temperature)
        self._last = (server, time.monotonic())
        return reply

    # -- exactness
    def reference(self, case: TextCase) -> list[list[int]]:
        """The plain server's T = 0 token ids per prompt, taken once per (prompt, budget)."""
        out = []
        for prompt, n in zip(case.prompts, case.max_new_tokens, strict=True):
            key = (tuple(prompt), n)
            if key not in self._reference:
                self._reference[key] = self._untimed(self.server(None), list(prompt), n, 0.0)["tokens"]
            out.append(self._reference[key])
        return out

    def exactness(self, config: Config, case: TextCase) -> dict[str, Any]:
        """`config`'s T = 0 tokens against the plain server's, per prompt (those not compared yet
        are sent once, untimed): prompts, mismatches, the first position where each parts."""
        plain = self.reference(case)
        server = self.server(config)
        divergence: list[int | None] = []
        for prompt, n, ref in zip(case.prompts, case.max_new_tokens, plain, strict=True):
            key = (config.key, tuple(prompt), n)
            if key not in self._exact:
                got = self._untimed(server, prompt, n, 0.0)["tokens"]
                first = next((i for i, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), None)
                if first is None and len(got) != len(ref):
                    first = min(len(got), len(ref))
                self._exact[key] = first
            divergence.append(self._exact[key])
        mismatches = sum(1 for d in divergence if d is not None)
        return {
            "prompts": len(divergence),
            "mismatches": mismatches,
            "first_divergence": [d for d in divergence if d is not None],
        }

    def checked(self, config: Config, case: TextCase) -> bool:
        return all(
            (config.key, tuple(p), n) in self._exact
            for p, n in zip(case.prompts, case.max_new_tokens, strict=True)
        )

    # -- measuring
    def measure(self, configs: list[Config], case: TextCase, batch_size: int = 1, repeats: int = 3, seed: int = 0,
                on_repeat: Callable[[int, float], None] | None = None, screen: Screen | None = None) -> list[Measurement]:  # fmt: skip
        """The configs against one plain side, interleaved; a config whose server fails raises
        `ServerError` (the caller fails that trial alone). `screen` is not supported (the whole
        workload is measured): `screens` is False."""
        if on_repeat is not None and len(configs) != 1:
            raise ValueError("on_repeat watches a single config")
        spec = list({c.key: c for c in configs if c.gamma > 0}.values())
        if not spec:
            return [self._baseline(case, batch_size, repeats) for _ in configs]
        measured = self._together(spec, case, batch_size, repeats, on_repeat)
        by_key = {c.key: m for c, m in zip(spec, measured, strict=True)}
        return [by_key[c.key] if c.gamma > 0 else _plain_of(measured[0], repeats) for c in configs]

    def rates(self, configs: list[Config], case: TextCase, batch_size: int, repeats: int) -> list[list[float]]:  # fmt: skip
        """Each config's tokens/s per repeat, ABBA, no plain side (their paired ratios are judged)."""
        servers = [self.server(c, tuple(c.key for c in configs)) for c in configs]
        for c in configs:
            self._warm(c, case, batch_size)
        out: list[list[float]] = [[] for _ in configs]
        for r in range(repeats):
            for i in range(len(configs))[:: -1 if r % 2 else 1]:
                out[i].append(self._pass(servers[i], case, batch_size, "spec")["tok_s"])
        return out

    def _warm(self, config: Config, case: TextCase, batch_size: int) -> None:
        """The untimed pass before timing: at T = 0 and B = 1 the exactness check of the prompts not
        checked before; otherwise one prompt (B = 1) or one closed loop of short requests (B > 1)."""
        server = self.server(config)
        if case.temperature == 0 and batch_size == 1 and not self.checked(config, case):
            self.exactness(config, case)
        elif batch_size > 1:
            self._warm_pass(server, case, batch_size)
        else:
            self._untimed(server, case.prompts[0], min(8, case.max_new_tokens[0]), case.temperature)

    def _warm_pass(self, server: VllmServer, case: TextCase, batch_size: int) -> None:
        """Untimed: one prompt (B = 1), or a closed loop of 8-token requests (B > 1: its batch shapes)."""
        short = case.head(1) if batch_size == 1 else case.pick(list(range(len(case.prompts))), 8)
        self._pass(server, short, batch_size, "warm")

    def _together(
        self, configs: list[Config], case: TextCase, batch_size: int, repeats: int,
        on_repeat: Callable[[int, float], None] | None,
    ) -> list[Measurement]:  # fmt: skip
        """Speculative `configs` against one plain side: per repeat a plain pass and each config's,
        in turn, reversed every other repeat (ABBA): 1 + k passes a repeat."""
        pinned = tuple(c.key for c in configs)
        servers = {i: self.server(c, pinned) for i, c in enumerate(configs)}  # every one up first
        plain = self.server(None)
        for c in configs:
            self._warm(c, case, batch_size)
        self._warm_pass(plain, case, batch_size)
        k = len(configs)
        passes: dict[int, list[dict[str, Any]]] = {i: [] for i in range(-1, k)}
        speedups: list[list[float]] = [[] for _ in configs]
        for r in range(repeats):
            order = [-1, *range(k)]
            if r % 2:
                order.reverse()  # ABBA: drift hits both sides alike
            for i in order:
                server = plain if i < 0 else servers[i]
                passes[i].append(self._pass(server, case, batch_size, "plain" if i < 0 else "spec"))
            for i in range(k):
                speedups[i].append(passes[i][r]["tok_s"] / passes[-1][r]["tok_s"])
            if on_repeat is not None:
                on_repeat(r, speedups[0][-1])
        base = median([p["tok_s"] for p in passes[-1]])
        exact_case = case.temperature == 0 and batch_size == 1
        return [
            self._measurement(
                c, passes[i], passes[-1], speedups[i], base, repeats, batch_size, case, exact_case
            )
            for i, c in enumerate(configs)
        ]

    def _measurement(
        self, config: Config, own: list[dict[str, Any]], plain: list[dict[str, Any]], speedups: list[float],
        base: float, repeats: int, batch_size: int, case: TextCase, exact_case: bool,
    ) -> Measurement:  # fmt: skip
        proposed = sum(p["draft_n"] for p in own)
        accepted = sum(p["draft_accepted"] for p in own)
        steps = sum(p["tokens"] for p in own) - sum(p["kept"] for p in own)
        metrics = Metrics(
            tokens_per_s=median([p["tok_s"] for p in own]),
            baseline_tokens_per_s=base,
            speedup=median(speedups),
            speedup_spread=spread(speedups),
            acceptance_rate=accepted / proposed if proposed else 0.0,
            mean_accepted_len=sum(p["tokens"] for p in own) / max(1, steps),
            repeats=repeats,
        )
        exact = self.exactness(config, case) if exact_case else {}
        drafts = sum(p["drafts"] for p in own)
        per_pos = [sum(col) for col in zip(*(p["per_position"] for p in own), strict=False)]
        evidence = {
            "drafts": drafts,
            "per_position_acceptance": [round(a / drafts, 4) for a in per_pos] if drafts else [],
        }
        return Measurement(
            metrics,
            sum(p["tokens"] for p in own) // max(1, repeats),
            exact.get("mismatches", 0),
            speedups,
            rates=[p["tok_s"] for p in own],
            baseline_rates=[p["tok_s"] for p in plain],
            requests=[q for p in plain + own for q in p["requests"]],
            flags=self.flags(config, batch_size),
            exactness={**exact, **evidence} if exact_case else evidence,
        )

    def _baseline(self, case: TextCase, batch_size: int, repeats: int) -> Measurement:
        plain = self.server(None)
        self._warm_pass(plain, case, batch_size)
        passes = [self._pass(plain, case, batch_size, "plain") for _ in range(max(1, repeats))]
        tok_s = median([p["tok_s"] for p in passes])
        metrics, rates = Metrics(tok_s, tok_s, 1.0, 0.0, 0.0, 1.0, repeats=repeats), [p["tok_s"] for p in passes]  # fmt: skip
        return Measurement(
            metrics, passes[0]["tokens"], 0, [1.0] * len(passes), rates=rates, baseline_rates=rates,
            requests=[q for p in passes for q in p["requests"]],
        )  # fmt: skip

    def plain_pass_s(self, case: TextCase, batch_size: int) -> float:
        """Seconds of one timed plain pass over `case` at `batch_size` (after an untimed one)."""
        plain = self.server(None)
        self._warm_pass(plain, case, batch_size)
        started = time.monotonic()
        self._pass(plain, case, batch_size, "plain")
        return time.monotonic() - started


def _plain_of(m: Measurement, repeats: int) -> Measurement:
    """The baseline's measurement in a round of configs: the shared plain side, 1.0 a repeat."""
    rate = m.metrics.baseline_tokens_per_s
    metrics = Metrics(rate, rate, 1.0, 0.0, 0.0, 1.0, repeats=repeats)
    plain = [q for q in m.requests if q.side == "plain"]
    tokens = sum(q.predicted_n for q in plain) // max(1, repeats)
    return Measurement(
        metrics, tokens, 0, [1.0] * repeats, rates=list(m.baseline_rates), baseline_rates=list(m.baseline_rates),
        requests=plain,
    )  # fmt: skip

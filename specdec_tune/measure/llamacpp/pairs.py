"""New server pairs for a measurement: a confirmation's new plain server (`renew`) and, for `check`
and its reference (`pair_per_repeat`), a new plain and config server before every repeat after the
first (`_new_pair`), each warmed up untimed. A mixin of `backend.LlamaCppBackend`, which gives it
`_plain`, `plain`, `_server`, `complete` and `_pass`."""

from __future__ import annotations

from typing import Any

from ...domain import Config
from .cases import STATEFUL_KINDS, WARMUP_PROMPT, TextCase
from .server import LlamaServer

WARM_TOKENS = 8  # new tokens a request of an untimed B > 1 warm-up pass asks for


class ServerPairs:
    _plain: dict[int, LlamaServer]
    plain: Any
    _server: Any
    complete: Any
    _pass: Any

    def renew(self) -> None:
        """A new plain server for what follows, warmed up by one untimed request: each config's
        server is new at every measurement already, so a confirmation then runs in a server pair
        of its own. One plain server can read 10 % slower than others of its config for as long as
        it runs (71 tokens/s against 79-81 on the check slice), a level that more repeats in it
        never average out. The saved prompt states stay: the new server restores them."""
        sizes = list(self._plain)
        for server in self._plain.values():
            server.stop()
        self._plain.clear()
        for b in sizes:
            self.complete(self.plain(b), WARMUP_PROMPT, 8, 0.0)

    def _new_pair(
        self, servers: dict[int, LlamaServer], configs: list[Config], part: TextCase, batch_size: int
    ) -> LlamaServer:
        """A new plain server and a new server for each config (but a stateful draft's, new at
        every pass already), each warmed up untimed as the first ones were: one request at B = 1,
        a warm-up pass at B > 1. Returns the plain one; `servers` is updated in place."""
        self._plain.pop(batch_size).stop()
        fresh = {-1: self.plain(batch_size)}
        for i, config in enumerate(configs):
            if config.draft.kind not in STATEFUL_KINDS:
                servers[i].stop()
                servers[i] = fresh[i] = self._server(config, batch_size)
        for server in fresh.values():
            if batch_size > 1:
                self._pass(server, warm_up(part), batch_size)
            else:
                self.complete(server, WARMUP_PROMPT, 8, 0.0)
        return fresh[-1]


def warm_up(case: TextCase) -> TextCase:
    """The untimed pass before a B > 1 measurement: every prompt of `case` (each slot primed with
    its own, `closedloop.prime`), B rows decoding together, WARM_TOKENS new tokens a request. It
    warms the server at its batch shape; a whole pass took 7 s a config at B = 4, L = 6 144."""
    return case.pick(list(range(len(case.prompts))), WARM_TOKENS)

"""Per-request counters of llama-server's `timings`, kept for every timed request of a measurement
so a cost model of the engine can be fitted from decode timings (`search.enginemodel`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class RequestStats:
    """One timed request's counters from the server's `timings` (server-common.cpp, build 11434).

    predicted_n: tokens generated, the first one included (it comes from the prompt's logits);
    predicted_ms: from that first token to the last, so it covers predicted_n - 1 - draft_accepted
    target forwards; draft_n: tokens drafted, summed over the request's drafts; draft_accepted:
    drafted tokens the target accepted. The server does not report how many forwards carried a
    draft (its per-request n_draft_verif_steps reaches only the log and /metrics).
    """

    side: str  # "spec" or "plain"
    predicted_n: int
    predicted_ms: float
    draft_n: int = 0
    draft_accepted: int = 0
    n_predict: int = 0  # the request's token budget
    batch_size: int = 1  # requests in flight on the server while it ran

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def request_stats(replies: Iterable[Any], side: str, batch_size: int) -> list[RequestStats]:
    """The counters of a pass's replies (the backend's, with the fields above but `side`)."""
    return [
        RequestStats(
            side, r.predicted_n, r.predicted_ms, r.draft_n, r.draft_accepted, r.n_predict, batch_size
        )
        for r in replies
    ]

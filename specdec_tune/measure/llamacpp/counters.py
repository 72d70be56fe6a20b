"""Per-request counters of llama-server's `timings`, kept for every timed request of a measurement
so a cost model of the engine can be fitted from decode timings (`search.enginemodel`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...measurement import RequestStats


def request_stats(replies: Iterable[Any], side: str, batch_size: int) -> list[RequestStats]:
    """The counters of a pass's replies (the backend's, with the fields above but `side`)."""
    return [
        RequestStats(
            side, r.predicted_n, r.predicted_ms, r.draft_n, r.draft_accepted, r.n_predict, batch_size
        )
        for r in replies
    ]

"""llama.cpp on a loaded machine: its busy rule, the hint that says why it crawls, and the one line a
server failure outside a trial becomes."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from ...checkpolicy import LLAMACPP_CHECK_POLICY
from ...errors import SpecDecError
from ..noise import busy_info, os_since, os_snapshot, os_window
from .server import ServerError


def engine_busy(info: dict[str, Any], threads: int | None, cpus: int) -> bool:
    """Busy for llama.cpp with `threads` threads (measure.noise.busy_info by LLAMACPP_CHECK_POLICY):
    with its threads on every core it waits for any other work at every step, so other processes
    beyond the cores its threads leave free plus a tenth of all CPUs already make a busy machine."""
    return busy_info(info, LLAMACPP_CHECK_POLICY, threads=threads, cpus=cpus)


def load_hint(info: dict[str, Any], threads: int | None, cpus: int) -> str:
    """Why llama.cpp may crawl here, from what the OS said (measure.noise.os_since): "" on a quiet
    machine. Its threads wait for each other at every step, spinning: when one of them shares a
    core with other work, every step waits for it. On a 2-core VM with one core kept busy,
    SmolLM2-135M decoded 0.8 tokens/s with 2 threads and 167 with 1 (165 with 2 on the quiet VM)."""
    if not engine_busy(info, threads, cpus):
        return ""
    taken = (info.get("others_cpu_share") or 0.0) * cpus
    free = max(1, int(cpus - taken))
    n = threads or cpus
    words = (
        f"the machine is busy (other processes {info.get('others_cpu_share') or 0.0:.0%} of all {cpus} CPUs"
    )
    words += f", busiest: {info['busiest'][0]})" if info.get("busiest") else ")"
    if n > free:
        words += (
            f": llama.cpp's {n} threads wait for the one that shares a core with that work, at every "
            f"step; pass --threads {free} (the cores left free) or measure on a quiet machine"
        )
    return words


def oversubscribed_line(threads: int | None, watch_s: float = 0.5) -> str:
    """One line before measuring when other processes already take cores llama.cpp's threads need
    (watched for `watch_s` seconds while this process sleeps); "" otherwise."""
    _, info = os_window(lambda: time.sleep(watch_s))
    hint = load_hint(info, threads, os.cpu_count() or 1)
    return hint[:1].upper() + hint[1:] if "pass --threads" in hint else ""


@contextlib.contextmanager
def server_failures(threads: int | None) -> Iterator[None]:
    """A llama-server that dies or stops answering outside a trial (the plain server, the costs,
    the exactness check) ends the command with one line (SpecDecError), saying when the OS saw a
    busy machine meanwhile, not with an internal error."""
    snapshot = os_snapshot()
    try:
        yield
    except ServerError as exc:
        hint = load_hint(os_since(snapshot), threads, os.cpu_count() or 1)
        raise SpecDecError(f"{exc}" + (f"; {hint}" if hint else "")) from None

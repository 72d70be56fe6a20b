"""A B > 1 pass in llama-server: B clients in a closed loop, client k on slot k, each slot holding its
prompt before the clock starts, so the pass times decoding, not prompt processing.

At a long context a B > 1 pass that processed its prompts timed mostly prefill: 8 requests of 6 144
tokens a pass at B = 4, and a 2 B x 3 L envelope that ran 40 minutes without finishing (stop 44).
Speculation changes decoding alone, and B = 1 already times decode only (the server's timings);
now B > 1 does too, by wall clock over requests whose prompts are already in their slots.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .args import DRAFT_MODEL_FLAG
from .cases import TextCase, _Reply
from .server import LlamaServer
from .states import PromptStates, state_name

Job = tuple[Any, int]  # a prompt and its token budget
Send = Callable[[LlamaServer, Any, int, int], _Reply]  # (server, prompt, n, slot) -> reply


def slot_lanes(jobs: list[Job], batch_size: int) -> list[list[Job]]:
    """A pass's requests per slot: at least 2B (the workload cycled when short), request i on slot
    i mod B. A workload of B prompts, or of a divisor of B, keeps each slot on one prompt."""
    requests = [jobs[i % len(jobs)] for i in range(max(len(jobs), 2 * batch_size))]
    return [requests[k::batch_size] for k in range(batch_size)]


def sent_tokens(case: TextCase, batch_size: int) -> int:
    """The new tokens a pass over `case` (a TextCase) asks for: B = 1 each prompt once, B > 1 every
    request of its slots' lanes."""
    jobs = list(zip(case.prompts, case.max_new_tokens, strict=True))
    if batch_size == 1:
        return sum(n for _, n in jobs)
    return sum(n for lane in slot_lanes(jobs, batch_size) for _, n in lane)


def prime(
    server: LlamaServer, lanes: list[list[Job]], batch_size: int, states: PromptStates, process: Send
) -> None:
    """Untimed: a state saved at this slot layout for every prompt of the pass (each processed once
    per backend, in the slot that starts with it where one does), and each slot holding its lane's
    first prompt. A server with a draft model processes its slots' first prompts itself (a state
    holds no draft context: `states`)."""
    firsts = [lane[0][0] for lane in lanes if lane]
    if DRAFT_MODEL_FLAG not in server.args:
        for prompt in dict.fromkeys(p for lane in lanes for p, _ in lane[1:]):
            if prompt not in firsts and not states.saved(prompt, batch_size):
                states.restore(server, prompt, process, 0, batch_size)
    for k, prompt in enumerate(firsts):
        states.hold(server, prompt, process, k, batch_size)


def closed_loop(
    server: LlamaServer, lanes: list[list[Job]], batch_size: int, states: PromptStates, send: Send
) -> list[_Reply]:
    """Client k sends lane k's requests to slot k one after another (a finished row is refilled at
    once). A slot that holds another prompt gets this one's state restored first, inside the timed
    loop (milliseconds); a server with a draft model processes it in the request, as a new request
    would be. Both sides of a comparison send the same lanes, so they meet the prompts alike."""
    done: list[_Reply] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    drafted = DRAFT_MODEL_FLAG in server.args

    def client(k: int) -> None:
        for prompt, n in lanes[k]:
            if errors:
                return
            try:
                if not drafted:
                    states.hold(server, prompt, send, k, batch_size)
                reply = send(server, prompt, n, k)
                server.held[k] = state_name(prompt, batch_size)
            except BaseException as exc:
                errors.append(exc)
                return
            with lock:
                done.append(reply)

    threads = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(batch_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return done

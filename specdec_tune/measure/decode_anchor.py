"""The decode anchor: the machine's speed at decode-shaped work, timed beside plain decoding.

A check judges the plain tokens/s of the target against the reference processes of the run
(app.reference). Between the two, a shared VM's own speed moves: on the 2-core VM plain decoding of
an unchanged setup fell from 128-137 to 98-110 tokens/s within half an hour of quiet checks, while
the small-matmul anchor (measure.anchors) followed it only partly (3-17 %). Within one process,
plain passes vary +-4 % from second to second.

The decode anchor is the target's own shape of work without the target's code: one step multiplies
a vector by a matrix of each weight shape the target has (as many of each as the target has, the
bytes and the kernel launches of one decode step), each followed by the few elementwise ops of a
norm. Its weights are random (fixed seed), in the target's dtype, built from the shapes the profile
stored (`DecodeAnchorSpec`), not from the model loaded now: a changed model does not move it.

`bench.measure_many(anchor=...)` runs it as one more contender, prompt by prompt between the plain
passes (timing.interleaved_parts), so a repeat's plain tokens/s per anchor step/s shares whatever
the machine was doing. On the VM, across 8 fresh processes that ratio varied 1.7 % (coefficient of
variation) where the plain tokens/s varied 7.7 %, and 9.6 % read at each process's matmul speed
(benchmarks/decode_anchor.py).

Pure torch, any device; no transformers code runs in it, so a slower model, attention kernel or
transformers release shows in the ratio while the host's speed cancels.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..domain import DecodeAnchorSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Above this many bytes of distinct weights the anchor cycles through the ones it has: a model this
# large streams from memory whatever it reads, and the anchor must not double a large model's memory.
MAX_ANCHOR_BYTES = 256 * 2**20
# Anchor steps per part: this share of the part's new tokens (a step costs about what a token does).
STEPS_PER_TOKEN = 0.5
EPS = 1e-6


def spec_of(model: PreTrainedModel) -> DecodeAnchorSpec:
    """The matrix shapes of `model`'s weights, in order of first appearance, with counts, and its
    dtype. An embedding table is read one row per token, so it counts only where an output layer
    multiplies by it too (tied), and then once."""
    import torch

    seen: set[int] = set()
    counts: dict[tuple[int, int], int] = {}
    dtype = None
    params = (
        p
        for module in model.modules()
        if not isinstance(module, torch.nn.Embedding)
        for p in module.parameters(recurse=False)
    )
    for param in params:
        if param.dim() != 2 or not torch.is_floating_point(param) or param.data_ptr() in seen:
            continue
        seen.add(param.data_ptr())
        shape = (int(param.shape[0]), int(param.shape[1]))
        counts[shape] = counts.get(shape, 0) + 1
        dtype = dtype or str(param.dtype).removeprefix("torch.")
    if not counts:
        raise ValueError("the model has no weight matrices to shape a decode anchor by")
    return DecodeAnchorSpec([[o, i, n] for (o, i), n in counts.items()], dtype or "float32")


class DecodeAnchor:
    """Decode-shaped steps on `device` (see the module's docstring); `run(steps)` runs that many."""

    def __init__(self, spec: DecodeAnchorSpec, device: str = "cpu", seed: int = 0) -> None:
        import torch

        dtype = getattr(torch, spec.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"decode anchor dtype {spec.dtype!r} is not a torch dtype")
        g = torch.Generator().manual_seed(seed)
        self.order: list[tuple[int, Any]] = []  # (input size, weight), one step's matrices in order
        made: list[Any] = []
        used = 0
        for out_dim, in_dim, count in spec.matrices:
            for _ in range(count):
                size = out_dim * in_dim * dtype.itemsize
                if used + size <= MAX_ANCHOR_BYTES or not made:
                    w = (torch.randn(out_dim, in_dim, generator=g) * in_dim**-0.5).to(device, dtype)
                    made.append(w)
                    used += size
                else:  # past the cap: a matrix of the same shape made before (else a new one)
                    w = next((m for m in made if tuple(m.shape) == (out_dim, in_dim)), None)
                    if w is None:
                        w = (torch.randn(out_dim, in_dim, generator=g) * in_dim**-0.5).to(device, dtype)
                        made.append(w)
                        used += size
                self.order.append((in_dim, w))
        sizes = {n for pair in spec.matrices for n in pair[:2]}
        self.state = {n: torch.randn(1, n, generator=g).to(device, dtype) for n in sizes}
        self.bytes = used
        self.matrices = len(self.order)

    def run(self, steps: int) -> int:
        """`steps` decode-shaped steps; returns `steps` (a part's result for interleaved_parts)."""
        import torch

        state, order = self.state, self.order
        with torch.inference_mode():
            for _ in range(steps):
                for in_dim, w in order:
                    y = torch.nn.functional.linear(state[in_dim], w)
                    state[w.shape[0]] = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + EPS)
        return steps


def steps_for(max_new_tokens: Iterable[int]) -> list[int]:
    """Anchor steps per part for a workload's prompts (STEPS_PER_TOKEN of each one's new tokens)."""
    return [max(1, round(n * STEPS_PER_TOKEN)) for n in max_new_tokens]

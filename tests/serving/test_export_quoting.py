"""Model paths reach exported shell commands quoted: a path with spaces and `;` is one argument,
never a second command, in every command engine and in the flags fragment."""

from __future__ import annotations

import dataclasses
import json
import shlex

import pytest
from helpers import make_sample_profile

from specdec_tune.serving.export import export

TARGET = "/srv/my models/llama 8b; touch pwned"
DRAFT = "/srv/my models/draft 1b;rm -rf ~ $(id)"


def _hostile(kind: str = "model"):
    p = make_sample_profile(kind, threshold=0.0)
    p.target = dataclasses.replace(p.target, path=TARGET, name=TARGET)
    if kind == "model":
        draft = dataclasses.replace(p.best.config.draft, path=DRAFT + ".gguf")
        p.best = dataclasses.replace(p.best, config=dataclasses.replace(p.best.config, draft=draft))
    return p


def _shell_words(text: str) -> list[str]:
    """The words a POSIX shell reads; `;`, `&`, `|` outside quotes come out as their own tokens."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


@pytest.mark.parametrize("engine", ["llamacpp", "vllm", "sglang"])
def test_command_keeps_a_path_with_spaces_and_semicolons_one_argument(engine):
    r = export(_hostile(), engine)
    assert r.exported is not None, r.nothing
    words = _shell_words(r.text)
    assert words == r.argv  # the shell reads back exactly the argv, nothing split or added
    assert not {";", "&", "|", "&&", "||"} & set(words)
    assert TARGET in words
    if engine == "llamacpp":
        assert words[words.index("--spec-draft-model") + 1] == DRAFT + ".gguf"
    elif engine == "vllm":
        spec = json.loads(words[words.index("--speculative-config") + 1])
        assert spec["model"] == DRAFT + ".gguf"
    else:
        assert DRAFT + ".gguf" in words


def test_llamacpp_lookup_command_quotes_the_target():
    r = export(_hostile("prompt_lookup"), "llamacpp")
    words = _shell_words(r.text)
    assert words[words.index("-m") + 1] == TARGET and words == r.argv


@pytest.mark.parametrize("engine", ["llamacpp", "vllm"])
def test_flags_fragment_quotes_the_draft_path(engine):
    r = export(_hostile(), engine, fmt="flags")
    last = r.text.splitlines()[-1]  # vLLM: line 2 is the `vllm serve` flag
    words = _shell_words(last)
    assert not {";", "&", "|"} & set(words)
    if engine == "llamacpp":
        assert DRAFT + ".gguf" in words
    else:
        assert json.loads(words[1])["model"] == DRAFT + ".gguf"


@pytest.mark.parametrize("engine", ["hf", "trtllm"])
def test_python_snippets_hold_the_paths_as_literals(engine):
    import ast

    r = export(_hostile(), engine)
    tree = ast.parse(r.text)  # valid Python: a quote in a path cannot end the string early
    literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)}
    assert TARGET in literals

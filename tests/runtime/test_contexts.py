"""Long-context prompts: the `context` field, the shipped long-context workloads, and fitting a prompt
to L tokens (runtime.contexts) with a deterministic counter and with the demo pair's own tokenizer."""

from __future__ import annotations

import importlib.util
import json
import platform
from pathlib import Path

import pytest
from helpers import fast_subset

from specdec_tune.demo import demo_path
from specdec_tune.errors import SpecDecError
from specdec_tune.runtime.contexts import (
    MAX_CALLS,
    fit_prompt,
    fit_workload,
    inline_context,
    padding_pool,
    prompt_lengths,
    tolerance,
)
from specdec_tune.runtime.workloads import Prompt, Workload, _join_messages, builtin_workloads, load_workload

LONG = ("long-code-edit", "long-doc-qa", "long-chat")
LENGTHS = (256, 2048, 6144)
ROOT = Path(__file__).resolve().parents[2]
# Computed on commit 3827e85 (before `context` existed) with
# `{n: load_workload(n).sha256 for n in builtin_workloads()}`: a prompt without context hashes as before,
# so profiles made on these workloads still pass `check`.
EXISTING_SHA256 = {
    "code-edit": "639422797759103e",
    "demo-code": "f66048e4764cd3c5",
    "general": "e6e4d528766240b0",
}


def chars(text: str) -> int:
    """A stand-in tokenizer: one token per 4 characters, about what a BPE gives on English and code."""
    return (len(text) + 3) // 4


def words(text: str) -> int:
    return len(text.split())


class Calls:
    """A counter that records how often it is called."""

    def __init__(self, count=chars):
        self.count, self.n = count, 0

    def __call__(self, text: str) -> int:
        self.n += 1
        return self.count(text)


def request_of(prompt: Prompt) -> str:
    return prompt.messages[-1]["content"] if prompt.messages else prompt.text


def write_jsonl(path: Path, objs: list[dict]) -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs), encoding="utf-8")
    return path


# ---- the `context` field ----------------------------------------------------------------------


def test_existing_builtins_keep_their_sha256():
    assert {n: load_workload(n).sha256 for n in EXISTING_SHA256} == EXISTING_SHA256


def test_context_changes_the_hash_and_none_leaves_it():
    plain = Workload("w", [Prompt("q")], "t")
    assert Workload("w", [Prompt("q", context=None)], "t").sha256 == plain.sha256
    assert Workload("w", [Prompt("q", context="doc")], "t").sha256 != plain.sha256


def test_context_and_context_file_in_a_user_file(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("line one\nline two\n", encoding="utf-8")
    path = write_jsonl(
        tmp_path / "mine.jsonl",
        [
            {"prompt": "Summarise.", "context_file": "docs/a.txt"},
            {"prompt": "Again.", "context": "inline text"},
            {"messages": [{"role": "user", "content": "Why?"}], "context_file": "docs/a.txt"},
        ],
    )
    first, second, third = load_workload(str(path)).prompts
    assert first == Prompt("Summarise.", context="line one\nline two\n")
    assert second.context == "inline text" and second.text == "Again."
    assert third.context == first.context and third.text == "user: Why?\nassistant:"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"context_file": "missing.txt"}, "`context_file` 'missing.txt' not found"),
        ({"context_file": ""}, "`context_file` must be a non-empty string"),
        ({"context_file": 3}, "`context_file` must be a non-empty string"),
        ({"context_file": "empty.txt"}, "is empty; give it text"),
        ({"context_file": "latin1.txt"}, "not UTF-8"),
        ({"context": ""}, "`context` is empty"),
        ({"context": ["a"]}, "`context` must be a string"),
        ({"context": "x", "context_file": "empty.txt"}, "not both"),
    ],
)
def test_bad_context_names_file_and_line(tmp_path, extra, message):
    (tmp_path / "empty.txt").write_text("  \n", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "fine"}, {"prompt": "q", **extra}])
    with pytest.raises(SpecDecError) as err:
        load_workload(str(path))
    assert f"{path}, line 2" in str(err.value) and message in str(err.value)


# ---- the shipped long-context workloads --------------------------------------------------------


def test_long_builtins_load_and_are_listed():
    assert set(LONG) <= set(builtin_workloads())
    sizes = {}
    for name in LONG:
        wl = load_workload(name)
        assert wl.source == f"builtin:{name}" and 6 <= len(wl.prompts) <= 8
        sizes[name] = [len(p.context or "") for p in wl.prompts]
    assert all(24_000 <= n <= 42_000 for n in sizes["long-code-edit"])  # 6144 tokens and more
    assert all(n >= 25_000 for n in sizes["long-doc-qa"])
    for p in load_workload("long-chat").prompts:
        roles = [m["role"] for m in p.messages]
        assert len(roles) >= 5 and roles == ["user", "assistant"] * (len(roles) // 2) + ["user"]


def test_shipped_data_is_small():
    data = ROOT / "specdec_tune" / "data"
    new = [*(data / "contexts").iterdir(), *(data / "workloads").glob("long-*.jsonl")]
    assert sum(p.stat().st_size for p in new) <= 600_000


def test_long_code_edit_asks_about_a_function_of_its_own_module():
    for p in load_workload("long-code-edit").prompts:
        request = p.messages[0]["content"]
        assert "whose source comes before this request" in request and "whole edited function" in request
        code = request.split("```python\n", 1)[1].split("\n```")[0]
        # The function's first line (a planted typo or a removed docstring changes later lines).
        assert code.splitlines()[0].strip() in p.context


def _script():
    spec = importlib.util.spec_from_file_location("mlcw", ROOT / "scripts" / "make_long_context_workloads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(
    platform.python_version() != _script().PYTHON,
    reason="the shipped files are made from another Python's standard library",
)
def test_shipped_files_are_what_the_script_makes():
    script = _script()
    data = ROOT / "specdec_tune" / "data"
    assert script.to_jsonl(script.build()) == (data / "workloads" / "long-code-edit.jsonl").read_text()
    for name, text in script.contexts().items():
        assert (data / "contexts" / name).read_text(encoding="utf-8") == text


# ---- fit_prompt ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LONG)
@pytest.mark.parametrize("length", LENGTHS)
def test_builtins_fit_within_tolerance(name, length):
    wl = load_workload(name)
    fitted = fit_workload(wl, length, chars)
    assert fitted.name == f"{name}@L{length}" and str(length) in fitted.source
    for original, p, n in zip(wl.prompts, fitted.prompts, prompt_lengths(fitted, chars), strict=True):
        assert length - tolerance(length) <= n <= length, (name, n)
        assert request_of(p).endswith(request_of(original))
        assert (p.category, p.max_new_tokens, p.context) == (original.category, original.max_new_tokens, None)
        if p.messages is not None:
            assert p.text == _join_messages(p.messages)
            assert p.messages[-1]["role"] == "user"


@pytest.mark.filterwarnings("ignore:a request alone")  # general's longest prompts at L=256
@pytest.mark.parametrize("length", fast_subset(LENGTHS, fast=(256,)))
def test_at_most_max_calls(length):
    for name in (*LONG, "general"):
        for p in load_workload(name).prompts:
            calls = Calls()
            fit_prompt(p, length, calls, padding_pool(p.context))
            assert calls.n <= MAX_CALLS


def test_cut_keeps_the_text_right_before_the_request_at_a_line_start():
    p = load_workload("long-code-edit").prompts[0]
    fitted = fit_prompt(p, 2048, chars)
    first = fitted.messages[0]["content"]
    context = first[: -len(p.messages[0]["content"])].removesuffix("\n\n")
    assert len(context) > 4000 and p.context.rstrip("\n").endswith(context)
    assert p.context[len(p.context.rstrip("\n")) - len(context) - 1] == "\n"  # cut at a line start


def test_plain_prompt_gets_context_then_request():
    ctx = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(1, 7))
    p = Prompt("Add a docstring to f6.", context=ctx)
    fitted = fit_prompt(p, 20, words)
    assert (
        fitted.text
        == "def f5(x):\n    return x + 5\n\ndef f6(x):\n    return x + 6\n\nAdd a docstring to f6."
    )
    assert fit_prompt(p, 100, words).text == ctx.rstrip("\n") + "\n\nAdd a docstring to f6."  # all there is


def test_padding_goes_before_a_short_own_context():
    p = Prompt("What does it say?", context="The own document.")
    pad = "".join(f"Padding line {i} of some other text.\n" for i in range(400))
    fitted = fit_prompt(p, 300, words, padding=pad)
    assert fitted.text.endswith(
        "Padding line 399 of some other text.\n\nThe own document.\n\nWhat does it say?"
    )
    assert 300 - tolerance(300) <= words(fitted.text) <= 300
    # Without padding, the prompt is as long as its text allows.
    assert fit_prompt(p, 300, words).text == "The own document.\n\nWhat does it say?"


def test_a_long_line_is_cut_at_a_word():
    p = Prompt("Question?", context=" ".join(f"w{i}" for i in range(1000)))  # one line
    fitted = fit_prompt(p, 100, words)
    assert 100 - tolerance(100) <= words(fitted.text) <= 100
    assert fitted.text.endswith("w999\n\nQuestion?") and fitted.text.startswith("w")


def test_request_longer_than_length_is_kept_whole():
    p = Prompt(" ".join(["word"] * 50), context="some context " * 20)
    with pytest.warns(UserWarning, match="50 tokens, over the context length 30"):
        fitted = fit_prompt(p, 30, words)
    assert fitted.text == p.text and prompt_lengths(Workload("w", [fitted], "t"), words) == [50]


def test_chat_context_goes_into_the_first_user_message():
    p = Prompt(
        "x",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Fix g."}],
        context="\n".join(f"line {i}" for i in range(200)),
    )
    fitted = fit_prompt(p, 60, words)
    system, user = fitted.messages
    assert system == {"role": "system", "content": "Be brief."}
    assert user["content"].endswith("line 199\n\nFix g.") and user["content"].startswith("line ")
    assert fitted.text == _join_messages(fitted.messages)
    assert 60 - tolerance(60) <= words(fitted.text) <= 60


def test_chat_drops_the_earliest_turns_whole():
    turns = []
    for i in range(6):
        turns += [
            {"role": "user", "content": f"question {i} " + "q " * 40},
            {"role": "assistant", "content": f"answer {i} " + "a " * 60},
        ]
    p = Prompt("x", messages=[*turns, {"role": "user", "content": "And now?"}])
    fitted = fit_prompt(p, 300, words)
    roles = [m["role"] for m in fitted.messages]
    assert roles == ["user", "assistant"] * (len(roles) // 2) + ["user"] and len(roles) < len(p.messages)
    assert fitted.messages[-2:] == p.messages[-2:]  # the latest turns and the request are whole
    # The room left is filled with the dropped turns' end, as text at the start of the first user message.
    first = fitted.messages[0]["content"]
    assert "assistant: answer" in first and first.endswith(
        p.messages[len(p.messages) - len(roles)]["content"]
    )
    assert 300 - tolerance(300) <= words(fitted.text) <= 300


def test_inline_context_and_lengths_of_an_unfitted_workload():
    p = Prompt("Q?", context="Doc.\n")
    assert inline_context(p) == Prompt("Doc.\n\nQ?")
    assert prompt_lengths(Workload("w", [p, Prompt("a b")], "t"), words) == [2, 2]


def test_bad_length():
    for bad in (0, -5, 2.5, True):
        with pytest.raises(SpecDecError, match="context length"):
            fit_prompt(Prompt("q"), bad, words)


@pytest.mark.slow  # tokenises whole modules
def test_demo_tokenizer_fits_long_code_edit():
    """The target's own tokenizer (the demo pair's byte-level BPE), read from its tokenizer.json."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer.from_file(str(demo_path("demo") / "tokenizer.json"))

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False).ids)

    wl = load_workload("long-code-edit")
    for length in LENGTHS:
        for n in prompt_lengths(fit_workload(wl, length, count), count):
            assert length - tolerance(length) <= n <= length

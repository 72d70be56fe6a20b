"""Workload loading, validation errors, hashing, and prompt encoding with an offline tokenizer."""

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from specdec_tune.errors import SpecDecError
from specdec_tune.runtime.workloads import (
    Prompt,
    Workload,
    builtin_workloads,
    encode_prompts,
    load_workload,
    prompt_text,
    stratified,
)

SPEC_BENCH = {"multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag"}
WORDS = ["[UNK]", "<s>", "</s>", "user", "assistant", "system", ":", "hello", "world", "hi", "there"]
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if loop.index0 % 2 == 0 and m['role'] != 'user' %}"
    "{{ raise_exception('roles must alternate') }}"
    "{% endif %}"
    "<s> {{ m['role'] }} : {{ m['content'] }} </s> "
    "{% endfor %}"
    "{% if add_generation_prompt %}<s> assistant : {% endif %}"
)


def make_tokenizer(chat_template: str | None = None) -> PreTrainedTokenizerFast:
    """A tiny word-level tokenizer built in memory: no downloads. It adds <s> by default, so a test
    can see that plain prompts are encoded without special tokens."""
    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
    fast.chat_template = chat_template
    return fast


@pytest.fixture(scope="module")
def plain_tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="module")
def chat_tokenizer():
    return make_tokenizer(CHAT_TEMPLATE)


def write_jsonl(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# ---- built-ins -------------------------------------------------------------------------------


def test_builtins_listed():
    assert {"demo-code", "general"} <= set(builtin_workloads())


def test_demo_code_builtin():
    wl = load_workload("demo-code")
    assert wl.name == "demo-code" and wl.source == "builtin:demo-code"
    assert len(wl.prompts) == 24
    for p in wl.prompts:
        assert p.category == "code"
        assert p.max_new_tokens is None  # the CLI decides
        assert p.messages is None
        assert 2 <= p.text.count("\n") + 1 <= 10
        assert p.text == p.text.rstrip(" ")  # a trailing space would split oddly in BPE


def test_general_builtin_covers_spec_bench():
    wl = load_workload("general")
    counts = {}
    for p in wl.prompts:
        counts[p.category] = counts.get(p.category, 0) + 1
    assert set(counts) == SPEC_BENCH
    assert all(n >= 5 for n in counts.values()), counts
    for p in wl.prompts:
        if p.category == "multi_turn":
            roles = [m["role"] for m in p.messages]
            assert roles[:3] == ["user", "assistant", "user"]
        else:
            assert p.messages is None
        if p.category == "summarization":
            passage = p.text.split("\n\n", 1)[1]
            assert 150 <= len(passage.split()) <= 250


def test_sha_stable_and_content_sensitive(tmp_path):
    a, b = load_workload("general"), load_workload("general")
    assert a.sha256 == b.sha256
    assert len(a.sha256) == 16 and int(a.sha256, 16) >= 0
    subset = Workload("general", stratified(a.prompts, 3), "builtin:general")
    assert subset.sha256 != a.sha256
    # The hash is of the prompts only: the same prompts from a copied file hash the same.
    copy = tmp_path / "copy.jsonl"
    copy.write_text(
        "\n".join(
            json.dumps({"prompt": p.text, "category": p.category}) for p in load_workload("demo-code").prompts
        ),
        encoding="utf-8",
    )
    assert load_workload(str(copy)).sha256 == load_workload("demo-code").sha256
    changed = Workload("x", [Prompt("a", None, None, None)], "s")
    assert changed.sha256 != Workload("x", [Prompt("b", None, None, None)], "s").sha256


def test_stratified_subset_covers_every_category_round_robin():
    full = load_workload("general").prompts
    picked = stratified(full, 8)
    categories = list(dict.fromkeys(p.category for p in full))
    assert len(categories) == 6
    # The first six take one prompt of each category in file order, then the round starts again.
    assert [p.category for p in picked] == categories + categories[:2]
    assert picked[0] is full[0] and len(set(map(id, picked))) == 8
    everything = stratified(full, 1000)
    assert len(everything) == len(full) and set(map(id, everything)) == set(map(id, full))
    for bad in (0, -1):
        with pytest.raises(SpecDecError, match="prompts"):
            stratified(full, bad)


# ---- user files ------------------------------------------------------------------------------


def test_user_file_loads(tmp_path):
    path = write_jsonl(
        tmp_path / "mine.jsonl",
        [
            json.dumps({"prompt": "hello world", "category": "greet", "max_new_tokens": 8, "id": 7}),
            "",
            json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
        ],
    )
    wl = load_workload(str(path))
    assert wl.name == "mine" and wl.source == str(path)
    first, second = wl.prompts
    assert first == Prompt("hello world", "greet", 8, None)
    assert second.messages == [{"role": "user", "content": "hi"}]
    assert second.text == "user: hi\nassistant:"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('"just a string"', "expected a JSON object"),
        ('{"category": "qa"}', "missing or empty `prompt`"),
        ('{"prompt": ""}', "missing or empty `prompt`"),
        ('{"prompt": "   "}', "missing or empty `prompt`"),
        ('{"prompt": 42}', "missing or empty `prompt`"),
        ('{"prompt": "x", "max_new_tokens": 0}', "`max_new_tokens` must be an integer >= 1"),
        ('{"prompt": "x", "max_new_tokens": "16"}', "`max_new_tokens` must be an integer >= 1"),
        ('{"prompt": "x", "max_new_tokens": 2.5}', "`max_new_tokens` must be an integer >= 1"),
        ('{"prompt": "x", "max_new_tokens": true}', "`max_new_tokens` must be an integer >= 1"),
        ('{"prompt": "x", "category": 3}', "`category` must be a string"),
        ('{"messages": []}', "`messages` must be a non-empty list"),
        ('{"messages": "hi"}', "`messages` must be a non-empty list"),
        ('{"messages": [{"role": "user"}]}', "message 1 must be an object"),
        ('{"messages": [{"role": "", "content": "x"}]}', "message 1 must be an object"),
        ('{"prompt": "x", "messages": [{"role": "user", "content": "y"}]}', "not both"),
    ],
)
def test_bad_line_names_file_and_line(tmp_path, line, message):
    path = write_jsonl(tmp_path / "bad.jsonl", [json.dumps({"prompt": "fine"}), "", line])
    with pytest.raises(SpecDecError) as err:
        load_workload(str(path))
    assert f"{path}, line 3" in str(err.value)
    assert message in str(err.value)


@pytest.mark.parametrize("content", ["", "\n\n", "   \n"])
def test_empty_file(tmp_path, content):
    path = tmp_path / "empty.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(SpecDecError, match="no prompts found") as err:
        load_workload(str(path))
    assert str(path) in str(err.value)


def test_not_utf8(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"prompt": "caf\xe9"}\n'.encode("latin-1"))
    with pytest.raises(SpecDecError, match="UTF-8"):
        load_workload(str(path))


def test_unknown_name_lists_builtins(tmp_path):
    with pytest.raises(SpecDecError) as err:
        load_workload("no-such-workload")
    assert "demo-code" in str(err.value) and "general" in str(err.value)
    with pytest.raises(SpecDecError, match="unknown workload"):
        load_workload(str(tmp_path))  # a directory is not a workload file


# ---- prompt text and encoding ----------------------------------------------------------------

CHAT = Prompt(
    "user: hello\nassistant: hi there\nuser: world\nassistant:",
    "multi_turn",
    None,
    [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hi there"},
        {"role": "user", "content": "world"},
    ],
)


def test_plain_prompt_text_ignores_template(chat_tokenizer):
    assert prompt_text(Prompt("hello world", None, None, None), chat_tokenizer) == "hello world"


def test_chat_template_applied(chat_tokenizer):
    text = prompt_text(CHAT, chat_tokenizer)
    assert text == (
        "<s> user : hello </s> <s> assistant : hi there </s> <s> user : world </s> <s> assistant : "
    )


def test_chat_without_template_joins_roles(plain_tokenizer):
    assert prompt_text(CHAT, plain_tokenizer) == "user: hello\nassistant: hi there\nuser: world\nassistant:"


def test_template_error_becomes_spec_dec_error(chat_tokenizer):
    bad = Prompt("x", None, None, [{"role": "assistant", "content": "hi"}])
    with pytest.raises(SpecDecError, match="roles must alternate"):
        prompt_text(bad, chat_tokenizer)


def test_encode_plain_adds_no_special_tokens(plain_tokenizer):
    assert plain_tokenizer("hello world")["input_ids"] == [1, 7, 8]  # the tokenizer's default adds <s>
    wl = Workload("w", [Prompt("hello world", None, None, None), Prompt("hi there", None, None, None)], "t")
    assert encode_prompts(wl, plain_tokenizer) == [[7, 8], [9, 10]]


def test_encode_chat_uses_template_tokens_once(chat_tokenizer):
    [ids] = encode_prompts(Workload("w", [CHAT], "t"), chat_tokenizer)
    assert ids == chat_tokenizer(prompt_text(CHAT, chat_tokenizer), add_special_tokens=False)["input_ids"]
    assert ids[0] == 1 and ids[1] == 3  # "<s> user": the template's own BOS, not a second one
    assert ids.count(1) == 4


def test_encode_builtins_with_tiny_tokenizer(plain_tokenizer, chat_tokenizer):
    for name in builtin_workloads():
        wl = load_workload(name)
        for tok in (plain_tokenizer, chat_tokenizer):
            encoded = encode_prompts(wl, tok)
            assert len(encoded) == len(wl.prompts) and all(encoded)


def test_empty_encoding_raises():
    # A BPE without an unknown token drops characters it doesn't know: "zzz" becomes no tokens.
    bpe = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[])))
    wl = Workload("w", [Prompt("ab", None, None, None), Prompt("zzz", None, None, None)], "t")
    with pytest.raises(SpecDecError, match="prompt 2: encodes to no tokens"):
        encode_prompts(wl, bpe)

"""Every reference in the project's prose resolves: a markdown link `[x](path#anchor)` to a file (and,
for a markdown file, to one of its headings), and a repository path a doc names (`docs/cli.md`,
`specdec_tune/runtime/decode.py`, `runtime/decode.py` inside the package, `tests/...`,
`benchmarks/...`) to a file that exists. A path with a glob or a `<placeholder>` is an example, not a
reference, and is skipped; so is whatever sits in a fenced code block (commands and their output).
Reads text only: no model, no package import."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specdec_tune"


def documents() -> list[Path]:
    docs = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "profiles" / "README.md"]
    docs += sorted((ROOT / "benchmarks").rglob("*.md"))
    docs += sorted(PACKAGE.rglob("README.md"))  # the demo models' and the workloads' own notes
    return [d for d in docs if d.is_file()]


_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
# Top-level folders a doc names by their path from the repository root.
_ROOTS = ("specdec_tune", "docs", "tests", "benchmarks", "scripts", "profiles", ".ci")
# The package's own folders, which docs name from inside the package (`runtime/decode.py`): only a
# path to a file (with a suffix) counts, since `runtime/batch` names a module in prose too.
_INSIDE = tuple(sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and not p.name.startswith("_")))
_STOP = r"[^\s`()\[\]'\",;|]"
_ROOT_PATH = re.compile(rf"(?<![\w./~-])((?:{'|'.join(re.escape(r) for r in _ROOTS)})/{_STOP}*)")
_INSIDE_PATH = re.compile(rf"(?<![\w./~-])((?:{'|'.join(_INSIDE)})/{_STOP}*\.[a-z]{{2,4}})(?![\w/])")
_EXAMPLE = set("<>*?{}…$")


def prose(text: str) -> str:
    """The text without its fenced code blocks and the targets of its links with a scheme (URLs)."""
    text = _FENCE.sub("", text)
    text = re.sub(r"\[[^\]]*\]\(\s*<?[a-zA-Z][a-zA-Z0-9+.-]*:[^)]*\)", "", text)  # a link out: its text too
    return re.sub(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://\S+", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _FENCE.sub("", doc.read_text(encoding="utf-8")).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(doc: Path) -> list[str]:
    broken = []
    for target in _LINK.findall(prose(doc.read_text(encoding="utf-8"))):
        if _SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target} (no heading there has the anchor #{anchor})")
    return broken


def named_paths(text: str) -> list[tuple[str, Path]]:
    """The repository paths a text names, each with the file it must be (examples left out)."""
    body = prose(text)
    found = [(p, ROOT / p) for p in _ROOT_PATH.findall(body)]
    found += [(p, PACKAGE / p) for p in _INSIDE_PATH.findall(body)]
    named = []
    for path, file in found:
        path = path.rstrip(".:")
        if not _EXAMPLE.intersection(path):
            named.append((path, file.parent / file.name.rstrip(".:")))
    return named


def broken_paths(doc: Path) -> list[str]:
    return [
        f"{p} (no such file)" for p, file in named_paths(doc.read_text(encoding="utf-8")) if not file.exists()
    ]


@pytest.mark.parametrize("doc", documents(), ids=lambda d: str(d.relative_to(ROOT)))
def test_every_link_resolves(doc: Path) -> None:
    broken = broken_links(doc)
    assert not broken, f"{doc.relative_to(ROOT)} links to: " + "; ".join(broken)


@pytest.mark.parametrize("doc", documents(), ids=lambda d: str(d.relative_to(ROOT)))
def test_every_named_path_exists(doc: Path) -> None:
    broken = broken_paths(doc)
    assert not broken, f"{doc.relative_to(ROOT)} names: " + "; ".join(broken)


_CODE_DOC = re.compile(r"(?<![\w./-])(docs/[\w./-]+\.md|[A-Z]+\.md)\b")


def test_code_cites_only_docs_that_exist() -> None:
    """A comment or docstring that sends the reader to `docs/x.md` (or `STYLE.md`) names a file here."""
    sources = [
        p for top in ("specdec_tune", "tests", "benchmarks", "scripts") for p in (ROOT / top).rglob("*.py")
    ]
    broken = [
        f"{src.relative_to(ROOT)}: {name}"
        for src in sources
        if src != Path(__file__).resolve()
        for name in _CODE_DOC.findall(src.read_text(encoding="utf-8"))
        if not (ROOT / name).exists()
    ]
    assert not broken, "cited docs that do not exist: " + "; ".join(broken)


def test_the_checker_finds_what_it_must(tmp_path: Path) -> None:
    """The rules themselves, on a fabricated doc: a checker that passes everything would pass above."""
    doc = tmp_path / "doc.md"
    doc.write_text(
        "# Top\n\n## Engine modes (`runtime/x`)\n\n"
        "[ok](doc.md#top) [ok](#engine-modes-runtimex) [gone](missing.md) [bad anchor](doc.md#nowhere)\n"
        "[web](https://example.com/docs/nothing.md) [docs/else.md](https://example.com/docs/else.md)\n"
        "`docs/architecture.md` `docs/nothing.md` llama.cpp/docs/speculative.md\n"
        "`profiles/<hw>/demo.yaml` `benchmarks/results/*.json` `runtime/decode.py` `runtime/gone.py`\n"
        "see tests/test_docs_links.py, and specdec_tune/nothing/.\n"
        "```\nspecdec-tune check profiles/nowhere/demo.yaml [x](gone-too.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(doc) == [
        "missing.md (no such file)",
        "doc.md#nowhere (no heading there has the anchor #nowhere)",
    ]
    assert broken_paths(doc) == [
        "docs/nothing.md (no such file)",
        "specdec_tune/nothing/ (no such file)",
        "runtime/gone.py (no such file)",
    ]

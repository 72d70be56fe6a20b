"""Build the shipped long-context texts (specdec_tune/data/contexts) and the `long-code-edit` workload:
whole standard-library modules' sources, each followed by an edit request on one of its functions.
Offline and deterministic: a fixed module list, a seed, this interpreter's own sources.

    python scripts/make_long_context_workloads.py [--data specdec_tune/data]

It also writes the reference-manual chapters that `long-doc-qa` asks about (from pydoc_data.topics).
`long-doc-qa.jsonl` and `long-chat.jsonl` are written by hand. The shipped files were made with PYTHON.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import random
import sys
import sysconfig
from pathlib import Path

PYTHON = "3.11.7"
SEED = 0
DATA = Path(__file__).resolve().parent.parent / "specdec_tune" / "data"
# (module, its file under the stdlib folder, the edit asked for). None of these is in code-edit; the
# first three are in the last 2 % of the demo models' corpus, which they were validated on, not trained on.
MODULES = (
    ("xmlrpc.server", "xmlrpc/server.py", "type-hints"),
    ("zipimport", "zipimport.py", "docstring"),
    ("zoneinfo._zoneinfo", "zoneinfo/_zoneinfo.py", "rename"),
    ("fractions", "fractions.py", "docstring"),
    ("tempfile", "tempfile.py", "fix-typo"),
    ("plistlib", "plistlib.py", "rename"),
    ("uuid", "uuid.py", "type-hints"),
)
# pydoc_data.topics chapters of the language reference (plain text, lines wrapped at ~80 columns).
TOPICS = ("types", "formatstrings", "compound")


def _code_edit_script():
    path = Path(__file__).resolve().parent / "make_code_edit_workload.py"
    spec = importlib.util.spec_from_file_location("make_code_edit_workload", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def context_name(file: str) -> str:
    # ".txt": the sources are data, not modules for setuptools, ruff or pytest to pick up.
    return file.replace("/", ".") + ".txt"


def contexts() -> dict[str, str]:
    """Context file name -> text: the modules' sources and the reference chapters."""
    from pydoc_data.topics import topics

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = {context_name(f): (stdlib / f).read_text(encoding="utf-8") for _, f, _ in MODULES}
    out.update({f"reference-{t}.txt": topics[t] for t in TOPICS})
    return out


def build(seed: int = SEED) -> list[dict]:
    """One edit request per module, on a function of that module, its whole source as context."""
    script = _code_edit_script()
    rng = random.Random(seed)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    records = []
    for module, file, category in MODULES:
        functions = script.functions_in(module, (stdlib / file).read_text(encoding="utf-8"))
        rng.shuffle(functions)
        found = None
        for _, qualname, node, code in functions:
            content = script.EDITS[category](module, node, code, rng)
            if content is not None:
                found = (qualname, content)
                break
        if found is None:
            raise SystemExit(f"no function of {module} takes a {category} edit")
        name, content = found
        # The request says where the function is, since the module's source comes right before it.
        content = content.replace(
            f"The function is from Python's `{module}` module.",
            f"The function is from Python's `{module}` module, whose source comes before this request.",
        )
        records.append(
            {
                "messages": [{"role": "user", "content": content}],
                "context_file": context_name(file),
                "category": category,
                "source": f"{module}:{name}",
            }
        )
    return records


def to_jsonl(records: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    if platform.python_version() != PYTHON:
        print(f"note: the shipped files were made with Python {PYTHON}; this is {platform.python_version()}")
    (args.data / "contexts").mkdir(parents=True, exist_ok=True)
    for name, text in contexts().items():
        (args.data / "contexts" / name).write_text(text, encoding="utf-8")
    records = build()
    (args.data / "workloads" / "long-code-edit.jsonl").write_text(to_jsonl(records), encoding="utf-8")
    print(f"wrote {len(records)} prompts and {len(contexts())} contexts under {args.data}", file=sys.stderr)


if __name__ == "__main__":
    main()

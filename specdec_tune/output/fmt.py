"""Number and table formatting shared by the terminal renderings."""

from __future__ import annotations

import re

from rich.table import Table
from rich.text import Text

# C0 controls but tab and newline, DEL and C1: an ESC from a profile could move the cursor or
# retitle the terminal, so it is shown as \x1b instead.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(text: object) -> str:
    """A value as inert text for the terminal: control characters shown as escapes."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text))


def styled(*parts: str | tuple[str, str]) -> Text:
    """Styled text without markup parsing: `styled(("error:", "red"), " ", message)`.

    Values that come from a profile, a study or an exception may hold `[/x]`; as Text they are
    printed as they are, never parsed (the consoles have markup off, see terminal.console)."""
    return Text.assemble(*((plain(p[0]), p[1]) if isinstance(p, tuple) else plain(p) for p in parts))


def times(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}×"


def num(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def vec(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values) if values else "—"


def unit(v: float | None, unit: str, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f} {unit}"


def kv_table(title: str, rows: list[tuple[str, str | Text]]) -> Table:
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    for k, v in rows:
        t.add_row(k, v)
    return t


def add_columns(table: Table, columns: list[tuple[str, str]]) -> None:
    """Columns by (name, justify)."""
    for name, justify in columns:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]

"""Number and table formatting shared by the terminal renderings."""

from __future__ import annotations

import re

from rich.table import Table
from rich.text import Text

from ..domain import CompileTime, Noise

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


def interval(iv: list[float] | None, digits: int = 2) -> str:
    """A speedup's interval as "[1.48, 1.57]×", or "—" when it has none (one repeat, older profile)."""
    return "—" if not iv else f"[{iv[0]:.{digits}f}, {iv[1]:.{digits}f}]×"


def final_verdict(search: object) -> str:
    """The final round's verdict in words (a profile's `search`), "" when it has none."""
    verdict = getattr(search, "final_verdict", "")
    margin = getattr(search, "final_margin", [])
    if not verdict:
        return ""
    against = (
        f"best / runner-up {margin[0]:.3f}× [{margin[1]:.3f}, {margin[2]:.3f}]" if len(margin) == 3 else ""
    )
    if verdict == "resolved":
        return f"resolved: {against}" if against else "resolved"
    tied = list(getattr(search, "final_tied", []) or [])
    words = f"tie within noise ({against})" if against else verdict
    if tied:
        words += f"; as fast within noise: {', '.join(tied)} (simplest first)"
    return words


def noise_words(n: Noise) -> str:
    """A profile's `noise` (domain.Noise) in one line."""
    parts = [f"plain passes vary {n.plain_pass_cv:.1%} over {n.plain_passes}"]
    if n.load_avg is not None:
        parts.append(f"load {n.load_avg:.2f} on {n.cpus} CPUs")
    if n.others_cpu_share is not None:
        parts.append(f"other processes {n.others_cpu_share:.0%} of all CPUs")
    if n.steal_share:
        parts.append(f"steal {n.steal_share:.0%}")
    words = ", ".join(parts) + f"; {n.repeats_needed} repeats resolve 5 %"
    w = getattr(n, "during_search", None)
    if w is not None and w.others_cpu_share is not None:
        words += f"; during the search ({w.seconds:.0f} s) other processes {w.others_cpu_share:.0%}"
        words += (f", steal {w.steal_share:.0%}" if w.steal_share else "") + (": BUSY" if w.busy else "")
    return words


def compile_words(c: CompileTime) -> str:
    """A profile's or costs file's `compile` (domain.CompileTime) in one line."""
    if not c.graphs:
        return "no graphs built (static engine)"
    return f"{c.graphs} graphs built in {c.compile_s:.1f} s, before and apart from every timing"

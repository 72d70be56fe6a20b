"""Where specdec-tune keeps what is not a result: the cache folder (studies, GGUF conversions, the
remembered engine mode, the locks of profile writes). One definition, so `XDG_CACHE_HOME` (which the
tests point into a temp folder) moves all of them at once.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/specdec-tune` when set, else `~/.cache/specdec-tune`."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "specdec-tune"

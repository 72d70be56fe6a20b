"""The atomic writer as the store has always named it; it lives in the shared leaf
`specdec_tune.atomic` so that runtime (the engine-auto memory, GGUF files) writes through it too."""

from ..atomic import atomic_path, atomic_write_bytes, atomic_write_text, locked, new_file_mode

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "locked", "new_file_mode"]

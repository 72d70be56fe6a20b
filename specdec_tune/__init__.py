"""specdec-tune: a hardware-aware autotuner for speculative decoding."""

__version__ = "0.1.0"

"""`python -m specdec_tune.cli`: the same command line as `specdec-tune`."""

from __future__ import annotations

from .main import main

main()

"""Plant a regression and show that `specdec-tune check` catches it (exit code 1).

Every drafting step of a model draft is made 3 ms slower (as a slower draft kernel, a new
dependency or a misconfigured thread pool would), then the stored profile is checked.

    python benchmarks/planted_regression.py [PROFILE] [--delay-ms 3]
"""

from __future__ import annotations

import argparse
import sys
import time

from specdec_tune.runtime.drafting import drafters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile", nargs="?", default="profiles/cpu-intel-xeon-2t/demo.yaml")
    ap.add_argument("--delay-ms", type=float, default=3.0)
    ap.add_argument("--junit", default="planted.xml")
    args = ap.parse_args()
    real = drafters.ModelDrafter.propose

    def slower(self, *a, **k):
        time.sleep(args.delay_ms / 1e3)
        return real(self, *a, **k)

    drafters.ModelDrafter.propose = slower
    from specdec_tune.cli import app

    sys.argv = ["specdec-tune", "check", args.profile, "--junit", args.junit]
    app()


if __name__ == "__main__":
    main()

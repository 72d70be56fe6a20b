#!/usr/bin/env bash
# The serving envelope's price (issue 51): the native engine's `run --context-lengths 256,1024,1792
# --batch-sizes 1,4` on the demo pair against one cell of it (`--context-lengths 1792`, B = 1), in
# the same session, each with fresh studies and the default budget; prints each command's wall
# time, the ratio, and each cell's answer (its `context_table`) beside the one-cell run's.
#
#   bash benchmarks/envelope.sh            # results in benchmarks/results/envelope/
#   bash benchmarks/envelope.sh cells      # a one-cell run at every other (B, L) of the envelope, and
#                                          # each cell's answer beside the envelope's (no envelope run)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=benchmarks/results/envelope
mkdir -p "$OUT"
timed() {  # NAME CMD...: log, print the wall time and exit code
  local name=$1; shift
  local t0; t0=$(date +%s)
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: $(( $(date +%s) - t0 )) s, exit $rc" | tee -a "$OUT/times.txt"
}
run() { specdec-tune run --storage "sqlite:///$(mktemp -d)/studies.db" "$@"; }
if [[ ${1:-} == cells ]]; then
  for b in 1 4; do
    for l in 256 1024 1792; do
      [[ $b == 1 && $l == 1792 ]] && continue  # the one cell the envelope run is timed against
      timed "cell-B$b-L$l" run --context-lengths "$l" --batch-sizes "$b" --out "$OUT/cell-B$b-L$l.yaml"
    done
  done
else
  timed cell run --context-lengths 1792 --out "$OUT/cell.yaml"
  timed envelope run --context-lengths 256,1024,1792 --batch-sizes 1,4 --out "$OUT/envelope.yaml"
fi
python - "$OUT" <<'EOF'
import sys
from pathlib import Path

from specdec_tune.store.yamlio import load_profile

out = Path(sys.argv[1])
times = {}
for line in (out / "times.txt").read_text().splitlines():
    name, rest = line.split(": ", 1)
    times[name] = int(rest.split(" s")[0])  # the latest of each
print(f"envelope / one cell: {times['envelope']} / {times['cell']} s = {times['envelope'] / times['cell']:.2f}x")


def one_cell(b: int, length: int):
    path = out / ("cell.yaml" if (b, length) == (1, 1792) else f"cell-B{b}-L{length}.yaml")
    if not path.exists():
        return None
    p = load_profile(path)
    return next((r.best for r in p.context_table if r.batch_size == b), None) or p.best


def shown(best) -> str:
    lo, hi = best.metrics.speedup_interval or (float("nan"), float("nan"))
    return f"{best.config.label} {best.metrics.speedup:.2f}x [{lo:.2f}, {hi:.2f}]"


for r in load_profile(out / "envelope.yaml").context_table:
    one = one_cell(r.batch_size, r.context_length)
    if one is None:
        print(f"B={r.batch_size} L={r.context_length}: envelope {shown(r.best)}; no one-cell run")
        continue
    lo, hi = one.metrics.speedup_interval or (0.0, float("inf"))
    elo, ehi = r.best.metrics.speedup_interval or (0.0, float("inf"))
    same = one.config.label == r.best.config.label
    overlap = elo <= hi and lo <= ehi
    within = "same config" if same else "intervals overlap" if overlap else "APART"
    print(f"B={r.batch_size} L={r.context_length}: envelope {shown(r.best)}; one cell {shown(one)}: {within}")
EOF

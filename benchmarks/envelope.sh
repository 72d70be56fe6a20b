#!/usr/bin/env bash
# The serving envelope's price (issue 51): the native engine's `run --context-lengths 256,1024,1792
# --batch-sizes 1,4` on the demo pair against one cell of it (`--context-lengths 1792`, B = 1), in
# the same session, each with fresh studies and the default budget; prints each command's wall
# time, the ratio, and each cell's answer (its `context_table`) beside the one-cell run's.
#
#   bash benchmarks/envelope.sh            # results in benchmarks/results/envelope/
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
timed cell run --context-lengths 1792 --out "$OUT/cell.yaml"
timed envelope run --context-lengths 256,1024,1792 --batch-sizes 1,4 --out "$OUT/envelope.yaml"
python - "$OUT" <<'EOF'
import sys
from pathlib import Path

from specdec_tune.store.yamlio import load_profile

out = Path(sys.argv[1])
times = dict(line.split(": ", 1) for line in (out / "times.txt").read_text().splitlines()[-2:])
cell_s, env_s = (int(times[k].split(" s")[0]) for k in ("cell", "envelope"))
print(f"envelope / one cell: {env_s} / {cell_s} s = {env_s / cell_s:.2f}x")
one = load_profile(out / "cell.yaml").best
print(f"one cell, B=1 L=1792: {one.config.label} {one.metrics.speedup:.2f}x {one.metrics.speedup_interval}")
for r in load_profile(out / "envelope.yaml").context_table:
    m = r.best.metrics
    print(f"envelope B={r.batch_size} L={r.context_length}: {r.best.config.label} {m.speedup:.2f}x {m.speedup_interval}")
EOF

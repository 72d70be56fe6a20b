#!/usr/bin/env bash
# The vLLM backend's numbers, in one sequence (docs/vllm.md keeps them): `run --backend vllm` on the
# demo pair and on SmolLM2 (code-edit, B = 1, each from a cold vLLM compile cache), SmolLM2 at
# B = 1,4,16 (the measured schedule), the profile's reference measured here, then `check` of it and
# of it with a planted 15 % slower speculative side, the grid with its top configs raced again, and
# the same prompts through llama.cpp beside vLLM.
#
#   SPECDEC_VLLM_PYTHON=.vllm-venv/bin/python bash benchmarks/vllm.sh [STEPS]
#
# STEPS: a comma list of demo,smollm2,batch,check,grid,grid-demo,versus (default: all). Results and
# logs go to benchmarks/results/vllm/; each command's wall time is printed and logged.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${SPECDEC_VLLM_PYTHON:?set SPECDEC_VLLM_PYTHON to the Python of the vLLM environment}"
OUT=benchmarks/results/vllm
mkdir -p "$OUT"
STEPS=",${1:-demo,smollm2,batch,check,grid,grid-demo,versus},"
STUDIES="sqlite:///$(mktemp -d)/studies.db"  # fresh studies: nothing is resumed from an earlier run

timed() {  # NAME CMD...: run with a cold vLLM compile cache, log, print the wall time and exit code
  local name=$1; shift
  local cache; cache=$(mktemp -d)
  local t0; t0=$(date +%s)
  VLLM_CACHE_ROOT="$cache" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  # vLLM processes left alive: zombies aside (an engine's worker, reparented when its engine core was
  # killed, waits for PID 1 to reap it: `pgrep` counts it, though it runs nothing and holds nothing)
  local left; left=$(ps -eo stat=,args= | awk '$1 !~ /^Z/ && /vllm\.entrypoints|VLLM::/' | grep -vc awk)
  echo "$name: $(( $(date +%s) - t0 )) s, exit $rc (vLLM processes alive: $left)" | tee -a "$OUT/times.txt"
  rm -rf "$cache"
}

# each run its own studies: the batch run's B = 1 cell would resume the smollm2 run's finished study
run() { specdec-tune run --backend vllm --workload code-edit --storage "sqlite:///$(mktemp -d)/studies.db" "$@"; }

[[ $STEPS == *,demo,* ]] && timed demo run --target demo --out "$OUT/demo.vllm.yaml"
[[ $STEPS == *,smollm2,* ]] && timed smollm2 run --target smollm2-135m --out "$OUT/smollm2-135m.vllm.yaml"
[[ $STEPS == *,batch,* ]] && timed batch run --target smollm2-135m --batch-sizes 1,4,16 --budget 600 \
  --out "$OUT/smollm2-135m.b1-4-16.vllm.yaml"
if [[ $STEPS == *,check,* ]]; then
  # The reference `check` judges against: the best config against plain in fresh server pairs (3 that
  # agree within 4 %), measured here. A vLLM run stores only its final round, one server pair, whose
  # level a check's pairs do not share (docs/vllm.md, "Export and check").
  timed reference specdec-tune reference "$OUT/smollm2-135m.vllm.yaml" --out "$OUT/smollm2-135m.ref.vllm.yaml" --json
  timed check specdec-tune check "$OUT/smollm2-135m.ref.vllm.yaml" --json
  # a planted 15 % slower speculative side (measure.planted's test-only hook, as
  # benchmarks/check_under_load.py plants it): every speculative pass reports 1.15x its decode time
  timed check-planted env SPECDEC_TEST_SLOWER_SPEC=1.15 specdec-tune check "$OUT/smollm2-135m.ref.vllm.yaml" --json
fi
# the grid over each run's own space (its drafts, γ 2-8), the run's choice raced beside its top configs
[[ $STEPS == *,grid,* ]] && timed grid python benchmarks/vllm_grid.py --target smollm2-135m \
  --profile "$OUT/smollm2-135m.vllm.yaml" --drafts ngram:4,ngram:2-4 --gammas 2,4,6,8 \
  --out "$OUT/grid_smollm2-135m_code-edit.json"
[[ $STEPS == *,grid-demo,* ]] && timed grid-demo python benchmarks/vllm_grid.py --target demo \
  --profile "$OUT/demo.vllm.yaml" --drafts ngram:4,ngram:2-4,draft-1l --gammas 2,4,6,8 \
  --out "$OUT/grid_demo_code-edit.json"
if [[ $STEPS == *,versus,* ]]; then
  # the tuned llama.cpp config: LLAMACPP_PROFILE (e.g. the committed profile of this hardware), or a run
  LLAMACPP_PROFILE=${LLAMACPP_PROFILE:-$OUT/smollm2-135m.llamacpp.yaml}
  [[ -f $LLAMACPP_PROFILE ]] || timed llamacpp specdec-tune run --backend llamacpp --target smollm2-135m \
    --workload code-edit --storage "$STUDIES" --out "$LLAMACPP_PROFILE"
  # the whole code-edit workload (8 prompts, 48 new tokens each), not the budget's cut of it
  timed versus python benchmarks/vllm_vs_llamacpp.py --vllm-profile "$OUT/smollm2-135m.vllm.yaml" \
    --llamacpp-profile "$LLAMACPP_PROFILE" --prompts 8 -n 48 --out "$OUT/versus.json"
fi
cat "$OUT/times.txt"

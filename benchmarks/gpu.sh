#!/usr/bin/env bash
# One GPU, about 10 minutes, three steps (docs/gpu.md):
#   1. the CUDA tests (`pytest -m cuda tests/runtime/test_cuda.py`): the shipped demo pair decoded on
#      CUDA in the eager, static and compiled engine modes (compiled: target and draft in CUDA graphs),
#      every row the target's own greedy output, and speculative sampling's χ² test on CUDA;
#   2. `specdec-tune run --device cuda` on the demo pair end to end (a budget of RUN_BUDGET_S seconds);
#   3. shape-only profiles (issue 14): an 8B-shaped target (llama-3.1-8b) with a 1B-shaped draft
#      (llama-3.2-1b), random weights in bfloat16, once per engine mode (--engine eager, --engine compiled).
# No weights and no network are needed beyond installing the package. It writes
#   benchmarks/results/gpu/<gpu-slug>.cuda-tests.log                      (pytest's report)
#   benchmarks/results/gpu/<gpu-slug>.demo.yaml, .demo.trials.csv, .demo.log (the demo run's profile)
#   benchmarks/results/gpu/<gpu-slug>.shape-<target>.<engine>.costs.yaml   (weights: random, the acceptance given below)
#   benchmarks/results/gpu/<gpu-slug>.<engine>.log                         (the full `profile` report)
# (not profiles/: the tests check every YAML there as a committed profile)
# and ends with one table: T_target, C_ver(γ), T_draft and the roofline share per engine mode.
# Everything, the install included, stays under BUDGET_S seconds (default 570: under 10 minutes, kills
# included): each step runs under `timeout` with its share of what is left. Exit 1 when a step failed.
#
#   bash benchmarks/gpu.sh
#   TARGET=qwen2.5-7b DRAFT=qwen2.5-0.5b ACCEPTANCE=0.75,0.7,0.65 bash benchmarks/gpu.sh
#   DEVICE=cpu DTYPE=float32 TARGET=tiny.json DRAFT=tiny-draft.json bash benchmarks/gpu.sh   # dry run
set -euo pipefail
cd "$(dirname "$0")/.."

BUDGET_S=${BUDGET_S:-570}
TESTS_S=${TESTS_S:-150}               # the most the CUDA tests may take (a compiled graph per shape)
RUN_BUDGET_S=${RUN_BUDGET_S:-60}      # `run --budget` of the demo pair; killed at twice that plus 30 s
TARGET=${TARGET:-llama-3.1-8b}        # a bundled shape name, or a config.json path
DRAFT=${DRAFT:-llama-3.2-1b}
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-bfloat16}
ENGINES=${ENGINES:-eager compiled}
MAX_GAMMA=${MAX_GAMMA:-8}
REPEATS=${REPEATS:-3}
CONTEXT_LEN=${CONTEXT_LEN:-512}
# Random weights accept nothing meaningful, so acceptance is given: a plausible per-position vector
# for a Llama 3.2 1B draft under Llama 3.1 8B on chat prompts. Replace it with a measured one
# (`specdec-tune profile` with the real models on any machine, then --acceptance-from that file).
ACCEPTANCE=${ACCEPTANCE:-0.8,0.76,0.73,0.71,0.69,0.67,0.66,0.65}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 COLUMNS=${COLUMNS:-150}  # COLUMNS: rich's width in the logs
START=$SECONDS
left() { echo $((BUDGET_S - (SECONDS - START))); }

# 1. Python with specdec-tune and torch: the one on PATH, else a venv (.gpu-venv) with torch from the
#    default index, which on Linux x86-64 is a CUDA build.
PY=python3
if ! $PY -c "import specdec_tune.cli, torch, transformers" 2>/dev/null; then
    [ -x .gpu-venv/bin/python ] || python3 -m venv .gpu-venv || {
        echo "error: python3 -m venv failed (Debian/Ubuntu: apt-get install python3-venv)" >&2
        exit 2
    }
    PY=.gpu-venv/bin/python
    if ! $PY -c "import specdec_tune.cli, torch, transformers" 2>/dev/null; then
        echo "installing torch==2.13.0 and specdec-tune into .gpu-venv ($(left) s left)"
        timeout "$(left)" $PY -m pip install -q --upgrade pip
        timeout "$(left)" $PY -m pip install -q torch==2.13.0
        timeout "$(left)" $PY -m pip install -q -e . pytest
    fi
fi
if [[ $DEVICE == cuda* ]] && ! $PY -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "error: $PY has torch $($PY -c 'import torch; print(torch.__version__)') without CUDA;" \
        "install a CUDA build (pip install torch==2.13.0 from the default index) or run with DEVICE=cpu" >&2
    exit 2
fi

# 2. Where the files go: the hardware slug profiles use (measure.hardware), e.g. nvidia-h200.
SLUG=$($PY -c "
import os, torch
from specdec_tune.measure.hardware import hardware_info
if os.environ.get('SPECDEC_THREADS'):  # a CPU slug counts torch threads, as the CLI sets them
    torch.set_num_threads(int(os.environ['SPECDEC_THREADS']))
print(hardware_info('$DEVICE')['slug'])")
NAME=$(basename "${TARGET%.json}")
mkdir -p benchmarks/results/gpu
HELP=$($PY -m specdec_tune.cli profile --help)
if ! grep -q -- "--engine" <<<"$HELP"; then
    echo "note: this specdec-tune has no profile --engine; one profile with its default engine"
    ENGINES=default
fi

FAILED=0

# 3. The CUDA tests: exactness in every engine mode and the χ² test, on this GPU.
log="benchmarks/results/gpu/$SLUG.cuda-tests.log"
echo "== the CUDA tests: pytest -m cuda tests/runtime/test_cuda.py (timeout ${TESTS_S}s)"
t0=$SECONDS
if ! $PY -c "import pytest" 2>/dev/null; then
    echo "   skipped: pytest is not installed for $PY (pip install pytest)" | tee "$log"
    FAILED=1
# -o addopts=: the project's addopts need pytest-xdist, which one GPU does not need
elif timeout --kill-after=10 "$(( $(left) < TESTS_S ? $(left) : TESTS_S ))" $PY -m pytest -q -m cuda \
    -o addopts= -p no:randomly -p no:cacheprovider -rs tests/runtime/test_cuda.py 2>&1 | tee "$log"; then
    echo "   the CUDA tests took $((SECONDS - t0)) s"
else
    echo "   the CUDA tests FAILED or timed out after $((SECONDS - t0)) s (see $log)"
    FAILED=1
fi

# 4. The demo pair end to end: profile, search and the final round on this GPU, engine mode auto
#    (compiled on CUDA), a fresh study; the profile goes beside the other results.
log="benchmarks/results/gpu/$SLUG.demo.log"
cap=$((2 * RUN_BUDGET_S + 30))
((cap < $(left) - 60)) || cap=$(($(left) - 60))
args=(run --device "$DEVICE" --budget "$RUN_BUDGET_S" --reference-processes 0
    --storage "sqlite:///$(mktemp -d)/demo.db" --out "benchmarks/results/gpu/$SLUG.demo.yaml")
echo "== the demo pair: specdec-tune ${args[*]} (timeout ${cap}s)"
t0=$SECONDS
if ((cap < 30)); then
    echo "   skipped: only ${cap}s left" | tee "$log"
    FAILED=1
elif timeout --kill-after=10 "$cap" $PY -m specdec_tune.cli "${args[@]}" 2>&1 | tee "$log"; then
    echo "   the demo run took $((SECONDS - t0)) s"
else
    echo "   the demo run FAILED or timed out after $((SECONDS - t0)) s (see $log)"
    FAILED=1
fi

# 5. One profile per engine mode, each with an equal share of the time left.
read -r -a MODES <<<"$ENGINES"
FILES=()
for i in "${!MODES[@]}"; do
    engine=${MODES[$i]}
    share=$((($(left) - 20) / (${#MODES[@]} - i)))
    out="benchmarks/results/gpu/$SLUG.shape-$NAME.$engine.costs.yaml"
    log="benchmarks/results/gpu/$SLUG.$engine.log"
    args=(profile --shape "$TARGET" --draft "shape:$DRAFT" --acceptance-vector "shape:$DRAFT=$ACCEPTANCE"
        --device "$DEVICE" --dtype "$DTYPE" --max-gamma "$MAX_GAMMA" --repeats "$REPEATS"
        --context-len "$CONTEXT_LEN" --out "$out")
    [ "$engine" = default ] || args+=(--engine "$engine")
    echo "== $engine: specdec-tune ${args[*]} (timeout ${share}s)"
    if ((share < 30)); then
        echo "   skipped: only ${share}s left" | tee "$log"
        FAILED=1
        continue
    fi
    t0=$SECONDS
    if timeout --kill-after=10 "$share" $PY -m specdec_tune.cli "${args[@]}" 2>&1 | tee "$log"; then
        echo "   $engine took $((SECONDS - t0)) s"
        FILES+=("$out")
    else
        echo "   $engine FAILED or timed out after $((SECONDS - t0)) s (see $log)"
        FAILED=1
    fi
done

# 6. The numbers side by side.
if ((${#FILES[@]})); then
    $PY - "${FILES[@]}" <<'EOF'
import sys
from specdec_tune.search.costmodel import CostModel
from specdec_tune.store.yamlio import load_costs

print(f"\n{'file':<52} {'mode':>8} {'T_target':>9} {'T_draft':>8} {'c':>6} {'roofline':>8} {'best γ':>7}  C_ver(γ) ms, γ = 1..")
for path in sys.argv[1:]:
    costs, hw = load_costs(path)
    roof = "—" if costs.roofline_share is None else f"{costs.roofline_share:.0%}"
    curve = " ".join(f"{v:.2f}" for v in costs.verify_ms)
    draft = "   (the draft was skipped: see the log)"
    if costs.drafts:
        d = costs.drafts[0]
        g, s = CostModel(costs).best_gamma(d.name, len(costs.verify_ms))
        draft = f"{d.t_draft_ms:>6.2f}ms {d.c:>6.3f} {roof:>8} {g:>3} {s:.2f}×"
    mode = getattr(costs, "engine_mode", "?")
    print(f"{path:<52} {mode:>8} {costs.t_target_ms:>7.2f}ms {draft}  {curve}")
    for reason in getattr(costs, "compile_fallbacks", []):
        print(f"    compile fell back to static: {reason}")
print(f"weights: {costs.weights} (shape {costs.shape}), context {costs.context_len}, on {hw['slug']}; "
      "best γ and its speedup are predicted from the given acceptance")
EOF
fi
echo "total $((SECONDS - START)) s"
exit $FAILED

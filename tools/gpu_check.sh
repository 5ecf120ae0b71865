#!/usr/bin/env bash
# The GPU checks in one run: the CUDA test binary, then greedy agreement with transformers on a seeded checkpoint.
#
# Usage: bash tools/gpu_check.sh [--shape llama-3.1-8b] [--layers N] [--binary .device/tensorfold]
#                                [--tests .device/cuda-tests] [--out DIR] [--work DIR] [--gguf FILE] [--no-tests]
#                                [--selfcheck] [--steps N]
# Build first (here, with cargo): the release binary, and `cargo test --release --test cuda --no-run`'s binary.
# --gguf FILE checks a trained GGUF model (e.g. the default model) on chat prompts instead of a seeded checkpoint;
# transformers reads it with the `gguf` package.
# --selfcheck also measures transformers bf16 against itself when only kernels change (gpu_reference.py selfcheck).
# Writes OUT/tests.txt, OUT/agreement.json and OUT/agreement.md (the comparison against bf16 and f32 references),
# and with --selfcheck OUT/selfcheck.json and OUT/selfcheck.md.
set -uo pipefail
cd "$(dirname "$0")/.."

SHAPE="llama-3.1-8b"
LAYERS=""
BINARY=".device/tensorfold"
TESTS=".device/cuda-tests"
OUT_DIR="${OUT:-./gpu-check-out}"
WORK="${TMPDIR:-/tmp}/tensorfold-check"
GGUF=""
RUN_TESTS=1
SELFCHECK=0
STEPS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --shape) SHAPE="$2"; shift 2 ;;
        --layers) LAYERS="$2"; shift 2 ;;
        --binary) BINARY="$2"; shift 2 ;;
        --tests) TESTS="$2"; shift 2 ;;
        --out) OUT_DIR="$2"; shift 2 ;;
        --work) WORK="$2"; shift 2 ;;
        --gguf) GGUF="$2"; shift 2 ;;
        --no-tests) RUN_TESTS=0; shift ;;
        --selfcheck) SELFCHECK=1; shift ;;
        --steps) STEPS=(--steps "$2"); shift 2 ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT_DIR" "$WORK"
export TF_CACHE_DIR="${TF_CACHE_DIR:-$WORK/cache}"
PY="${PYTHON:-python3}"
status=0

if [[ $RUN_TESTS == 1 ]]; then
    echo "== CUDA tests"
    "$TESTS" --test-threads 1 2>&1 | tee "$OUT_DIR/tests.txt" || status=1
    # The GEMM kernels' own test binary, beside the engine's.
    gemm_tests="$(dirname "$TESTS")/gemm-tests"
    if [[ -x "$gemm_tests" ]]; then
        "$gemm_tests" 2>&1 | tee -a "$OUT_DIR/tests.txt" || status=1
    fi
fi

if [[ -n "$GGUF" ]]; then
    CKPT="$GGUF"
    "$PY" tools/gpu_reference.py prompts --texts --model "$CKPT" --out "$WORK/prompts.json" ${STEPS[@]+"${STEPS[@]}"} || exit 1
else
    CKPT="$WORK/${SHAPE}${LAYERS:+-l$LAYERS}"
    echo "== checkpoint $CKPT"
    if [[ ! -f "$CKPT/config.json" ]]; then
        "$PY" tools/make_checkpoint.py --shape "$SHAPE" ${LAYERS:+--layers "$LAYERS"} --out "$CKPT" || exit 1
    fi
    "$PY" tools/gpu_reference.py prompts --model "$CKPT" --seed 0 --out "$WORK/prompts.json" ${STEPS[@]+"${STEPS[@]}"} || exit 1
fi
echo "== ours"
"$BINARY" logits --model "$CKPT" --device cuda --prompts "$WORK/prompts.json" --out "$WORK/ours" 2>&1 | tail -5 || status=1
for dtype in bfloat16 float32; do
    echo "== transformers $dtype"
    "$PY" tools/gpu_reference.py reference --model "$CKPT" --prompts "$WORK/prompts.json" --out "$WORK/ref_$dtype" --dtype "$dtype" || status=1
done
"$PY" tools/gpu_reference.py compare --ours "$WORK/ours" --ref "$WORK/ref_bfloat16" --ref2 "$WORK/ref_float32" \
    --out "$OUT_DIR/agreement.json" | tee "$OUT_DIR/agreement.md" || status=1
if [[ $SELFCHECK == 1 ]]; then
    echo "== selfcheck"
    "$PY" tools/gpu_reference.py selfcheck --model "$CKPT" --prompts "$WORK/prompts.json" --out "$WORK/selfcheck" \
        --ours "$WORK/ours" && cp "$WORK/selfcheck/selfcheck.json" "$WORK/selfcheck/selfcheck.md" "$OUT_DIR/" || status=1
fi
exit $status

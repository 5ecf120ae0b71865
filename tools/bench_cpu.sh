#!/usr/bin/env bash
# CPU benchmark: `tensorfold bench` against llama.cpp (the xllamacpp wheel) on the same GGUF file
# with the same thread count, run alternately; prints both sides and the ratios ours/llama.cpp.
#
# Usage: tools/bench_cpu.sh [THREADS=2]
# Environment: ROUNDS (alternating rounds, default 2; the best of each side is compared),
#   PROMPT_TOKENS (512), DECODE_TOKENS (128), REPEATS (3, per side per round),
#   TF_CACHE_DIR / XDG_CACHE_HOME (where the model and the bench venv live), PYTHON (python3).
set -euo pipefail

THREADS="${1:-2}"
ROUNDS="${ROUNDS:-2}"
PROMPT_TOKENS="${PROMPT_TOKENS:-512}"
DECODE_TOKENS="${DECODE_TOKENS:-128}"
REPEATS="${REPEATS:-3}"
XLLAMACPP_VERSION="2026.10.11549"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"

cd "$(dirname "$0")/.."

# The same rules as the binary's cache directory.
if [[ -n "${TF_CACHE_DIR:-}" ]]; then
    CACHE="$TF_CACHE_DIR"
elif [[ -n "${XDG_CACHE_HOME:-}" ]]; then
    CACHE="$XDG_CACHE_HOME/tensorfold"
else
    CACHE="$HOME/.cache/tensorfold"
fi

VENV="$CACHE/bench-venv"
VPY="$VENV/bin/python"
if ! "$VPY" -c "import importlib.metadata as m, sys; sys.exit(m.version('xllamacpp') != '$XLLAMACPP_VERSION')" 2>/dev/null; then
    echo "bench: installing xllamacpp==$XLLAMACPP_VERSION into $VENV" >&2
    mkdir -p "$CACHE"
    "${PYTHON:-python3}" -m venv "$VENV"
    "$VPY" -m pip install --quiet --disable-pip-version-check "xllamacpp==$XLLAMACPP_VERSION"
fi

cargo build --release
BIN=target/release/tensorfold

# Without --model the binary fetches the default model into the cache.
env -u TF_MODEL "$BIN" bench --threads "$THREADS" --prompt-tokens 1 --decode-tokens 1 --repeats 1 >/dev/null
MODEL="$CACHE/$MODEL_FILE"
[[ -f "$MODEL" ]] || { echo "bench: $MODEL not found after the fetch" >&2; exit 1; }

sizes=(--threads "$THREADS" --prompt-tokens "$PROMPT_TOKENS" --decode-tokens "$DECODE_TOKENS" --repeats "$REPEATS")
ours=()
peer=()
for round in $(seq 1 "$ROUNDS"); do
    line="$(TF_LOG=warn "$BIN" bench --model "$MODEL" "${sizes[@]}")"
    echo "round $round tensorfold: $line"
    ours+=("$line")
    line="$("$VPY" tools/bench_llamacpp.py --model "$MODEL" "${sizes[@]}")"
    echo "round $round llama.cpp:  $line"
    peer+=("$line")
done

"$VPY" - "$MODEL" "$XLLAMACPP_VERSION" "${#ours[@]}" "${ours[@]}" "${peer[@]}" <<'EOF'
import json, sys

model, version, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ours = [json.loads(s) for s in sys.argv[4 : 4 + n]]
peer = [json.loads(s) for s in sys.argv[4 + n :]]


def best(runs):
    out = dict(runs[0])
    for key in ("prompt_tok_s", "decode_tok_s"):
        out[key] = max(r[key] for r in runs)
    return out


o, p = best(ours), best(peer)
print(f"\nmodel: {model}")
print(f"threads: {o['threads']} (ours) / {p['threads']} (llama.cpp, xllamacpp {version})")
print(f"{'':10} {'tensorfold':>12} {'llama.cpp':>12} {'ratio':>7} {'target':>7}")
for label, key, target in (("prompt", "prompt_tok_s", 0.8), ("decode", "decode_tok_s", 1.0)):
    ratio = o[key] / p[key]
    mark = "ok" if ratio >= target else "below"
    print(f"{label + ' tok/s':10} {o[key]:12.2f} {p[key]:12.2f} {ratio:7.2f} {'>= ' + str(target):>7} {mark}")
print(f"(prompt {o['prompt_tokens']} / {p['prompt_tokens']} tokens, decode {o['decode_tokens']} / {p['decode_tokens']} tokens)")
EOF

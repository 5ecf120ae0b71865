#!/usr/bin/env bash
# Server benchmark on the CPU: `tensorfold serve` against llama.cpp's server (the xllamacpp wheel, through
# tools/llamacpp_server.py) on the same GGUF with the same threads, PARALLEL slots each and continuous batching.
# The servers run one at a time; tools/bench_openai.py runs against each: STREAMS concurrent greedy streams of
# MAX_TOKENS tokens, each count with a system text of PREFIX_WORDS words per stream and then one all streams
# share, and the time to first token of a short prompt sent once and then REPEAT_TTFT times again. Prints both
# sides and the ratios ours/llama.cpp (above 1 is better for tok/s, below 1 for TTFT).
#
# Usage: tools/bench_server_cpu.sh [THREADS=2]
# Environment: STREAMS (1,8,32), MAX_TOKENS (128), PARALLEL (32), SLOT_CONTEXT (1024, positions per request),
#   PREFIX_WORDS (300), REPEAT_TTFT (5), SEED (17, of the texts), ROUNDS (1; alternating rounds, the best of each
#   side is compared), LOAD_TIMEOUT (300 s), BENCH_MODEL (a GGUF to serve instead of the default model),
#   TF_CACHE_DIR / XDG_CACHE_HOME (where the model and the bench venv live), PYTHON (python3),
#   TF_BIN (a tensorfold binary to measure; default: build this checkout), SKIP (tensorfold or llamacpp: run one side).
set -euo pipefail

THREADS="${1:-2}"
STREAMS="${STREAMS:-1,8,32}"
MAX_TOKENS="${MAX_TOKENS:-128}"
PARALLEL="${PARALLEL:-32}"
SLOT_CONTEXT="${SLOT_CONTEXT:-1024}"
PREFIX_WORDS="${PREFIX_WORDS:-300}"
REPEAT_TTFT="${REPEAT_TTFT:-5}"
SEED="${SEED:-17}"
ROUNDS="${ROUNDS:-1}"
LOAD_TIMEOUT="${LOAD_TIMEOUT:-300}"
SKIP="${SKIP:-}"

cd "$(dirname "$0")/.."
source tools/bench_env.sh

bench_xllamacpp
if [[ "$SKIP" == tensorfold ]]; then
    BIN=""
    [[ -n "${BENCH_MODEL:-}" ]] || { echo "bench: SKIP=tensorfold needs BENCH_MODEL" >&2; exit 1; }
    MODEL="$BENCH_MODEL"
else
    if [[ -n "${TF_BIN:-}" ]]; then
        BIN="$TF_BIN"
    else
        cargo build --release
        BIN=target/release/tensorfold
    fi
    bench_model "$BIN"
fi

WORK="$(mktemp -d)"
SERVER_PID=""
CLIENT_PID=""
URL=""

stop_server() {
    [[ -n "$SERVER_PID" ]] || return 0
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 300); do
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "bench: the server did not stop within 30 s of SIGTERM; killing it" >&2
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
}
stop_client() {
    [[ -n "$CLIENT_PID" ]] || return 0
    kill -TERM "$CLIENT_PID" 2>/dev/null || true
    wait "$CLIENT_PID" 2>/dev/null || true
    CLIENT_PID=""
}
trap 'stop_client; stop_server; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

# Starts a server (the command after the name), which prints `listening on http://ADDR` on stderr; sets URL
# once /health answers 200.
start_server() {
    local name="$1" log="$WORK/$1.log" deadline=$((SECONDS + LOAD_TIMEOUT))
    shift
    "$@" >/dev/null 2>"$log" &
    SERVER_PID=$!
    URL=""
    until [[ -n "$URL" ]]; do
        URL="$(grep -m1 -o 'listening on http://[^[:space:]]*' "$log" | cut -d' ' -f3 || true)"
        if ! kill -0 "$SERVER_PID" 2>/dev/null || ((SECONDS > deadline)); then
            echo "bench: $name did not start; the end of its log:" >&2
            tail -20 "$log" >&2
            exit 1
        fi
        sleep 0.1
    done
    until "$VPY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/health', timeout=5)" "$URL" \
        2>/dev/null; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null || ((SECONDS > deadline)); then
            echo "bench: $name did not become healthy; the end of its log:" >&2
            tail -20 "$log" >&2
            exit 1
        fi
        sleep 0.2
    done
}

run_side() {
    local name="$1" round="$2"
    shift 2
    start_server "$name" "$@"
    # In the background, so that a signal reaches the traps while the client runs.
    "$VPY" tools/bench_openai.py --base-url "$URL/v1" --streams "$STREAMS" --max-tokens "$MAX_TOKENS" \
        --temperature 0 --prefix-words "$PREFIX_WORDS" --repeat-ttft "$REPEAT_TTFT" --seed "$SEED" --warmup --json \
        >"$WORK/$name.$round.json" &
    CLIENT_PID=$!
    wait "$CLIENT_PID"
    CLIENT_PID=""
    stop_server
    echo "round $round $name: done" >&2
}

for round in $(seq "$ROUNDS"); do
    if [[ "$SKIP" != tensorfold ]]; then
        TF_LOG=warn run_side tensorfold "$round" "$BIN" serve --host 127.0.0.1 --port 0 --model "$MODEL" \
            --threads "$THREADS" --parallel "$PARALLEL" --context "$SLOT_CONTEXT" --no-voice
    fi
    if [[ "$SKIP" != llamacpp ]]; then
        run_side llamacpp "$round" "$VPY" tools/llamacpp_server.py --model "$MODEL" --threads "$THREADS" \
            --parallel "$PARALLEL" --slot-context "$SLOT_CONTEXT"
    fi
done

"$VPY" - "$WORK" "$MODEL" "$THREADS" "$PARALLEL" "$XLLAMACPP_VERSION" <<'PY'
import glob, json, math, os, sys

work, model, threads, parallel, version = sys.argv[1:6]
sides = {}
for side in ("tensorfold", "llamacpp"):
    reports = [json.load(open(path)) for path in sorted(glob.glob(os.path.join(work, f"{side}.*.json")))]
    if reports:
        sides[side] = reports

# The best of the rounds: the most tok/s, the least TTFT.
BETTER = {"total_output_tok_s": max, "decode_tok_s_per_stream_mean": max, "ttft_p50_s": min, "ttft_p95_s": min,
          "output_tokens": max, "ttft_first_s": min, "ttft_repeat_p50_s": min}


def best_rows(reports):
    rows = {}
    for report in reports:
        for row in report["results"]:
            key = (row["streams"], row["prefix"])
            rows[key] = {k: BETTER[k](rows[key][k], v) if key in rows and k in BETTER else v for k, v in row.items()}
    return rows


def best_repeat(reports):
    repeats = [r["repeat_ttft"] for r in reports if "repeat_ttft" in r]
    return {k: BETTER[k](r[k] for r in repeats) for k in ("ttft_first_s", "ttft_repeat_p50_s")} if repeats else None


rows = {side: best_rows(reports) for side, reports in sides.items()}
repeat = {side: best_repeat(reports) for side, reports in sides.items()}
names = {"tensorfold": "tensorfold", "llamacpp": "llama.cpp"}
first = next(iter(sides.values()))[0]
print(f"\nmodel: {model}")
print(f"threads {threads}, {parallel} slots each, llama.cpp from xllamacpp {version}; greedy, max_tokens"
      f" {first['results'][0]['max_tokens']}, system texts of {first['prefix_words']} words")


def fmt(value, width, digits):
    return f"{value:{width}.{digits}f}" if value is not None and not math.isnan(value) else f"{'-':>{width}}"


def cells(values, key, width, digits):
    ours, theirs = (values.get(side, {}).get(key) for side in ("tensorfold", "llamacpp"))
    ratio = ours / theirs if ours is not None and theirs else None
    return f"{fmt(ours, width, digits)} {fmt(theirs, width, digits)} {fmt(ratio, 6, 2)}"


header = f"{'tensorfold':>10} {'llama.cpp':>10} {'ratio':>6}"
print(f"\n{'':14} | {'total tok/s':^28} | {'decode tok/s per stream':^28} | {'TTFT p50 s':^28} | tokens/stream")
print(f"{'streams prefix':14} | {header} | {header} | {header} | ours / llama.cpp")
keys = sorted({key for side_rows in rows.values() for key in side_rows})
for key in keys:
    values = {side: side_rows[key] for side, side_rows in rows.items() if key in side_rows}
    per_stream = " / ".join(f"{values[s]['output_tokens'] / key[0]:.0f}" if s in values else "-"
                            for s in ("tensorfold", "llamacpp"))
    print(f"{key[0]:>7} {key[1]:>6} | {cells(values, 'total_output_tok_s', 10, 1)}"
          f" | {cells(values, 'decode_tok_s_per_stream_mean', 10, 1)}"
          f" | {cells(values, 'ttft_p50_s', 10, 3)} | {per_stream}")
if any(repeat.values()):
    values = {side: r for side, r in repeat.items() if r}
    print(f"\nrepeated prompt, 1 stream   | {header}")
    print(f"{'TTFT first send s':27} | {cells(values, 'ttft_first_s', 10, 3)}")
    print(f"{'TTFT repeat p50 s':27} | {cells(values, 'ttft_repeat_p50_s', 10, 3)}")
print("(ratio: ours / llama.cpp; above 1 is better for tok/s, below 1 for TTFT)")
PY

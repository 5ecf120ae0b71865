#!/usr/bin/env bash
# Drama speech on the GPU at Orpheus 3B's size: makes tools/make_drama.py's orpheus-3b checkpoint on local disk,
# then tools/bench_speech.py against `serve --device cuda --model DIR --speech-model DIR` (text lanes on the same
# model): one stream for time to first audio, the stream counts, and the largest count alone and beside text streams.
# Results land in $OUT: speech.jsonl (bench_speech's JSON lines), speech.txt (its tables and the steps), gpu.txt, and
# all.tgz (those, the checkpoint log and each server's stderr).
#
# Usage (after `bash tools/device_build.sh` here, with .device carried): bash tools/gpu_speech.sh
# Every stream asks for MAX_TOKENS language-model tokens and gets them all (the checkpoint never ends its speech):
# 253 = 7 * 36 + 1 gives 36 frames, 36 * 2048 / 24000 = 3.072 s of audio. Overrides, by environment:
#     STREAMS=64,128,256,320   the counts; the last (the largest) runs alone and beside TEXT_STREAMS text streams
#     MAX_TOKENS=253           TEXT_STREAMS=32   TEXT_MAX_TOKENS=64   REPEAT=1 (rounds per count)
#     PARALLEL                 lanes (default: the largest count + TEXT_STREAMS)
#     CONTEXT=512              positions per lane: the prompt (about 40) and MAX_TOKENS must fit
#     ROUND_TOKENS=2048        tokens per round, so the prompts of hundreds of streams prefill in a few rounds
#     CKPT=/tmp/tensorfold-bench/orpheus-3b   SEED=0   SERVE_ARGS (more serve words)
#     TF_BIN=.device/tensorfold   DEVICE=cuda (TF_BIN=target/release/tensorfold DEVICE=cpu tries the script on a CPU)
#     SECONDS_TTFA=60   SECONDS_COUNTS=180   SECONDS_TEXT=120   each step's bound (the checkpoint's is 150)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu-speech-out}"
export TF_CACHE_DIR="${TF_CACHE_DIR:-/tmp/tfc}"
export PYTHONUNBUFFERED=1
STREAMS="${STREAMS:-64,128,256,320}"
MAX_TOKENS="${MAX_TOKENS:-253}"
TEXT_STREAMS="${TEXT_STREAMS:-32}"
TEXT_MAX_TOKENS="${TEXT_MAX_TOKENS:-64}"
REPEAT="${REPEAT:-1}"
LARGEST="${STREAMS##*,}"
PARALLEL="${PARALLEL:-$(( $(tr ',' '\n' <<< "$STREAMS" | sort -n | tail -1) + TEXT_STREAMS ))}"
CONTEXT="${CONTEXT:-512}"
ROUND_TOKENS="${ROUND_TOKENS:-2048}"
CKPT="${CKPT:-${TMPDIR:-/tmp}/tensorfold-bench/orpheus-3b}"
SEED="${SEED:-0}"
TF_BIN="${TF_BIN:-.device/tensorfold}"
DEVICE="${DEVICE:-cuda}"
LOGS="$OUT/logs"
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 ))"; }
mkdir -p "$OUT" "$LOGS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
note() { echo "== $* at $(elapsed) s" | tee -a "$OUT/speech.txt"; }

if [[ ! -f "$CKPT/model.safetensors" ]]; then
    note "make_drama.py --shape orpheus-3b --seed $SEED"
    timeout 150 python3 tools/make_drama.py --shape orpheus-3b --out "$CKPT" --seed "$SEED" > "$LOGS/checkpoint.log" 2>&1 ||
        { tail -5 "$LOGS/checkpoint.log" | tee -a "$OUT/speech.txt"; exit 1; }
    tail -2 "$LOGS/checkpoint.log" | tee -a "$OUT/speech.txt"
fi

# bench NAME SECONDS ARGS...: one bench_speech.py run with its own server, bounded by SECONDS.
bench() {
    local name="$1" seconds="$2"
    shift 2
    note "bench_speech.py $name ($*), at most $seconds s"
    # A session of its own, so that whatever the step leaves running (its server) is stopped by the group's id.
    setsid timeout -k 20 "$seconds" python3 tools/bench_speech.py --binary "$TF_BIN" --device "$DEVICE" \
        --model "$CKPT" --speech-model "$CKPT" --parallel "$PARALLEL" --voice tara --max-tokens "$MAX_TOKENS" \
        --serve-arg="--no-voice --context $CONTEXT --round-tokens $ROUND_TOKENS ${SERVE_ARGS:-}" \
        --server-log "$LOGS/serve-$name.log" "$@" > "$LOGS/$name.jsonl" 2> "$LOGS/$name.txt" &
    local pid=$!
    wait "$pid"
    echo "exit $? after $(elapsed) s" >> "$LOGS/$name.txt"
    kill -KILL -- "-$pid" 2> /dev/null
    cat "$LOGS/$name.jsonl" >> "$OUT/speech.jsonl"
    tee -a "$OUT/speech.txt" < "$LOGS/$name.txt"
}

bench ttfa "${SECONDS_TTFA:-60}" --streams 1 --repeat 3
OTHERS="${STREAMS%"$LARGEST"}"
[[ -n "${OTHERS%,}" ]] && bench counts "${SECONDS_COUNTS:-180}" --streams "${OTHERS%,}" --repeat "$REPEAT"
bench text "${SECONDS_TEXT:-120}" --streams "$LARGEST" --repeat "$REPEAT" --text-streams "$TEXT_STREAMS" --text-max-tokens "$TEXT_MAX_TOKENS"
note "done"
tar czf "${TMPDIR:-/tmp}/gpu-speech.tgz" -C "$OUT" . && mv "${TMPDIR:-/tmp}/gpu-speech.tgz" "$OUT/all.tgz"
rm -rf "$LOGS"

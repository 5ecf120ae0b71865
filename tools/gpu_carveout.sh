#!/usr/bin/env bash
# The carveout on the GPU in one command: `tensorfold lend --device cuda` lends GPU memory to `serve --device cuda`
# in another process. Three servers in turn on one checkpoint: off (no carveout), on (the ordinary KV room and the
# lent pages), and lent-first (on, with LENT_OWN_PAGES pages of its own, so the streams' KV lives in lent memory).
# Each gives its KV pages and tokens and the carveout line from its log, and tools/bench_openai.py's decode tok/s.
# After each server stops, the daemon must have every slice back. A second daemon, with a pool twice the GPU,
# must refuse an ask of all of it (cuMemCreate fails) and still lend 2 MiB. Then, where they were built, the
# device pool's own tests and the CUDA runtime tests whose names contain `lent`.
# Results land in $OUT: carveout.txt (the table, every step and every failure), gpu.txt, all.tgz (the logs).
#
# Usage (after `bash tools/device_build.sh` here, with .device carried): bash tools/gpu_carveout.sh
# Overrides, by environment:
#     POOL_MIB=4096    the daemon's pool        ASK_MIB=$POOL_MIB   what each server asks for (TF_CARVEOUT_MIB)
#     STREAMS=1,32     MAX_TOKENS=128           PARALLEL=32 (lanes)  LENT_OWN_PAGES=1
#     CKPT             default: tools/make_checkpoint.py's llama-3.1-8b (LAYERS=N keeps its first N layers),
#                      made under ${TMPDIR:-/tmp}/tensorfold-bench when missing
#     TF_BIN=.device/tensorfold   SERVE_ARGS (more serve words)
#     SECONDS_LOAD=240 (a server's start)  SECONDS_BENCH=120 (a server's bench)  SECONDS_CHECKPOINT=200
#     DEVICE=cuda (TF_BIN=target/release/tensorfold DEVICE=cpu CKPT=MODEL tries the script on a CPU, host memory lent)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu-carveout-out}"
export TF_CACHE_DIR="${TF_CACHE_DIR:-/tmp/tfc}"
export PYTHONUNBUFFERED=1
POOL_MIB="${POOL_MIB:-4096}"
ASK_MIB="${ASK_MIB:-$POOL_MIB}"
STREAMS="${STREAMS:-1,32}"
MAX_TOKENS="${MAX_TOKENS:-128}"
PARALLEL="${PARALLEL:-32}"
LENT_OWN_PAGES="${LENT_OWN_PAGES:-1}"
LAYERS="${LAYERS:-}"
CKPT="${CKPT:-${TMPDIR:-/tmp}/tensorfold-bench/llama-3.1-8b${LAYERS:+-l$LAYERS}}"
TF_BIN="${TF_BIN:-.device/tensorfold}"
DEVICE="${DEVICE:-cuda}"
SECONDS_LOAD="${SECONDS_LOAD:-240}"
SECONDS_BENCH="${SECONDS_BENCH:-120}"
POOL_SLICES=$(( (POOL_MIB + 1) / 2 ))
LOGS="$OUT/logs"
REPORT="$OUT/carveout.txt"
T0=$(date +%s)
elapsed() { echo "$(( $(date +%s) - T0 ))"; }
mkdir -p "$OUT" "$LOGS"
: > "$REPORT"
note() { echo "== $* at $(elapsed) s" | tee -a "$REPORT"; }
FAILED=0
fail() { FAILED=1; echo "FAILED: $*" | tee -a "$REPORT"; }
# plain FILE: the log without terminal colours.
plain() { sed 's/\x1b\[[0-9;]*m//g' "$1" 2> /dev/null; }
# has FILE PATTERN: whether the plain log has a line matching PATTERN (ERE); grep reads it all, so no broken pipe.
has() { plain "$1" | grep -E -- "$2" > /dev/null; }

# The key and the sockets live in a folder of this run's own; every process group started here is stopped at exit.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tf-carveout.XXXXXX")
GROUPS_STARTED=()
cleanup() {
    for pgid in ${GROUPS_STARTED[@]+"${GROUPS_STARTED[@]}"}; do
        kill -TERM -- "-$pgid" 2> /dev/null
    done
    sleep 1
    for pgid in ${GROUPS_STARTED[@]+"${GROUPS_STARTED[@]}"}; do
        kill -KILL -- "-$pgid" 2> /dev/null
    done
    rm -rf "$WORK"
    [[ $FAILED == 0 ]] && echo "all steps passed" >> "$REPORT" || echo "some steps FAILED (see above)" >> "$REPORT"
    tar czf "${TMPDIR:-/tmp}/gpu-carveout.tgz" -C "$OUT" logs && mv "${TMPDIR:-/tmp}/gpu-carveout.tgz" "$OUT/all.tgz"
    rm -rf "$LOGS"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
head -c 32 /dev/urandom | base64 | tr -d '/+=\n' > "$WORK/lend.key"
echo >> "$WORK/lend.key"
chmod 600 "$WORK/lend.key"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt" 2>&1
GPU_MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2> /dev/null | head -1 | tr -dc 0-9)

if [[ ! -f "$CKPT/config.json" && ! -f "$CKPT" ]]; then
    note "make_checkpoint.py --shape llama-3.1-8b ${LAYERS:+--layers $LAYERS}"
    timeout "${SECONDS_CHECKPOINT:-200}" python3 tools/make_checkpoint.py --shape llama-3.1-8b \
        ${LAYERS:+--layers "$LAYERS"} --out "$CKPT" > "$LOGS/checkpoint.log" 2>&1 ||
        { fail "making the checkpoint: $(tail -1 "$LOGS/checkpoint.log")"; exit 1; }
fi

# start_group LOG COMMAND...: runs COMMAND in a session of its own, stderr and stdout to LOG; sets PGID.
start_group() {
    local log="$1"
    shift
    setsid "$@" > "$log" 2>&1 &
    PGID=$!
    GROUPS_STARTED+=("$PGID")
}

# stop_group PGID: asks the group to stop, then kills what is left after 15 s.
stop_group() {
    kill -TERM -- "-$1" 2> /dev/null
    for _ in $(seq 30); do
        kill -0 -- "-$1" 2> /dev/null || return 0
        sleep 0.5
    done
    kill -KILL -- "-$1" 2> /dev/null
}

# wait_line LOG PID SECONDS PATTERN: waits until LOG has a line matching PATTERN (ERE) while PID lives.
wait_line() {
    local log="$1" pid="$2" deadline=$(( $(date +%s) + $3 )) pattern="$4"
    while (( $(date +%s) < deadline )); do
        has "$log" "$pattern" && return 0
        kill -0 "$pid" 2> /dev/null || { has "$log" "$pattern"; return; }
        sleep 0.5
    done
    return 1
}

# start_daemon NAME POOL_MIB: `tensorfold lend --device DEVICE` on $WORK/NAME.sock; sets DAEMON_PID, or fails.
start_daemon() {
    local name="$1" log="$LOGS/$1.log"
    note "tensorfold lend --device $DEVICE --pool-mib $2 ($name)"
    start_group "$log" timeout -k 5 1800 env -u TF_CARVEOUT_KEY TF_LOG=info TF_CARVEOUT_SOCKET="$WORK/$name.sock" \
        TF_CARVEOUT_KEY_FILE="$WORK/lend.key" "$TF_BIN" lend --device "$DEVICE" --pool-mib "$2"
    DAEMON_PID=$PGID
    if wait_line "$log" "$DAEMON_PID" 60 " lending .* slices of "; then
        plain "$log" | grep -m1 " lending .* slices of " | sed 's/^.* lending /lending /' | tee -a "$REPORT"
        return 0
    fi
    fail "$name did not start: $(plain "$log" | tail -1)"
    return 1
}

# daemon_whole LOG: waits until the daemon's last loan line says every slice of POOL_SLICES is free.
daemon_whole() {
    local log="$1" last=""
    for _ in $(seq 40); do
        last=$(plain "$log" | grep -E " (lent|took back) " | tail -1 | grep -oE "free_slices=[0-9]+")
        [[ -z "$last" || "$last" == "free_slices=$POOL_SLICES" ]] && break
        sleep 0.5
    done
    local lent back
    lent=$(plain "$log" | grep -cE " lent ")
    back=$(plain "$log" | grep -cE " took back ")
    echo "daemon: $lent loans, $back taken back, ${last:-free_slices=$POOL_SLICES (nothing lent)} of $POOL_SLICES" |
        tee -a "$REPORT"
    [[ "$lent" == "$back" && ( -z "$last" || "$last" == "free_slices=$POOL_SLICES" ) ]] ||
        fail "the daemon's pool is not whole after the server stopped"
}

# run NAME CARVEOUT(0|1) [SERVE WORDS...]: one server, its log lines and its bench, then stopped.
run() {
    local name="$1" carveout="$2" log="$LOGS/serve-$1.log"
    shift 2
    note "serve $name (TF_CARVEOUT=$carveout${*:+ $*})"
    local env=(env -u TF_CARVEOUT_KEY TF_CARVEOUT="$carveout" TF_LOG=info)
    [[ $carveout == 1 ]] && env+=(TF_CARVEOUT_MIB="$ASK_MIB" TF_CARVEOUT_SOCKET="$WORK/lend.sock"
        TF_CARVEOUT_KEY_FILE="$WORK/lend.key")
    # shellcheck disable=SC2086
    start_group "$log" timeout -k 10 $(( SECONDS_LOAD + SECONDS_BENCH + 30 )) "${env[@]}" "$TF_BIN" serve \
        --device "$DEVICE" --model "$CKPT" --no-voice --host 127.0.0.1 --port 0 --parallel "$PARALLEL" "$@" \
        ${SERVE_ARGS:-}
    local server=$PGID status=0
    if ! wait_line "$log" "$server" "$SECONDS_LOAD" "every model is loaded; serving"; then
        fail "serve $name did not start: $(plain "$log" | tail -1)"
        status=1
    else
        plain "$log" | grep -E "carveout|memory model=" | sed 's/^.*\(INFO\|WARN\) //' | tee -a "$REPORT"
        if [[ $carveout == 1 ]] && ! has "$log" "carveout: KV pages in lent memory"; then
            fail "serve $name has no KV pages in lent memory"
            status=1
        else
            local url
            url=$(plain "$log" | grep -m1 "^listening on http://" | awk '{print $NF}')
            timeout "$SECONDS_BENCH" python3 tools/bench_openai.py --base-url "$url/v1" --streams "$STREAMS" \
                --max-tokens "$MAX_TOKENS" --json > "$LOGS/bench-$name.json" 2> "$LOGS/bench-$name.err" ||
                fail "bench on serve $name: $(tail -1 "$LOGS/bench-$name.err")"
        fi
    fi
    stop_group "$server"
    [[ $carveout == 1 ]] && daemon_whole "$LOGS/lend.log"
    return $status
}

run off 0
if start_daemon lend "$POOL_MIB"; then
    # Without lent pages, a server of LENT_OWN_PAGES pages could not hold the streams.
    run on 1 && run lent-first 1 --kv-pages "$LENT_OWN_PAGES"
    stop_group "$DAEMON_PID"
fi

# claim SOCKET MIB: one claim from python, as the protocol says; prints the reply and what the descriptor is.
claim() {
    timeout 60 python3 - "$1" "$WORK/lend.key" "$2" << 'EOF'
import os, socket, stat, struct, sys
path, key_path, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
key = open(key_path, "rb").readline().rstrip(b"\r\n")
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
sock.settimeout(50)
sock.connect(path)
sock.send(b"TFLD" + struct.pack("<BBHQ", 1, 1, len(key), mib << 20) + key)
reply, fds, _, _ = socket.recv_fds(sock, 16, 4)
ok, reason, size = reply[6], reply[7], struct.unpack("<Q", reply[8:16])[0]
print(f"claim of {mib} MiB: ok={ok} reason={reason} size={size} descriptors={len(fds)}")
for fd in fds:
    mode = os.fstat(fd).st_mode
    try:
        length = os.lseek(fd, 0, os.SEEK_END)
    except OSError as e:
        length = f"not seekable ({e.strerror})"
    print(f"  descriptor: regular file {stat.S_ISREG(mode)}, char device {stat.S_ISCHR(mode)}, length {length}")
    os.close(fd)
sock.close()
EOF
}

if [[ $DEVICE == cuda && -n "$GPU_MIB" ]] && start_daemon big $(( GPU_MIB * 2 )); then
    note "an ask of twice the GPU ($(( GPU_MIB * 2 )) MiB), then 2 MiB"
    answer=$(claim "$WORK/big.sock" $(( GPU_MIB * 2 )) 2>&1)
    echo "$answer" >> "$REPORT"
    [[ "$answer" == *"ok=0 reason=2 size=0"* ]] || fail "an ask larger than the GPU was not refused"
    plain "$LOGS/big.log" | grep "refused a claim" | head -1 | sed 's/^.*refused/refused/' >> "$REPORT"
    answer=$(claim "$WORK/big.sock" 2 2>&1)
    echo "$answer" >> "$REPORT"
    [[ "$answer" == *"ok=1 reason=0 size=2097152 descriptors=1"* ]] ||
        fail "the daemon did not lend 2 MiB after refusing an ask larger than the GPU"
    kill -0 "$DAEMON_PID" 2> /dev/null || fail "the daemon stopped after an ask larger than the GPU"
    stop_group "$DAEMON_PID"
fi

note "table"
python3 - "$LOGS" "$STREAMS" >> "$REPORT" 2>&1 << 'EOF' || fail "the table"
import json, pathlib, re, sys
logs, counts = pathlib.Path(sys.argv[1]), [int(c) for c in sys.argv[2].split(",")]
head = ["run", "kv_pages", "kv_lent_pages", "kv_tokens", "kv_tokens_gained"]
head += [f"decode tok/s/stream @{n}" for n in counts] + [f"total tok/s @{n}" for n in counts]
print(" | ".join(head))
for name in ["off", "on", "lent-first"]:
    log = logs / f"serve-{name}.log"
    if not log.exists():
        continue
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    field = lambda key: (re.findall(rf"\b{key}=(\d+)", text) or ["-"])[0]
    cells = [name, field("kv_pages"), field("kv_lent_pages"), field("kv_tokens"), field("kv_tokens_gained")]
    try:
        rows = {r["streams"]: r for r in json.loads((logs / f"bench-{name}.json").read_text())["results"]}
    except (OSError, ValueError, KeyError):
        rows = {}
    cells += [f"{rows[n]['decode_tok_s_per_stream_mean']:.1f}" if n in rows else "-" for n in counts]
    cells += [f"{rows[n]['total_output_tok_s']:.1f}" if n in rows else "-" for n in counts]
    print(" | ".join(cells))
EOF

# tests FILE FILTER: a prebuilt test binary's tests whose names contain FILTER, their result lines appended.
tests() {
    [[ -x "$1" ]] || { echo "($1 not built: skipped)" | tee -a "$REPORT"; return; }
    note "$1 $2"
    timeout 300 "$1" "$2" --test-threads 1 > "$LOGS/$(basename "$1").txt" 2>&1 || fail "$1 $2"
    grep -E "^test |test result|skipped|panicked" "$LOGS/$(basename "$1").txt" | tee -a "$REPORT"
}
tests .device/lib-tests lend_pool
tests .device/cuda-runtime-tests lent
note "done"
exit "$FAILED"

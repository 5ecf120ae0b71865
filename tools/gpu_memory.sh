#!/usr/bin/env bash
# Memory pressure on the GPU: the engine's round on a full GPU (tests/cuda_memory.rs), the CUDA tests, a cap too
# small for the model, and a server whose GPU another process fills while streams of new widths arrive.
#
# Usage (after building .device here: the release binary as .device/tensorfold, tests/cuda.rs as
# .device/cuda-tests, tests/cuda_memory.rs as .device/cuda-memory-tests; .device carried):
#     bash tools/gpu_memory.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./gpu-memory-out}"
export TF_CACHE_DIR="${TF_CACHE_DIR:-/tmp/tfc}"
CKPT="${TMPDIR:-/tmp}/tensorfold-memory/llama-2-layers"
PORT=18400
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$OUT/gpu.txt"
echo "== the engine's round on a full GPU"
timeout 120 .device/cuda-memory-tests --test-threads 1 --nocapture 2>&1 | grep -vE "^\s*$" | tee "$OUT/cuda-memory.txt"
echo "== CUDA tests"
timeout 300 .device/cuda-tests --test-threads 1 2>&1 | grep -E "^test |test result|skipped|panicked" |
    tee "$OUT/cuda-tests.txt"
[[ -f "$CKPT/config.json" ]] || timeout 200 python3 tools/make_checkpoint.py --shape llama-3.1-8b --layers 2 \
    --out "$CKPT" --init-device cuda > "$OUT/checkpoint.log" 2>&1
echo "== a cap too small for the weights"
timeout 60 .device/tensorfold serve --device cuda --model "$CKPT" --port "$PORT" --no-voice \
    --memory-limit 1000000000 > "$OUT/small-cap.log" 2>&1
echo "exit status $?" | tee -a "$OUT/small-cap.log"
tail -3 "$OUT/small-cap.log"
echo "== a server whose GPU another process fills"
.device/tensorfold serve --device cuda --model "$CKPT" --port "$PORT" --parallel 64 --no-voice 2> "$OUT/serve.log" &
SERVER=$!
for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
    sleep 0.2
done
timeout 240 python3 - "$PORT" <<'EOF' 2>&1 | tee "$OUT/full-gpu.txt"
import collections, json, sys, threading, urllib.error, urllib.request
import torch

url = f"http://127.0.0.1:{sys.argv[1]}/v1/completions"

def one(results, i):
    body = json.dumps({"prompt": f"Count to {i}:", "max_tokens": 8, "temperature": 0}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            results.append((r.status, None))
    except urllib.error.HTTPError as e:
        results.append((e.code, (e.headers.get("Retry-After"), json.loads(e.read())["error"]["code"])))
    except Exception as e:
        results.append(("no reply", repr(e)))

def wave(width):
    results = []
    threads = [threading.Thread(target=one, args=(results, i)) for i in range(width)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    return results

print("before the fill, 1 stream:", wave(1))
held, block = [], 8 << 30
while block >= 1 << 20:
    try:
        held.append(torch.empty(block, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        block //= 2
free, total = torch.cuda.mem_get_info()
print(f"filled: {sum(t.numel() for t in held) / 2**30:.1f} GiB taken, {free / 2**20:.0f} MiB left of {total / 2**30:.0f} GiB")
for width in (3, 5, 9, 17, 33, 47):
    counts = collections.Counter(json.dumps(r) for r in wave(width))
    print(f"{width} streams at once on the full GPU:", dict(counts))
del held
torch.cuda.empty_cache()
print("after the fill, 23 streams:", dict(collections.Counter(json.dumps(r) for r in wave(23))))
EOF
curl -s "http://127.0.0.1:$PORT/health" | tee -a "$OUT/full-gpu.txt"; echo
kill "$SERVER"; wait "$SERVER" 2> /dev/null
grep -iE "panick|error" "$OUT/serve.log" | head -5
echo "== done"

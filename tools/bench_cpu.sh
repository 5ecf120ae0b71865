#!/usr/bin/env bash
# CPU benchmark: `tensorfold bench` against llama.cpp (the xllamacpp wheel) on the same GGUF file
# with the same thread count, run alternately; prints both sides and the ratios ours/llama.cpp.
#
# Usage: tools/bench_cpu.sh [THREADS=2]
# Environment: ROUNDS (alternating rounds, default 3; the best of each side is compared),
#   PROMPT_TOKENS (512), DECODE_TOKENS (128), REPEATS (3, per side per round),
#   IDLE_WAIT (seconds to wait, before each run, for the CPUs to be idle; default 0: no wait),
#   TF_CACHE_DIR / XDG_CACHE_HOME (where the model and the bench venv live), PYTHON (python3),
#   TF_BIN (a tensorfold binary to measure; default: build this checkout).
set -euo pipefail

THREADS="${1:-2}"
ROUNDS="${ROUNDS:-3}"
PROMPT_TOKENS="${PROMPT_TOKENS:-512}"
DECODE_TOKENS="${DECODE_TOKENS:-128}"
REPEATS="${REPEATS:-3}"
IDLE_WAIT="${IDLE_WAIT:-0}"
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

# TF_BIN names a binary to measure instead of this checkout's release build (a before/after pair in one session).
if [[ -n "${TF_BIN:-}" ]]; then
    BIN="$TF_BIN"
else
    cargo build --release
    BIN=target/release/tensorfold
fi

# Without --model the binary fetches the default model into the cache.
env -u TF_MODEL "$BIN" bench --threads "$THREADS" --prompt-tokens 1 --decode-tokens 1 --repeats 1 >/dev/null
MODEL="$CACHE/$MODEL_FILE"
[[ -f "$MODEL" ]] || { echo "bench: $MODEL not found after the fetch" >&2; exit 1; }

# The rounds alternate the two sides; each run reports the share of the CPUs that other processes
# used while it ran, so a figure taken on a busy machine shows as such.
"$VPY" - "$BIN" "$MODEL" "$XLLAMACPP_VERSION" "$ROUNDS" "$IDLE_WAIT" \
    --threads "$THREADS" --prompt-tokens "$PROMPT_TOKENS" --decode-tokens "$DECODE_TOKENS" --repeats "$REPEATS" <<'PY'
import json, os, resource, subprocess, sys, time

bin_path, model, version, rounds, idle_wait = sys.argv[1:6]
sizes = sys.argv[6:]
sides = {
    "tensorfold": [bin_path, "bench", "--model", model, *sizes],
    "llama.cpp": [sys.executable, "tools/bench_llamacpp.py", "--model", model, *sizes],
}


def cpu_jiffies():
    """(busy, total) jiffies over all CPUs, or None where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except OSError:
        return None
    return sum(fields) - fields[3] - fields[4], sum(fields)


def wait_for_idle(limit_s):
    """Waits (at most limit_s) until the CPUs were at least 90% idle for two 5 s windows in a row."""
    deadline, quiet = time.monotonic() + limit_s, 0
    while quiet < 2 and time.monotonic() < deadline:
        before = cpu_jiffies()
        if before is None:
            return
        time.sleep(5)
        after = cpu_jiffies()
        quiet = quiet + 1 if after[0] - before[0] <= 0.1 * (after[1] - before[1]) else 0


def run(cmd):
    """Runs one side; returns its JSON line and the CPU share other processes used meanwhile."""
    if float(idle_wait) > 0:
        wait_for_idle(float(idle_wait))
    usage, jiffies, started = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_jiffies(), time.monotonic()
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=dict(os.environ, TF_LOG="warn"))
    wall, after = time.monotonic() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    own = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
    others = None
    if jiffies is not None:
        busy = (cpu_jiffies()[0] - jiffies[0]) / os.sysconf("SC_CLK_TCK")
        others = max(0.0, busy - own) / (os.cpu_count() * wall)
    return json.loads(out.stdout.strip().splitlines()[-1]), others


results = {side: [] for side in sides}
for round_index in range(1, int(rounds) + 1):
    for side, cmd in sides.items():
        result, others = run(cmd)
        results[side].append(result)
        busy = "" if others is None else f"  (other processes: {100 * others:.0f}% of the CPUs)"
        print(f"round {round_index} {side + ':':11} {json.dumps(result)}{busy}", flush=True)


def best(runs):
    out = dict(runs[0])
    for key in ("prompt_tok_s", "decode_tok_s"):
        out[key] = max(r[key] for r in runs)
    return out


o, p = best(results["tensorfold"]), best(results["llama.cpp"])
print(f"\nmodel: {model}")
print(f"threads: {o['threads']} (ours) / {p['threads']} (llama.cpp, xllamacpp {version})")
print(f"{'':12} {'tensorfold':>10} {'llama.cpp':>10} {'ratio':>6}  target")
for label, key, target in (("prompt tok/s", "prompt_tok_s", 0.8), ("decode tok/s", "decode_tok_s", 1.0)):
    ratio = o[key] / p[key]
    print(f"{label:12} {o[key]:10.2f} {p[key]:10.2f} {ratio:6.2f}  >= {target} {'ok' if ratio >= target else 'below'}")
print(f"(prompt {o['prompt_tokens']} / {p['prompt_tokens']} tokens, decode {o['decode_tokens']} / {p['decode_tokens']} tokens)")
PY

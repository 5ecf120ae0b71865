#!/usr/bin/env bash
# CPU benchmark: `tensorfold bench` against two builds of llama.cpp on the same GGUF file with the same
# thread count, run alternately: the xllamacpp wheel (a portable build) and llama-cpp-python compiled here
# with GGML_NATIVE (-march=native; built once into the bench venv, needs a C++ compiler). Prints every
# side and the ratios ours/llama.cpp against the stronger build, for prompt and for decode.
#
# Usage: tools/bench_cpu.sh [THREADS=2]
# Environment: ROUNDS (alternating rounds, default 3; the best of each side is compared),
#   PROMPT_TOKENS (512), DECODE_TOKENS (128), REPEATS (3, per side per round),
#   IDLE_WAIT (seconds to wait, before each run, for the CPUs to be idle; default 0: no wait),
#   NATIVE (1; 0 leaves out the native build), BENCH_MODEL (a GGUF to run instead of the default model),
#   TF_CACHE_DIR / XDG_CACHE_HOME (where the model and the bench venv live), PYTHON (python3),
#   TF_BIN (a tensorfold binary to measure; default: build this checkout).
set -euo pipefail

THREADS="${1:-2}"
ROUNDS="${ROUNDS:-3}"
PROMPT_TOKENS="${PROMPT_TOKENS:-512}"
DECODE_TOKENS="${DECODE_TOKENS:-128}"
REPEATS="${REPEATS:-3}"
IDLE_WAIT="${IDLE_WAIT:-0}"
NATIVE="${NATIVE:-1}"

cd "$(dirname "$0")/.."
source tools/bench_env.sh

bench_xllamacpp
NATIVE_VERSION="" NATIVE_NOTE="left out (NATIVE=$NATIVE)"
if [[ "$NATIVE" == 1 ]]; then
    if bench_native_llamacpp; then
        NATIVE_VERSION="$LLAMA_CPP_PYTHON_VERSION"
    else
        NATIVE_NOTE="not measured: no build (see the bench: line above)"
    fi
fi

# TF_BIN names a binary to measure instead of this checkout's release build (a before/after pair in one session).
if [[ -n "${TF_BIN:-}" ]]; then
    BIN="$TF_BIN"
else
    cargo build --release
    BIN=target/release/tensorfold
fi

bench_model "$BIN"

# The rounds alternate the sides; each run reports the share of the CPUs that other processes
# used while it ran, so a figure taken on a busy machine shows as such.
"$VPY" - "$BIN" "$MODEL" "$XLLAMACPP_VERSION" "$NATIVE_VERSION" "$NATIVE_NOTE" "$ROUNDS" "$IDLE_WAIT" \
    --threads "$THREADS" --prompt-tokens "$PROMPT_TOKENS" --decode-tokens "$DECODE_TOKENS" --repeats "$REPEATS" <<'PY'
import json, os, resource, subprocess, sys, time

bin_path, model, version, native_version, native_note, rounds, idle_wait = sys.argv[1:8]
sizes = sys.argv[8:]
sides = {
    "tensorfold": [bin_path, "bench", "--model", model, *sizes],
    "xllamacpp": [sys.executable, "tools/bench_llamacpp.py", "--model", model, *sizes],
}
if native_version:
    sides["native"] = [sys.executable, "tools/bench_llamacpp_native.py", "--model", model, *sizes]


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


bests = {side: best(runs) for side, runs in results.items()}
peers = [side for side in bests if side != "tensorfold"]
o = bests["tensorfold"]
print(f"\nmodel: {model}")
builds = {"xllamacpp": f"xllamacpp {version}", "native": f"llama-cpp-python {native_version}, GGML_NATIVE"}
print(f"threads: {o['threads']} (ours) / " + " / ".join(f"{bests[p]['threads']} ({builds[p]})" for p in peers))
if not native_version:
    print(f"native llama.cpp build: {native_note}")
print(f"{'':12} {'tensorfold':>10} " + " ".join(f"{p:>10}" for p in peers) + f" {'ratio':>6}  {'against':9} target")
# The ratio is taken against the faster llama.cpp build of each row.
for label, key, target in (("prompt tok/s", "prompt_tok_s", 1.3), ("decode tok/s", "decode_tok_s", 1.3)):
    stronger = max(peers, key=lambda p: bests[p][key])
    ratio = o[key] / bests[stronger][key]
    figures = " ".join(f"{bests[p][key]:10.2f}" for p in peers)
    verdict = "ok" if ratio >= target else "below"
    print(f"{label:12} {o[key]:10.2f} {figures} {ratio:6.2f}  {stronger:9} >= {target} {verdict}")
def counts(key):
    return " / ".join(str(bests[side][key]) for side in bests)


print(f"(prompt {counts('prompt_tokens')} tokens, decode {counts('decode_tokens')} tokens: " + ", ".join(bests) + ")")
PY

#!/usr/bin/env python3
"""A soak: mixed traffic for a long while against a running server, its memory sampled (stdlib; matplotlib for the
plot when it is installed).

    python3 tools/soak.py --base-url http://127.0.0.1:8000 --pid PID --minutes 60 --streams 64 --out soak/

--streams clients send, one request after another: streamed and whole chat, completions, speech when the server has
a voice, embeddings, requests dropped part way, and bad requests that must get a 4xx. The server's resident memory
(VmRSS of --pid) is read every --sample-seconds. Written to --out: samples.csv (time, RSS), windows.csv (per window
of --window-minutes and kind of request: count, failures, latency p50/p95/p99), summary.json, and soak.png when
matplotlib imports. It fails (exit 1) when a request that should succeed did not, or when RSS after the warm-up (the
first --warmup-fraction of the run) grew by --max-growth (5%) or more: the mean of the last three samples against
the mean of the first three after the warm-up.
"""

import argparse
import csv
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request

from cancel_storm import voices

KINDS = ["chat_stream"] * 4 + ["chat"] * 2 + ["completion"] * 2 + ["speech"] * 2 + ["embeddings", "dropped", "bad"]
KINDS += ["responses", "responses_stream", "messages_stream"]
WORDS = ["sea", "light", "stone", "river", "map", "song", "harbor", "wind", "lamp", "north"]


def rss_bytes(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmRSS")


def request_for(kind, rng, voice):
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 30)))
    chat = {"model": "any", "messages": [{"role": "user", "content": words}], "max_tokens": rng.randint(8, 64)}
    if kind in ("chat", "chat_stream", "dropped"):
        return "/v1/chat/completions", {**chat, "stream": kind != "chat", "seed": rng.randint(0, 999)}
    if kind.startswith("responses"):
        return "/v1/responses", {"model": "any", "input": words, "max_output_tokens": chat["max_tokens"],
                                 "stream": kind != "responses", "store": False}
    if kind == "messages_stream":
        return "/v1/messages", {**chat, "stream": True}
    if kind == "completion":
        return "/v1/completions", {"model": "any", "prompt": words, "max_tokens": rng.randint(8, 64)}
    if kind == "speech":
        return "/v1/audio/speech", {"model": "tts-1", "voice": voice, "input": words, "response_format": "mp3"}
    if kind == "embeddings":
        return "/v1/embeddings", {"model": "any", "input": [words, words.upper()]}
    bad = rng.choice([{"model": "any", "messages": []}, {"model": "any", "messages": "hi"},
                      {**chat, "temperature": -1}, {**chat, "n": 99}])
    return "/v1/chat/completions", bad


def one(base_url, rng, kind, voice, timeout):
    """Sends one request of `kind`; returns whether it went as it should."""
    path, body = request_for(kind, rng, voice)
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(f"{base_url}{path}", json.dumps(body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if kind == "dropped":
                response.read(rng.randint(1, 2000))
                # Closing the connection under a stream ends the request on the server.
                response.close()
                return True
            response.read()
            return kind != "bad" and response.status == 200
    except urllib.error.HTTPError as error:
        return kind == "bad" and 400 <= error.code < 500
    except (OSError, ValueError):
        return kind == "dropped"


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server, without /v1")
    parser.add_argument("--pid", type=int, required=True, help="the server's process id, for its RSS")
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--streams", type=int, default=64, help="clients at once (64)")
    parser.add_argument("--sample-seconds", type=float, default=10.0)
    parser.add_argument("--window-minutes", type=float, default=5.0)
    parser.add_argument("--warmup-fraction", type=float, default=0.2)
    parser.add_argument("--max-growth", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    parser.add_argument("--out", default="soak", help="directory for the CSVs, the summary and the plot")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    os.makedirs(args.out, exist_ok=True)
    voice_list = voices(args.base_url)
    kinds = [k for k in KINDS if k != "speech" or voice_list]
    started = time.monotonic()
    end = started + args.minutes * 60
    results, samples, lock = [], [], threading.Lock()

    def client(seed):
        rng = random.Random(seed)
        while time.monotonic() < end:
            kind = rng.choice(kinds)
            sent = time.monotonic()
            ok = one(args.base_url, rng, kind, voice_list[0] if voice_list else None, args.timeout)
            with lock:
                results.append((sent - started, kind, ok, time.monotonic() - sent))

    threads = [threading.Thread(target=client, args=(args.seed * 7919 + i,), daemon=True) for i in range(args.streams)]
    for t in threads:
        t.start()
    while time.monotonic() < end:
        samples.append((time.monotonic() - started, rss_bytes(args.pid)))
        time.sleep(min(args.sample_seconds, max(0.0, end - time.monotonic())))
    for t in threads:
        t.join(args.timeout)
    samples.append((time.monotonic() - started, rss_bytes(args.pid)))

    with open(os.path.join(args.out, "samples.csv"), "w", newline="") as f:
        csv.writer(f).writerows([("seconds", "rss_bytes")] + samples)
    window = args.window_minutes * 60
    rows = []
    for w in range(int(args.minutes * 60 // window) + 1):
        for kind in sorted(set(kinds)):
            got = [r for r in results if w * window <= r[0] < (w + 1) * window and r[1] == kind]
            if got:
                seconds = [r[3] for r in got]
                rows.append((w, kind, len(got), sum(not r[2] for r in got),
                             *(round(percentile(seconds, q), 3) for q in (0.5, 0.95, 0.99))))
    with open(os.path.join(args.out, "windows.csv"), "w", newline="") as f:
        csv.writer(f).writerows([("window", "kind", "requests", "failed", "p50_s", "p95_s", "p99_s")] + rows)

    after = [rss for t, rss in samples if t >= args.warmup_fraction * args.minutes * 60]
    first, last = sum(after[:3]) / len(after[:3]), sum(after[-3:]) / len(after[-3:])
    summary = {
        "minutes": args.minutes,
        "streams": args.streams,
        "requests": len(results),
        "failed": sum(not r[2] for r in results),
        "rss_first_mib": round(first / 2**20, 1),
        "rss_last_mib": round(last / 2**20, 1),
        "rss_growth": round(last / first - 1, 4),
        "out": args.out,
    }
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    plot(args.out, samples, rows, window)
    print(json.dumps(summary))
    return 0 if summary["failed"] == 0 and summary["rss_growth"] < args.max_growth else 1


def plot(out, samples, rows, window):
    """soak.png: RSS over time, and each kind's p95 latency per window; skipped without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.plot([t / 60 for t, _ in samples], [r / 2**20 for _, r in samples])
    top.set_ylabel("RSS (MiB)")
    for kind in sorted({r[1] for r in rows}):
        mine = [r for r in rows if r[1] == kind]
        bottom.plot([(r[0] + 0.5) * window / 60 for r in mine], [r[5] for r in mine], marker="o", label=kind)
    bottom.set_ylabel("p95 latency (s)")
    bottom.set_xlabel("minutes")
    bottom.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "soak.png"), dpi=100)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Decode speed with and without drafts, on tasks that copy and on free text, at 1 and --streams streams.

Starts `tensorfold serve` on --model. Each task runs greedy with "draft": false and then with drafts, alternating
--repeats times. Every run is a streamed request, and its decode rate is tokens after the first over the time
after the first. The outputs of both runs must be identical, or the script exits 1. Prints one JSON object: per
task and stream count, the best rate of each side, their ratio, and whether the texts matched.

    python3 tools/bench_drafts.py --binary target/release/tensorfold --model SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

from bench_openai import Endpoint, sse_events

PARAGRAPH = (
    "The harbor town woke slowly. Fishing boats rocked against the pier, gulls argued over scraps, and the baker "
    "on Station Street pulled the first loaves from her oven while the church bell rang seven times."
)
TASKS = {
    "edit": f"Rewrite this paragraph, changing only 'harbor' to 'river':\n\n{PARAGRAPH}",
    "list": "Repeat this list exactly, one item a line: " + ", ".join(f"item {i} of the order" for i in range(1, 25)),
    "code": "Repeat this code exactly:\n\ndef total_price(items, tax_rate):\n    subtotal = sum(item.price for item "
            "in items)\n    tax = subtotal * tax_rate\n    return subtotal + tax\n\ndef total_weight(items):\n    "
            "return sum(item.weight for item in items)\n",
    "free": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def run(endpoint, model, prompt, draft, max_tokens):
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "draft": draft, "stream_options": {"include_usage": True}}
    conn = endpoint.connect()
    start = time.perf_counter()
    conn.request("POST", endpoint.prefix + "/chat/completions", json.dumps(body), endpoint.headers)
    response = conn.getresponse()
    if response.status != 200:
        sys.exit(f"status {response.status}: {response.read()[:300]!r}")
    first, text, tokens = None, [], 0
    for data in sse_events(response):
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        for choice in chunk.get("choices", []):
            piece = choice.get("delta", {}).get("content")
            if piece:
                first = first or time.perf_counter()
                text.append(piece)
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    conn.close()
    rate = (tokens - 1) / (end - first) if first and tokens > 1 and end > first else 0.0
    return "".join(text), rate


def side_by_side(endpoint, model, prompt, streams, repeats, max_tokens):
    import concurrent.futures as cf

    best = {False: 0.0, True: 0.0}
    texts = {False: None, True: None}
    with cf.ThreadPoolExecutor(streams) as pool:
        for _ in range(repeats):
            for draft in (False, True):
                results = list(pool.map(lambda _: run(endpoint, model, prompt, draft, max_tokens), range(streams)))
                texts[draft] = [t for t, _ in results]
                best[draft] = max(best[draft], sum(r for _, r in results))
    return {"plain_tok_s": round(best[False], 1), "drafted_tok_s": round(best[True], 1),
            "ratio": round(best[True] / best[False], 3) if best[False] else None,
            "identical": texts[False] == texts[True]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", default="target/release/tensorfold")
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--port", type=int, default=18124)
    args = parser.parse_args()
    cmd = [args.binary, "serve", "--model", args.model, "--port", str(args.port), "--threads", str(args.threads),
           "--parallel", str(args.streams), "--no-voice"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{args.port}/health", timeout=2).read()
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    sys.exit("tensorfold did not start")
                time.sleep(0.2)
        endpoint = Endpoint(f"http://127.0.0.1:{args.port}/v1")
        model = endpoint.model()
        report = {"threads": args.threads, "max_tokens": args.max_tokens, "tasks": {}}
        for name, prompt in TASKS.items():
            report["tasks"][name] = {
                f"{n}_streams": side_by_side(endpoint, model, prompt, n, args.repeats, args.max_tokens)
                for n in (1, args.streams)
            }
        print(json.dumps(report, indent=1))
        same = all(v["identical"] for t in report["tasks"].values() for v in t.values())
        return 0 if same else 1
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    sys.exit(main())

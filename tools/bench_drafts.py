#!/usr/bin/env python3
"""Decode speed with and without drafts, on tasks that copy and on free text, at 1 and --streams streams.

Starts `tensorfold serve` on --model, with any --serve-arg words. Each task runs greedy with "draft": false and
then with drafts, alternating --repeats times. Every run is a streamed request, and its decode rate is tokens after the first over the time
after the first. The outputs of both runs must be identical, or the script exits 1. Prints one JSON object: per
task and stream count, the median rate of each side, the median of the repeats' paired ratios, the share of drafted tokens accepted, and whether
the texts matched.

    python3 tools/bench_drafts.py --binary target/release/tensorfold --model SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import json
import os
import shlex
import statistics
import sys

from bench_openai import serve, stream_chat

DRAFTED, ACCEPTED = "tensorfold_drafted_tokens_total", "tensorfold_draft_accepted_tokens_total"

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
    # Tasks the drafting was not tuned on: text that repeats its shape but not its tokens, and text that copies little.
    "count": "Count from 1 to 300, separated by commas.",
    "prose": "Explain how a refrigerator keeps food cold, for a curious twelve-year-old.",
    "translate": f"Translate this paragraph into French:\n\n{PARAGRAPH}",
    "lists": "List twenty kinds of fruit, one a line, each with its usual colour.",
}


def run(endpoint, model, prompt, draft, max_tokens):
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "draft": draft, "stream_options": {"include_usage": True}}
    try:
        result = stream_chat(endpoint, body)
    except RuntimeError as error:
        sys.exit(str(error))
    times, tokens = result["token_times"], (result["usage"] or {}).get("completion_tokens", 0)
    first, end = (times[0] if times else None), result["done_s"]
    rate = (tokens - 1) / (end - first) if first is not None and tokens > 1 and end > first else 0.0
    return result["text"], rate


def side_by_side(endpoint, model, prompt, streams, repeats, max_tokens):
    import concurrent.futures as cf

    rates = {False: [], True: []}
    texts = {False: None, True: None}
    before = endpoint.metrics()
    with cf.ThreadPoolExecutor(streams) as pool:
        for _ in range(repeats):
            for draft in (False, True):
                results = list(pool.map(lambda _: run(endpoint, model, prompt, draft, max_tokens), range(streams)))
                texts[draft] = [t for t, _ in results]
                rates[draft].append(sum(r for _, r in results))
    after = endpoint.metrics()
    drafted, accepted = (after[k] - before.get(k, 0) for k in (DRAFTED, ACCEPTED))
    # Each repeat's pair gives a ratio; their median is robust to the machine's drift and to one slow run.
    pairs = [d / p for p, d in zip(rates[False], rates[True]) if p]
    return {"plain_tok_s": round(statistics.median(rates[False]), 1),
            "drafted_tok_s": round(statistics.median(rates[True]), 1),
            "ratio": round(statistics.median(pairs), 3) if pairs else None,
            "drafted_tokens": int(drafted), "accepted_share": round(accepted / drafted, 3) if drafted else None,
            "identical": texts[False] == texts[True]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", default="target/release/tensorfold")
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma list of " + ", ".join(TASKS))
    parser.add_argument("--serve-arg", action="append", default=[], help="more `serve` words, e.g. '--device cuda'")
    args = parser.parse_args()
    serve_args = ["--model", args.model, "--threads", str(args.threads), "--parallel", str(args.streams),
                  "--no-voice", *(w for a in args.serve_arg for w in shlex.split(a))]
    with serve(args.binary, serve_args) as endpoint:
        model = endpoint.model()
        report = {"threads": args.threads, "max_tokens": args.max_tokens, "serve_args": serve_args, "tasks": {}}
        for name in args.tasks.split(","):
            report["tasks"][name] = {
                f"{n}_streams": side_by_side(endpoint, model, TASKS[name], n, args.repeats, args.max_tokens)
                for n in sorted({1, args.streams})
            }
    print(json.dumps(report, indent=1))
    same = all(v["identical"] for t in report["tasks"].values() for v in t.values())
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

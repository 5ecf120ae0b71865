#!/usr/bin/env python3
"""The three equalities: a fixed set of greedy and seeded requests must give the same tokens alone and together
(concurrent = solo), resumed from the prefix cache and fresh (resumed = fresh), and with drafts and without
(drafted = plain).

Runs every request solo with "cache": false and "draft": false, one at a time: the reference. Then the same
requests all at once among background noise requests started at seeded random times; then each twice with the
cache, the second resuming from the first; then each with drafts. Prints one token_sha256 per request (sha256 of
the completion text, or with --logprobs of the tokens the logprobs name) and a count for each equality. Exits 1
on any difference in text, finish_reason or usage (less its cached-token count).

    python3 tools/bench_concurrent.py --base-url http://127.0.0.1:8000/v1
    python3 tools/bench_concurrent.py --alone ...    # only the solo pass, e.g. to compare two builds
    python3 tools/bench_concurrent.py --serial ...   # the second pass one at a time too (repeatability)
"""

import argparse
import hashlib
import json
import random
import sys
import threading
import time

from bench_openai import Endpoint, sse_events

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "Explain photosynthesis in one sentence.",
    "Once upon a time, in a small village,",
    "What is 12 times 7?",
    "Give me a name for a pet turtle.",
    "Describe the smell of rain.",
    "The three laws of motion are",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue?",
    "Write the first line of a mystery novel.",
    "def fibonacci(n):",
    "Name a planet with rings.",
    "What do bees make?",
    "Suggest a title for a cookbook.",
    "How many legs does a spider have?",
    "Write a limerick about a cat.",
]


def measured_requests(model, logprobs):
    """Greedy and seeded, chat and text, streamed and not, with 16..64 max_tokens."""
    requests = []
    for i, prompt in enumerate(PROMPTS):
        chat = i % 3 != 2
        body = {"model": model, "max_tokens": 16 + (i * 13) % 49}
        if chat:
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if i % 2 == 0:
            body["temperature"] = 0
        else:
            body.update(temperature=1.0, top_p=0.9, seed=1000 + i)
        if i % 4 >= 2:
            body.update(stream=True, stream_options={"include_usage": True})
        if logprobs:
            body["logprobs"] = True if chat else 1
        requests.append(("/chat/completions" if chat else "/completions", body))
    return requests


def noise_requests(model, count):
    return [
        {
            "model": model,
            "messages": [{"role": "user", "content": f"Tell me about the number {i}. " * (1 + i * 6)}],
            "max_tokens": 8 + i * 11,
            "temperature": 0.7,
            "seed": i,
            "stream": True,
        }
        for i in range(count)
    ]


def logprob_tokens(choice):
    """The token strings of a choice's logprobs, chat or text shape, or None."""
    logprobs = choice.get("logprobs") or {}
    if logprobs.get("content") is not None:
        return [entry.get("token") for entry in logprobs["content"]]
    return logprobs.get("tokens")


def run(endpoint, path, body):
    """One request to the end: text, finish_reason, usage and the logprob tokens if asked."""
    conn = endpoint.connect()
    conn.request("POST", endpoint.prefix + path, json.dumps(body), endpoint.headers)
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"POST {path}: {response.status} {response.read()[:500]!r}")
    result = {"text": "", "finish_reason": None, "usage": None, "tokens": None}
    chunks = (json.loads(d) for d in sse_events(response) if d != "[DONE]") if body.get("stream") else None
    for chunk in chunks if chunks is not None else [json.loads(response.read())]:
        if chunk.get("usage"):
            result["usage"] = chunk["usage"]
        for choice in chunk.get("choices", []):
            message = choice.get("delta") or choice.get("message") or {}
            result["text"] += message.get("content") or choice.get("text") or ""
            result["finish_reason"] = choice.get("finish_reason") or result["finish_reason"]
            tokens = logprob_tokens(choice)
            if tokens is not None:
                result["tokens"] = (result["tokens"] or []) + tokens
    conn.close()
    payload = json.dumps(result["tokens"]) if result["tokens"] is not None else result["text"]
    result["token_sha256"] = hashlib.sha256(payload.encode("utf-8")).hexdigest()
    return result


def run_together(endpoint, requests, noise, rng, spread_s):
    """Every request and noise request on its own thread, each after a random delay."""
    results, errors = [None] * len(requests), []
    delays = [rng.uniform(0, spread_s) for _ in range(len(requests) + len(noise))]

    def measured(i):
        time.sleep(delays[i])
        try:
            results[i] = run(endpoint, *requests[i])
        except Exception as error:  # reported with its index below
            errors.append(f"request {i}: {error}")

    def background(j):
        time.sleep(delays[len(requests) + j])
        try:
            run(endpoint, "/chat/completions", noise[j])
        except Exception as error:  # noise failing is still a server failure
            errors.append(f"noise {j}: {error}")

    threads = [threading.Thread(target=measured, args=(i,)) for i in range(len(requests))]
    threads += [threading.Thread(target=background, args=(j,)) for j in range(len(noise))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the server's /v1 URL")
    parser.add_argument("--alone", action="store_true", help="run only the solo pass and print its shas")
    parser.add_argument("--serial", action="store_true", help="run the second pass one at a time too")
    parser.add_argument("--noise", type=int, default=8, help="background requests in the concurrent pass (8)")
    parser.add_argument("--spread", type=float, default=1.5, help="start times spread over this many seconds")
    parser.add_argument("--seed", type=int, default=7, help="seed of the start times (7)")
    parser.add_argument("--logprobs", action="store_true", help="hash the tokens named by logprobs")
    parser.add_argument("--api-key", help="sent as the Bearer token")
    args = parser.parse_args()

    endpoint = Endpoint(args.base_url, args.api_key)
    requests = with_fields(measured_requests(endpoint.model(), args.logprobs), cache=False, draft=False)
    solo = [run(endpoint, path, body) for path, body in requests]
    if args.alone:
        for i, result in enumerate(solo):
            print(f"{i:2} token_sha256={result['token_sha256']} finish={result['finish_reason']}")
        return 0
    if args.serial:
        again = [run(endpoint, path, body) for path, body in requests]
    else:
        noise = noise_requests(requests[0][1]["model"], args.noise)
        again = run_together(endpoint, requests, noise, random.Random(args.seed), args.spread)

    resumed = []
    for path, body in with_fields(requests, cache=True):
        run(endpoint, path, body)
        resumed.append(run(endpoint, path, body))
    drafted = [run(endpoint, path, body) for path, body in with_fields(requests, draft=True)]
    counts, failed = [], False
    for name, runs in (("concurrent=solo", again), ("resumed=fresh", resumed), ("drafted=plain", drafted)):
        same = [equal(first, second) for first, second in zip(solo, runs)]
        for i in (i for i, ok in enumerate(same) if not ok):
            print(f"{i:2} {name} DIFFERS: {solo[i]['text']!r} vs {runs[i]['text']!r}")
        counts.append(f"{name} {sum(same)}/{len(same)}")
        failed |= not all(same)
    for i, first in enumerate(solo):
        print(f"{i:2} token_sha256={first['token_sha256']} finish={first['finish_reason']}")
    print(", ".join(counts))
    return 1 if failed else 0


def with_fields(requests, **fields):
    return [(path, dict(body, **fields)) for path, body in requests]


def equal(first, second):
    """Same tokens, text, finish reason and usage; how much of the prompt was cached is no part of the output."""
    usage = lambda r: {k: v for k, v in (r["usage"] or {}).items() if k != "prompt_tokens_details"}  # noqa: E731
    keys = ("token_sha256", "text", "finish_reason")
    return all(first[k] == second[k] for k in keys) and usage(first) == usage(second)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Time to first token with a shared system prompt: tensorfold's prefix cache beside llama.cpp's prompt cache.

Both serve the same GGUF on the CPU with the same threads and 8 slots. Each side gets, in order: one cold
request (the system prompt, about --system-words x 1.35 tokens, and a question), one warm request (the same
system prompt, another question), then --streams warm requests at once (other questions). Every request asks for
one token, greedy, not streamed, so its wall time is its time to first token. tensorfold also runs the
--streams requests with "cache": false, the cold figure the cache saves. llama.cpp runs in process through the
`xllamacpp` wheel (as tools/bench_llamacpp.py), with `cache_prompt` on.

    python3 tools/bench_prefix.py --binary target/release/tensorfold --model SmolLM2-135M-Instruct.Q4_1.gguf
"""

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time

from bench_cache import varied_text
from bench_openai import serve

QUESTIONS = [
    "Which word appears first in the text?", "How many sentences end with a question mark?",
    "Name a color the text mentions.", "Which number in the text is the largest?",
    "Does the text mention a river?", "Give one word from the last sentence.",
    "What is the text's mood?", "Name an animal in the text.", "Which season fits the text?",
    "Give the text a title.", "Is there a mountain in the text?", "Name a metal the text mentions.",
]


def messages(system, question):
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def at_once(fn, items):
    """Runs fn on every item in its own thread, all started together; returns the results in order."""
    results = [None] * len(items)
    barrier = threading.Barrier(len(items))

    def run(i):
        barrier.wait()
        results[i] = fn(items[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def phases(request, system, streams):
    """Seconds (and cached tokens) of the cold, warm and concurrent warm requests."""
    cold = request(messages(system, QUESTIONS[0]))
    warm = request(messages(system, QUESTIONS[1]))
    many = at_once(request, [messages(system, QUESTIONS[2 + i % 10] + f" ({i})") for i in range(streams)])
    return {"cold": cold, "warm": warm, "streams": many}


def summary(result):
    many = [s for s, _ in result["streams"]]
    return {
        "cold_s": result["cold"][0],
        "cold_cached": result["cold"][1],
        "warm_s": result["warm"][0],
        "warm_cached": result["warm"][1],
        "streams_median_s": statistics.median(many),
        "streams_max_s": max(many),
        "streams_cached_min": min(c for _, c in result["streams"]),
    }


def tensorfold_side(args, system):
    serve_args = ["--model", args.model, "--parallel", str(args.streams), "--threads", str(args.threads), "--no-voice"]
    with serve(args.binary, serve_args) as endpoint:
        name = endpoint.model()

        def request(msgs, cache=True):
            body = {"model": name, "messages": msgs, "max_tokens": 1, "temperature": 0, "cache": cache}
            conn = endpoint.connect()
            start = time.perf_counter()
            conn.request("POST", endpoint.prefix + "/chat/completions", json.dumps(body), endpoint.headers)
            reply = json.loads(conn.getresponse().read())
            seconds = time.perf_counter() - start
            conn.close()
            return seconds, reply["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)

        result = phases(request, system, args.streams)
        uncached = at_once(lambda m: request(m, False),
                           [messages(system, QUESTIONS[2 + i % 10] + f" [{i}]") for i in range(args.streams)])
        out = summary(result)
        out["streams_uncached_median_s"] = statistics.median(s for s, _ in uncached)
        return out


def llamacpp_side(args, system):
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.n_parallel = args.streams
    params.n_ctx = args.streams * 4096
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.cache_prompt = True
    params.n_gpu_layers = 0
    params.verbosity = -1
    server = xllamacpp.Server(params)

    def request(msgs):
        body = {"messages": msgs, "max_tokens": 1, "temperature": 0, "cache_prompt": True}
        start = time.perf_counter()
        reply = server.handle_chat_completions(body)
        seconds = time.perf_counter() - start
        if not isinstance(reply, dict) or "choices" not in reply:
            sys.exit(f"llama.cpp chat failed: {reply}")
        usage = reply.get("usage", {})
        return seconds, (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)

    return summary(phases(request, system, args.streams))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", default="target/release/tensorfold")
    parser.add_argument("--model", required=True, help="the GGUF both sides serve")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--system-words", type=int, default=1100, help="words of the shared system prompt")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--skip", action="append", default=[], choices=["tensorfold", "llamacpp"])
    args = parser.parse_args()
    system = varied_text(random.Random(args.seed), args.system_words)
    report = {"threads": args.threads, "streams": args.streams, "system_words": args.system_words}
    if "tensorfold" not in args.skip:
        report["tensorfold"] = tensorfold_side(args, system)
    if "llamacpp" not in args.skip:
        report["llamacpp"] = llamacpp_side(args, system)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()

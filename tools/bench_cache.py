#!/usr/bin/env python3
"""Time to first token of a cold request on a long (about 2000 tokens) prompt of varied text (stdlib only).

The prompt is built from --seed (random when not given, and printed), so a new seed is a cold prompt; with
the prefix cache on, later --repeat runs resume from it and report usage.prompt_tokens_details.cached_tokens.
--require-cold exits 1 if the first request reports a prefix-cache hit (cached_tokens > 0). For the shared
system prompt beside llama.cpp, see bench_prefix.py.

    python3 tools/bench_cache.py --base-url http://127.0.0.1:8000/v1 --require-cold
"""

import argparse
import json
import random
import sys
import time

from bench_openai import Endpoint, sse_events

WORDS = (
    "river mountain lantern copper whisper harbor meadow signal orchard glacier thunder velvet compass "
    "archive ember falcon granite horizon ivory jasmine kettle lagoon marble nectar obsidian pepper quartz "
    "saffron timber umbrella violet walnut yarrow zephyr beacon cinder dune echo fern grove hollow island "
    "juniper kiln ledger mosaic nimbus opal prairie quiver ridge summit tundra valley willow"
).split()
VERBS = "carries finds paints follows gathers hides measures opens remembers shapes trades watches".split()


def varied_text(rng, num_words):
    """Sentences of random words, numbers and punctuation, so the tokens do not repeat in a pattern."""
    sentences, count = [], 0
    while count < num_words:
        length = rng.randint(6, 16)
        words = [rng.choice(WORDS) for _ in range(length)]
        words.insert(rng.randint(1, length - 1), rng.choice(VERBS))
        if rng.random() < 0.3:
            words.insert(rng.randint(0, length), str(rng.randint(2, 9999)))
        sentence = " ".join(words)
        sentences.append(sentence[0].upper() + sentence[1:] + rng.choice([".", ".", "!", "?", ";"]))
        count += len(words)
    return " ".join(sentences)


def timed_request(endpoint, model, prompt, max_tokens):
    """One streaming chat request: seconds to the first content chunk, and the final usage."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt + "\n\nSummarize the text above in one sentence."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    conn = endpoint.connect()
    start = time.perf_counter()
    conn.request("POST", endpoint.prefix + "/chat/completions", json.dumps(body), endpoint.headers)
    response = conn.getresponse()
    if response.status != 200:
        raise SystemExit(f"status {response.status}: {response.read()[:500]!r}")
    ttft, usage = None, None
    for data in sse_events(response):
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices", []):
            if ttft is None and (choice.get("delta", {}).get("content") or choice.get("finish_reason")):
                ttft = time.perf_counter() - start
    conn.close()
    if ttft is None:
        ttft = time.perf_counter() - start
    return ttft, usage or {}


def cached_tokens(usage):
    return (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the server's /v1 URL")
    parser.add_argument("--words", type=int, default=1500, help="words of prompt text, about 2000 tokens (1500)")
    parser.add_argument("--seed", type=int, help="seed of the prompt text (random)")
    parser.add_argument("--repeat", type=int, default=1, help="send the same prompt this many times (1)")
    parser.add_argument("--max-tokens", type=int, default=8, help="tokens to generate per request (8)")
    parser.add_argument("--require-cold", action="store_true", help="exit 1 if the first request hits a cache")
    parser.add_argument("--api-key", help="sent as the Bearer token")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    prompt = varied_text(random.Random(seed), args.words)
    endpoint = Endpoint(args.base_url, args.api_key)
    model = endpoint.model()
    runs = []
    for _ in range(args.repeat):
        ttft, usage = timed_request(endpoint, model, prompt, args.max_tokens)
        run = {"ttft_s": ttft, "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached_tokens(usage)}
        runs.append(run)
    if args.json:
        print(json.dumps({"seed": seed, "model": model, "runs": runs}, indent=2))
    else:
        print(f"model {model}, prompt seed {seed}")
        for i, run in enumerate(runs):
            label = "cold" if i == 0 else f"repeat {i}"
            print(f"{label:>9}: ttft_s {run['ttft_s']:.3f}  prompt_tokens {run['prompt_tokens']}  "
                  f"cached_tokens {run['cached_tokens']}")
    if args.require_cold and runs[0]["cached_tokens"] > 0:
        print(f"the first request hit a prefix cache ({runs[0]['cached_tokens']} cached tokens)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

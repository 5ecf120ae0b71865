#!/usr/bin/env python3
"""The llama.cpp side of the CPU benchmark, through the `xllamacpp` wheel's in-process server.

Prints one JSON line with the keys `tensorfold bench` prints:
{"threads", "prompt_tokens", "prompt_tok_s", "decode_tokens", "decode_tok_s"}.

- prompt: the prompt token ids (the same ids `tensorfold bench` uses) processed as one pass
  (n_batch = n_ubatch >= prompt), with one token generated; the figure is llama.cpp's own
  `timings.prompt_per_second`, and `prompt_tokens` is the count llama.cpp reports it processed.
- decode: a 1-token prompt, then exactly `--decode-tokens` greedy tokens (ignore_eos);
  the figure is `timings.predicted_per_second`.
- The prompt cache is off (server-wide and per request), so every repeat really processes the
  prompt; one unmeasured warm-up request runs first; the best of `--repeats` is reported.

Usage: python tools/bench_llamacpp.py --model PATH [--threads N] [--prompt-tokens 512]
                                      [--decode-tokens 128] [--repeats 3] [--verbose]
"""

import argparse
import json
import os
import struct
import sys

import xllamacpp

GGUF_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY = 8, 9


def gguf_vocab_size(path):
    """The length of `tokenizer.ggml.tokens`, read from the GGUF header without loading tensors."""
    with open(path, "rb") as f:

        def read(fmt):
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        def read_string():
            return f.read(read("<Q"))

        def skip(value_type):
            if value_type == GGUF_STRING:
                f.seek(read("<Q"), os.SEEK_CUR)
            elif value_type == GGUF_ARRAY:
                item_type, count = read("<I"), read("<Q")
                for _ in range(count):
                    skip(item_type)
            else:
                f.seek(struct.calcsize(GGUF_SCALAR[value_type]), os.SEEK_CUR)

        if f.read(4) != b"GGUF":
            sys.exit(f"{path}: not a GGUF file")
        read("<I")
        read("<Q")
        for _ in range(read("<Q")):
            key, value_type = read_string(), read("<I")
            if key == b"tokenizer.ggml.tokens" and value_type == GGUF_ARRAY:
                read("<I")
                return read("<Q")
            skip(value_type)
    sys.exit(f"{path}: no tokenizer.ggml.tokens")


def bench_prompt(vocab_size, num_tokens):
    """The ids `tensorfold bench` uses: spread over the vocabulary, no BOS."""
    return [(i * 7919 + 13) % vocab_size for i in range(num_tokens)]


def complete(server, prompt, n_predict):
    response = server.handle_completions(
        {
            "prompt": prompt,
            "n_predict": n_predict,
            "ignore_eos": True,
            "cache_prompt": False,
            "temperature": 0.0,
            "top_k": 1,
        }
    )
    if not isinstance(response, dict) or "timings" not in response:
        sys.exit(f"llama.cpp completion failed: {response}")
    timings = response["timings"]
    if timings.get("cache_n", 0) != 0:
        sys.exit(f"llama.cpp reused {timings['cache_n']} cached prompt tokens; the prompt cache must be off")
    return timings


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--verbose", action="store_true", help="keep llama.cpp's own log on stderr")
    args = parser.parse_args()

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.n_parallel = 1
    params.n_ctx = args.prompt_tokens + args.decode_tokens + 16
    params.n_batch = max(args.prompt_tokens, 512)
    params.n_ubatch = params.n_batch
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.cache_prompt = False
    params.n_gpu_layers = 0
    if not args.verbose:
        params.verbosity = -1
    server = xllamacpp.Server(params)

    prompt = bench_prompt(gguf_vocab_size(args.model), args.prompt_tokens)
    complete(server, prompt[:16], 4)
    best_pp, best_tg, prompt_n, predicted_n = 0.0, 0.0, 0, 0
    for _ in range(max(args.repeats, 1)):
        pp = complete(server, prompt, 1)
        best_pp, prompt_n = max(best_pp, pp["prompt_per_second"]), pp["prompt_n"]
        tg = complete(server, prompt[:1], args.decode_tokens)
        best_tg, predicted_n = max(best_tg, tg["predicted_per_second"]), tg["predicted_n"]
    if predicted_n != args.decode_tokens:
        sys.exit(f"llama.cpp decoded {predicted_n} tokens, not {args.decode_tokens}")
    print(
        json.dumps(
            {
                "threads": args.threads,
                "prompt_tokens": prompt_n,
                "prompt_tok_s": round(best_pp, 2),
                "decode_tokens": predicted_n,
                "decode_tok_s": round(best_tg, 2),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

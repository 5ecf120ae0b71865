#!/usr/bin/env python3
"""The natively built llama.cpp side of the CPU benchmark, through `llama-cpp-python` built with GGML_NATIVE.

Prints one JSON line with the keys `tensorfold bench` and tools/bench_llamacpp.py print:
{"threads", "prompt_tokens", "prompt_tok_s", "decode_tokens", "decode_tok_s"}.

- prompt: the prompt token ids (the same ids `tensorfold bench` uses) decoded as one batch
  (n_batch = n_ubatch >= prompt), then one greedy token sampled; timed from the start of the batch
  to that token, as llama.cpp's server times `prompt_per_second`.
- decode: a 1-token prompt, then exactly `--decode-tokens` greedy tokens, each sampled and decoded
  (an end-of-text token does not stop it); timed over those tokens, as `predicted_per_second`.
- The KV cache is cleared before every pass, so every repeat really processes the prompt; one
  unmeasured warm-up pass runs first; the best of `--repeats` is reported.

The xllamacpp wheel and this build are never loaded into one process: each brings its own ggml.

Usage: python tools/bench_llamacpp_native.py --model PATH [--threads N] [--prompt-tokens 512]
                                             [--decode-tokens 128] [--repeats 3] [--verbose]
"""

import argparse
import json
import os
import sys
import time

import llama_cpp


def bench_prompt(vocab_size, num_tokens):
    """The ids `tensorfold bench` uses: spread over the vocabulary, no BOS."""
    return [(i * 7919 + 13) % vocab_size for i in range(num_tokens)]


class Runner:
    """One llama.cpp context with a greedy sampler; every pass starts from an empty KV cache."""

    def __init__(self, args):
        n_batch = max(args.prompt_tokens, 512)
        self.llm = llama_cpp.Llama(
            model_path=args.model,
            n_gpu_layers=0,
            n_ctx=max(args.prompt_tokens, 1) + args.decode_tokens + 16,
            n_batch=n_batch,
            n_ubatch=n_batch,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            # llama.cpp's own default (auto) turns it on for the CPU; llama-cpp-python's is off.
            flash_attn=True,
            verbose=args.verbose,
        )
        self.sampler = llama_cpp.llama_sampler_init_greedy()

    def next_token(self):
        return llama_cpp.llama_sampler_sample(self.sampler, self.llm.ctx, -1)

    def prompt_pass(self, tokens):
        """Seconds to decode the prompt as one batch and sample its first token."""
        self.llm.reset()
        started = time.perf_counter()
        self.llm.eval(tokens)
        self.next_token()
        return time.perf_counter() - started

    def decode_pass(self, first, num_tokens):
        """Seconds to sample and decode num_tokens tokens, one at a time, after a 1-token prompt."""
        self.llm.reset()
        self.llm.eval([first])
        started = time.perf_counter()
        for _ in range(num_tokens):
            self.llm.eval([self.next_token()])
        return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--verbose", action="store_true", help="keep llama.cpp's own log on stderr")
    args = parser.parse_args()
    if args.prompt_tokens < 2 or args.decode_tokens < 1:
        sys.exit("--prompt-tokens must be at least 2 (one batch) and --decode-tokens at least 1")

    runner = Runner(args)
    prompt = bench_prompt(runner.llm.n_vocab(), args.prompt_tokens)
    runner.prompt_pass(prompt[:16])
    runner.decode_pass(prompt[0], 4)
    best_pp, best_tg = 0.0, 0.0
    for _ in range(max(args.repeats, 1)):
        best_pp = max(best_pp, args.prompt_tokens / runner.prompt_pass(prompt))
        best_tg = max(best_tg, args.decode_tokens / runner.decode_pass(prompt[0], args.decode_tokens))
    print(
        json.dumps(
            {
                "threads": args.threads,
                "prompt_tokens": args.prompt_tokens,
                "prompt_tok_s": round(best_pp, 2),
                "decode_tokens": args.decode_tokens,
                "decode_tok_s": round(best_tg, 2),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Greedy agreement between tensorfold and llama.cpp: how many leading tokens each pair generates alike.

For each of a few chat prompts, the model's own chat template (the GGUF's `tokenizer.chat_template`) is
rendered and tokenized once, by llama.cpp; those token ids are the prompt of every side, so the
template and the tokenizer cannot differ between them. Then, greedily and up to `--max-tokens` tokens:

- llama.cpp: `llama-cpp-python` in this process, a greedy sampler, stopping after an end-of-generation token;
- tensorfold f32: `tensorfold serve` with `TF_CPU_ACTIVATIONS` unset (the default, f32 activations);
- tensorfold int8: the same server with `TF_CPU_ACTIVATIONS=int8`.

The servers get `/v1/completions` with the ids as `prompt`, temperature 0, `draft` and `cache` off, and
`logprobs: 2`, whose `tokens` name each generated token, the end-of-generation token included, and whose
`top_logprobs` give each step's two best: at a divergence the gap between them says how near a tie it was.
The same request without `logprobs` (the engine's argmax path) is checked to write the same text.
Tokens are compared by each side's text for the one token (special tokens as written), which tells
token ids apart except for tokens spelled alike.

Per prompt it prints the number of leading tokens that agree, counting an end-of-generation token both
sides produce; `=` marks outputs identical to the end. As a check on the template, it also asks the
f32 server's `/v1/chat/completions` to count the same conversation's prompt tokens.

Needs the bench venv (tools/bench_env.sh: bench_native_llamacpp builds `llama-cpp-python` there):

    ~/.cache/tensorfold/bench-venv/bin/python tools/agree_llamacpp.py --bin target/release/tensorfold \
        [--model PATH] [--threads 2] [--max-tokens 64] [--json OUT.json]
"""

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import llama_cpp
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# One prompt per kind of output, so agreement is not measured on one style of text alone.
PROMPTS = [
    ("question", "What is the capital of France, and what is it famous for?"),
    ("list", "List five fruits that are rich in vitamin C."),
    ("code", "Write a Python function that returns the factorial of n."),
    ("translation", "Translate into French: The weather is nice today, so let's go for a walk in the park."),
    ("story", "Write the opening of a story about a lighthouse keeper who finds a message in a bottle."),
    ("arithmetic", "What is 17 multiplied by 23? Show your work."),
    ("definition", "Define the word 'photosynthesis' in one sentence."),
    ("haiku", "Write a haiku about autumn rain."),
]


def default_model():
    """The default model in the binary's cache directory, found by the same rules as tools/bench_env.sh."""
    if os.environ.get("TF_CACHE_DIR"):
        cache = os.environ["TF_CACHE_DIR"]
    elif os.environ.get("XDG_CACHE_HOME"):
        cache = os.path.join(os.environ["XDG_CACHE_HOME"], "tensorfold")
    else:
        cache = os.path.join(os.path.expanduser("~"), ".cache", "tensorfold")
    return os.path.join(cache, MODEL_FILE)


class LlamaCpp:
    """One llama.cpp context: renders the chat template, tokenizes, and generates greedily."""

    def __init__(self, args):
        self.llm = llama_cpp.Llama(
            model_path=args.model,
            n_gpu_layers=0,
            n_ctx=2048,
            n_batch=512,
            n_ubatch=512,
            n_threads=args.threads,
            n_threads_batch=args.threads,
            # llama.cpp's own default (auto) turns it on for the CPU; llama-cpp-python's is off.
            flash_attn=True,
            verbose=args.verbose,
        )
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.sampler = llama_cpp.llama_sampler_init_greedy()
        template = self.llm.metadata.get("tokenizer.chat_template")
        if not template:
            sys.exit(f"{args.model} has no tokenizer.chat_template")
        eos, bos = self.special_text(self.llm.token_eos()), self.special_text(self.llm.token_bos())
        self.formatter = Jinja2ChatFormatter(template, eos_token=eos, bos_token=bos)

    def close(self):
        llama_cpp.llama_sampler_free(self.sampler)
        self.llm.close()

    def special_text(self, token):
        return self.llm._model.token_get_text(token) if token >= 0 else ""

    def piece(self, token):
        """A token's text, special tokens as written, bytes that are not whole UTF-8 as U+FFFD."""
        return self.llm.detokenize([token], special=True).decode("utf-8", errors="replace")

    def chat_prompt(self, messages):
        """The template rendered with its generation prompt, tokenized as llama.cpp's server does."""
        text = self.formatter(messages=messages).prompt
        # add_bos adds BOS only where the model's metadata asks for it.
        return self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)

    def generate(self, prompt_ids, max_tokens):
        """Greedy tokens, ending after an end-of-generation token or at max_tokens."""
        self.llm.reset()
        self.llm.eval(prompt_ids)
        tokens = []
        while len(tokens) < max_tokens:
            token = llama_cpp.llama_sampler_sample(self.sampler, self.llm.ctx, -1)
            tokens.append(token)
            if llama_cpp.llama_vocab_is_eog(self.vocab, token):
                break
            self.llm.eval([token])
        return [self.piece(t) for t in tokens]


class Server:
    """`tensorfold serve` on a free port, started with its own environment and stopped with SIGTERM."""

    def __init__(self, args, activations):
        env = dict(os.environ)
        env.pop("TF_API_KEY", None)
        if activations:
            env["TF_CPU_ACTIVATIONS"] = activations
        else:
            env.pop("TF_CPU_ACTIVATIONS", None)
        command = [args.bin, "serve", "--model", args.model, "--threads", str(args.threads), "--port", "0",
                   "--no-voice", "--draft-tokens", "0"]
        self.log = []
        self.process = subprocess.Popen(
            command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self.address = self._wait_listening(timeout=120)
        self._wait_healthy(timeout=300)

    def _wait_listening(self, timeout):
        lines = queue.Queue()

        # Drains stderr for the server's whole life, so its log can never fill the pipe and block it.
        def drain():
            for line in self.process.stderr:
                self.log.append(line.rstrip("\n"))
                lines.put(line)
            lines.put(None)

        threading.Thread(target=drain, daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = lines.get(timeout=deadline - time.monotonic())
            except queue.Empty:
                break
            if line is None:
                break
            if line.startswith("listening on http://"):
                return line.split()[-1]
        self.stop()
        raise RuntimeError("tensorfold serve did not start:\n" + "\n".join(self.log[-20:]))

    def _wait_healthy(self, timeout):
        # /health answers 503 until the model is loaded; a start-up check, so polling is fine here.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(self.address + "/health", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("tensorfold serve did not become healthy:\n" + "\n".join(self.log[-20:]))

    def post(self, route, body):
        request = urllib.request.Request(
            self.address + route, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=600) as reply:
                return json.load(reply)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{route} answered {e.code}: {e.read().decode(errors='replace')}") from None

    def generate(self, prompt_ids, max_tokens):
        """Token texts (the end-of-generation token included), finish reason, whether the argmax path agrees, and
        each step's gap between its two best log-probabilities."""
        body = {"prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0, "draft": False, "cache": False}
        plain = self.post("/v1/completions", body)["choices"][0]
        choice = self.post("/v1/completions", {**body, "logprobs": 2})["choices"][0]
        gaps = [gap(top) for top in choice["logprobs"]["top_logprobs"]]
        return choice["logprobs"]["tokens"], choice["finish_reason"], plain["text"] == choice["text"], gaps

    def chat_prompt_tokens(self, messages):
        body = {"messages": messages, "max_tokens": 1, "temperature": 0, "cache": False}
        return self.post("/v1/chat/completions", body)["usage"]["prompt_tokens"]

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def gap(top):
    """The gap between a step's two best log-probabilities (inf where only one is given)."""
    best = sorted(top.values(), reverse=True)
    return best[0] - best[1] if len(best) > 1 else float("inf")


def leading_agreement(a, b):
    """Leading tokens a and b share, and whether they are identical to the end."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n, a == b


def run_server(args, activations, prompt_ids, messages=None):
    """Every prompt's tokens from one server; with messages, also its own chat template's prompt lengths."""
    server = Server(args, activations)
    try:
        outputs = [server.generate(ids, args.max_tokens) for ids in prompt_ids]
        counts = [server.chat_prompt_tokens(m) for m in messages] if messages else None
    finally:
        server.stop()
    return outputs, counts


def cell(agreement):
    n, identical = agreement
    return f"{n}=" if identical else str(n)


def print_table(rows, max_tokens):
    pairs = [("f32~llama", "f32_llama"), ("int8~llama", "int8_llama"), ("f32~int8", "f32_int8")]
    header = f"{'prompt':<12} {'prompt_tok':>10} {'llama_len':>9} " + " ".join(f"{p:>10}" for p, _ in pairs)
    print(header)
    for row in rows:
        cells = " ".join(f"{cell(row[key]):>10}" for _, key in pairs)
        print(f"{row['name']:<12} {row['prompt_tokens']:>10} {row['llama_len']:>9} {cells}")
    means = " ".join(f"{sum(r[k][0] for r in rows) / len(rows):>10.1f}" for _, k in pairs)
    full = " ".join(f"{sum(r[k][1] for r in rows):>8}/{len(rows)}" for _, k in pairs)
    print(f"{'mean':<12} {'':>10} {'':>9} {means}")
    print(f"{'identical':<12} {'':>10} {'':>9} {full}")
    print(f"(leading tokens that agree, of at most {max_tokens}; '=' marks outputs identical to the end)")


def print_divergences(rows):
    """Where each pair first differs, with a little context, so a divergence can be judged by eye."""
    for row in rows:
        for label, a, b, key in (("f32", "f32", "llama", "f32_llama"), ("int8", "int8", "llama", "int8_llama")):
            n, identical = row[key]
            if identical:
                continue
            left = row["tokens"][a][n] if n < len(row["tokens"][a]) else "<end>"
            right = row["tokens"][b][n] if n < len(row["tokens"][b]) else "<end>"
            context = "".join(row["tokens"][b][max(0, n - 8):n])
            margin = row["gaps"][a][n] if n < len(row["gaps"][a]) else float("nan")
            print(f"{row['name']:<12} {label:>4}~llama at {n}: after {context!r}: {left!r} vs {right!r}"
                  f" (our two best {margin:.3f} apart in log-probability)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default=os.environ.get("TF_BIN", "target/release/tensorfold"))
    parser.add_argument("--model", default=default_model())
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", help="also write every prompt's tokens and agreements here")
    parser.add_argument("--verbose", action="store_true", help="keep llama.cpp's own log on stderr")
    args = parser.parse_args()
    if not os.path.isfile(args.model):
        sys.exit(f"{args.model} not found (run `{args.bin} bench` once to fetch the default model)")
    if args.max_tokens < 1:
        sys.exit("--max-tokens must be at least 1")

    conversations = [[{"role": "user", "content": text}] for _, text in PROMPTS]
    started = time.monotonic()
    llama = LlamaCpp(args)
    try:
        prompt_ids = [llama.chat_prompt(messages) for messages in conversations]
        llama_tokens = [llama.generate(ids, args.max_tokens) for ids in prompt_ids]
    finally:
        llama.close()
    f32, chat_counts = run_server(args, None, prompt_ids, conversations)
    int8, _ = run_server(args, "int8", prompt_ids)

    rows = []
    for i, (name, _) in enumerate(PROMPTS):
        tokens = {"llama": llama_tokens[i], "f32": f32[i][0], "int8": int8[i][0]}
        gaps = {"f32": f32[i][3], "int8": int8[i][3]}
        rows.append({
            "name": name,
            "prompt_tokens": len(prompt_ids[i]),
            "chat_prompt_tokens": chat_counts[i],
            "llama_len": len(tokens["llama"]),
            "finish": {"f32": f32[i][1], "int8": int8[i][1]},
            "argmax_path_same": {"f32": f32[i][2], "int8": int8[i][2]},
            "f32_llama": leading_agreement(tokens["f32"], tokens["llama"]),
            "int8_llama": leading_agreement(tokens["int8"], tokens["llama"]),
            "f32_int8": leading_agreement(tokens["f32"], tokens["int8"]),
            "tokens": tokens,
            "gaps": gaps,
        })

    print(f"model {args.model}, {args.threads} threads, greedy, at most {args.max_tokens} tokens")
    print_table(rows, args.max_tokens)
    print_divergences(rows)
    mismatched = [r["name"] for r in rows if r["chat_prompt_tokens"] != r["prompt_tokens"]]
    if mismatched:
        print(f"template check: tensorfold's own chat template counts other prompt lengths for {mismatched}")
    else:
        print("template check: tensorfold's own chat template gives every prompt the same number of tokens")
    differing = [f"{r['name']} ({side})" for r in rows for side, same in r["argmax_path_same"].items() if not same]
    if differing:
        print(f"argmax check: without log-probabilities tensorfold wrote other text for {differing}")
    else:
        print("argmax check: without log-probabilities tensorfold wrote the same text for every prompt")
    print(f"took {time.monotonic() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "threads": args.threads, "max_tokens": args.max_tokens,
                       "prompts": dict(PROMPTS), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()

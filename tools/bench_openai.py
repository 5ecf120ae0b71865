#!/usr/bin/env python3
"""Throughput and time to first token of an OpenAI-compatible server under N concurrent streams (stdlib only).

For each stream count it starts that many streaming chat completions at once and prints the mean decode
tokens/s per stream, the total output tokens/s, and TTFT p50/p95.

    python3 tools/bench_openai.py --base-url http://127.0.0.1:8000/v1 --streams 1,8,32 --max-tokens 128
    python3 tools/bench_openai.py --schema ...   # each count without and then with a JSON schema's masks
    python3 tools/bench_openai.py --prefix-words 300 --repeat-ttft 3 --temperature 0 ...

With --schema every stream also asks for `response_format` json_schema: a list of at least 64 records, long
enough that no stream ends before --max-tokens, so the two rows differ only by the grammar's masks.

With --prefix-words N every stream's request starts with a system message of N words of varied text, and each
count runs twice: each stream with its own system message ("own"), then all streams with one ("shared"). The
texts are new for every row, so a row never resumes from an earlier row's prompt; the rows differ only by
whether the streams of one row share their prefix.

With --repeat-ttft K one stream sends a short prompt (about 25 tokens) the server has not seen, then the same
prompt K times; it prints the first TTFT and the median TTFT of the repeats, which a prompt cache can serve.
"""

import argparse
import contextlib
import http.client
import json
import random
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

DEFAULT_PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."
REPEAT_PROMPT = "Give me three short tips for keeping a small vegetable garden healthy through a long and dry summer"
PREFIX_MODES = ("none", "own", "shared")
RECORDS_SCHEMA = {
    "type": "object",
    "properties": {
        "records": {
            "type": "array",
            "minItems": 64,
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer"}},
                "required": ["name", "age"],
            },
        }
    },
    "required": ["records"],
}


class Endpoint:
    """Host, port and path prefix of a base URL such as http://127.0.0.1:8000/v1."""

    def __init__(self, base_url, api_key=None):
        self.base_url = base_url
        url = urllib.parse.urlsplit(base_url)
        if url.scheme != "http":
            raise SystemExit(f"only http:// base URLs are supported, got {base_url}")
        self.host, self.port = url.hostname, url.port or 80
        self.prefix = url.path.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def connect(self, timeout=600):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get_json(self, path):
        conn = self.connect()
        conn.request("GET", self.prefix + path, headers=self.headers)
        response = conn.getresponse()
        body = response.read()
        conn.close()
        if response.status != 200:
            raise RuntimeError(f"GET {path}: {response.status} {body[:500]!r}")
        return json.loads(body)

    def model(self):
        return self.get_json("/models")["data"][0]["id"]

    def healthy(self):
        try:
            conn = self.connect(timeout=5)
            conn.request("GET", "/health")
            status = conn.getresponse().status
            conn.close()
            return status == 200
        except OSError:
            return False

    def metrics(self):
        """The server's Prometheus counters and gauges without labels, by name."""
        conn = self.connect()
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        pairs = (line.split() for line in text.splitlines() if line and not line.startswith("#"))
        return {p[0]: float(p[1]) for p in pairs if len(p) == 2 and "{" not in p[0]}


@contextlib.contextmanager
def serve(binary, args, timeout_s=600, log_path=None):
    """Runs `BINARY serve ARGS` on a free port; yields its /v1 Endpoint once /health answers, and stops it after.

    With log_path, every line the server writes to stderr is also written to that file."""
    command = [binary, "serve", "--host", "127.0.0.1", "--port", "0", *args]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = open(log_path, "w") if log_path else None

    def drain():
        for line in server.stderr:
            if log:
                log.write(line)

    drainer = threading.Thread(target=drain, daemon=True)
    try:
        lines, url = [], None
        for line in server.stderr:
            lines.append(line.rstrip())
            if log:
                log.write(line)
                log.flush()
            if line.startswith("listening on http://"):
                url = line.split()[-1]
                break
        if url is None:
            server.wait()
            raise SystemExit(f"tensorfold exited with {server.returncode}:\n" + "\n".join(lines[-20:]))
        # Keeps draining stderr so the server never blocks on a full pipe.
        drainer.start()
        endpoint = Endpoint(url + "/v1")
        deadline = time.time() + timeout_s
        while not endpoint.healthy():
            if time.time() > deadline or server.poll() is not None:
                raise SystemExit("tensorfold did not become ready")
            time.sleep(0.2)
        yield endpoint
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:  # a graceful shutdown that waits on busy lanes
            server.kill()
            server.wait()
        if log:
            if drainer.is_alive():
                drainer.join(timeout=5)
            log.close()


def sse_events(response):
    """Yields each `data:` payload of a text/event-stream response as it arrives."""
    data = []
    while True:
        line = response.readline()
        if not line:
            break
        line = line.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    if data:
        yield "\n".join(data)


def stream_chat(endpoint, body):
    """One streaming chat completion: times of each content chunk, the text, usage, finish_reason and the time of
    the stream's end, all from the request's start."""
    conn = endpoint.connect()
    start = time.perf_counter()
    conn.request("POST", endpoint.prefix + "/chat/completions", json.dumps(body), endpoint.headers)
    response = conn.getresponse()
    if response.status != 200:
        raise RuntimeError(f"status {response.status}: {response.read()[:500]!r}")
    token_times, text, usage, finish = [], [], None, None
    for data in sse_events(response):
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices", []):
            piece = choice.get("delta", {}).get("content")
            if piece:
                token_times.append(time.perf_counter() - start)
                text.append(piece)
            finish = choice.get("finish_reason") or finish
    done = time.perf_counter() - start
    conn.close()
    return {"token_times": token_times, "text": "".join(text), "usage": usage, "finish_reason": finish, "done_s": done}


def percentile(values, q):
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def chat_body(model, messages, max_tokens, temperature):
    return {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def prefix_messages(prompt, num_streams, prefix, prefix_words, rng):
    """Each stream's messages: the prompt alone, or after a system text of its own or one all streams share."""
    from bench_cache import varied_text  # bench_cache imports this module

    if prefix == "none":
        return [[{"role": "user", "content": prompt}]] * num_streams
    shared = varied_text(rng, prefix_words)
    systems = [shared if prefix == "shared" else varied_text(rng, prefix_words) for _ in range(num_streams)]
    return [[{"role": "system", "content": system}, {"role": "user", "content": prompt}] for system in systems]


def run_streams(endpoint, model, num_streams, max_tokens, prompt, schema=False, temperature=0.8, prefix="none",
                prefix_words=0, rng=None):
    body = chat_body(model, None, max_tokens, temperature)
    if schema:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "records", "schema": RECORDS_SCHEMA}}
    messages = prefix_messages(prompt, num_streams, prefix, prefix_words, rng or random.Random())
    results, errors = [None] * num_streams, []
    barrier = threading.Barrier(num_streams)

    def worker(i):
        barrier.wait()
        try:
            results[i] = stream_chat(endpoint, dict(body, messages=messages[i], seed=i))
        except Exception as error:  # reported below with the stream count
            errors.append(f"stream {i}: {error}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(num_streams)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"{len(errors)} of {num_streams} streams failed; first: {errors[0]}")

    ttfts, decode_rates, total_tokens = [], [], 0
    for result in results:
        times = result["token_times"]
        tokens = result["usage"]["completion_tokens"] if result["usage"] else len(times)
        total_tokens += tokens
        if times:
            ttfts.append(times[0])
        # Decode speed excludes the first token, whose time is prefill and queueing.
        if len(times) >= 2 and times[-1] > times[0]:
            decode_rates.append((tokens - 1) / (times[-1] - times[0]))
    return {
        "streams": num_streams,
        "schema": schema,
        "prefix": prefix,
        "max_tokens": max_tokens,
        "wall_s": wall,
        "output_tokens": total_tokens,
        "decode_tok_s_per_stream_mean": statistics.fmean(decode_rates) if decode_rates else float("nan"),
        "total_output_tok_s": total_tokens / wall if wall > 0 else float("nan"),
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p95_s": percentile(ttfts, 95),
    }


def repeat_ttft(endpoint, model, num_repeats, rng):
    """TTFT of a new short prompt sent once, then the median TTFT of the same prompt sent num_repeats times."""
    # A number from the seed, so a server that served other seeds before has not seen the first send.
    messages = [{"role": "user", "content": f"{REPEAT_PROMPT} (note {rng.randrange(10**6)})."}]
    body = chat_body(model, messages, 8, 0.0)
    ttfts = []
    for _ in range(num_repeats + 1):
        times = stream_chat(endpoint, body)["token_times"]
        if not times:
            raise RuntimeError("a repeated-prompt request streamed no content")
        ttfts.append(times[0])
    return {"repeats": num_repeats, "ttft_first_s": ttfts[0], "ttft_repeat_p50_s": percentile(ttfts[1:], 50)}


def parse_streams(values):
    counts = []
    for value in values or ["1"]:
        counts.extend(int(part) for part in value.split(",") if part.strip())
    if not counts or min(counts) < 1:
        raise SystemExit("--streams needs positive counts")
    return counts


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="the server's /v1 URL")
    parser.add_argument("--streams", action="append", help="concurrent streams: repeatable or a comma list (1)")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per stream (128)")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, help="the user message")
    parser.add_argument("--api-key", help="sent as the Bearer token")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--schema", action="store_true", help="run each count again with a JSON schema")
    parser.add_argument("--temperature", type=float, default=0.8, help="sampling temperature; 0 is greedy (0.8)")
    parser.add_argument("--prefix-words", type=int, default=0, help="run each count with own and shared system texts")
    parser.add_argument("--repeat-ttft", type=int, default=0, help="also time a short prompt sent again, K times")
    parser.add_argument("--seed", type=int, help="seed of the system texts and the repeated prompt (random)")
    parser.add_argument("--warmup", action="store_true", help="send one short unmeasured request first")
    args = parser.parse_args()

    endpoint = Endpoint(args.base_url, args.api_key)
    model = endpoint.model()
    rng = random.Random(args.seed)
    if args.warmup:
        stream_chat(endpoint, chat_body(model, [{"role": "user", "content": "Say hello."}], 8, 0.0))
    repeat = repeat_ttft(endpoint, model, args.repeat_ttft, rng) if args.repeat_ttft > 0 else None
    rows = [
        run_streams(endpoint, model, n, args.max_tokens, args.prompt, schema, args.temperature, prefix,
                    args.prefix_words, rng)
        for n in parse_streams(args.streams)
        for schema in ([False, True] if args.schema else [False])
        for prefix in (PREFIX_MODES[1:] if args.prefix_words > 0 else PREFIX_MODES[:1])
    ]
    if args.json:
        report = {"base_url": args.base_url, "model": model, "prefix_words": args.prefix_words, "results": rows}
        if repeat:
            report["repeat_ttft"] = repeat
        json.dump(report, sys.stdout, indent=2)
        print()
        return
    print(f"model {model}, max_tokens {args.max_tokens}, temperature {args.temperature}")
    print(
        f"{'streams':>7} {'schema':>6} {'prefix':>6} {'decode tok/s/stream':>20} {'total tok/s':>12}"
        f" {'TTFT p50 s':>11} {'TTFT p95 s':>11}"
    )
    for row in rows:
        schema = "yes" if row["schema"] else "no"
        print(
            f"{row['streams']:>7} {schema:>6} {row['prefix']:>6} {row['decode_tok_s_per_stream_mean']:>20.1f}"
            f" {row['total_output_tok_s']:>12.1f}"
            f" {row['ttft_p50_s']:>11.3f} {row['ttft_p95_s']:>11.3f}"
        )
    if repeat:
        print(f"repeated prompt, 1 stream: TTFT first {repeat['ttft_first_s']:.3f} s,"
              f" repeats p50 {repeat['ttft_repeat_p50_s']:.3f} s ({repeat['repeats']} repeats)")


if __name__ == "__main__":
    main()

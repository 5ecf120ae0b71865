#!/usr/bin/env python3
"""Speech streaming under load: time to first audio, real-time factor and audio throughput at N streams (stdlib only).

For each N in --streams and each format in --format it starts N streaming /v1/audio/speech requests at once
(response_format pcm by default, 16-bit LE mono, distinct seeds, a fixed set of sentences) and measures per stream:

    ttfa_s    time to first audio byte, from sending the request (the server sends a format's header with the
              first audio, so for every format this is the first encoded sound)
    wall_s    from sending the request to the last byte
    audio_s   audio received: bytes / 2 / the x-sample-rate header (pcm and wav only; the encoded formats leave it,
              the RTF and the throughput out)
    rtf       real-time factor = wall_s / audio_s (wall seconds spent streaming per second of audio
              produced, first-byte wait included); below 1 means faster than real time

and per configuration: TTFA p50, p90 and p95, per-stream RTF p50, p90 and p95, the number of streams faster than
real time (rtf < 1), and throughput as the audio seconds of all streams per wall second (first request sent to last
stream done), the median over --repeat. `--max-tokens N` sends `"max_tokens": N` in every speech body: for a Drama
voice the most tokens the language model generates for the request, 7 per frame of 2048 samples at 24 kHz, so a
model that never ends its speech (as tools/make_drama.py's orpheus-3b shape) gives every stream the same
(N // 7) * 2048 / 24000 s of audio.
With --text-streams K each N runs twice, alone and beside K streaming text requests (max_tokens --text-max-tokens,
started before the speech streams and looping until they finish); their tokens/s counts content chunks that
arrive while the speech streams run. One JSON object per configuration goes to stdout, a table to stderr.
Any HTTP error, broken stream or stream without audio exits 1 with a message.

    python3 tools/bench_speech.py --base-url http://127.0.0.1:8000/v1 --streams 1,8,32 --text-streams 4
    python3 tools/bench_speech.py --binary target/release/tensorfold --model M --speech-model DIR --streams 1,8,32
    python3 tools/bench_speech.py --binary target/release/tensorfold --voice heart --format pcm,mp3,opus,aac,flac
    python3 tools/bench_speech.py --binary .device/tensorfold --device cuda --model DIR --speech-model DIR \
        --serve-arg=--no-voice --voice tara --max-tokens 253 --streams 64,128 --text-streams 32

With --binary, --model and --speech-model may name the same Drama directory: the text streams then run on the
speech model's own lanes. --server-log FILE keeps the server's stderr.
"""

import argparse
import contextlib
import http.client
import json
import shlex
import signal
import statistics
import sys
import threading
import time

from bench_openai import Endpoint, parse_streams, percentile, serve, sse_events

RTF_DEFINITION = (
    "rtf = stream wall seconds (request sent to last byte) / audio seconds received; below 1 is faster than real time"
)

SENTENCES = [
    "The lighthouse keeper climbed the stairs one last time before the storm arrived.",
    "Please remember to water the plants on the balcony while I am away.",
    "Our train leaves at seven fifteen, so we should be at the station by seven.",
    "She opened the letter slowly, afraid of what it might say.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Thank you for calling; all of our agents are busy helping other customers.",
    "In the morning the valley was filled with a thick, silver fog.",
    "Could you tell me the way to the nearest library, please?",
]
TEXT_PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."


class BenchError(Exception):
    """A failure the bench reports and exits 1 on."""


FORMATS = ["pcm", "wav", "mp3", "opus", "aac", "flac"]
# Bytes before the samples: the formats whose audio seconds the byte count gives.
RAW_HEADER_BYTES = {"pcm": 0, "wav": 44}


def speech_stream(endpoint, model, text, seed, voice, max_tokens=None, response_format="pcm"):
    """One speech stream read as it arrives: ttfa, wall, audio bytes and the sample rate."""
    body = {"model": model, "input": text, "response_format": response_format, "stream_format": "audio", "seed": seed}
    if voice:
        body["voice"] = voice
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    conn = endpoint.connect()
    start = time.perf_counter()
    try:
        conn.request("POST", endpoint.prefix + "/audio/speech", json.dumps(body), endpoint.headers)
        response = conn.getresponse()
        if response.status != 200:
            raise BenchError(f"POST /audio/speech: {response.status} {response.read()[:500]!r}")
        rate = int(response.getheader("x-sample-rate") or 0)
        if rate <= 0:
            raise BenchError("POST /audio/speech: no x-sample-rate header")
        first, num_bytes = None, 0
        # read1 returns what one chunk holds; read(n) would wait for n bytes and hide the first audio.
        while chunk := response.read1(65536):
            first = first if first is not None else time.perf_counter()
            num_bytes += len(chunk)
        end = time.perf_counter()
    except (http.client.HTTPException, OSError) as error:
        raise BenchError(f"POST /audio/speech: stream broken: {error!r}") from error
    finally:
        conn.close()
    if num_bytes == 0:
        raise BenchError(f"POST /audio/speech (seed {seed}): stream ended with no audio")
    audio_s = rtf = None
    if response_format in RAW_HEADER_BYTES:
        num_bytes -= RAW_HEADER_BYTES[response_format]
        if num_bytes % 2:
            raise BenchError(f"POST /audio/speech (seed {seed}): {num_bytes} bytes is not whole 16-bit samples")
        audio_s = num_bytes / 2 / rate
        rtf = (end - start) / audio_s
    return {"start": start, "end": end, "ttfa_s": first - start, "wall_s": end - start,
            "audio_s": audio_s, "rtf": rtf, "sample_rate": rate, "seed": seed}


def text_body(model, api, max_tokens, seed):
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0.8, "seed": seed, "stream": True}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": TEXT_PROMPT}]
    else:
        body["prompt"] = TEXT_PROMPT
    return body


def text_stream(endpoint, api, body, on_chunk):
    """One streaming text request; on_chunk(time) for each chunk that carries text. Returns the HTTP status."""
    path = "/chat/completions" if api == "chat" else "/completions"
    conn = endpoint.connect()
    try:
        conn.request("POST", endpoint.prefix + path, json.dumps(body), endpoint.headers)
        response = conn.getresponse()
        if response.status != 200:
            return response.status, response.read()[:500]
        for data in sse_events(response):
            if data == "[DONE]":
                break
            for choice in json.loads(data).get("choices", []):
                if (choice.get("delta") or {}).get("content") or choice.get("text"):
                    on_chunk(time.perf_counter())
        return 200, b""
    except (http.client.HTTPException, OSError) as error:
        raise BenchError(f"POST {path}: stream broken: {error!r}") from error
    finally:
        conn.close()


def pick_text_api(endpoint, model, wanted, max_tokens):
    """The text API to load the server with; 'auto' falls back to completions when the model has no chat template."""
    for api in ["chat", "completions"] if wanted == "auto" else [wanted]:
        status, body = text_stream(endpoint, api, text_body(model, api, max_tokens, 0), lambda _: None)
        if status == 200:
            return api
        if not (wanted == "auto" and status == 400 and b'"param":"messages"' in body):
            raise BenchError(f"text warm-up on {api}: {status} {body!r}")
    raise BenchError("no text API answered")


class TextTraffic:
    """K threads looping streaming text requests until stopped, keeping the time of every text chunk."""

    def __init__(self, endpoint, model, api, num_streams, max_tokens):
        self.stop, self.errors = threading.Event(), []
        self.chunk_times, self.num_requests = [[] for _ in range(num_streams)], [0] * num_streams
        self.ready = [threading.Event() for _ in range(num_streams)]
        self.threads = [
            threading.Thread(target=self._loop, args=(endpoint, model, api, max_tokens, i)) for i in range(num_streams)
        ]

    def _loop(self, endpoint, model, api, max_tokens, i):
        def on_chunk(t):
            self.chunk_times[i].append(t)
            self.ready[i].set()

        round_ = 0
        try:
            while not self.stop.is_set():
                body = text_body(model, api, max_tokens, 1000 * i + round_)
                status, body = text_stream(endpoint, api, body, on_chunk)
                if status != 200:
                    raise BenchError(f"text stream {i}: {status} {body!r}")
                self.num_requests[i] += 1
                round_ += 1
        except Exception as error:  # reported by finish()
            self.errors.append(f"text stream {i}: {error}")
        finally:
            self.ready[i].set()

    def start(self):
        """Starts every stream and waits until each has produced text, so the speech streams meet a busy server."""
        for thread in self.threads:
            thread.start()
        for ready in self.ready:
            ready.wait()
        if self.errors:
            self.finish(0, 0)

    def finish(self, window_start, window_end):
        """Stops the loops (each ends its current request) and returns tokens/s inside the window."""
        self.stop.set()
        for thread in self.threads:
            thread.join()
        if self.errors:
            raise BenchError(f"{len(self.errors)} text streams failed; first: {self.errors[0]}")
        window = window_end - window_start
        counts = [sum(window_start <= t <= window_end for t in times) for times in self.chunk_times]
        return {"tok_s_total": sum(counts) / window, "tok_s_per_stream_median": statistics.median(counts) / window,
                "requests_completed": sum(self.num_requests)}


def run_once(endpoint, model, args, num_streams, num_text_streams, text_api, response_format):
    """One round: N speech streams started together, beside the text traffic if any."""
    traffic = None
    if num_text_streams:
        traffic = TextTraffic(endpoint, model, text_api, num_text_streams, args.text_max_tokens)
        traffic.start()
    results, errors = [None] * num_streams, []
    barrier = threading.Barrier(num_streams)

    def worker(i):
        barrier.wait()
        try:
            text = SENTENCES[i % len(SENTENCES)]
            seed = args.seed + i
            results[i] = speech_stream(endpoint, model, text, seed, args.voice, args.max_tokens, response_format)
        except Exception as error:  # reported below with the stream count
            errors.append(f"speech stream {i}: {error}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(num_streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        if traffic:
            traffic.stop.set()
            for thread in traffic.threads:
                thread.join()
        raise BenchError(f"{len(errors)} of {num_streams} speech streams failed; first: {errors[0]}")
    window_start, window_end = min(r["start"] for r in results), max(r["end"] for r in results)
    text = traffic.finish(window_start, window_end) if traffic else None
    return results, window_end - window_start, text


def known(function, values):
    """function(values), or None where the format left them unknown."""
    return None if any(v is None for v in values) else function(values)


def run_config(endpoint, model, args, num_streams, num_text_streams, text_api, response_format):
    """--repeat rounds of one configuration, summed up as one JSON-ready dict."""
    streams, rounds = [], []
    for _ in range(args.repeat):
        results, wall, text = run_once(endpoint, model, args, num_streams, num_text_streams, text_api, response_format)
        streams += results
        audio = known(sum, [r["audio_s"] for r in results])
        rounds.append({"wall_s": wall, "audio_s": audio, "audio_s_per_wall_s": None if audio is None else audio / wall,
                       "text": text})
    rates = {r["sample_rate"] for r in streams}
    ttfa, rtf = [r["ttfa_s"] for r in streams], [r["rtf"] for r in streams]
    row = {
        "streams": num_streams,
        "text_streams": num_text_streams,
        "repeat": args.repeat,
        "response_format": response_format,
        "sample_rate": rates.pop() if len(rates) == 1 else sorted(rates),
        "rtf_definition": RTF_DEFINITION,
        "max_tokens": args.max_tokens,
        "ttfa_median_s": statistics.median(ttfa),
        "ttfa_p50_s": percentile(ttfa, 50),
        "ttfa_p90_s": percentile(ttfa, 90),
        "ttfa_p95_s": percentile(ttfa, 95),
        "ttfa_max_s": max(ttfa),
        "rtf_median": known(statistics.median, rtf),
        "rtf_p50": known(lambda v: percentile(v, 50), rtf),
        "rtf_p90": known(lambda v: percentile(v, 90), rtf),
        "rtf_p95": known(lambda v: percentile(v, 95), rtf),
        "streams_faster_than_real_time": known(lambda v: sum(r < 1 for r in v), rtf),
        "streams_measured": len(rtf),
        "audio_s_per_stream_median": known(statistics.median, [r["audio_s"] for r in streams]),
        "audio_s_per_wall_s": known(statistics.median, [r["audio_s_per_wall_s"] for r in rounds]),
        "rounds": rounds,
    }
    if num_text_streams:
        row["text_api"] = text_api
        row["text_max_tokens"] = args.text_max_tokens
        row["text_tok_s_total"] = statistics.median(r["text"]["tok_s_total"] for r in rounds)
        row["text_tok_s_per_stream_median"] = statistics.median(r["text"]["tok_s_per_stream_median"] for r in rounds)
    return row


def serve_args(args):
    """The `serve` words for --binary: every stream gets a lane, with the models and any --serve-arg words."""
    parallel = args.parallel or max(parse_streams(args.streams)) + args.text_streams
    words = ["--parallel", str(parallel)] + (["--speech-model", args.speech_model] if args.speech_model else [])
    words += ["--model", args.model] if args.model else []
    words += ["--device", args.device] if args.device else []
    return words + [word for arg in args.serve_arg or [] for word in shlex.split(arg)]


def cell(value, width, digits):
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def print_table(rows):
    print(f"{'format':>6} {'streams':>7} {'text':>4} {'TTFA p50 s':>10} {'TTFA p95 s':>10} {'RTF p50':>8}"
          f" {'RTF p95':>8} {'rtf < 1':>8} {'audio s/s':>9} {'text tok/s':>10}", file=sys.stderr)
    for row in rows:
        text = f"{row['text_tok_s_total']:>10.1f}" if row["text_streams"] else f"{'-':>10}"
        faster = row["streams_faster_than_real_time"]
        real_time = "-" if faster is None else f"{faster}/{row['streams_measured']}"
        print(f"{row['response_format']:>6} {row['streams']:>7} {row['text_streams']:>4} {row['ttfa_p50_s']:>10.3f}"
              f" {row['ttfa_p95_s']:>10.3f} {cell(row['rtf_p50'], 8, 3)} {cell(row['rtf_p95'], 8, 3)} {real_time:>8}"
              f" {cell(row['audio_s_per_wall_s'], 9, 2)} {text}", file=sys.stderr)
    print(RTF_DEFINITION, file=sys.stderr)


def parse_formats(values):
    """--format values (repeatable, comma lists) in order, each once; pcm when none is given."""
    formats = []
    for value in values or ["pcm"]:
        for name in value.split(","):
            if name not in FORMATS:
                raise BenchError(f"--format {name!r}: use {', '.join(FORMATS)}")
            formats += [] if name in formats else [name]
    return formats


def bench(args):
    endpoint = Endpoint(args.base_url, args.api_key)
    model = args.model_id or endpoint.model()
    formats = parse_formats(args.format)
    for response_format in formats:  # warm-up, not measured
        speech_stream(endpoint, model, SENTENCES[0], args.seed, args.voice, args.max_tokens, response_format)
    text_api = pick_text_api(endpoint, model, args.text_api, args.text_max_tokens) if args.text_streams else None
    rows = []
    for num_streams in parse_streams(args.streams):
        for num_text_streams in [0, args.text_streams] if args.text_streams else [0]:
            for response_format in formats:
                row = run_config(endpoint, model, args, num_streams, num_text_streams, text_api, response_format)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print_table(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", "--url", help="a running server's /v1 URL (default http://127.0.0.1:8000/v1)")
    parser.add_argument("--binary", help="start this tensorfold binary on a free port instead, and stop it at the end")
    parser.add_argument("--model", help="with --binary: the text model to serve (the server's default if not given)")
    parser.add_argument("--speech-model", help="with --binary: a Drama checkpoint directory (default: the default voice)")
    parser.add_argument("--parallel", type=int, help="with --binary: lanes (default: most streams + text streams)")
    parser.add_argument("--device", choices=["cpu", "cuda"], help="with --binary: where the models run (serve's default)")
    parser.add_argument("--serve-arg", action="append", help="with --binary: more serve arguments, repeatable")
    parser.add_argument("--server-log", help="with --binary: write the server's stderr to this file")
    parser.add_argument("--streams", action="append", help="concurrent speech streams: repeatable or a comma list (1)")
    parser.add_argument("--text-streams", type=int, default=0, help="also run each N beside this many text streams")
    parser.add_argument("--text-max-tokens", type=int, default=64, help="max_tokens of each text request (64)")
    parser.add_argument("--text-api", choices=["auto", "chat", "completions"], default="auto",
                        help="/chat/completions, /completions, or chat unless the model has no template (auto)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds per configuration (1)")
    parser.add_argument("--seed", type=int, default=1, help="seed of stream 0; stream i gets seed + i (1)")
    parser.add_argument("--voice", help="the voice of every stream (the server's default if not given)")
    parser.add_argument("--format", action="append",
                        help=f"response_format of every stream: repeatable or a comma list of {','.join(FORMATS)} (pcm)")
    parser.add_argument("--max-tokens", type=int, help="the speech body's max_tokens: most LM tokens per stream (Drama)")
    parser.add_argument("--model-id", help="the request's model field (default: the first of /v1/models)")
    parser.add_argument("--api-key", help="sent as the Bearer token")
    args = parser.parse_args()
    if args.binary and args.base_url:
        parser.error("--binary cannot go with --base-url")
    if args.repeat < 1 or args.text_streams < 0:
        parser.error("--repeat must be at least 1 and --text-streams not negative")
    if args.max_tokens is not None and args.max_tokens < 1:
        parser.error("--max-tokens must be at least 1")

    # A timeout's SIGTERM unwinds through serve(), which stops the server it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))
    try:
        server = serve(args.binary, serve_args(args), log_path=args.server_log) if args.binary else None
        with server or contextlib.nullcontext() as endpoint:
            args.base_url = endpoint.base_url if endpoint else args.base_url or "http://127.0.0.1:8000/v1"
            bench(args)
    except (BenchError, RuntimeError, OSError, http.client.HTTPException) as error:
        print(f"bench_speech: {args.base_url}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Drop thousands of requests at random moments and check the server gives everything back (stdlib only).

    python3 tools/cancel_storm.py --base-url http://127.0.0.1:8000 --count 10000 --concurrency 16

Each drop picks a request (chat, completions, responses or messages, streamed or not, speech when the server has
a voice, embeddings) and a moment: before the body is whole, right after it (queued or in prefill), or after a
random number of reply bytes; and a way to go: close, half-close then close, or a reset (SO_LINGER 0). After every
--check-every drops and at the end it waits until the server is idle and compares /metrics with the baseline taken
before: requests running and waiting, KV pages held by requests and the ledger's bytes must all be back. A request
that a client did not drop (one in five, read to its end) must have succeeded. It prints one JSON line and exits 1 on a leak.
"""

import argparse
import json
import random
import socket
import struct
import sys
import threading
import time
import urllib.parse
import urllib.request

WATCHED = ["tensorfold_requests_running", "tensorfold_requests_waiting", "tensorfold_kv_pages_used",
           "tensorfold_ledger_total_bytes"]
MOMENTS = ["half_body", "after_body", "after_bytes", "after_bytes", "read_all"]
EXITS = ["close", "half_close", "reset"]


def metrics(base_url):
    """The watched gauges from /metrics."""
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in WATCHED:
            values[name] = float(value)
    return values


def voices(base_url):
    """The voice names /v1/audio/voices lists, every model's."""
    try:
        with urllib.request.urlopen(f"{base_url}/v1/audio/voices", timeout=30) as response:
            models = json.load(response).get("data", [])
        return [v["voice"] for m in models for v in m.get("voices", [])]
    except (OSError, ValueError, KeyError):
        return []


def body_for(kind, rng, voice):
    words = " ".join(rng.choice(["sea", "light", "stone", "river", "map", "song"]) for _ in range(rng.randint(1, 20)))
    stream = kind.endswith("_stream")
    if kind.startswith("chat"):
        return "/v1/chat/completions", {"model": "any", "messages": [{"role": "user", "content": words}],
                                         "max_tokens": rng.randint(1, 32), "stream": stream, "seed": rng.randint(0, 99)}
    if kind.startswith("completion"):
        return "/v1/completions", {"model": "any", "prompt": words, "max_tokens": rng.randint(1, 32), "stream": stream}
    if kind.startswith("responses"):
        return "/v1/responses", {"model": "any", "input": words, "max_output_tokens": rng.randint(1, 32),
                                 "stream": stream, "store": False}
    if kind.startswith("messages"):
        return "/v1/messages", {"model": "any", "messages": [{"role": "user", "content": words}],
                                "max_tokens": rng.randint(1, 32), "stream": stream}
    if kind == "speech":
        return "/v1/audio/speech", {"model": "tts-1", "voice": voice, "input": words, "response_format": "pcm"}
    return "/v1/embeddings", {"model": "any", "input": [words, words[::-1]]}


def drop_one(host, port, rng, kinds, voice):
    """One request, dropped at a random moment; returns whether a read-to-the-end request succeeded (or None)."""
    kind = rng.choice(kinds)
    path, body = body_for(kind, rng, voice)
    payload = json.dumps(body).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    moment, exit_how = rng.choice(MOMENTS), rng.choice(EXITS)
    sock = socket.create_connection((host, port), timeout=120)
    ok = None
    try:
        if moment == "half_body":
            sock.sendall(head + payload[: rng.randint(0, len(payload) - 1)])
        else:
            sock.sendall(head + payload)
        if moment == "after_body":
            time.sleep(rng.random() * 0.05)
        elif moment == "after_bytes":
            wanted, got = rng.randint(1, 4000), 0
            while got < wanted:
                chunk = sock.recv(min(4096, wanted - got))
                if not chunk:
                    break
                got += len(chunk)
        elif moment == "read_all":
            reply = b""
            while chunk := sock.recv(65536):
                reply += chunk
            ok = reply.startswith(b"HTTP/1.1 200")
    finally:
        if exit_how == "half_close":
            try:
                sock.shutdown(socket.SHUT_WR)
                time.sleep(rng.random() * 0.02)
            except OSError:
                pass
        elif exit_how == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    return ok


def settle(base_url, baseline, timeout):
    """Waits until the watched gauges equal the baseline; returns the last reading and whether they did."""
    deadline = time.monotonic() + timeout
    while True:
        now = metrics(base_url)
        if all(now.get(k) == baseline.get(k) for k in WATCHED):
            return now, True
        if time.monotonic() > deadline:
            return now, False
        time.sleep(0.1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server, without /v1")
    parser.add_argument("--count", type=int, default=1000, help="requests to drop (1000)")
    parser.add_argument("--concurrency", type=int, default=16, help="clients at once (16)")
    parser.add_argument("--check-every", type=int, default=1000, help="drops between checks of the baseline")
    parser.add_argument("--settle-seconds", type=float, default=60.0, help="how long the server has to get idle")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    url = urllib.parse.urlparse(args.base_url)
    host, port = url.hostname, url.port or 80
    voice_list = voices(args.base_url)
    kinds = ["chat_stream", "chat", "completion_stream", "completion", "embeddings"]
    kinds += ["responses_stream", "responses", "messages_stream", "messages"]
    kinds += ["speech"] * bool(voice_list)
    baseline = metrics(args.base_url)
    summary = {"dropped": 0, "read_to_end": 0, "failed_to_end": 0, "client_errors": 0, "checks": 0, "leaks": []}
    lock = threading.Lock()
    started = time.monotonic()
    done = 0
    while done < args.count:
        batch = min(args.check_every, args.count - done)
        counter = iter(range(batch))

        def worker(seed):
            rng = random.Random(seed)
            while True:
                with lock:
                    if next(counter, None) is None:
                        return
                try:
                    ok = drop_one(host, port, rng, kinds, voice_list[0] if voice_list else None)
                except OSError:
                    ok = "error"
                with lock:
                    if ok is None:
                        summary["dropped"] += 1
                    elif ok == "error":
                        summary["client_errors"] += 1
                    else:
                        summary["read_to_end"] += 1
                        summary["failed_to_end"] += not ok

        threads = [threading.Thread(target=worker, args=(args.seed * 1000003 + done + i,))
                   for i in range(args.concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done += batch
        reading, idle = settle(args.base_url, baseline, args.settle_seconds)
        summary["checks"] += 1
        if not idle:
            summary["leaks"].append({"after": done, "metrics": reading, "baseline": baseline})
    summary["requests"] = done
    summary["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(summary))
    return 1 if summary["leaks"] or summary["failed_to_end"] else 0


if __name__ == "__main__":
    sys.exit(main())

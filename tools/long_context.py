"""Long contexts through the server: a prompt past --context is refused with a 400 naming both sizes, and a long
prompt within it gets its first token.

    python3 tools/long_context.py --binary .device/tensorfold --ckpt DIR [--context 131072] [--prompt 65536]

Starts `tensorfold serve` on the checkpoint with the given context (and --device cuda unless --device says
otherwise), sends a prompt of context + 1 tokens and then one of --prompt tokens (one output token each), prints
one JSON line per request and exits non-zero when the first is not refused with a 400 or the second fails.
"""

import argparse
import http.client
import json
import pathlib
import random
import socket
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_gpu import http_status, id_ceiling, stop_server  # noqa: E402


def complete(port, ids, timeout):
    """(status, seconds, body) of one completion of `ids`, one output token."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    body = json.dumps(dict(prompt=ids, max_tokens=1, temperature=0)).encode()
    start = time.perf_counter()
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, time.perf_counter() - start, resp.read().decode(errors="replace")
    finally:
        conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=".device/tensorfold")
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--prompt", type=int, default=65536)
    ap.add_argument("--log", default="long-context-server.log")
    ap.add_argument("--ids-from", help="a directory with config.json for the token id range (default --ckpt)")
    args = ap.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [args.binary, "serve", "--model", args.ckpt, "--device", args.device, "--no-voice", "--port", str(port),
           "--parallel", "4", "--context", str(args.context)]
    log = open(args.log, "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    ok = False
    try:
        started = time.perf_counter()
        while http_status(port, "/health") != 200:
            if proc.poll() is not None or time.perf_counter() - started > 240:
                print(json.dumps({"error": "the server did not become healthy", "exit": proc.poll()}))
                return 1
            time.sleep(0.5)
        ceiling = id_ceiling(args.ids_from or args.ckpt)
        rng = random.Random(5)
        too_long = [rng.randrange(ceiling) for _ in range(args.context + 1)]
        status, secs, body = complete(port, too_long, 120)
        refused = status == 400 and str(args.context) in body
        print(json.dumps({"prompt_tokens": len(too_long), "status": status, "seconds": round(secs, 3),
                          "refused_naming_sizes": refused, "body": body[:300]}), flush=True)
        within = [rng.randrange(ceiling) for _ in range(args.prompt)]
        status, secs, body = complete(port, within, 600)
        print(json.dumps({"prompt_tokens": len(within), "status": status, "seconds": round(secs, 3),
                          "body": body[:200] if status != 200 else ""}), flush=True)
        ok = refused and status == 200
    finally:
        stop_server(proc)
        log.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

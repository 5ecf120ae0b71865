#!/usr/bin/env python3
"""GPU benchmark: our server against transformers on one seeded random checkpoint, in one unattended run.

    bench_gpu.py run --shape llama-3.1-8b --binary .device/tensorfold --out DIR [--work DIR] [--commit SHA]

Each phase (checkpoint, bandwidth, server, peer) runs as a child process under its own time limit and writes
DIR/phase_NAME.json as it goes, so a phase that fails or runs out of time costs only itself; the report is
DIR/results.json and DIR/results.md. Uses only the standard library, torch and transformers."""

import argparse
import datetime
import http.client
import json
import os
import pathlib
import random
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import tempfile
import sys
import threading
import time

T0 = float(os.environ.get("BENCH_T0") or time.time())
TOOLS = pathlib.Path(__file__).resolve().parent
PROMPT_IDS = 32
# Random prompt ids stay below this and below the first special token.
ID_CEILING = 32000
# Each phase: its cap in seconds, and the least it is left when earlier phases ran long.
PHASES = {"checkpoint": (300, 60), "bandwidth": (60, 20), "server": (300, 60), "peer": (240, 60)}


def log(phase, message):
    print(f"[{time.time() - T0:7.1f}s] {phase}: {message}", flush=True)


class Recorder:
    """A phase's results, rewritten to its JSON file after every change so a killed phase keeps them."""

    def __init__(self, path):
        self.path, self.data = pathlib.Path(path), {}
        self.set("status", "running")

    def set(self, key, value):
        self.update(**{key: value})

    def update(self, **values):
        self.data.update(values)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.path)


def random_prompts(args, count, length, seed):
    rng = random.Random(seed)
    return [[rng.randrange(args.id_ceiling) for _ in range(length)] for _ in range(count)]


def id_ceiling(ckpt):
    """Below the vocabulary, the config's special ids and the tokenizer's added tokens, and at most ID_CEILING."""
    config = json.loads((pathlib.Path(ckpt) / "config.json").read_text())
    ids = [config["vocab_size"], ID_CEILING]
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = config.get(key)
        ids += value if isinstance(value, list) else [value] if value is not None else []
    tok = pathlib.Path(ckpt) / "tokenizer.json"
    if tok.is_file():
        ids += [t["id"] for t in json.loads(tok.read_text()).get("added_tokens", [])]
    return min(ids)


def safetensors_sizes(ckpt):
    """Bytes and shape of every tensor, from the safetensors headers alone."""
    sizes = {}
    for path in sorted(pathlib.Path(ckpt).glob("*.safetensors")):
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, info in header.items():
            if name != "__metadata__":
                begin, end = info["data_offsets"]
                sizes[name] = (end - begin, info["shape"])
    return sizes


def bytes_per_token(ckpt):
    """Weight bytes one batch-1 decode step reads: all but the input embedding, of which one row."""
    sizes = safetensors_sizes(ckpt)
    total = sum(n for n, _ in sizes.values())
    embed = next((k for k in sizes if k.endswith("embed_tokens.weight")), None)
    tied = not any(k.endswith("lm_head.weight") for k in sizes)
    if embed is None or tied:
        # A tied embedding is read whole as the output head.
        return total, total
    n, shape = sizes[embed]
    return total, total - n + n // shape[0]


def phase_bandwidth(args, rec):
    import torch

    rec.update(gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    size = args.copy_gib << 30
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1)
    dst.copy_(src)
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    formula = "(bytes read + bytes written) / best time = 2 * buffer bytes / seconds, 1e9 bytes per GB"
    rec.update(copy_bytes=size, copy_seconds_best=min(times), bandwidth_gb_s=2 * size / min(times) / 1e9)
    rec.update(formula=formula, status="ok")
    log("bandwidth", f"{rec.data['bandwidth_gb_s']:.0f} GB/s copying {args.copy_gib} GiB (best of {len(times)})")


def http_status(port, path, timeout=2.0):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


class Stream:
    """One streamed completion: when each event came, the usage, any error."""

    def __init__(self, port, ids, max_tokens, timeout):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        body = dict(prompt=ids, max_tokens=max_tokens, temperature=0, stream=True, ignore_eos=True)
        self.body = json.dumps(dict(body, stream_options={"include_usage": True})).encode()
        self.sent = self.first = self.last = None
        self.events, self.tokens, self.error, self.finish = 0, None, None, None

    def run(self):
        try:
            self.sent = time.perf_counter()
            self.conn.request("POST", "/v1/completions", self.body, {"Content-Type": "application/json"})
            resp = self.conn.getresponse()
            if resp.status != 200:
                self.error = f"HTTP {resp.status}: {resp.read()[:300]!r}"
                return self
            # read1 hands over what arrived (about one event) without the per-byte cost of readline.
            buf = b""
            while data := resp.read1(65536):
                now = time.perf_counter()
                *events, buf = (buf + data).split(b"\n\n")
                for event in events:
                    if event.startswith(b"data:"):
                        if event[5:].strip() == b"[DONE]":
                            return self
                        self.event(json.loads(event[5:]), now)
            self.error = self.error or "stream ended without [DONE]"
        except Exception as e:  # noqa: BLE001 - a failed stream is a result, not a crash
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.conn.close()
        return self

    def event(self, chunk, now):
        if "error" in chunk:
            self.error = str(chunk["error"])[:300]
            return
        if chunk.get("usage"):
            self.tokens = chunk["usage"].get("completion_tokens")
        for choice in chunk.get("choices") or []:
            if choice.get("text") or choice.get("finish_reason"):
                self.first = self.first or now
                self.last = now
                self.events += 1
            self.finish = choice.get("finish_reason") or self.finish

    def count(self):
        return self.tokens if self.tokens is not None else self.events

    def decode_rate(self):
        n, ok = self.count(), not self.error and self.first and self.last > self.first
        return (n - 1) / (self.last - self.first) if ok and n >= 2 else None


def run_streams(port, prompts, max_tokens, timeout):
    """All prompts at once, one thread and connection each; returns (streams, wall seconds, client cpu share)."""
    streams = [Stream(port, ids, max_tokens, timeout) for ids in prompts]
    for s in streams:
        s.conn.connect()
    barrier = threading.Barrier(len(streams) + 1)

    def go(s):
        barrier.wait()
        s.run()

    threads = [threading.Thread(target=go, args=(s,), daemon=True) for s in streams]
    for t in threads:
        t.start()
    cpu = time.process_time()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join(timeout)
    # The wall time runs from the release of every request to the last token of any.
    end = max((s.last for s in streams if s.last), default=time.perf_counter())
    return streams, end - start, (time.process_time() - cpu) / max(time.perf_counter() - start, 1e-9)


def stream_summary(streams, wall, cpu_share):
    ok = [s for s in streams if not s.error]
    tokens = sum(s.count() for s in ok)
    ttfts = [s.first - s.sent for s in ok if s.first]
    rates = [r for r in (s.decode_rate() for s in ok) if r]
    return {
        "streams": len(streams),
        "failed": len(streams) - len(ok),
        "errors": sorted({s.error for s in streams if s.error})[:5],
        "output_tokens": tokens,
        "wall_s": wall,
        "total_tok_s": tokens / wall if wall > 0 and ok else None,
        "ttft_median_ms": statistics.median(ttfts) * 1e3 if ttfts else None,
        "per_stream_decode_median_tok_s": statistics.median(rates) if rates else None,
        "finish_reasons": sorted({str(s.finish) for s in ok}),
        # Streams that ended before max_tokens (an end-of-sequence token; the server may ignore ignore_eos).
        "stopped_early": sum(s.finish == "stop" for s in ok),
        "client_cpu_share": cpu_share,
    }


def stop_server(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def tail(path, lines=20):
    try:
        return pathlib.Path(path).read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return []


def phase_server(args, rec):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log_path = pathlib.Path(args.out) / "server.log"
    cmd = [args.binary, "serve", "--model", str(args.ckpt)]
    cmd += ["--device", args.device] if args.device != "none" else []
    cmd += ["--no-voice", "--port", str(port), "--parallel", str(args.parallel), "--context", str(args.context)]
    cmd += ["--round-tokens", str(args.round_tokens)] + list(args.server_arg or [])
    log_file = open(log_path, "wb")
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    rec.set("command", cmd)
    log("server", " ".join(cmd))
    started = time.perf_counter()
    try:
        while http_status(port, "/health") != 200:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited with {proc.returncode} before /health answered 200")
            if time.perf_counter() - started > args.load_timeout:
                raise RuntimeError(f"/health not 200 after {args.load_timeout}s")
            time.sleep(0.5)
        rec.set("ready_s", time.perf_counter() - started)
        log("server", f"healthy after {rec.data['ready_s']:.1f}s")
        server_measurements(args, rec, port)
        rec.set("status", "ok")
    except Exception as e:  # noqa: BLE001 - recorded for the report
        rec.update(status="failed", error=f"{type(e).__name__}: {e}", log_tail=tail(log_path))
        log("server", f"FAILED: {rec.data['error']}")
    finally:
        rec.set("exit_code", stop_server(proc))
        log_file.close()
        log("server", f"stopped (exit {proc.returncode})")


def server_measurements(args, rec, port):
    timeout = args.request_timeout
    seed = 1000
    warm = Stream(port, random_prompts(args, 1, PROMPT_IDS, seed)[0], 16, timeout).run()
    if warm.error:
        raise RuntimeError(f"warm-up request: {warm.error}")
    singles = []
    for i in range(args.single_repeats):
        s = Stream(port, random_prompts(args, 1, PROMPT_IDS, seed + 1 + i)[0], args.single_tokens, timeout).run()
        singles.append({"tokens": s.count(), "decode_tok_s": s.decode_rate(), "error": s.error})
        log("server", f"1 stream: {s.count()} tokens, {s.decode_rate() or 0:.1f} tok/s decode {s.error or ''}")
    rates = [x["decode_tok_s"] for x in singles if x["decode_tok_s"]]
    rec.set("single", {"runs": singles, "decode_tok_s": max(rates) if rates else None})
    for n in args.streams:
        prompts = random_prompts(args, n, args.stream_prompt, seed + 100 * n)
        summary = stream_summary(*run_streams(port, prompts, args.stream_tokens, timeout))
        rec.set(f"streams_{n}", summary)
        tok_s, cpu = summary["total_tok_s"] or 0, summary["client_cpu_share"]
        log("server", f"{n} streams: {summary['output_tokens']} tokens, {tok_s:.0f} tok/s, client cpu {cpu:.2f}")
    ttfts = []
    long_prompts = random_prompts(args, args.ttft_repeats + 1, args.long_prompt, seed + 7)
    for i, ids in enumerate(long_prompts):
        s = Stream(port, ids, 1, timeout).run()
        ms = (s.first - s.sent) * 1e3 if s.first and not s.error else None
        if i > 0:
            ttfts.append({"ms": ms, "error": s.error})
        log("server", f"cold {args.long_prompt} TTFT {'(warm-up) ' if i == 0 else ''}{ms or 0:.1f} ms {s.error or ''}")
        rec.set("ttft_8k", ttft_summary(ttfts))


def ttft_summary(runs):
    ms = [r["ms"] for r in runs if r["ms"] is not None]
    return {"runs": runs, "best_ms": min(ms) if ms else None, "median_ms": statistics.median(ms) if ms else None}


def phase_peer(args, rec):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    rec.set("transformers", transformers.__version__)
    started = time.perf_counter()
    kwargs = dict(dtype=torch.bfloat16, attn_implementation="sdpa")
    try:
        model = AutoModelForCausalLM.from_pretrained(args.ckpt, device_map=args.peer_device, **kwargs)
    except (ImportError, ValueError, RuntimeError):
        model = AutoModelForCausalLM.from_pretrained(args.ckpt, **kwargs).to(args.peer_device)
    model.eval()
    rec.set("load_s", time.perf_counter() - started)
    log("peer", f"loaded in {rec.data['load_s']:.1f}s")
    eos = model.config.eos_token_id
    pad = eos[0] if isinstance(eos, list) else eos if eos is not None else 0

    cuda = args.peer_device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    oom = getattr(torch.cuda, "OutOfMemoryError", MemoryError)

    def generate(prompts, n):
        """Seconds for greedy generation of exactly n tokens: min_new_tokens keeps EOS from ending it early."""
        ids = torch.tensor(prompts, device=args.peer_device)
        sync()
        start = time.perf_counter()
        with torch.inference_mode():
            kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=pad)
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
        sync()
        assert out.shape[1] == ids.shape[1] + n, "generate stopped early"
        return time.perf_counter() - start

    seed = 2000
    generate(random_prompts(args, 1, PROMPT_IDS, seed), 8)
    one = random_prompts(args, 1, PROMPT_IDS, seed + 1)
    prefill = min(generate(one, 1) for _ in range(2))
    full = min(generate(one, args.single_tokens) for _ in range(args.single_repeats))
    rate = (args.single_tokens - 1) / (full - prefill)
    rec.set("single", {"decode_tok_s": rate, "t_1_s": prefill, f"t_{args.single_tokens}_s": full})
    log("peer", f"batch 1: {rate:.1f} tok/s decode")
    for n in args.streams:
        try:
            prompts = random_prompts(args, n, args.stream_prompt, seed + 100 * n)
            generate(prompts, 2)
            wall = generate(prompts, args.stream_tokens)
            rec.set(f"streams_{n}", {"total_tok_s": n * args.stream_tokens / wall, "wall_s": wall})
            log("peer", f"batch {n}: {n * args.stream_tokens / wall:.0f} tok/s")
        except oom:
            rec.set(f"streams_{n}", {"total_tok_s": "OOM"})
            log("peer", f"batch {n}: OOM")
        if cuda:
            torch.cuda.empty_cache()
    ttfts = []
    for i, ids in enumerate(random_prompts(args, args.ttft_repeats + 1, args.long_prompt, seed + 7)):
        try:
            ms = generate([ids], 1) * 1e3
            if i > 0:
                ttfts.append({"ms": ms, "error": None})
            log("peer", f"{args.long_prompt} TTFT {'(warm-up) ' if i == 0 else ''}{ms:.1f} ms")
        except oom:
            ttfts.append({"ms": None, "error": "OOM"})
        rec.set("ttft_8k", ttft_summary(ttfts))
    rec.set("status", "ok")


def run_phase(name, argv, timeout, scratch):
    """Runs a phase in its own process group under a time limit; returns its JSON (or a failure record)."""
    log(name, f"start (limit {timeout:.0f}s)")
    proc = subprocess.Popen(argv, start_new_session=True, env=dict(os.environ, BENCH_T0=str(T0)))
    timed_out = False
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        log(name, "time limit reached; stopping it")
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:
        data = json.loads((scratch / f"phase_{name}.json").read_text())
    except (OSError, ValueError):
        data = {}
    if timed_out:
        data["status"], data["error"] = "timeout", f"stopped at its time limit of {timeout:.0f}s"
    elif proc.returncode != 0 and data.get("status") != "failed":
        data["status"] = "failed"
        data.setdefault("error", f"exit code {proc.returncode}")
    log(name, f"{data.get('status', 'no result')} ({proc.returncode})")
    return data


def phase_limit(name, deadline):
    later = list(PHASES)[list(PHASES).index(name) + 1 :]
    reserve = sum(PHASES[p][1] for p in later) + 10
    return max(min(PHASES[name][0], deadline - (time.time() - T0) - reserve), PHASES[name][1] // 2)


def cmd_run(args):
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Only the report, the progress log and the server's log go to --out; the rest stays in a scratch folder.
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="tensorfold-bench-"))
    ckpt = pathlib.Path(args.ckpt) if args.ckpt else default_ckpt(args)
    me = [sys.executable, str(pathlib.Path(__file__).resolve())]
    results = {"phases": {}}
    if not (ckpt / "config.json").is_file():
        # Written beside its final name and renamed when complete, so a cut-off one is never reused.
        tmp = ckpt.with_name(ckpt.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        make = [sys.executable, str(TOOLS / "make_checkpoint.py"), "--shape", args.shape, "--out", str(tmp)]
        make += ["--tokenizer"] + (["--layers", str(args.layers)] if args.layers else [])
        limit = phase_limit("checkpoint", args.deadline)
        log("checkpoint", f"start (limit {limit:.0f}s): {' '.join(make)}")
        started, log_path = time.perf_counter(), scratch / "checkpoint.log"
        with open(log_path, "wb") as log_file:
            try:
                code = subprocess.run(make, timeout=limit, stdout=log_file, stderr=subprocess.STDOUT).returncode
                status = {"status": "ok" if code == 0 else "failed", "seconds": time.perf_counter() - started}
            except subprocess.TimeoutExpired:
                status = {"status": "timeout", "seconds": limit}
        if status["status"] == "ok":
            tmp.rename(ckpt)
        else:
            status["log_tail"] = tail(log_path)
        log("checkpoint", f"{status['status']} in {status['seconds']:.1f}s")
        results["phases"]["checkpoint"] = status
    else:
        log("checkpoint", f"using existing {ckpt}")
        results["phases"]["checkpoint"] = {"status": "existing"}
    if (ckpt / "config.json").is_file():
        total, per_token = bytes_per_token(ckpt)
        results["weights"] = {"total_bytes": total, "bytes_per_token": per_token}
        log("weights", f"{total / 1e9:.2f} GB in all, {per_token / 1e9:.3f} GB read per batch-1 token")
        for name in [p for p in ("bandwidth", "server", "peer") if p not in args.skip]:
            limit = phase_limit(name, args.deadline)
            # A phase reads its settings from a file: these arguments plus what the run worked out.
            settings = dict(vars(args), ckpt=str(ckpt), id_ceiling=id_ceiling(ckpt), scratch=str(scratch))
            settings["load_timeout"] = max(limit - 60, limit / 2)
            path = scratch / f"settings_{name}.json"
            path.write_text(json.dumps(settings, default=str, indent=1) + "\n")
            results["phases"][name] = run_phase(name, me + ["phase", name, str(path)], limit, scratch)
    write_report(args, ckpt, results, out)


def default_ckpt(args):
    work = pathlib.Path(args.work or os.path.join(os.environ.get("TMPDIR", "/tmp"), "tensorfold-bench"))
    work.mkdir(parents=True, exist_ok=True)
    return work / (f"ckpt-{args.shape}" + (f"-{args.layers}l" if args.layers else ""))


def pick(value, *keys):
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def ratio(ours, peer):
    number = (int, float)
    return ours / peer if isinstance(ours, number) and isinstance(peer, number) and peer else None


def cell(value, spec=".1f"):
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)


def write_report(args, ckpt, results, out):
    ours, peer = results["phases"].get("server", {}), results["phases"].get("peer", {})
    bw, per_token = pick(results["phases"], "bandwidth", "bandwidth_gb_s"), pick(results, "weights", "bytes_per_token")
    limit = bw * 1e9 / per_token if bw and per_token else None
    rows = [("batch-1 decode tok/s", ("single", "decode_tok_s"))]
    rows += [(f"{n} streams total output tok/s", (f"streams_{n}", "total_tok_s")) for n in args.streams]
    rows += [(f"cold {args.long_prompt}-token TTFT ms, {k}", ("ttft_8k", f"{k}_ms")) for k in ("best", "median")]
    table = [dict(metric=label, tensorfold=pick(ours, *keys), transformers=pick(peer, *keys)) for label, keys in rows]
    for row in table:
        row["ratio"] = ratio(row["tensorfold"], row["transformers"])
    fraction = ratio(pick(ours, "single", "decode_tok_s"), limit)
    peer_fraction = ratio(pick(peer, "single", "decode_tok_s"), limit)
    streams_256, ttft = pick(ours, "streams_256", "total_tok_s"), pick(ours, "ttft_8k", "best_ms")
    met = lambda value, ok: None if value is None else bool(ok)  # noqa: E731
    targets = {
        "batch-1 decode >= 90% of the bandwidth limit": met(fraction, (fraction or 0) >= 0.90),
        "256 streams >= 15000 tok/s": met(streams_256, (streams_256 or 0) >= 15000),
        "cold 8K TTFT <= 300 ms": met(ttft if args.long_prompt == 8192 else None, (ttft or 1e9) <= 300),
    }
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results.update(date=date, gpu=pick(results["phases"], "bandwidth", "gpu"), shape=args.shape, layers=args.layers)
    results.update(checkpoint=str(ckpt), commit=args.commit or os.environ.get("TF_COMMIT"), binary=args.binary)
    results.update(bandwidth_gb_s=bw, bandwidth_formula=pick(results["phases"], "bandwidth", "formula"))
    results.update(decode_limit_tok_s=limit, decode_fraction_of_limit=fraction)
    results.update(peer_decode_fraction_of_limit=peer_fraction, table=table, targets=targets)
    results["elapsed_s"] = time.time() - T0
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    md = [f"# GPU benchmark: {args.shape}" + (f" ({args.layers} layers)" if args.layers else ""), ""]
    md += [f"date {date}; GPU {results['gpu'] or '-'}; commit {results['commit'] or '-'}; binary {args.binary}"]
    md += ["", "| metric | tensorfold | transformers | ratio (ours/peer) |", "|---|---|---|---|"]
    for r in table:
        ours_cell, peer_cell = cell(r["tensorfold"]), cell(r["transformers"])
        md.append(f"| {r['metric']} | {ours_cell} | {peer_cell} | {cell(r['ratio'], '.2f')} |")
    md += [
        "",
        f"- measured copy bandwidth: {cell(bw, '.0f')} GB/s ({results['bandwidth_formula'] or 'not measured'})",
        f"- bytes read per batch-1 token: {cell(per_token and per_token / 1e9, '.3f')} GB "
        "(every weight but the input embedding, of which one row; KV cache reads not counted)",
        f"- batch-1 decode limit = bandwidth / bytes per token: {cell(limit)} tok/s; "
        f"ours {cell(fraction and 100 * fraction)}% of it, transformers {cell(peer_fraction and 100 * peer_fraction)}%",
        "",
        "| target | met |",
        "|---|---|",
    ]
    md += [f"| {k} | {'not measured' if v is None else 'yes' if v else 'no'} |" for k, v in targets.items()]
    md += ["", "| phase | status | note |", "|---|---|---|"]
    md += [f"| {k} | {v.get('status', '-')} | {str(v.get('error', ''))[:200]} |" for k, v in results["phases"].items()]
    md.append(f"\nelapsed {results['elapsed_s']:.0f}s")
    (out / "results.md").write_text("\n".join(md) + "\n")
    print("\n".join(md), flush=True)


def cmd_phase(cli):
    args = argparse.Namespace(**json.loads(pathlib.Path(cli.settings).read_text()), name=cli.name)
    rec = Recorder(pathlib.Path(args.scratch) / f"phase_{args.name}.json")
    # SIGTERM from the time limit unwinds, so the server phase still stops its server and records why.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        {"bandwidth": phase_bandwidth, "server": phase_server, "peer": phase_peer}[args.name](args, rec)
    except BaseException as e:
        rec.update(status="timeout" if isinstance(e, SystemExit) else "failed", error=f"{type(e).__name__}: {e}"[:500])
        raise
    return 0 if rec.data["status"] == "ok" else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="every phase, then the report")
    p.add_argument("--shape", default="llama-3.1-8b")
    p.add_argument("--layers", type=int, help="a truncated checkpoint of the shape")
    p.add_argument("--ckpt", help="use this checkpoint instead of making one under --work")
    p.add_argument("--work", help="where checkpoints are kept; default: $TMPDIR or /tmp, /tensorfold-bench")
    p.add_argument("--out", default=os.environ.get("OUT") or "bench-out")
    p.add_argument("--commit", help="default: $TF_COMMIT")
    p.add_argument("--deadline", type=float, default=540, help="seconds from the start for the whole run")
    p.add_argument("--skip", action="append", default=[], choices=["bandwidth", "server", "peer"])
    p.add_argument("--request-timeout", type=float, default=120, help="seconds one request may take")
    p.add_argument("--streams", type=int, action="append", help="concurrent streams (repeatable; default 64 and 256)")
    p.add_argument("--single-repeats", type=int, default=2, help="batch-1 decode runs; the best counts")
    p.add_argument("--ttft-repeats", type=int, default=3, help="distinct cold long prompts after one warm-up")
    p.add_argument("--binary", default=".device/tensorfold")
    p.add_argument("--device", default="cuda", help="our server's --device; 'none' leaves the flag out")
    p.add_argument("--parallel", type=int, default=256)
    p.add_argument("--context", type=int, default=9216)
    p.add_argument("--round-tokens", type=int, default=512)
    p.add_argument("--server-arg", action="append", help="one more argument for our server (repeatable)")
    p.add_argument("--copy-gib", type=int, default=4)
    p.add_argument("--peer-device", default="cuda", help="where transformers runs")
    p.add_argument("--single-tokens", type=int, default=256, help="output tokens of the batch-1 decode run")
    p.add_argument("--stream-tokens", type=int, default=128, help="output tokens of each concurrent stream")
    p.add_argument("--stream-prompt", type=int, default=PROMPT_IDS, help="prompt tokens of each concurrent stream")
    p.add_argument("--long-prompt", type=int, default=8192, help="prompt tokens of the cold TTFT runs")
    p.set_defaults(run=cmd_run)
    p = sub.add_parser("phase", help="one phase, as run starts it")
    p.add_argument("name", choices=["bandwidth", "server", "peer"])
    p.add_argument("settings", help="the JSON file of settings that run wrote")
    p.set_defaults(run=cmd_phase)
    args = parser.parse_args()
    args.streams = (args.streams or [64, 256]) if args.command == "run" else None
    sys.exit(args.run(args) or 0)


if __name__ == "__main__":
    main()

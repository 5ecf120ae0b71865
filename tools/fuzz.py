#!/usr/bin/env python3
"""Fuzz a running tensorfold server from its own OpenAPI description with schemathesis.

    python3 tools/fuzz.py --base-url http://127.0.0.1:8000 --examples 80 --seed 1

Every route in /openapi.json gets generated requests, valid and not, in schemathesis's phases (the documented
examples, boundary coverage, random fuzzing, stateful sequences). A run passes when no reply is a 5xx, every reply
arrives within --max-response-time and matches the document (status, headers, content type, body, each SSE
event), and the server still answers /health and a chat request afterwards. It prints one JSON line: the cases
generated, the failures, the seconds, and whether the server was alive after. A run that schemathesis ends with an
error inside its own case generator (no case failed or errored; CPython 3.11.7's parser can fail so deep in
hypothesis's strategies) runs once more with the next seed, and the line says so.

Two of schemathesis's checks are left out, since a schema cannot state what they need: whether a schema-valid
request is accepted (token ids and `dimensions` depend on the loaded model, `max_tokens` on speech depends on the
voice) and whether a schema-violating request is refused (fields the server ignores, as OpenAI's API ignores
them, are not checked for type).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

EXCLUDED_CHECKS = "positive_data_acceptance,negative_data_rejection"


def schemathesis_command():
    """The schemathesis entry point of this interpreter's environment."""
    script = os.path.join(os.path.dirname(sys.executable), "schemathesis")
    return [script] if os.path.exists(script) else ["schemathesis"]


def alive(base_url, timeout):
    """Whether /health says ok and a one-token chat completion succeeds."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=timeout) as response:
            if response.status != 200:
                return False
        body = json.dumps({"model": "any", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1})
        request = urllib.request.Request(
            f"{base_url}/v1/chat/completions", body.encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status == 200 and json.load(response)["choices"][0]["finish_reason"] is not None
    except (OSError, ValueError, KeyError, IndexError):
        return False


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="the server, without /v1")
    parser.add_argument("--examples", type=int, default=80, help="most examples per route and phase (80)")
    parser.add_argument("--seed", type=int, default=1, help="schemathesis's seed, for a run that can be repeated")
    parser.add_argument("--workers", default="2", help="concurrent schemathesis workers (2)")
    parser.add_argument("--max-response-time", type=float, default=30.0, help="a slower reply fails (30 s)")
    parser.add_argument("--min-cases", type=int, default=0, help="fail when fewer cases were generated")
    parser.add_argument("--report-dir", help="keep schemathesis's JSON report and the failures' reproductions here")
    args = parser.parse_args()

    report_dir = args.report_dir or tempfile.mkdtemp(prefix="tf-fuzz-")
    os.makedirs(report_dir, exist_ok=True)
    report = os.path.join(report_dir, "schemathesis.json")
    def command(seed):
        return schemathesis_command() + [
            "run", f"{args.base_url}/openapi.json",
            "--url", args.base_url,
            "--checks", "all",
            "--exclude-checks", EXCLUDED_CHECKS,
            "--max-response-time", str(args.max_response_time),
            "--request-timeout", str(args.max_response_time * 2),
            "--max-examples", str(args.examples),
            "--seed", str(seed),
            "--workers", args.workers,
            "--no-shrink",
            "--continue-on-failure",
            "--report", "json",
            "--report-json-path", report,
        ]

    started = time.monotonic()
    retried = 0
    while True:
        # schemathesis keeps its state in the working directory: the report's, not the caller's.
        run = subprocess.run(command(args.seed + retried), capture_output=True, text=True, cwd=report_dir)
        try:
            with open(report) as f:
                cases = json.load(f)["test_cases"]
        except (OSError, ValueError, KeyError):
            cases = {}
        # An error inside schemathesis's own generator, with no failed or errored case, is the tool's: run again once.
        tool_error = "Runtime Error" in run.stdout and not cases.get("with_failures") and not cases.get("errored")
        if run.returncode == 0 or not tool_error or retried == 1:
            break
        sys.stderr.write(run.stdout[-3000:])
        retried += 1
    seconds = time.monotonic() - started
    summary = {
        "cases": cases.get("generated", 0),
        "with_failures": cases.get("with_failures", 0),
        "unique_failures": cases.get("unique_failures", 0),
        "errored": cases.get("errored", 0),
        "schemathesis_exit": run.returncode,
        "retried_after_tool_error": retried,
        "seconds": round(seconds, 1),
        "alive_after": alive(args.base_url, args.max_response_time),
        "report": report,
    }
    ok = run.returncode == 0 and summary["alive_after"] and summary["cases"] >= args.min_cases
    if not ok:
        sys.stdout.write(run.stdout[-20000:])
        sys.stderr.write(run.stderr[-5000:])
    print(json.dumps(summary))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

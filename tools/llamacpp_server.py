#!/usr/bin/env python3
"""llama.cpp's HTTP server, from the `xllamacpp` wheel, in the foreground: the peer of `tensorfold serve`.

Prints `listening on http://ADDR` on stderr (as `tensorfold serve` does) once the model is loaded and the
port is bound, serves the OpenAI routes under /v1 with continuous batching and --parallel slots of
--slot-context positions each, and exits when it receives SIGTERM or SIGINT.

    python3 tools/llamacpp_server.py --model SmolLM2-135M-Instruct.Q4_1.gguf --threads 2 --parallel 32
"""

import argparse
import os
import signal
import sys

import xllamacpp


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--parallel", type=int, default=32, help="slots decoding at once (32)")
    parser.add_argument("--slot-context", type=int, default=2048, help="positions per slot (2048)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (0)")
    parser.add_argument("--verbose", action="store_true", help="keep llama.cpp's own log on stderr")
    args = parser.parse_args()

    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.hostnames = [args.host]
    params.port = args.port
    params.n_parallel = args.parallel
    params.n_ctx = args.parallel * args.slot_context
    params.cont_batching = True
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_gpu_layers = 0
    if not args.verbose:
        params.verbosity = -1

    # Blocked before the server's threads start, so they inherit the mask and sigwait alone takes the signal.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    server = xllamacpp.Server(params)
    print(f"listening on {server.listening_address}", file=sys.stderr, flush=True)
    signal.sigwait(stop_signals)
    # Dropping the server stops its HTTP threads and frees the model before the interpreter exits.
    del server


if __name__ == "__main__":
    main()

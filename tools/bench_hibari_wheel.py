#!/usr/bin/env python3
"""The peer for the hibari voice: the wheel's own Python (onnxruntime on the shipped int8 graph) on bench_speech's sentences.

Run it with a Python that has the wheel and onnxruntime (pip install hibari-tts==0.2.1); it prints one JSON object:
audio seconds, synthesis seconds (G2P included, best of --repeat) and the real-time factor wall / audio, for
one stream on --threads onnxruntime threads, so bench_speech.py's one-stream figures have a peer on the same machine.

    python3 tools/bench_hibari_wheel.py --threads 1 --repeat 3
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_speech import SENTENCES  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads (1)")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the fastest is reported (3)")
    args = parser.parse_args()
    try:
        from hibari import Hibari
    except ImportError as error:
        sys.exit(f"cannot import hibari ({error}); pip install hibari-tts==0.2.1")
    tts = Hibari(threads=args.threads)
    tts("Warm up.", seed=0)
    best, audio_s = None, 0.0
    for _ in range(args.repeat):
        start = time.perf_counter()
        audio_s = sum(len(tts(text, seed=i)) for i, text in enumerate(SENTENCES)) / tts.sample_rate
        wall = time.perf_counter() - start
        best = wall if best is None else min(best, wall)
    print(json.dumps({"peer": "hibari-tts wheel", "threads": args.threads, "sentences": len(SENTENCES),
                      "audio_s": round(audio_s, 3), "wall_s": round(best, 4), "rtf": round(best / audio_s, 5)}))


if __name__ == "__main__":
    main()

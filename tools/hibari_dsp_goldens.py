#!/usr/bin/env python3
"""Goldens for the Hibari signal stage (audio/src/hibari): the wheel's own dsp.synth on seeded network outputs.

    python3 -m pip download --no-deps hibari-tts==0.2.1 -d DIR && unzip DIR/*.whl -d DIR/w
    tools/hibari_dsp_goldens.py DIR/w [--out tests/data/hibari_dsp]

Needs numpy (scipy too if dsp.py should take its float32 FFT path, as it does when installed). dsp.synth takes a
numpy Generator for its noise; here it gets one that hands back the noise our Rust draws, defined below, so the
goldens test the whole stage, noise included. The inputs come from the same counter-based uniform, so the Rust
test regenerates them and only the audio is stored: index.json names each case, and <case>.f32 holds its
samples as little-endian float32.
"""
import argparse
import importlib.util
import json
import pathlib

import numpy as np

NUM_BINS = 601
GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1
# (name, frames, input seed, noise seed); 1 and 2 frames exercise reflect padding longer than the signal.
CASES = [("f1", 1, 11, 101), ("f2", 2, 12, 102), ("f5", 5, 13, 103), ("f40", 40, 14, 104), ("f123", 123, 15, 105)]
PARTS = ["lh", "theta", "ln", "lr", "phi"]


def mix(z):
    """SplitMix64's finalizer on uint64 arrays, as kernels/src/sampling.rs has it."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def uniform(seed, counters):
    """tensorfold_kernels::sampling::uniform(seed, counter) for each counter: a float64 in [0, 1)."""
    base = mix(np.array([(seed ^ GOLDEN) & MASK], np.uint64))[0]
    z = mix(base + np.asarray(counters, np.uint64) * np.uint64(GOLDEN))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def cells(num_frames):
    """k*601 + b for bin b (rows) of frame k (columns)."""
    frames = np.arange(num_frames, dtype=np.uint64)[None, :] * np.uint64(NUM_BINS)
    return frames + np.arange(NUM_BINS, dtype=np.uint64)[:, None]


def normal_pair(seed, index):
    """audio/src/hibari/noise.rs normal_pair: Box-Muller on the uniforms at counters 2*index and 2*index + 1."""
    counter = np.asarray(index, np.uint64) * np.uint64(2)
    u1, u2 = uniform(seed, counter), uniform(seed, counter + np.uint64(1))
    radius, angle = np.sqrt(-2.0 * np.log(1.0 - u1)), 2.0 * np.pi * u2
    return (radius * np.cos(angle)).astype(np.float32), (radius * np.sin(angle)).astype(np.float32)


def noise(seed, num_frames):
    """Z as dsp.synth draws it, [bins, 2F] float32 viewed as complex: frame k, bin b is normal_pair(seed, k*601 + b)."""
    re, im = normal_pair(seed, cells(num_frames))
    z = np.empty((NUM_BINS, 2 * num_frames), np.float32)
    z[:, 0::2], z[:, 1::2] = re, im
    return z


class OurNoise:
    """Stands in for the numpy Generator dsp.synth expects; hands back our Z."""

    def __init__(self, seed):
        self.seed = seed

    def standard_normal(self, shape, dtype):
        assert dtype == np.float32 and shape[0] == NUM_BINS and shape[1] % 2 == 0, (shape, dtype)
        return noise(self.seed, shape[1] // 2)


def inputs(seed, num_frames):
    """Network outputs from the counter-based uniform; audio/tests/hibari_dsp.rs builds the same ones.

    Part p (lh, theta, ln, lr, phi) at frame k, bin b reads counter (p << 32) | (k*601 + b): log gains are
    -8 + 10u, or 7.5 where u >= 0.9995 (past the clamp at 7); theta is -3 + 6u; phi is -4 + 8u. F0 at frame k
    reads counter (5 << 32) | k: unvoiced 40u where k % 9 is 4 or 6, 0 where it is 5, else voiced 80 + 220u Hz.
    """
    out = {}
    for p, name in enumerate(PARTS):
        u = uniform(seed, cells(num_frames) | np.uint64(p << 32))
        if name == "theta":
            v = -3.0 + 6.0 * u
        elif name == "phi":
            v = -4.0 + 8.0 * u
        else:
            v = np.where(u >= 0.9995, 7.5, -8.0 + 10.0 * u)
        out[name] = v.astype(np.float32)
    k = np.arange(num_frames)
    u = uniform(seed, k.astype(np.uint64) | np.uint64(5 << 32))
    f0 = np.where(k % 9 == 5, 0.0, np.where((k % 9 == 4) | (k % 9 == 6), 40.0 * u, 80.0 + 220.0 * u))
    out["f0"] = f0.astype(np.float32)
    return out


def probes(arrays, num_frames):
    """A few generated values, [frame, bin, value], so the Rust test can check it built the same inputs."""
    spots = sorted({(0, 0), (num_frames // 2, 300), (num_frames - 1, NUM_BINS - 1)})
    out = {name: [[k, b, float(arrays[name][b, k])] for k, b in spots] for name in PARTS}
    out["f0"] = [[k, 0, float(arrays["f0"][k])] for k, _ in spots]
    return out


def load_dsp(wheel):
    path = pathlib.Path(wheel) / "hibari" / "dsp.py"
    spec = importlib.util.spec_from_file_location("hibari_dsp", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel", help="unpacked hibari-tts 0.2.1 wheel (the folder holding hibari/dsp.py)")
    parser.add_argument("--out", default=str(pathlib.Path(__file__).resolve().parent.parent / "tests/data/hibari_dsp"))
    args = parser.parse_args()
    dsp = load_dsp(args.wheel)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for name, num_frames, input_seed, noise_seed in CASES:
        x = inputs(input_seed, num_frames)
        audio = dsp.synth(x["lh"], x["theta"], x["ln"], x["lr"], x["phi"], x["f0"], OurNoise(noise_seed))
        assert audio.dtype == np.float32 and audio.shape == (num_frames * dsp.HOP,), (audio.dtype, audio.shape)
        audio.astype("<f4").tofile(out / f"{name}.f32")
        cases.append({"name": name, "num_frames": num_frames, "input_seed": input_seed, "noise_seed": noise_seed,
                      "audio": f"{name}.f32", "probes": probes(x, num_frames)})
    index = {"source": "hibari-tts==0.2.1 hibari/dsp.py synth", "fft_backend": dsp.FFT_BACKEND,
             "numpy": np.__version__, "sample_rate": dsp.SR, "hop": dsp.HOP, "cases": cases}
    head = "".join(f" {json.dumps(k)}: {json.dumps(v)},\n" for k, v in index.items() if k != "cases")
    rows = ",\n".join(f"  {json.dumps(case)}" for case in cases)
    (out / "index.json").write_text(f'{{\n{head} "cases": [\n{rows}\n ]\n}}\n')


if __name__ == "__main__":
    main()

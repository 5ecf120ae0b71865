#!/usr/bin/env python3
"""Builds a seeded random SNAC 24 kHz codec laid out like the published checkpoint, and reference decodes.

    make_snac.py --size test --out tests/data/snac      # reduced width, committed for CI
    make_snac.py --size full --out DIR                  # the published widths, for local fidelity runs
    make_snac.py --convert DIR                          # DIR/pytorch_model.bin -> DIR/model.safetensors

The directory gets `config.json` (SNAC's constructor arguments, as published), `pytorch_model.bin`
(a torch pickle, as published), `model.safetensors` converted from that pickle, and
`goldens.safetensors`: random codes and the reference `SNAC.decode` PCM for them. The reference runs
with every NoiseBlock's `randn` noise replaced by zeros; one extra golden replaces it instead by the
counter-based draws that tensorfold makes (`normal_draws` below), so the noise path is checked too.
"""

import argparse
import json
import math
import pathlib

import numpy as np
import torch

# The published hubertsiuzdak/snac_24khz configuration.
FULL = {
    "sampling_rate": 24000,
    "encoder_dim": 48,
    "encoder_rates": [2, 4, 8, 8],
    "decoder_dim": 1024,
    "decoder_rates": [8, 8, 4, 2],
    "attn_window_size": None,
    "codebook_size": 4096,
    "codebook_dim": 8,
    "vq_strides": [4, 2, 1],
    "noise": True,
    "depthwise": True,
}

# Same rates, strides and codebooks at a width small enough to commit.
TEST = dict(FULL, encoder_dim=8, decoder_dim=128)

GOLDEN_FRAMES = [4, 8, 16]
NOISE_FRAMES = 8
NOISE_SEED = 7

MASK = (1 << 64) - 1
GOLDEN_GAMMA = 0x9E3779B97F4A7C15


def mix(z):
    """SplitMix64's finalizer, as in tensorfold-kernels' sampling."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def uniform(seed, counter):
    z = mix((mix(seed ^ GOLDEN_GAMMA) + counter * GOLDEN_GAMMA) & MASK)
    return (z >> 11) / float(1 << 53)


def normal_draws(seed, block, start, count):
    """Standard normal draws for positions start.. of a decoder block, by Box-Muller on two uniforms."""
    out = np.empty(count, dtype=np.float32)
    for i in range(count):
        counter = ((block << 48) | (start + i)) * 2
        u1, u2 = uniform(seed, counter), uniform(seed, counter + 1)
        out[i] = math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)
    return out


def randomize(model, gen):
    """Moves every parameter off its initial value so a loader that skips one is caught."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("original0") or name.endswith("weight_g"):
                p.mul_(torch.empty_like(p).uniform_(0.5, 1.5, generator=gen))
            elif name.endswith("alpha"):
                p.copy_(torch.empty_like(p).uniform_(0.5, 2.0, generator=gen))
            elif name.endswith("bias"):
                p.copy_(torch.empty_like(p).uniform_(-0.1, 0.1, generator=gen))


def convert(directory):
    """Rewrites DIR/pytorch_model.bin as DIR/model.safetensors, names and float32 values unchanged."""
    from safetensors.torch import save_file

    directory = pathlib.Path(directory)
    state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    tensors = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in state.items()}
    save_file(tensors, str(directory / "model.safetensors"))
    print(f"wrote {directory / 'model.safetensors'}: {len(tensors)} tensors")


def decode(model, codes, noise_seed=None):
    """The reference decode with NoiseBlock noise replaced: zeros, or tensorfold's draws for a seed."""
    from snac.layers import NoiseBlock

    blocks = [m for m in model.decoder.modules() if isinstance(m, NoiseBlock)]
    original = NoiseBlock.forward

    def forward(self, x):
        if noise_seed is None:
            return x
        n = normal_draws(noise_seed, blocks.index(self), 0, x.shape[-1])
        return x + torch.from_numpy(n).view(1, 1, -1) * self.linear(x)

    NoiseBlock.forward = forward
    try:
        with torch.no_grad():
            out = model.decode([torch.from_numpy(c.astype(np.int64)).view(1, -1) for c in codes])
    finally:
        NoiseBlock.forward = original
    return out.reshape(-1).numpy().astype(np.float32)


def build(size, out, seed):
    from safetensors.numpy import save_file
    from snac import SNAC

    config = TEST if size == "test" else FULL
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = SNAC(**config).eval()
    randomize(model, torch.Generator().manual_seed(seed + 1))
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    torch.save(model.state_dict(), out / "pytorch_model.bin")
    convert(out)

    rng = np.random.default_rng(seed + 2)
    goldens = {}
    strides = config["vq_strides"]
    for frames in GOLDEN_FRAMES:
        codes = [rng.integers(0, config["codebook_size"], frames * strides[0] // s).astype(np.int32) for s in strides]
        for i, c in enumerate(codes):
            goldens[f"codes.{frames}.{i}"] = c
        pcm = decode(model, codes)
        goldens[f"pcm.{frames}"] = pcm
        print(f"{frames} frames: {pcm.size} samples, rms {np.sqrt(np.mean(pcm**2)):.4f}, peak {np.abs(pcm).max():.4f}")
        if frames == NOISE_FRAMES:
            goldens[f"pcm_noise.{frames}"] = decode(model, codes, NOISE_SEED)
    save_file(goldens, str(out / "goldens.safetensors"), metadata={"noise_seed": str(NOISE_SEED)})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=["test", "full"], default="test")
    ap.add_argument("--out", help="directory to write the checkpoint and goldens into")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--convert", metavar="DIR", help="only convert DIR/pytorch_model.bin to model.safetensors")
    args = ap.parse_args()
    if args.convert:
        convert(args.convert)
    elif args.out:
        build(args.size, args.out, args.seed)
    else:
        ap.error("give --out DIR or --convert DIR")


if __name__ == "__main__":
    main()

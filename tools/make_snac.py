#!/usr/bin/env python3
"""Builds a seeded random SNAC 24 kHz codec laid out like the published checkpoint, and reference decodes.

    make_snac.py --size test --out tests/data/snac      # reduced width, committed for CI
    make_snac.py --size full --out DIR                  # the published widths, for local fidelity runs
    make_snac.py --convert DIR                          # DIR/pytorch_model.bin -> DIR/model.safetensors
    make_snac.py --size full --decoder-only --out DIR   # random decoder tensors only, without the snac package

The directory gets `config.json` (SNAC's constructor arguments, as published), `pytorch_model.bin`
(a torch pickle, as published), `model.safetensors` converted from that pickle, and
`goldens.safetensors`: random codes and the reference `SNAC.decode` PCM for them. The reference runs
with every NoiseBlock's `randn` noise replaced by zeros; one extra golden replaces it instead by the
counter-based draws that tensorfold makes (`normal_draws` below), so the noise path is checked too.

`--decoder-only` needs numpy and safetensors alone: it writes `config.json` and a `model.safetensors` with the
quantizer and decoder tensors `SnacDecoder::open` reads (`decoder_tensors`), convolutions as folded `.weight`,
seeded random values scaled by fan-in so the decode stays finite and below tanh's saturation. No goldens: there is no reference.
"""

import argparse
import json
import math
import pathlib

import numpy as np

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
    import torch

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
    import torch
    from safetensors.torch import save_file

    directory = pathlib.Path(directory)
    state = torch.load(directory / "pytorch_model.bin", map_location="cpu", weights_only=True)
    tensors = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in state.items()}
    save_file(tensors, str(directory / "model.safetensors"))
    print(f"wrote {directory / 'model.safetensors'}: {len(tensors)} tensors")


def decode(model, codes, noise_seed=None):
    """The reference decode with NoiseBlock noise replaced: zeros, or tensorfold's draws for a seed."""
    import torch
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


def decoder_tensors(config):
    """(name, shape, std) of every tensor the decoding path reads, convolutions as folded `.weight`.

    A convolution's std is gain / sqrt(fan in); the gains keep a random decode's activations near unit size
    through the blocks and its output below tanh's saturation. Other tensors have std None."""
    kernel, dilations = 7, [1, 3, 9]
    latent = config["encoder_dim"] * 2 ** len(config["encoder_rates"])
    dim, books = config["decoder_dim"], config["codebook_dim"]
    out = []
    for i in range(len(config["vq_strides"])):
        p = f"quantizer.quantizers.{i}"
        out += [(f"{p}.codebook.weight", [config["codebook_size"], books], None)]
        out += [(f"{p}.out_proj.weight", [latent, books, 1], books**-0.5), (f"{p}.out_proj.bias", [latent], None)]

    def conv(name, c_out, c_in, k, fan_in, bias=True, gain=1.0):
        out.append((f"{name}.weight", [c_out, c_in, k], gain / math.sqrt(fan_in)))
        if bias:
            out.append((f"{name}.bias", [c_out], None))

    def alpha(name, channels):
        out.append((f"{name}.alpha", [1, channels, 1], None))

    assert config["depthwise"] and config["noise"], "the 24 kHz layout: depthwise convolutions and NoiseBlocks"
    conv("decoder.model.0", latent, 1, kernel, kernel)
    conv("decoder.model.1", dim, latent, 1, latent)
    for i, stride in enumerate(config["decoder_rates"]):
        p, c_in, c_out = f"decoder.model.{2 + i}.block", dim >> i, dim >> (i + 1)
        alpha(f"{p}.0", c_in)
        # A transposed convolution's weight is [c_in, c_out, k]; each output sums about c_in * 2 taps.
        out.extend([(f"{p}.1.weight", [c_in, c_out, 2 * stride], 0.5 / math.sqrt(2 * c_in)), (f"{p}.1.bias", [c_out], None)])
        conv(f"{p}.2.linear", c_out, c_out, 1, c_out, bias=False)
        for j, _ in enumerate(dilations):
            unit = f"{p}.{3 + j}.block"
            alpha(f"{unit}.0", c_out)
            conv(f"{unit}.1", c_out, 1, kernel, kernel)
            alpha(f"{unit}.2", c_out)
            conv(f"{unit}.3", c_out, c_out, 1, c_out, gain=0.3)
    last, width = 2 + len(config["decoder_rates"]), dim >> len(config["decoder_rates"])
    alpha(f"decoder.model.{last}", width)
    conv(f"decoder.model.{last + 1}", 1, width, kernel, width * kernel, gain=0.3)
    return out


def write_random_decoder(config, out, seed):
    """config.json and a model.safetensors of seeded random decoder tensors, without the snac package."""
    from safetensors.numpy import save_file

    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for name, shape, std in decoder_tensors(config):
        if name.endswith("alpha"):
            values = rng.uniform(0.5, 2.0, shape)
        elif name.endswith("bias"):
            values = rng.uniform(-0.1, 0.1, shape)
        else:
            values = rng.standard_normal(shape) * (1.0 if std is None else std)
        tensors[name] = values.astype(np.float32)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(tensors, str(out / "model.safetensors"))
    return tensors


def build(size, out, seed):
    import torch
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
    ap.add_argument("--decoder-only", action="store_true", help="random decoder tensors only, no snac package")
    args = ap.parse_args()
    if args.convert:
        convert(args.convert)
    elif args.out and args.decoder_only:
        write_random_decoder(TEST if args.size == "test" else FULL, args.out, args.seed)
    elif args.out:
        build(args.size, args.out, args.seed)
    else:
        ap.error("give --out DIR or --convert DIR")


if __name__ == "__main__":
    main()

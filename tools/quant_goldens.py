#!/usr/bin/env python3
"""Writes the goldens of kernels/src/quant.rs: seeded GGML blocks dequantized by the `gguf` package."""

import pathlib
import struct
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

# Byte offsets of the f16 scale fields inside one block, overwritten so every scale is finite.
SCALE_OFFSETS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q8_0: [0],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}

# Edge values every float record carries: zeros, tiny, huge and subnormal numbers.
EDGE_VALUES = [0.0, -0.0, 1.0, -2.5, 6.0e-8, -6.0e-5, 65504.0, 1.0e-30, 3.0e38]


def quant_blocks(rng, ty, num_blocks):
    block_len, block_bytes = GGML_QUANT_SIZES[ty]
    blocks = rng.integers(0, 256, size=(num_blocks, block_bytes), dtype=np.uint8)
    for offset in SCALE_OFFSETS[ty]:
        scales = (rng.standard_normal(num_blocks) * 0.05).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(num_blocks, 2)
    return blocks.reshape(-1), num_blocks * block_len


def float_values(rng, n):
    values = rng.standard_normal(n).astype(np.float32) * np.float32(3.0)
    values[: len(EDGE_VALUES)] = EDGE_VALUES
    return values


def float_blocks(rng, ty, n):
    values = float_values(rng, n)
    if ty == T.F32:
        return values.view(np.uint8), n
    if ty == T.F16:
        with np.errstate(over="ignore"):
            halves = values.astype(np.float16)
        halves[~np.isfinite(halves)] = np.float16(1.5)
        return halves.view(np.uint8), n
    # BF16 keeps the upper half of each f32; random low bits make the rounding irrelevant here.
    return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8), n


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    out_path = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else root / "kernels/tests/data/quant_goldens.bin"
    rng = np.random.default_rng(20240601)
    records = []
    for ty in [T.F32, T.F16, T.BF16]:
        records.append((ty, *float_blocks(rng, ty, 64)))
    for ty in [T.Q4_0, T.Q4_1, T.Q8_0]:
        records.append((ty, *quant_blocks(rng, ty, 4)))
    for ty in [T.Q4_K, T.Q5_K, T.Q6_K]:
        records.append((ty, *quant_blocks(rng, ty, 2)))
    with open(out_path, "wb") as f:
        for ty, raw, num_elements in records:
            expected = np.ascontiguousarray(dequantize(raw.copy(), ty), dtype=np.float32).reshape(-1)
            assert expected.size == num_elements and np.all(np.isfinite(expected)), ty.name
            # A record: u32 type id, u32 byte count, u32 element count, the bytes, the f32 values.
            f.write(struct.pack("<III", int(ty), raw.size, num_elements))
            f.write(raw.tobytes())
            f.write(expected.astype("<f4").tobytes())
    print(f"wrote {len(records)} records to {out_path}")


if __name__ == "__main__":
    main()

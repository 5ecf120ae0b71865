#!/usr/bin/env python3
"""Builds seeded random checkpoints of real architectures with transformers, and golden outputs for them.

    make_checkpoint.py --shape tiny-qwen2 --out DIR --golden DIR/reference.json

The goldens are computed from the checkpoint as saved, in float32 with eager attention, so a
loader that reads the directory back must reproduce them.
"""

import argparse
import json
import math
import pathlib

import numpy as np
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
}

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
}

# Small enough to commit; heads 4 over kv heads 2 keeps grouped-query attention in play.
TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    max_position_embeddings=256,
    initializer_range=0.1,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
)

SHAPES = {
    # An original context of 32 puts the tiny head_dim's frequencies in all three llama3 bands.
    "tiny-llama3": (
        "llama",
        dict(
            TINY,
            num_hidden_layers=2,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            rope_scaling=dict(LLAMA3_SCALING, original_max_position_embeddings=32),
            tie_word_embeddings=False,
        ),
    ),
    "tiny-qwen2": (
        "qwen2",
        dict(TINY, num_hidden_layers=2, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True),
    ),
    "tiny-qwen3": (
        "qwen3",
        dict(
            TINY,
            num_hidden_layers=3,
            head_dim=32,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
        ),
    ),
    # Llama 2 has no grouped-query attention, so this one keeps one kv head per head.
    "tiny-llama2": (
        "llama",
        dict(
            TINY,
            num_hidden_layers=2,
            num_key_value_heads=4,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            tie_word_embeddings=False,
        ),
    ),
    "llama-3.1-8b": (
        "llama",
        dict(
            vocab_size=128256,
            hidden_size=4096,
            intermediate_size=14336,
            num_hidden_layers=32,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            rope_scaling=dict(LLAMA3_SCALING, original_max_position_embeddings=8192),
            tie_word_embeddings=False,
            bos_token_id=128000,
            eos_token_id=128001,
        ),
    ),
    "qwen2.5-7b": (
        "qwen2",
        dict(
            vocab_size=152064,
            hidden_size=3584,
            intermediate_size=18944,
            num_hidden_layers=28,
            num_attention_heads=28,
            num_key_value_heads=4,
            max_position_embeddings=131072,
            max_window_layers=28,
            use_sliding_window=False,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
            bos_token_id=151643,
            eos_token_id=151643,
        ),
    ),
    "qwen3-8b": (
        "qwen3",
        dict(
            vocab_size=151936,
            hidden_size=4096,
            intermediate_size=12288,
            num_hidden_layers=36,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
            attention_bias=False,
            bos_token_id=151643,
            eos_token_id=151645,
        ),
    ),
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

PROMPT_LENGTHS = [1, 2, 7, 16, 29, 40]
# The prompt whose logits are kept at every position, not only the last.
ALL_POSITIONS_PROMPT = 5
NUM_NEW_TOKENS = 64


def build_model(shape, dtype, seed):
    arch, fields = SHAPES[shape]
    config_class, model_class = ARCHS[arch]
    config = config_class(**fields)
    torch.manual_seed(seed)
    torch.set_default_dtype(dtype)
    model = model_class(config)
    torch.set_default_dtype(torch.float32)
    if shape.startswith("tiny-"):
        widen_tiny_init(model, seed)
    return model.eval()


def widen_tiny_init(model, seed):
    """Gives norms and biases non-trivial values and widens the logits so greedy picks are decisive."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32).to(param.dtype)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.1 * noise)
        # Widening the final norm, not the embedding, keeps tied models from echoing their input.
        model.model.norm.weight.mul_(4.0)


def save(model, out, max_shard_size, tiny):
    out.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, safe_serialization=True, **kwargs)
    if tiny:
        # A tiny model has no special tokens, so its generation defaults say nothing.
        (out / "generation_config.json").unlink(missing_ok=True)


def prompts(vocab_size, seed):
    generator = torch.Generator().manual_seed(seed + 2)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


@torch.no_grad()
def greedy(model, ids):
    """Argmax decoding by full recomputation: no cache, and nothing like EOS can end it early."""
    tokens, margins = list(ids), []
    for _ in range(NUM_NEW_TOKENS):
        logits = model(torch.tensor([tokens])).logits[0, -1]
        top = torch.topk(logits, 2).values
        tokens.append(int(torch.argmax(logits)))
        margins.append(float(top[0] - top[1]))
    return tokens[len(ids) :], margins


class F32:
    """A float32 value written as its shortest decimal that reads back to the same float32."""

    def __init__(self, value):
        assert math.isfinite(value)
        self.value = np.float32(value)
        self.text = str(self.value)


def f32_list(tensor):
    return [F32(v) for v in tensor.to(torch.float32).reshape(-1).tolist()]


def to_json(value):
    if isinstance(value, F32):
        return value.text
    if isinstance(value, list):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{to_json(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


@torch.no_grad()
def golden(out, shape, seed):
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    config = model.config
    records = []
    for i, ids in enumerate(prompts(config.vocab_size, seed)):
        logits = model(torch.tensor([ids])).logits[0]
        tokens, margins = greedy(model, ids)
        record = {"ids": ids, "last_logits": f32_list(logits[-1])}
        if i == ALL_POSITIONS_PROMPT:
            record["all_logits"] = [f32_list(row) for row in logits]
        record["greedy"] = tokens
        record["greedy_margins"] = [F32(m) for m in margins]
        records.append(record)
    return {
        "shape": shape,
        "model_type": config.model_type,
        "seed": seed,
        "vocab_size": config.vocab_size,
        "num_new_tokens": NUM_NEW_TOKENS,
        "all_logits_prompt": ALL_POSITIONS_PROMPT,
        "prompts": records,
    }


def check_round_trip(path, reference):
    """Reads the written file back and demands every logit is the same float32, bit for bit."""
    written = json.loads(path.read_text())
    for got, want in zip(written["prompts"], reference["prompts"]):
        for key in ("last_logits", "all_logits", "greedy_margins"):
            if key in want:
                a = np.array(got[key], dtype=np.float32).reshape(-1)
                b = np.array([v.value for v in flatten(want[key])], dtype=np.float32)
                assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), key


def flatten(values):
    return [v for row in values for v in flatten(row)] if isinstance(values, list) else [values]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES))
    parser.add_argument("--out", required=True, type=pathlib.Path, help="checkpoint directory to write")
    parser.add_argument("--dtype", choices=sorted(DTYPES), help="default: float32 for tiny shapes, else bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-shard-size", help='e.g. "200KB" to write model.safetensors.index.json and shards')
    parser.add_argument("--golden", type=pathlib.Path, help="JSON file to write the reference outputs to")
    args = parser.parse_args()

    tiny = args.shape.startswith("tiny-")
    dtype = DTYPES[args.dtype or ("float32" if tiny else "bfloat16")]
    torch.use_deterministic_algorithms(True)
    save(build_model(args.shape, dtype, args.seed), args.out, args.max_shard_size, tiny)
    if args.golden:
        reference = golden(args.out, args.shape, args.seed)
        args.golden.write_text(to_json(reference) + "\n")
        check_round_trip(args.golden, reference)


if __name__ == "__main__":
    main()

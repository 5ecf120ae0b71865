#!/usr/bin/env python3
"""Builds seeded random checkpoints of real architectures with transformers, and golden outputs for them.

    make_checkpoint.py --shape tiny-qwen2 --out DIR --golden DIR/reference.json
    make_checkpoint.py --shape tiny-qwen3-moe --out DIR --golden DIR/reference.json
    make_checkpoint.py --shape tiny-qwen3-next --out DIR --golden DIR/reference.json
    make_checkpoint.py --shape llama-3.1-8b --out DIR [--layers 2] [--init-device cuda]

The goldens are computed from the checkpoint as saved, in float32 with eager attention, so a
loader that reads the directory back must reproduce them.

Full-size shapes also get a tokenizer (tokenizer.json, tokenizer_config.json): a byte-level BPE
whose merges are enumerated deterministically (no training), with the config's bos/eos ids as
special tokens at exactly those ids, padded with reserved specials up to the vocabulary size.
Tiny shapes get one only with --tokenizer, so the committed goldens stay as they are.
"""

import argparse
import heapq
import json
import math
import os
import pathlib

import numpy as np
import torch
import transformers
from checkpoint_moe import check_moe_layers, expert_layout, moe_shapes, router_gaps
from checkpoint_next import add_mtp, bf16_errors, make_agreeing, mtp_golden, next_shapes
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

ARCHS = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM),
    "mixtral": (MixtralConfig, MixtralForCausalLM),
    "qwen3_next": (Qwen3NextConfig, Qwen3NextForCausalLM),
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
    # Layer 1 is dense through mlp_only_layers, so both kinds of MLP and the change between them are tested.
    "tiny-qwen3-moe": (
        "qwen3_moe",
        dict(
            TINY,
            num_hidden_layers=3,
            head_dim=32,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
            num_experts=16,
            num_experts_per_tok=4,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
        ),
    ),
    # Mixtral's intermediate_size is each expert's; it always renormalizes its top-k weights.
    "tiny-mixtral": (
        "mixtral",
        dict(
            TINY,
            num_hidden_layers=2,
            intermediate_size=48,
            rms_norm_eps=1e-5,
            rope_theta=1000000.0,
            sliding_window=None,
            tie_word_embeddings=False,
            num_local_experts=8,
            num_experts_per_tok=2,
        ),
    ),
    # A reduced Qwen3-MoE for the CPU bench against llama.cpp (docs/benchmarks-moe.md): 64 experts of 384, top 8.
    "qwen3-moe-cpu-bench": (
        "qwen3_moe",
        dict(
            vocab_size=32768,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=64,
            max_position_embeddings=4096,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            tie_word_embeddings=False,
            num_experts=64,
            num_experts_per_tok=8,
            moe_intermediate_size=384,
            norm_topk_prob=True,
            decoder_sparse_step=1,
            mlp_only_layers=[],
            bos_token_id=32760,
            eos_token_id=32761,
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
    **next_shapes(TINY),
    **moe_shapes(),
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

# Pre-tokenizer splits as the released Llama 3 and Qwen2 tokenizer.json files spell them.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Special tokens by offset from the first special id, where the released tokenizers put them.
LLAMA3_SPECIALS = {
    0: "<|begin_of_text|>",
    1: "<|end_of_text|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    8: "<|eom_id|>",
    9: "<|eot_id|>",
}
QWEN_SPECIALS = {0: "<|endoftext|>", 1: "<|im_start|>", 2: "<|im_end|>"}

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# English letter frequencies (per mille) rank the enumerated merges, so common strings come first.
LETTER_FREQ = dict(
    zip(
        "etaoinshrdlcumwfgypbvkjxqz",
        [127, 91, 82, 75, 70, 67, 63, 61, 60, 43, 40, 28, 28, 24, 24, 22, 20, 20, 19, 15, 10, 8, 2, 2, 1, 1],
        strict=True,
    )
)
# A tiny shape without bos/eos in its config keeps this many specials at the top of its vocabulary.
TINY_SPECIALS = 16

PROMPT_LENGTHS = [1, 2, 7, 16, 29, 40]
# The prompt whose logits are kept at every position, not only the last.
ALL_POSITIONS_PROMPT = 5
NUM_NEW_TOKENS = 64


def shape_fields(shape, layers):
    arch, fields = SHAPES[shape]
    if layers is not None:
        fields = dict(fields, num_hidden_layers=layers)
        if "max_window_layers" in fields:
            fields["max_window_layers"] = min(fields["max_window_layers"], layers)
    return arch, fields


def build_model(shape, dtype, seed, layers=None, init_device="cpu"):
    arch, fields = shape_fields(shape, layers)
    config_class, model_class = ARCHS[arch]
    config = config_class(**fields)
    torch.manual_seed(seed)
    torch.set_default_dtype(dtype)
    if init_device == "cpu":
        model = model_class(config)
    else:
        # Initialising on the accelerator takes seconds where the CPU takes minutes for 8B.
        with torch.device(init_device):
            model = model_class(config)
    torch.set_default_dtype(torch.float32)
    if shape.startswith("tiny-"):
        widen_tiny_init(model, seed)
    check_moe_layers(model, fields)
    return model.eval()


def widen_tiny_init(model, seed):
    """Gives norms and biases non-trivial values and widens the logits so greedy picks are decisive."""
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        # Qwen3-Next's norms scale by one plus their weight, all but the gated norm of its linear attention.
        centred = model.config.model_type == "qwen3_next"
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32).to(param.dtype)
            if name.endswith("norm.weight"):
                offset = 0.0 if centred and not name.endswith("linear_attn.norm.weight") else 1.0
                param.copy_(offset + 0.2 * noise)
            elif name.endswith(".bias"):
                param.copy_(0.1 * noise)
        # Widening the final norm, not the embedding, keeps tied models from echoing their input.
        norm = model.model.norm.weight
        norm.copy_(4.0 * (norm + 1.0) - 1.0 if centred else 4.0 * norm)


def save(model, out, max_shard_size, tiny):
    out.mkdir(parents=True, exist_ok=True)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(out, safe_serialization=True, **kwargs)
    if tiny:
        # A tiny model has no special tokens, so its generation defaults say nothing.
        (out / "generation_config.json").unlink(missing_ok=True)
    else:
        write_generation_config(out, model.config)


def write_generation_config(out, config):
    """Greedy-neutral generation defaults whose bos/eos are the config's."""
    generation = {"_from_model_config": True, "bos_token_id": config.bos_token_id}
    generation["eos_token_id"] = config.eos_token_id
    generation["transformers_version"] = transformers.__version__
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def byte_chars():
    """GPT-2's printable stand-in for each byte, indexed by byte value."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def enumerate_merges(count):
    """The `count` likeliest strings of a space mark plus letters, each as a merge of its prefix and last letter.

    A best-first walk over the prefix tree: a string's prefix is always likelier, so it is merged first.
    """
    letters = sorted(LETTER_FREQ, key=lambda c: (-LETTER_FREQ[c], c))
    logp = [math.log(LETTER_FREQ[c] / 1000.0) for c in letters]
    space = byte_chars()[ord(" ")]
    roots = [(math.log(0.5), space)] + [(lp, c) for lp, c in zip(logp, letters, strict=True)]
    heap = [(-(score + logp[0]), text + letters[0], 0) for score, text in roots]
    heapq.heapify(heap)
    merges = []
    while len(merges) < count:
        neg, text, i = heapq.heappop(heap)
        merges.append((text[:-1], text[-1]))
        if i + 1 < len(letters):
            heapq.heappush(heap, (neg + logp[i] - logp[i + 1], text[:-1] + letters[i + 1], i + 1))
        heapq.heappush(heap, (neg - logp[0], text + letters[0], 0))
    return merges


def special_layout(arch, vocab_size, bos_id, eos_id, named=None):
    """Id to text of every special token: from the first special id to the end of the vocabulary.

    `named` (id to text) names specials beyond the family's known ones, such as Orpheus's custom tokens."""
    known = LLAMA3_SPECIALS if arch == "llama" else QWEN_SPECIALS
    ids = [i for i in (bos_id, eos_id) if i is not None]
    first = min(ids) if ids else vocab_size - TINY_SPECIALS
    if bos_id is None and eos_id is None:
        bos_id = first if arch == "llama" else None
        eos_id = first + (1 if arch == "llama" else 2)
    assert 256 < first and max(ids + [first]) < vocab_size, "specials must follow the 256 byte tokens"
    names = {first + offset: text for offset, text in known.items() if first + offset < vocab_size}
    names.update(named or {})
    names = {i: names.get(i, f"<|reserved_{i - first}|>") for i in range(first, vocab_size)}
    return first, names, bos_id, eos_id


def build_tokenizer(arch, vocab_size, bos_id, eos_id, named=None):
    """A byte-level BPE with exactly vocab_size entries; returns (tokenizers.Tokenizer, tokenizer_config dict)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    first, names, bos_id, eos_id = special_layout(arch, vocab_size, bos_id, eos_id, named)
    chars = byte_chars()
    merges = enumerate_merges(first - 256)
    vocab = {c: i for i, c in enumerate(chars)}
    for a, b in merges:
        vocab[a + b] = len(vocab)
    assert len(vocab) == first, "every merge makes a new token"
    llama = arch == "llama"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=llama))
    if not llama:
        tok.normalizer = normalizers.NFC()
    split = pre_tokenizers.Split(Regex(LLAMA3_SPLIT if llama else QWEN2_SPLIT), behavior="isolated", invert=False)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(names[i], special=True, normalized=False) for i in range(first, vocab_size)])
    bos = names.get(bos_id) if bos_id is not None else None
    if llama and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
        )
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    for i, text in names.items():
        assert tok.token_to_id(text) == i, f"special {text} landed at {tok.token_to_id(text)}, not {i}"
    assert tok.get_vocab_size(with_added_tokens=True) == vocab_size
    config = {
        "add_bos_token": bool(llama and bos is not None),
        "add_eos_token": False,
        "bos_token": bos,
        "eos_token": names[eos_id],
        "pad_token": None,
        "chat_template": LLAMA3_TEMPLATE if llama else CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return tok, config


def write_tokenizer(out, arch, config):
    tok, tok_config = build_tokenizer(arch, config.vocab_size, config.bos_token_id, config.eos_token_id)
    tok_config["model_max_length"] = config.max_position_embeddings
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")


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


def load_reference(out):
    """The saved checkpoint in float32 with eager attention, and eager experts where transformers has the choice."""
    kwargs = dict(dtype=torch.float32, attn_implementation="eager")
    try:
        model = AutoModelForCausalLM.from_pretrained(out, experts_implementation="eager", **kwargs)
    except (TypeError, ValueError):
        model = AutoModelForCausalLM.from_pretrained(out, **kwargs)
    return model.eval()


@torch.no_grad()
def golden(out, shape, seed):
    model = load_reference(out)
    config = model.config
    top_k = getattr(config, "num_experts_per_tok", None)
    records = []
    for i, ids in enumerate(prompts(config.vocab_size, seed)):
        outputs = model(torch.tensor([ids]), output_router_logits=True) if top_k else model(torch.tensor([ids]))
        logits = outputs.logits[0]
        tokens, margins = greedy(model, ids)
        record = {"ids": ids, "last_logits": f32_list(logits[-1])}
        gaps = router_gaps(outputs, top_k) if top_k else None
        if gaps is not None:
            record["router_gaps"] = f32_list(gaps)
        if i == ALL_POSITIONS_PROMPT:
            record["all_logits"] = [f32_list(row) for row in logits]
        mtp = mtp_golden(model, out, ids)
        if mtp is not None:
            record["mtp_logits"] = [f32_list(row) for row in mtp]
        record["greedy"] = tokens
        record["greedy_margins"] = [F32(m) for m in margins]
        records.append(record)
    reference = {
        "shape": shape,
        "model_type": config.model_type,
        "seed": seed,
        "vocab_size": config.vocab_size,
        "num_new_tokens": NUM_NEW_TOKENS,
        "all_logits_prompt": ALL_POSITIONS_PROMPT,
        "prompts": records,
    }
    if config.model_type == "qwen3_next":
        for record, error in zip(records, bf16_errors(out, records)):
            record["bf16_error"] = F32(error)
    layout = expert_layout(out)
    if layout:
        reference["expert_layout"] = layout
        reference["transformers_version"] = transformers.__version__
    return reference


def check_round_trip(path, reference):
    """Reads the written file back and demands every logit is the same float32, bit for bit."""
    written = json.loads(path.read_text())
    for got, want in zip(written["prompts"], reference["prompts"]):
        for key in ("last_logits", "all_logits", "greedy_margins", "router_gaps", "mtp_logits"):
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
    parser.add_argument("--layers", type=int, help="keep only the first N layers (a truncated shape for smoke tests)")
    parser.add_argument("--tokenizer", action=argparse.BooleanOptionalAction,
                        help="write tokenizer.json and tokenizer_config.json; default: yes, but no for tiny shapes")
    parser.add_argument("--init-device", help="where to initialise the weights; default: cuda if present, cpu for tiny")
    parser.add_argument("--agreeing-head", action="store_true", help="Qwen3-Next: an MTP head guessing the model's picks")
    args = parser.parse_args()

    tiny = args.shape.startswith("tiny-")
    dtype = DTYPES[args.dtype or ("float32" if tiny else "bfloat16")]
    init_device = args.init_device or ("cuda" if torch.cuda.is_available() and not tiny else "cpu")
    # Deterministic cuBLAS wants this set before it starts; initialisation itself needs no matmul.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    model = build_model(args.shape, dtype, args.seed, args.layers, init_device)
    if args.agreeing_head:
        make_agreeing(model)
    save(model, args.out, args.max_shard_size, tiny)
    if model.config.model_type == "qwen3_next":
        add_mtp(args.out, model, args.seed, args.agreeing_head)
    if args.tokenizer if args.tokenizer is not None else not tiny:
        write_tokenizer(args.out, SHAPES[args.shape][0], model.config)
    del model
    if args.golden:
        reference = golden(args.out, args.shape, args.seed)
        args.golden.write_text(to_json(reference) + "\n")
        check_round_trip(args.golden, reference)


if __name__ == "__main__":
    main()

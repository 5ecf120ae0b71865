#!/usr/bin/env python3
"""Writes a Hugging Face checkpoint directory as GGUF, with llama.cpp's names, so tensorfold and llama.cpp read one file.

    hf_to_gguf.py --model DIR --out FILE.gguf [--type f32|f16|q8_0|q4_1]

Architectures: llama, mixtral (GGUF `llama` with experts), qwen2, qwen3, qwen3_moe (`qwen3moe`) and qwen3_next
(`qwen3next`, as tools/gguf_next.py says, its MTP head included). Matrices take
--type; norms and the routers (ffn_gate_inp) stay f32, as llama.cpp's converter keeps them. Experts are stacked per
layer into ffn_{gate,up,down}_exps. Llama-family q and k rows are permuted for adjacent-pair RoPE, as llama.cpp
expects. A tokenizer.json beside the weights becomes a `gpt2` BPE vocabulary; without one the file has none (tensorfold
sizes the vocabulary from the embedding; llama.cpp needs one). A Qwen3-MoE layer with a dense MLP (mlp_only_layers)
is written with ffn_gate/up/down: tensorfold reads it, llama.cpp does not. Needs numpy and gguf.
"""

import argparse
import json
import pathlib
import sys

import gguf
import gguf_next
import numpy as np

ARCH = {
    "llama": "llama",
    "mixtral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3moe",
    "qwen3_next": "qwen3next",
}
TYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_1": gguf.GGMLQuantizationType.Q4_1,
}
# Per-layer names: Hugging Face suffix -> GGUF suffix.
LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "mlp.gate.weight": "ffn_gate_inp.weight",
    "block_sparse_moe.gate.weight": "ffn_gate_inp.weight",
}
# Expert projections: (Hugging Face prefix and names of gate, up, down) per layout.
EXPERTS = [("mlp.experts.", ("gate_proj", "up_proj", "down_proj")), ("block_sparse_moe.experts.", ("w1", "w3", "w2"))]


def fail(message):
    print(f"hf_to_gguf: {message}", file=sys.stderr)
    sys.exit(1)


class Tensors:
    """Every tensor of the directory's safetensors files, read as f32 on demand (bf16 by its bits, as numpy has none)."""

    DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}

    def __init__(self, directory):
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            fail(f"no .safetensors file in {directory}")
        self.where = {}
        for path in files:
            with open(path, "rb") as f:
                size = int.from_bytes(f.read(8), "little")
                header = json.loads(f.read(size))
            for name, info in header.items():
                if name != "__metadata__":
                    self.where[name] = (path, 8 + size, info)

    def __contains__(self, name):
        return name in self.where

    def get(self, name):
        path, base, info = self.where[name]
        if info["dtype"] not in self.DTYPES:
            fail(f"{name}: dtype {info['dtype']} is not converted (F32, F16 and BF16 are)")
        start, end = info["data_offsets"]
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=base + start, shape=(end - start,))
        values = np.frombuffer(data, dtype=self.DTYPES[info["dtype"]]).reshape(info["shape"])
        if info["dtype"] == "BF16":
            return (values.astype(np.uint32) << 16).view(np.float32)
        return values.astype(np.float32)


def permute_pairs(w, heads):
    """Rows of each head from [first halves, second halves] to interleaved pairs (llama.cpp's RoPE order)."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_matrix(writer, name, data, qtype):
    if data.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32 or name.endswith("ffn_gate_inp.weight"):
        writer.add_tensor(name, data.astype(np.float32))
    elif qtype == gguf.GGMLQuantizationType.F16:
        writer.add_tensor(name, data.astype(np.float16))
    else:
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        if data.shape[-1] % block:
            # As llama.cpp's converter does, a matrix whose rows are not whole blocks keeps full precision.
            print(f"hf_to_gguf: {name} stays f32: rows of {data.shape[-1]} are not whole blocks of {block}")
            writer.add_tensor(name, data.astype(np.float32))
            return
        writer.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def add_vocab(writer, directory, config):
    path = directory / "tokenizer.json"
    if not path.exists():
        return False
    tok = json.loads(path.read_text())
    model = tok.get("model", {})
    if model.get("type") != "BPE":
        fail(f"{path}: only BPE tokenizers are converted, not {model.get('type')!r}")
    ids = dict(model["vocab"])
    special = set()
    for added in tok.get("added_tokens", []):
        ids[added["content"]] = added["id"]
        if added.get("special"):
            special.add(added["id"])
    size = max(config["vocab_size"], max(ids.values()) + 1)
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [gguf.TokenType.UNUSED] * size
    for text, i in ids.items():
        tokens[i] = text
        types[i] = gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    for key, add in (("bos_token_id", writer.add_bos_token_id), ("eos_token_id", writer.add_eos_token_id)):
        value = config.get(key)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            add(value)
    return True


def rope_theta(config):
    """Transformers 5's `rope_parameters` first, as transformers and tensorfold read a config that has both."""
    return (config.get("rope_parameters") or {}).get("rope_theta") or config.get("rope_theta") or 10000.0


def convert(directory, out, qtype):
    config = json.loads((directory / "config.json").read_text())
    model_type = config.get("model_type")
    if model_type not in ARCH:
        fail(f"unsupported model_type {model_type!r} (supported: {', '.join(ARCH)})")
    arch = ARCH[model_type]
    tensors = Tensors(directory)
    heads, kv_heads, hidden = config["num_attention_heads"], config["num_key_value_heads"], config["hidden_size"]
    head_dim = config.get("head_dim") or hidden // heads
    layers = config["num_hidden_layers"]
    next_family = arch == "qwen3next"
    mtp = next_family and "mtp.fc.weight" in tensors
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_name(directory.name)
    writer.add_context_length(config.get("max_position_embeddings", 4096))
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers + int(mtp))
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if next_family:
        gguf_next.write_metadata(writer, config, fail)
    else:
        writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(rope_theta(config))
    writer.add_file_type(qtype)
    experts = config.get("num_experts") or config.get("num_local_experts")
    if experts:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(config["num_experts_per_tok"])
        if config.get("moe_intermediate_size"):
            writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    has_vocab = add_vocab(writer, directory, config)
    add_matrix(writer, "token_embd.weight", tensors.get("model.embed_tokens.weight"), qtype)
    norm = tensors.get("model.norm.weight")
    writer.add_tensor("output_norm.weight", norm + 1.0 if next_family else norm)
    if "lm_head.weight" in tensors and not config.get("tie_word_embeddings", False):
        add_matrix(writer, "output.weight", tensors.get("lm_head.weight"), qtype)
    def add_experts(hf, gg):
        for prefix, (gate, up, down) in EXPERTS:
            if f"{hf}{prefix}0.{gate}.weight" not in tensors:
                continue
            for proj, kind in ((gate, "gate"), (up, "up"), (down, "down")):
                stacked = np.stack([tensors.get(f"{hf}{prefix}{e}.{proj}.weight") for e in range(experts)])
                add_matrix(writer, f"{gg}ffn_{kind}_exps.weight", stacked, qtype)

    dense_moe_layers = []
    for i in range(layers):
        hf, gg = f"model.layers.{i}.", f"blk.{i}."
        if next_family:
            gguf_next.write_layer(writer, tensors, hf, gg, config, add_matrix, qtype)
        for suffix, name in LAYER.items() if not next_family else ():
            if hf + suffix not in tensors:
                continue
            data = tensors.get(hf + suffix)
            if arch == "llama" and suffix.startswith(("self_attn.q_proj", "self_attn.k_proj")):
                data = permute_pairs(data, heads if "q_proj" in suffix else kv_heads)
            add_matrix(writer, gg + name, data, qtype)
        add_experts(hf, gg)
        if experts and f"{hf}mlp.gate_proj.weight" in tensors:
            dense_moe_layers.append(i)
    if mtp:
        gguf_next.write_mtp(writer, tensors, layers, config, add_matrix, qtype, add_experts)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    notes = []
    if not has_vocab:
        notes.append("no tokenizer.json: no vocabulary (llama.cpp will not load it)")
    if dense_moe_layers:
        notes.append(f"dense MLP layers {dense_moe_layers} among experts (llama.cpp will not load it)")
    print(f"wrote {out} ({arch}, {qtype.name})" + "".join(f"; {n}" for n in notes))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=pathlib.Path)
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--type", default="f32", choices=sorted(TYPES))
    args = ap.parse_args()
    convert(args.model, args.out, TYPES[args.type])


if __name__ == "__main__":
    main()

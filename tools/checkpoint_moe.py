"""Mixture-of-experts helpers of make_checkpoint.py: layer kinds, router near-ties, the saved expert layout."""

import json

import torch


def moe_layer_kinds(fields):
    """Per layer, True where its MLP is a mixture of experts, by the rule the Qwen3-MoE decoder layer applies."""
    num_experts = fields.get("num_experts", fields.get("num_local_experts", 0))
    dense, step = fields.get("mlp_only_layers") or [], fields.get("decoder_sparse_step", 1)
    return [i not in dense and num_experts > 0 and (i + 1) % step == 0 for i in range(fields["num_hidden_layers"])]


def check_moe_layers(model, fields):
    """Fails unless the built model has the layer kinds and head size the shape asks for, so a goldens run tests them."""
    if "num_experts_per_tok" not in fields:
        return
    for layer, sparse in zip(model.model.layers, moe_layer_kinds(fields), strict=True):
        # Transformers 4 named Mixtral's block `block_sparse_moe`; 5 names it `mlp` like the others.
        mlp = layer.mlp if hasattr(layer, "mlp") else layer.block_sparse_moe
        assert hasattr(mlp, "experts") == sparse, f"layer kinds differ from {moe_layer_kinds(fields)}"
    # Stacked expert parameters are initialised by the model's own hook; an uninitialised one would show here.
    for name, param in model.named_parameters():
        assert torch.isfinite(param).all() and param.abs().max() < 10, f"{name} was not initialised"
    if "head_dim" in fields:
        attention = next((layer.self_attn for layer in model.model.layers if hasattr(layer, "self_attn")), None)
        if attention is None:
            return
        q = attention.q_proj.weight
        # Qwen3-Next's query projection also gives each head its output gate.
        width = fields["num_attention_heads"] * fields["head_dim"] * (2 if "linear_num_key_heads" in fields else 1)
        assert q.shape[0] == width, f"head_dim ignored: q is {q.shape}"


def router_gaps(outputs, top_k):
    """Per token, the smallest gap over the MoE layers between the k-th and the next router probability.

    A gap near zero means a rounding difference may pick another expert there, so a test can loosen for it."""
    router_logits = getattr(outputs, "router_logits", None)
    if not router_logits:
        return None
    gaps = []
    for logits in router_logits:
        probs = torch.softmax(logits.to(torch.float32), dim=-1)
        top = torch.topk(probs, top_k + 1, dim=-1).values
        gaps.append(top[:, top_k - 1] - top[:, top_k])
    return torch.stack(gaps).min(dim=0).values


def expert_layout(out):
    """How the saved file stores experts: one tensor per expert, or stacked across experts."""
    index = out / "model.safetensors.index.json"
    if index.exists():
        names = json.loads(index.read_text())["weight_map"]
    else:
        from safetensors import safe_open

        with safe_open(out / "model.safetensors", framework="pt") as f:
            names = list(f.keys())
    experts = [n for n in names if ".experts." in n]
    if not experts:
        return None
    return "stacked" if any(n.endswith((".gate_up_proj", ".down_proj")) for n in experts) else "per-expert"


def moe_shapes():
    """Full-size mixture-of-experts shapes for the GPU benchmarks, as their published configs give them."""
    return {
        # Qwen3-30B-A3B: 128 experts of 768, 8 a token, in every one of 48 layers; 61 GB in bf16.
        "qwen3-30b-a3b": (
            "qwen3_moe",
            dict(
                vocab_size=151936,
                hidden_size=2048,
                intermediate_size=6144,
                num_hidden_layers=48,
                num_attention_heads=32,
                num_key_value_heads=4,
                head_dim=128,
                max_position_embeddings=40960,
                rms_norm_eps=1e-6,
                rope_theta=1000000.0,
                tie_word_embeddings=False,
                num_experts=128,
                num_experts_per_tok=8,
                moe_intermediate_size=768,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                bos_token_id=151643,
                eos_token_id=151645,
            ),
        ),
    }

"""Qwen3-Next (`qwen3next`) tensors and metadata for hf_to_gguf.py, in the layout llama.cpp's converter writes.

Norms that scale by one plus their weight are stored with the one added (all but the linear layers' gated norm);
each linear layer's input projection is split into `attn_qkv` (every q, every k, every v) and `attn_gate` (every z);
A_log is stored as -exp(A_log) in `ssm_a`; the MTP head becomes block `num_hidden_layers` with its `nextn.*` tensors.
"""

import numpy as np

# Hugging Face suffix -> (GGUF suffix, add one).
LAYER = {
    "input_layernorm.weight": ("attn_norm.weight", True),
    "post_attention_layernorm.weight": ("post_attention_norm.weight", True),
    "self_attn.q_proj.weight": ("attn_q.weight", False),
    "self_attn.k_proj.weight": ("attn_k.weight", False),
    "self_attn.v_proj.weight": ("attn_v.weight", False),
    "self_attn.o_proj.weight": ("attn_output.weight", False),
    "self_attn.q_norm.weight": ("attn_q_norm.weight", True),
    "self_attn.k_norm.weight": ("attn_k_norm.weight", True),
    "linear_attn.in_proj_ba.weight": ("ssm_ba.weight", False),
    "linear_attn.dt_bias": ("ssm_dt.bias", False),
    "linear_attn.norm.weight": ("ssm_norm.weight", False),
    "linear_attn.out_proj.weight": ("ssm_out.weight", False),
    "mlp.gate.weight": ("ffn_gate_inp.weight", False),
    "mlp.gate_proj.weight": ("ffn_gate.weight", False),
    "mlp.up_proj.weight": ("ffn_up.weight", False),
    "mlp.down_proj.weight": ("ffn_down.weight", False),
    "mlp.shared_expert.gate_proj.weight": ("ffn_gate_shexp.weight", False),
    "mlp.shared_expert.up_proj.weight": ("ffn_up_shexp.weight", False),
    "mlp.shared_expert.down_proj.weight": ("ffn_down_shexp.weight", False),
}
MTP = {
    "mtp.fc.weight": ("nextn.eh_proj.weight", False),
    "mtp.pre_fc_norm_embedding.weight": ("nextn.enorm.weight", True),
    "mtp.pre_fc_norm_hidden.weight": ("nextn.hnorm.weight", True),
    "mtp.norm.weight": ("nextn.shared_head_norm.weight", True),
}


def attention_interval(config, fail):
    """The interval of full-attention layers that `layer_types` follows; llama.cpp has no other way to say it."""
    types = config.get("layer_types")
    interval = config.get("full_attention_interval", 4)
    if types is None:
        return interval
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    interval = full[0] + 1 if full else len(types) + 1
    want = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(len(types))]
    if types != want:
        fail(f"layer_types {types} is not one full-attention layer in every {interval}: llama.cpp cannot say it")
    return interval


def grouped(qkvz, config):
    """`in_proj_qkvz` rows (each key head's q, k, v, z end to end) as (every q, k and v; every z)."""
    nk, dk = config["linear_num_key_heads"], config["linear_key_head_dim"]
    group_v = config["linear_num_value_heads"] // nk * config["linear_value_head_dim"]
    groups = qkvz.reshape(nk, 2 * dk + 2 * group_v, -1)
    q, k = groups[:, :dk], groups[:, dk : 2 * dk]
    v, z = groups[:, 2 * dk : 2 * dk + group_v], groups[:, 2 * dk + group_v :]
    cols = qkvz.shape[-1]
    qkv = np.concatenate([q.reshape(-1, cols), k.reshape(-1, cols), v.reshape(-1, cols)])
    return qkv, z.reshape(-1, cols)


def write_metadata(writer, config, fail):
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    factor = (config.get("rope_parameters") or {}).get("partial_rotary_factor") or config.get("partial_rotary_factor")
    writer.add_rope_dimension_count(int(head_dim * (factor or 0.25)))
    writer.add_ssm_conv_kernel(config["linear_conv_kernel_dim"])
    writer.add_ssm_state_size(config["linear_key_head_dim"])
    writer.add_ssm_group_count(config["linear_num_key_heads"])
    writer.add_ssm_time_step_rank(config["linear_num_value_heads"])
    writer.add_ssm_inner_size(config["linear_value_head_dim"] * config["linear_num_value_heads"])
    writer.add_full_attention_interval(attention_interval(config, fail))
    if config.get("shared_expert_intermediate_size"):
        writer.add_expert_shared_feed_forward_length(config["shared_expert_intermediate_size"])


def write_layer(writer, tensors, hf, gg, config, add_matrix, qtype):
    """One decoder layer's own tensors (not its routed experts) from prefix `hf` to block prefix `gg`."""
    for suffix, (name, centred) in LAYER.items():
        if hf + suffix in tensors:
            data = tensors.get(hf + suffix)
            add_matrix(writer, gg + name, data + 1.0 if centred else data, qtype)
    if hf + "linear_attn.in_proj_qkvz.weight" in tensors:
        qkv, z = grouped(tensors.get(hf + "linear_attn.in_proj_qkvz.weight"), config)
        add_matrix(writer, gg + "attn_qkv.weight", qkv, qtype)
        add_matrix(writer, gg + "attn_gate.weight", z, qtype)
        conv = tensors.get(hf + "linear_attn.conv1d.weight")
        writer.add_tensor(gg + "ssm_conv1d.weight", conv.reshape(conv.shape[0], conv.shape[-1]).astype(np.float32))
        writer.add_tensor(gg + "ssm_a", (-np.exp(tensors.get(hf + "linear_attn.A_log"))).astype(np.float32))
    if hf + "mlp.shared_expert_gate.weight" in tensors:
        gate = tensors.get(hf + "mlp.shared_expert_gate.weight").reshape(-1)
        writer.add_tensor(gg + "ffn_gate_inp_shexp.weight", gate.astype(np.float32))


def write_mtp(writer, tensors, block, config, add_matrix, qtype, add_experts):
    """The MTP head as block `block`: its decoder layer and its `nextn.*` tensors; False where there is none."""
    if "mtp.fc.weight" not in tensors:
        return False
    gg = f"blk.{block}."
    write_layer(writer, tensors, "mtp.layers.0.", gg, config, add_matrix, qtype)
    add_experts("mtp.layers.0.", gg)
    for name, (suffix, centred) in MTP.items():
        data = tensors.get(name)
        add_matrix(writer, gg + suffix, data + 1.0 if centred else data, qtype)
    writer.add_nextn_predict_layers(1)
    return True

"""Qwen3-Next (Flash Next) helpers of make_checkpoint.py: its tiny shape, its MTP head, and the head's goldens.

Transformers runs Qwen3-Next without its multi-token-prediction (MTP) head and skips `mtp.*` weights on load. The
head here is built from transformers' own Qwen3-Next layers, wired as vLLM's Qwen3-Next MTP predictor wires them:
the next token's embedding and the main model's final hidden state (after its last norm) each RMS-normed, joined
embedding first, projected by `fc` to the hidden size, one full-attention decoder layer, a norm, then the main
model's output head. Row i reads the hidden state of position i and the token of position i + 1, at position i.
"""

import copy
import json

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM
from transformers.models.qwen3_next import modeling_qwen3_next as qn


def next_shapes(tiny):
    """The family's shapes; `tiny` is make_checkpoint.py's base of the committed tiny shapes."""
    return {
        # Flash Next: three Gated DeltaNet layers around one gated attention layer; layer 1's MLP is dense, the others
        # are experts with a gated shared expert. Key heads 2 under value heads 4 keeps the grouping in play.
        "tiny-qwen3-next": (
            "qwen3_next",
            dict(
                tiny,
                num_hidden_layers=4,
                layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
                head_dim=32,
                rms_norm_eps=1e-6,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0, partial_rotary_factor=0.25),
                tie_word_embeddings=False,
                linear_conv_kernel_dim=4,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                linear_num_key_heads=2,
                linear_num_value_heads=4,
                num_experts=16,
                num_experts_per_tok=4,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=48,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[1],
            ),
        ),
        # Qwen3-Next-80B-A3B's shape; --layers cuts it to fit one GPU (24 layers are about 40B parameters, 80 GB in bf16).
        "qwen3-next-80b-a3b": (
            "qwen3_next",
            dict(
                vocab_size=151936,
                hidden_size=2048,
                intermediate_size=5120,
                num_hidden_layers=48,
                num_attention_heads=16,
                num_key_value_heads=2,
                head_dim=256,
                max_position_embeddings=262144,
                rms_norm_eps=1e-6,
                rope_parameters=dict(rope_type="default", rope_theta=10000000.0, partial_rotary_factor=0.25),
                tie_word_embeddings=False,
                full_attention_interval=4,
                linear_conv_kernel_dim=4,
                linear_key_head_dim=128,
                linear_value_head_dim=128,
                linear_num_key_heads=16,
                linear_num_value_heads=32,
                num_experts=512,
                num_experts_per_tok=10,
                moe_intermediate_size=512,
                shared_expert_intermediate_size=512,
                norm_topk_prob=True,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                bos_token_id=151643,
                eos_token_id=151645,
            ),
        ),
    }


class MtpHead(torch.nn.Module):
    """One MTP layer over a Qwen3-Next config: a full-attention decoder layer with the model's MLP kind."""

    def __init__(self, config):
        super().__init__()
        layer_config = copy.deepcopy(config)
        layer_config.layer_types = ["full_attention"]
        layer_config.mlp_only_layers = []
        h, eps = config.hidden_size, config.rms_norm_eps
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = qn.Qwen3NextRMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = qn.Qwen3NextRMSNorm(h, eps=eps)
        self.layers = torch.nn.ModuleList([qn.Qwen3NextDecoderLayer(layer_config, 0)])
        self.norm = qn.Qwen3NextRMSNorm(h, eps=eps)

    def forward(self, model, ids, hidden):
        """Logits of each row: row i joins token ids[i + 1] with hidden[i], at position i."""
        n = len(ids) - 1
        embeds = model.model.embed_tokens(torch.tensor([ids[1:]]))
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden[:, :n])], dim=-1))
        positions = torch.arange(n)[None]
        rope = model.model.rotary_emb(x, positions)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        x = self.layers[0](x, position_embeddings=rope, attention_mask=mask, position_ids=positions)
        return model.lm_head(self.norm(x))


def seeded_mtp(config, seed, dtype=torch.float32):
    """An MTP head with seeded weights: norms near one (they scale by one plus their weight), the rest normal."""
    torch.manual_seed(seed + 3)
    torch.set_default_dtype(dtype)
    try:
        head = MtpHead(config)
    finally:
        torch.set_default_dtype(torch.float32)
    generator = torch.Generator().manual_seed(seed + 4)
    with torch.no_grad():
        for name, param in head.named_parameters():
            noise = torch.randn(param.shape, generator=generator).to(param.dtype)
            scale = 0.2 if name.endswith("norm.weight") else config.initializer_range
            param.copy_(scale * noise)
    return head.eval()


def mtp_tensors(head, config):
    """The head's tensors under the published checkpoints' names, experts one tensor each."""
    out = {}
    for name, tensor in head.state_dict().items():
        if name.endswith("experts.gate_up_proj"):
            prefix, width = name[: -len("gate_up_proj")], config.moe_intermediate_size
            for e, stacked in enumerate(tensor):
                out[f"mtp.{prefix}{e}.gate_proj.weight"] = stacked[:width]
                out[f"mtp.{prefix}{e}.up_proj.weight"] = stacked[width:]
        elif name.endswith("experts.down_proj"):
            prefix = name[: -len("down_proj")]
            for e, down in enumerate(tensor):
                out[f"mtp.{prefix}{e}.down_proj.weight"] = down
        else:
            out[f"mtp.{name}"] = tensor
    return {name: t.contiguous().clone() for name, t in out.items()}


# Every block's output projection: zeroed, the block adds nothing to the residual stream.
OUTPUTS = ("o_proj.weight", "out_proj.weight", "down_proj.weight", "down_proj")


@torch.no_grad()
def make_agreeing(model):
    """Zeroes every block's output projection, so a position's logits follow from its own token alone: the model's
    greedy next token is a function of the current one."""
    if model.config.model_type != "qwen3_next":
        raise SystemExit(f"--agreeing-head needs a Qwen3-Next shape, not {model.config.model_type}")
    for name, param in model.named_parameters():
        if name.endswith(OUTPUTS):
            param.zero_()


@torch.no_grad()
def agreeing_head(head, model):
    """Makes the head's tensors guess what `make_agreeing`'s model picks: `fc` passes the normed embedding through
    unscaled, its layer adds nothing, and its last norm is the model's."""
    for name, tensor in head.items():
        if name.endswith(OUTPUTS):
            tensor.zero_()
    fc, hidden = head["mtp.fc.weight"], model.config.hidden_size
    fc.zero_()
    fc[:, :hidden] = torch.eye(hidden, dtype=fc.dtype)
    head["mtp.pre_fc_norm_embedding.weight"].zero_()
    head["mtp.norm.weight"].copy_(model.model.norm.weight)


def add_mtp(out, model, seed, agreeing=False):
    """Adds a seeded MTP head to a saved Qwen3-Next checkpoint, in the model's dtype: into its one file, or as a shard
    of its own that the index names; and `num_nextn_predict_layers` to its config. `agreeing`: the head of
    `agreeing_head`, for a model made by `make_agreeing`."""
    head = mtp_tensors(seeded_mtp(model.config, seed, model.dtype), model.config)
    if agreeing:
        agreeing_head(head, model)
    index = out / "model.safetensors.index.json"
    if index.exists():
        save_file(head, out / "model-mtp.safetensors", metadata={"format": "pt"})
        listing = json.loads(index.read_text())
        listing["weight_map"].update({name: "model-mtp.safetensors" for name in head})
        index.write_text(json.dumps(listing, indent=2) + "\n")
    else:
        weights = out / "model.safetensors"
        tensors = load_file(weights)
        tensors.update(head)
        save_file(tensors, weights, metadata={"format": "pt"})
    config = json.loads((out / "config.json").read_text())
    config["num_nextn_predict_layers"] = 1
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def load_mtp(out, model):
    """The saved MTP head, read back from the checkpoint."""
    head = MtpHead(model.config)
    stacked = {}
    files = [out / "model-mtp.safetensors", out / "model.safetensors"]
    found = load_file(next(f for f in files if f.exists()))
    tensors = {k[len("mtp.") :]: v.float() for k, v in found.items() if k.startswith("mtp.")}
    for name, param in head.state_dict().items():
        if name.endswith("experts.gate_up_proj"):
            prefix = name[: -len("gate_up_proj")]
            parts = [torch.cat([tensors[f"{prefix}{e}.gate_proj.weight"], tensors[f"{prefix}{e}.up_proj.weight"]])
                     for e in range(param.shape[0])]
            stacked[name] = torch.stack(parts)
        elif name.endswith("experts.down_proj"):
            prefix = name[: -len("down_proj")]
            stacked[name] = torch.stack([tensors[f"{prefix}{e}.down_proj.weight"] for e in range(param.shape[0])])
        else:
            stacked[name] = tensors[name]
    head.load_state_dict(stacked)
    return head.eval()


@torch.no_grad()
def mtp_golden(model, out, ids):
    """The MTP head's logits of every row of a prompt (one fewer than its tokens), or None without a head."""
    config = json.loads((out / "config.json").read_text())
    if not config.get("num_nextn_predict_layers") or len(ids) < 2:
        return None
    hidden = model.model(torch.tensor([ids])).last_hidden_state
    return load_mtp(out, model)(model, ids, hidden)[0]


@torch.no_grad()
def bf16_errors(out, records):
    """Per prompt, transformers' own bf16 error on the last logits: the largest difference from its f32 logits over
    the largest f32 logit. It bounds what another format's error may be on that prompt."""
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16, attn_implementation="eager").eval()
    errors = []
    for record in records:
        got = model(torch.tensor([record["ids"]])).logits[0, -1].float()
        want = torch.tensor([v.value for v in record["last_logits"]], dtype=torch.float32)
        errors.append(float((got - want).abs().max() / want.abs().max()))
    return errors

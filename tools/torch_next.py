#!/usr/bin/env python3
"""The hybrid (Qwen3-Next) peer for GPU benchmarks: transformers' Qwen3NextForCausalLM with random bf16 weights.

Its Gated DeltaNet layers run flash-linear-attention's kernels where that package imports (carry its wheels: the
script says which path ran), its experts transformers' grouped-GEMM backend where it has one; a dynamic cache,
no CUDA graphs, scheduler, paging or HTTP. Prints one JSON line per figure: copy bandwidth; the bytes a batch-1
token reads (attention and linear layers, the chosen and shared experts, routers, head) and the limit they set;
prompt seconds at --prefill; decode tok/s at each of --batches after --ctx tokens.

Usage: python3 torch_next.py [--layers 8] [--ctx 512] [--prefill 2048] [--batches 1,64] [--tiny]
--tiny runs the committed tiny shape on the CPU, to check the script itself.
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_checkpoint import ARCHS, shape_fields  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=8)
ap.add_argument("--ctx", type=int, default=512)
ap.add_argument("--prefill", type=int, default=2048)
ap.add_argument("--batches", default="1,64")
ap.add_argument("--steps", type=int, default=16)
ap.add_argument("--tiny", action="store_true")
args = ap.parse_args()

dev = "cpu" if args.tiny else "cuda"
shape = "tiny-qwen3-next" if args.tiny else "qwen3-next-80b-a3b"


def out(**kw):
    print(json.dumps(dict(peer="torch-next", **kw)), flush=True)


def sync():
    if dev == "cuda":
        torch.cuda.synchronize()


def build():
    arch, fields = shape_fields(shape, None if args.tiny else args.layers)
    config_class, model_class = ARCHS[arch]
    config = config_class(**fields)
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        model = model_class(config).eval()
    torch.set_default_dtype(torch.float32)
    experts = "eager"
    if hasattr(model, "set_experts_implementation"):
        try:
            model.set_experts_implementation("grouped_mm")
            experts = "grouped_mm"
        except (ValueError, RuntimeError, ImportError) as e:
            experts = f"eager ({e})"
    return model, config, experts


def linear_path():
    """Whether the fast kernels transformers' Qwen3-Next looks for import here; it warns when it falls back."""
    from importlib.util import find_spec

    return dict(fla=find_spec("fla") is not None, causal_conv1d=find_spec("causal_conv1d") is not None)


def copy_bandwidth():
    if dev != "cuda":
        return None
    a = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    b.copy_(a)
    sync()
    t = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    sync()
    return 2 * 10 * a.numel() / (time.perf_counter() - t)


def token_bytes(c):
    """bf16 bytes one batch-1 token reads: every layer's mixer and router, the chosen and shared experts, the head."""
    h, layers = c.hidden_size, c.num_hidden_layers
    full = sum(1 for t in c.layer_types[:layers] if t == "full_attention")
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    attention = h * (2 * q + 2 * kv) + q * h
    nk, nv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    conv = 2 * nk * dk + nv * dv
    linear = h * (conv + nv * dv + 2 * nv) + nv * dv * h + conv * c.linear_conv_kernel_dim
    expert = 3 * h * c.moe_intermediate_size
    shared = 3 * h * c.shared_expert_intermediate_size + h
    mlp = c.num_experts * h + c.num_experts_per_tok * expert + shared
    weights = full * attention + (layers - full) * linear + layers * mlp + c.vocab_size * h
    # The linear layers' recurrent state is f32 in transformers' cache, read and written once a token.
    state = (layers - full) * nv * dk * dv * 4 * 2
    return 2 * weights + state


@torch.no_grad()
def main():
    model, c, experts = build()
    out(shape=shape, layers=c.num_hidden_layers, experts=experts, **linear_path())
    bw = copy_bandwidth()
    if bw:
        nbytes = token_bytes(c)
        out(copy_bytes_per_s=bw, token_bytes=nbytes, batch1_limit_tok_s=bw / nbytes)
    vocab = c.vocab_size
    ids = torch.randint(0, vocab, (1, args.prefill), device=dev)
    model(ids, use_cache=True)
    sync()
    t = time.perf_counter()
    model(ids, use_cache=True)
    sync()
    out(prefill_tokens=args.prefill, seconds=time.perf_counter() - t)
    for batch in [int(b) for b in args.batches.split(",")]:
        ids = torch.randint(0, vocab, (batch, args.ctx), device=dev)
        res = model(ids, use_cache=True)
        cache, nxt = res.past_key_values, res.logits[:, -1:].argmax(-1)
        times = []
        for _ in range(args.steps):
            sync()
            t = time.perf_counter()
            res = model(nxt, past_key_values=cache, use_cache=True)
            sync()
            times.append(time.perf_counter() - t)
            cache, nxt = res.past_key_values, res.logits[:, -1:].argmax(-1)
        # The first steps warm the kernels' caches and autotuning: the median of the rest.
        rest = sorted(times[2:])
        step = rest[len(rest) // 2]
        out(batch=batch, ctx=args.ctx, step_s=step, tok_s=batch / step)


main()

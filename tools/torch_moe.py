#!/usr/bin/env python3
"""The mixture-of-experts torch peer for GPU benchmarks: the Qwen3-30B-A3B shape in bf16 with random weights.

cuBLAS for attention's projections and the head, SDPA for attention, torch's grouped GEMM (`torch._grouped_mm`)
for the experts, with each round's (row, expert) pairs sorted by expert on the GPU; a static KV cache and one CUDA
graph per decode step; no scheduler, paging or HTTP. It bounds what a plain torch server reaches on this shape.
Prints one JSON line per figure: copy bandwidth; the bytes a batch-1 token reads (the chosen experts, attention,
routers, head) and the limit they set; prompt seconds at each --prefill length; decode tok/s at batch 1, 64 and
256 after each --ctx length.

Usage: python3 torch_moe.py [--layers N] [--ctx 512] [--prefill 2048] [--batches 1,64,256] [--tiny]
--tiny shrinks every width and runs on the CPU without graphs, to check the script itself.
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=48)
ap.add_argument("--ctx", default="512")
ap.add_argument("--prefill", default="2048")
ap.add_argument("--batches", default="1,64,256")
ap.add_argument("--tiny", action="store_true")
args = ap.parse_args()

torch.manual_seed(0)
TINY = args.tiny
dev = "cpu" if TINY else "cuda"
# Qwen3-30B-A3B: hidden, heads, kv heads, head size, experts, chosen, expert width, vocabulary.
H, NH, NKV, HD, E, K, FE, V = (64, 4, 2, 16, 16, 4, 32, 512) if TINY else (2048, 32, 4, 128, 128, 8, 768, 151936)
L = args.layers
# Rows of each expert's group are padded to this many, as the grouped GEMM's tiles want.
ALIGN = 16


def out(**kw):
    print(json.dumps(dict(peer="torch-moe", **kw)), flush=True)


def bandwidth():
    if TINY:
        return 1e10
    x = torch.empty(4 << 30, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.time()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    return 10 * 2 * x.numel() / (time.time() - t)


def w(*shape):
    return torch.randn(*shape, device=dev, dtype=torch.bfloat16) * 0.02


def grouped(x, weights, offs):
    """Rows of x grouped by expert (offs: each group's end) times each expert's [N, K] weight."""
    if hasattr(torch, "_grouped_mm"):
        return torch._grouped_mm(x, weights.transpose(-2, -1), offs=offs)
    outs, start = [], 0
    for e, end in enumerate(offs.tolist()):
        outs.append(x[start:end] @ weights[e].t())
        start = end
    return torch.cat(outs + [x.new_zeros(x.shape[0] - start, weights.shape[1])])


class Model:
    def __init__(self):
        one = lambda: torch.ones(H, device=dev, dtype=torch.bfloat16)  # noqa: E731
        self.emb = w(V, H)
        self.layers = [dict(n1=one(), qkv=w((NH + 2 * NKV) * HD, H), qn=torch.ones(HD, device=dev, dtype=torch.bfloat16),
                            kn=torch.ones(HD, device=dev, dtype=torch.bfloat16), o=w(H, NH * HD), n2=one(),
                            router=w(E, H), gu=w(E, 2 * FE, H), down=w(E, H, FE)) for _ in range(L)]
        self.norm, self.head = one(), w(V, H)
        attn = (NH + 2 * NKV) * HD * H + H * NH * HD
        self.token_bytes = L * (2 * (attn + E * H) + 2 * K * 3 * H * FE) + 2 * V * H
        self.nbytes = sum(t.numel() * 2 for layer in self.layers for t in layer.values()) + 2 * 2 * V * H
        inv = 1.0 / (1e6 ** (torch.arange(0, HD, 2, device=dev).float() / HD))
        f = torch.outer(torch.arange(40960, device=dev).float(), inv)
        self.cos, self.sin = f.cos(), f.sin()

    def rope(self, x, pos):
        c, s = self.cos[pos].unsqueeze(2), self.sin[pos].unsqueeze(2)
        x1, x2 = x.float()[..., : HD // 2], x.float()[..., HD // 2:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype)

    def experts(self, h, layer):
        """Top-K of E experts per row, renormalized; pairs sorted by expert, grouped GEMMs, weighted sum back."""
        t = h.shape[0]
        probs = torch.softmax((h @ layer["router"].t()).float(), -1)
        weight, chosen = probs.topk(K, -1)
        weight = (weight / weight.sum(-1, keepdim=True)).to(h.dtype)
        flat = chosen.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(E, device=dev, dtype=torch.long).scatter_add_(0, flat, torch.ones_like(flat))
        padded = (counts + ALIGN - 1) // ALIGN * ALIGN
        ends = padded.cumsum(0)
        starts, first = ends - padded, counts.cumsum(0) - counts
        sorted_expert = flat[order]
        dest = starts[sorted_expert] + torch.arange(t * K, device=dev) - first[sorted_expert]
        rows = t * K + E * (ALIGN - 1)
        buf = h.new_zeros(rows, H)
        buf[dest] = h[order // K]
        g, u = grouped(buf, layer["gu"], ends.to(torch.int32)).chunk(2, -1)
        y = grouped(F.silu(g) * u, layer["down"], ends.to(torch.int32))
        back = y[dest] * weight.flatten()[order].unsqueeze(-1)
        return torch.zeros_like(h).index_add_(0, order // K, back)

    def forward(self, ids, pos, kc, vc, mask):
        b, t = ids.shape
        x = self.emb[ids]
        for li, layer in enumerate(self.layers):
            h = F.rms_norm(x, (H,), layer["n1"], 1e-6)
            q, k, v = (h @ layer["qkv"].t()).split([NH * HD, NKV * HD, NKV * HD], -1)
            q = self.rope(F.rms_norm(q.view(b, t, NH, HD), (HD,), layer["qn"], 1e-6), pos).transpose(1, 2)
            k = self.rope(F.rms_norm(k.view(b, t, NKV, HD), (HD,), layer["kn"], 1e-6), pos).transpose(1, 2)
            v = v.view(b, t, NKV, HD).transpose(1, 2)
            if mask is None:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                kc[li].index_copy_(2, pos[0], k)
                vc[li].index_copy_(2, pos[0], v)
                a = F.scaled_dot_product_attention(q, kc[li], vc[li], attn_mask=mask, enable_gqa=True)
            x = x + a.transpose(1, 2).reshape(b, t, NH * HD) @ layer["o"].t()
            h = F.rms_norm(x, (H,), layer["n2"], 1e-6)
            x = x + self.experts(h.reshape(b * t, H), layer).view(b, t, H)
        return F.rms_norm(x[:, -1], (H,), self.norm, 1e-6) @ self.head.t()


def sync():
    if not TINY:
        torch.cuda.synchronize()


def decode_rate(m, b, ctx, steps):
    s = ctx + steps + 16
    kc = [torch.zeros(b, NKV, s, HD, device=dev, dtype=torch.bfloat16) for _ in range(L)]
    vc = [torch.zeros_like(k) for k in kc]
    ids = torch.randint(0, V, (b, 1), device=dev)
    pos = torch.full((b, 1), ctx, device=dev, dtype=torch.long)
    mask = torch.zeros(b, 1, 1, s, device=dev, dtype=torch.bfloat16)
    mask[..., ctx + 1:] = float("-inf")
    with torch.inference_mode():
        if TINY:
            step = lambda: ids.copy_(m.forward(ids, pos, kc, vc, mask).argmax(-1, keepdim=True))  # noqa: E731
        else:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    m.forward(ids, pos, kc, vc, mask)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                nxt = m.forward(ids, pos, kc, vc, mask).argmax(-1, keepdim=True)

            def step():
                graph.replay()
                ids.copy_(nxt)

        for _ in range(3):
            step()
        sync()
        t = time.time()
        for _ in range(steps):
            step()
        sync()
    return b * steps / (time.time() - t)


def prefill_time(m, t):
    ids = torch.randint(0, V, (1, t), device=dev)
    pos = torch.arange(t, device=dev).unsqueeze(0)
    with torch.inference_mode():
        m.forward(ids, pos, None, None, None)
        sync()
        best = 1e9
        for _ in range(3):
            start = time.time()
            m.forward(ids, pos, None, None, None)
            sync()
            best = min(best, time.time() - start)
    return best


def naive_experts(h, layer):
    """Each row through its own experts one by one: what `Model.experts` must equal."""
    probs = torch.softmax((h @ layer["router"].t()).float(), -1)
    weight, chosen = probs.topk(K, -1)
    weight = (weight / weight.sum(-1, keepdim=True)).to(h.dtype)
    rows = []
    for r in range(h.shape[0]):
        acc = torch.zeros(H, dtype=h.dtype)
        for j in range(K):
            g, u = (h[r] @ layer["gu"][chosen[r, j]].t()).chunk(2, -1)
            acc = acc + (F.silu(g) * u) @ layer["down"][chosen[r, j]].t() * weight[r, j]
        rows.append(acc)
    return torch.stack(rows)


def main():
    if TINY:
        m = Model()
        h = torch.randn(37, H, dtype=torch.bfloat16)
        err = (m.experts(h, m.layers[0]).float() - naive_experts(h, m.layers[0]).float()).abs().max().item()
        out(check="grouped experts = one row at a time", max_abs_error=err)
        assert err < 1e-2, err
    bw = bandwidth()
    out(copy_bw_tbs=round(bw / 1e12, 3), grouped_mm=hasattr(torch, "_grouped_mm"))
    m = Model()
    out(weight_gb=round(m.nbytes / 1e9, 2), token_gb=round(m.token_bytes / 1e9, 3),
        limit_tok_s=round(bw / m.token_bytes, 1), layers=L)
    for t in [int(x) for x in args.prefill.split(",") if x]:
        out(prefill_tokens=t, seconds=round(prefill_time(m, t), 4))
    for ctx in [int(x) for x in args.ctx.split(",") if x]:
        for b in [int(x) for x in args.batches.split(",") if x]:
            try:
                out(batch=b, ctx=ctx, decode_tok_s=round(decode_rate(m, b, ctx, 8 if TINY else 64), 1))
            except Exception as e:  # a batch that does not fit is a figure too
                out(batch=b, ctx=ctx, error=repr(e)[:200])
            if not TINY:
                torch.cuda.empty_cache()


main()

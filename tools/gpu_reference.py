#!/usr/bin/env python3
"""Greedy-decoding references from transformers, and their comparison with our binary's output.

    gpu_reference.py prompts   --vocab V --seed S --out prompts.json [--model DIR] [--steps 32]
    gpu_reference.py prompts   --texts --model MODEL.gguf --out prompts.json   (chat prompts for a trained model)
    gpu_reference.py reference --model DIR --prompts prompts.json --out REF_DIR [--dtype bfloat16|float32]
    gpu_reference.py compare   --ours OURS_DIR --ref REF_DIR [--ref2 REF2_DIR] --out summary.json
    gpu_reference.py selfcheck --model DIR --prompts prompts.json --out OUT_DIR [--ours OURS_DIR] [--steps N]

A run directory holds `tokens.json` ({"tokens": [[generated ids] per prompt]}) and its logits: either
`logits.f32` (raw little-endian float32, [prompts, steps, vocab], as our binary writes it) or one
`logits_NN.npy` per prompt ([steps, vocab] float32, as `reference` writes it). Logits row k is the
one the k-th generated token was picked from. A `--model` that names a `.gguf` file is read by
transformers' GGUF loader (dequantized, then cast to --dtype), which needs the `gguf` package.
"""

import argparse
import json
import math
import pathlib
import random
import statistics
import sys

import numpy as np

PROMPT_LENGTHS = [1, 5, 17, 32, 64, 100, 128, 200]
DEFAULT_STEPS = 32
# Random prompt ids stay below this, where every shape has ordinary tokens.
ID_CEILING = 32000
# Chat prompts for a trained model, whose greedy choices have real margins.
TEXTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers greater than 100.",
    "Translate 'good morning' into Spanish and German.",
    "Give me a recipe for pancakes.",
    "Why is the sky blue?",
    "Describe the water cycle for a ten-year-old.",
]


def pretrained_args(model):
    """from_pretrained's path and keywords: a .gguf file loads through transformers' GGUF reader."""
    path = pathlib.Path(model)
    if path.suffix == ".gguf":
        return str(path.parent), {"gguf_file": path.name}
    return str(path), {}


def special_ids(model_dir):
    """Ids the prompts must avoid: the config's bos/eos/pad and the tokenizer's added tokens."""
    if model_dir is None:
        return set()
    model_dir = pathlib.Path(model_dir)
    ids = set()
    config = json.loads((model_dir / "config.json").read_text())
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = config.get(key)
        ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    tok_path = model_dir / "tokenizer.json"
    if tok_path.is_file():
        ids.update(t["id"] for t in json.loads(tok_path.read_text()).get("added_tokens", []))
    return ids


def config_vocab(model_dir):
    return json.loads((pathlib.Path(model_dir) / "config.json").read_text())["vocab_size"]


def text_prompts(model):
    from transformers import AutoTokenizer

    where, extra = pretrained_args(model)
    tok = AutoTokenizer.from_pretrained(where, **extra)
    chats = [[{"role": "user", "content": text}] for text in TEXTS]
    texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats]
    return [tok.encode(t, add_special_tokens=False) for t in texts], len(tok)


def cmd_prompts(args):
    if args.texts:
        if not args.model:
            raise SystemExit("--texts needs --model, whose tokenizer and chat template make the prompts")
        prompts, vocab = text_prompts(args.model)
        body = {"prompts": prompts, "steps": args.steps, "vocab_size": vocab, "texts": TEXTS}
        pathlib.Path(args.out).write_text(json.dumps(body) + "\n")
        print(f"wrote {len(prompts)} chat prompts of {[len(p) for p in prompts]} ids to {args.out}")
        return
    vocab = args.vocab if args.vocab is not None else config_vocab(args.model)
    avoid = special_ids(args.model)
    pool = [i for i in range(min(vocab, ID_CEILING)) if i not in avoid]
    rng = random.Random(args.seed)
    prompts = [[rng.choice(pool) for _ in range(n)] for n in PROMPT_LENGTHS]
    body = {"prompts": prompts, "steps": args.steps, "vocab_size": vocab, "seed": args.seed}
    pathlib.Path(args.out).write_text(json.dumps(body) + "\n")
    print(f"wrote {len(prompts)} prompts of {PROMPT_LENGTHS} ids, {args.steps} steps each, to {args.out}")


def load_model(model_dir, dtype_name, attn, device):
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, dtype_name)
    where, extra = pretrained_args(model_dir)
    kwargs = dict(dtype=dtype, attn_implementation=attn, **extra)
    try:
        model = AutoModelForCausalLM.from_pretrained(where, device_map=device, **kwargs)
    except (ImportError, ValueError, RuntimeError) as e:
        # Without accelerate, device_map is refused: load on the CPU, then move.
        print(f"device_map={device} refused ({type(e).__name__}); loading on cpu then moving", file=sys.stderr)
        model = AutoModelForCausalLM.from_pretrained(where, **kwargs).to(device)
    return model.eval()


def greedy(model, prompt, steps, device, copies=1):
    """Argmax decoding with the KV cache; returns (tokens, float32 logits [steps, vocab]). No EOS stop."""
    import torch

    # The prompt fills `copies` identical batch rows; every row is fed row 0's token, and row 0 is kept.
    ids = torch.tensor([prompt] * copies, device=device)
    rows, tokens = [], []
    with torch.inference_mode():
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        for step in range(steps):
            row = out.logits[0, -1].float()
            token = int(torch.argmax(row))
            rows.append(row.cpu().numpy())
            tokens.append(token)
            if step + 1 < steps:
                step_ids = torch.tensor([[token]] * copies, device=device)
                out = model(input_ids=step_ids, past_key_values=out.past_key_values, use_cache=True)
    return tokens, np.stack(rows).astype(np.float32)


def decode_prompts(model, prompts, steps, device, out, copies=1):
    """Greedy-decodes each prompt, saving its logits_NN.npy under out; returns the tokens per prompt."""
    out.mkdir(parents=True, exist_ok=True)
    all_tokens = []
    for i, prompt in enumerate(prompts):
        tokens, logits = greedy(model, prompt, steps, device, copies)
        np.save(out / f"logits_{i:02d}.npy", logits)
        all_tokens.append(tokens)
        print(f"prompt {i} ({len(prompt)} ids): {tokens[:8]}...", flush=True)
    return all_tokens


def cmd_reference(args):
    import time

    import torch
    import transformers

    body = json.loads(pathlib.Path(args.prompts).read_text())
    steps = args.steps or body.get("steps", DEFAULT_STEPS)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    out = pathlib.Path(args.out)
    start = time.perf_counter()
    model = load_model(args.model, args.dtype, args.attn, device)
    print(f"loaded {args.model} as {args.dtype} on {device} in {time.perf_counter() - start:.1f}s", flush=True)
    all_tokens = decode_prompts(model, body["prompts"], steps, device, out)
    meta = {
        "tokens": all_tokens,
        "prompts": body["prompts"],
        "steps": steps,
        "vocab_size": int(model.config.vocab_size),
        "model": str(args.model),
        "dtype": args.dtype,
        "attn": args.attn,
        "device": device,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "seconds": round(time.perf_counter() - start, 2),
    }
    (out / "tokens.json").write_text(json.dumps(meta) + "\n")
    print(f"wrote {out}/tokens.json and {len(all_tokens)} logits files in {meta['seconds']}s")


class Run:
    """A run directory: generated tokens per prompt and their logits rows."""

    def __init__(self, path, vocab):
        self.path = pathlib.Path(path)
        meta = json.loads((self.path / "tokens.json").read_text())
        self.tokens = meta["tokens"]
        self.vocab = vocab or meta.get("vocab_size")
        raw = self.path / "logits.f32"
        self.flat = None
        if raw.is_file():
            if not self.vocab:
                raise SystemExit(f"{raw}: pass --vocab or --model to say the vocabulary size")
            data = np.memmap(raw, dtype="<f4", mode="r")
            per_prompt = data.size // len(self.tokens)
            if data.size % (len(self.tokens) * self.vocab):
                raise SystemExit(f"{raw}: {data.size} floats are not {len(self.tokens)} prompts x steps x {self.vocab}")
            self.flat = data.reshape(len(self.tokens), per_prompt // self.vocab, self.vocab)

    def logits(self, i):
        if self.flat is not None:
            return np.asarray(self.flat[i], dtype=np.float32)
        return np.load(self.path / f"logits_{i:02d}.npy")


def top2(row):
    part = np.partition(row, -2)[-2:]
    return float(part[1]), float(part[0])


def compare_prompt(a_tokens, a_logits, b_tokens, b_logits):
    """`a` is measured against `b` (the reference) over the steps whose contexts are the same."""
    steps = min(len(a_tokens), len(b_tokens))
    agreed = 0
    while agreed < steps and a_tokens[agreed] == b_tokens[agreed]:
        agreed += 1
    first = agreed if agreed < steps else None
    rows = min(steps if first is None else first + 1, len(a_logits), len(b_logits))
    diff = a_logits[:rows].astype(np.float64) - b_logits[:rows].astype(np.float64)
    ref_norm = float(np.linalg.norm(b_logits[:rows].astype(np.float64)))
    row_errs = [
        float(np.linalg.norm(diff[k]) / max(np.linalg.norm(b_logits[k].astype(np.float64)), 1e-30)) for k in range(rows)
    ]
    result = {
        "steps": steps,
        "agreed": agreed,
        "first_disagreement": first,
        "rows_compared": rows,
        "rel_err": float(np.linalg.norm(diff)) / max(ref_norm, 1e-30) if rows else None,
        "max_row_rel_err": max(row_errs) if row_errs else None,
        "max_abs_err": float(np.abs(diff).max()) if rows else None,
        # Our logits should pick our own tokens; a miss means the dump and the tokens are misaligned.
        "argmax_mismatches": int(sum(int(np.argmax(a_logits[k])) != a_tokens[k] for k in range(min(rows, steps)))),
    }
    if first is not None and first < min(len(a_logits), len(b_logits)):
        b1, b2 = top2(b_logits[first])
        a1, a2 = top2(a_logits[first])
        ours, theirs = a_tokens[first], b_tokens[first]
        result.update(
            ref_margin=b1 - b2,
            ours_margin=a1 - a2,
            # How much the reference preferred its own pick over ours, and we ours over its.
            ref_gap=float(b_logits[first][theirs] - b_logits[first][ours]),
            ours_gap=float(a_logits[first][ours] - a_logits[first][theirs]),
        )
    return result


def compare_runs(a, b):
    n = min(len(a.tokens), len(b.tokens))
    per_prompt = [compare_prompt(a.tokens[i], a.logits(i), b.tokens[i], b.logits(i)) for i in range(n)]
    errs = [p["rel_err"] for p in per_prompt if p["rel_err"] is not None]
    summary = {
        "prompts": n,
        "min_agreed": min(p["agreed"] for p in per_prompt) if per_prompt else None,
        "all_agreed": sum(p["first_disagreement"] is None for p in per_prompt),
        "max_rel_err": max(errs) if errs else None,
        "median_rel_err": statistics.median(errs) if errs else None,
        "max_abs_err": max((p["max_abs_err"] for p in per_prompt if p["max_abs_err"] is not None), default=None),
        "argmax_mismatches": sum(p["argmax_mismatches"] for p in per_prompt),
    }
    return {"summary": summary, "per_prompt": per_prompt}


def fmt(value, spec=".3g"):
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec) if math.isfinite(value) else str(value)
    return str(value)


def markdown(name, result):
    lines = [
        f"### {name}",
        "",
        "| prompt | agreed/steps | first diff | ref margin | run margin | ref gap | rel err | max row rel | max abs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for i, p in enumerate(result["per_prompt"]):
        cells = [
            str(i),
            f"{p['agreed']}/{p['steps']}",
            fmt(p["first_disagreement"]),
            fmt(p.get("ref_margin")),
            fmt(p.get("ours_margin")),
            fmt(p.get("ref_gap")),
            fmt(p["rel_err"]),
            fmt(p["max_row_rel_err"]),
            fmt(p["max_abs_err"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    s = result["summary"]
    lines += [
        "",
        f"min agreed steps {fmt(s['min_agreed'])}; prompts with all steps agreed {s['all_agreed']}/{s['prompts']}; "
        f"rel err max {fmt(s['max_rel_err'])}, median {fmt(s['median_rel_err'])}; max abs err {fmt(s['max_abs_err'])}; "
        f"argmax mismatches in the first run {s['argmax_mismatches']}",
        "",
    ]
    return "\n".join(lines)


def cmd_compare(args):
    vocab = args.vocab or (config_vocab(args.model) if args.model else None)
    ref = Run(args.ref, vocab)
    vocab = vocab or ref.vocab
    ours = Run(args.ours, vocab)
    pairs = {"ours_vs_ref": compare_runs(ours, ref)}
    if args.ref2:
        ref2 = Run(args.ref2, vocab)
        pairs["ours_vs_ref2"] = compare_runs(ours, ref2)
        # The two references against each other: the noise floor of their precision difference.
        pairs["ref_vs_ref2"] = compare_runs(ref, ref2)
    body = {"ours": str(args.ours), "ref": str(args.ref), "ref2": args.ref2 and str(args.ref2), "vocab_size": vocab}
    body.update(pairs)
    text = "\n".join(markdown(name, result) for name, result in pairs.items())
    print(text)
    pathlib.Path(args.out).write_text(json.dumps(body, indent=1) + "\n")
    if args.markdown:
        pathlib.Path(args.markdown).write_text(text)


def cmd_selfcheck(args):
    """transformers bf16 against its own solo run when only kernels change: batch, reduced reduction, attention."""
    import gc

    import torch

    body = json.loads(pathlib.Path(args.prompts).read_text())
    prompts, steps = body["prompts"], args.steps or body.get("steps", DEFAULT_STEPS)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    out = pathlib.Path(args.out)
    model = load_model(args.model, "bfloat16", "sdpa", device)
    vocab = int(model.config.vocab_size)

    def variant(name, model, copies=1):
        print(f"== {name}", flush=True)
        tokens = decode_prompts(model, prompts, steps, device, out / name, copies)
        (out / name / "tokens.json").write_text(json.dumps({"tokens": tokens, "vocab_size": vocab}) + "\n")

    variant("solo", model)
    variant("copies2", model, 2)
    variant("copies4", model, 4)
    matmul = torch.backends.cuda.matmul
    reduced = matmul.allow_bf16_reduced_precision_reduction
    matmul.allow_bf16_reduced_precision_reduction = False
    try:
        variant("no_reduced_reduction", model)
    finally:
        matmul.allow_bf16_reduced_precision_reduction = reduced
    del model
    gc.collect()
    torch.cuda.empty_cache()
    variant("eager", load_model(args.model, "bfloat16", "eager", device))

    solo = Run(out / "solo", vocab)
    ties = [sum(a == b for a, b in map(top2, solo.logits(i))) for i in range(len(solo.tokens))]
    print(f"steps with a top-two tie per prompt in solo: {ties}")
    runs = {name: Run(out / name, vocab) for name in ("copies2", "copies4", "no_reduced_reduction", "eager")}
    if args.ours:
        runs["ours"] = Run(args.ours, vocab)
    results = {name: compare_runs(run, solo) for name, run in runs.items()}
    agreed = {name: [p["agreed"] for p in r["per_prompt"]] for name, r in results.items()}
    lines = [
        "| variant | agreed steps per prompt | prompts with all steps | median rel err |",
        "|---|---|---|---|",
    ]
    for name, r in results.items():
        s = r["summary"]
        whole, err = f"{s['all_agreed']}/{s['prompts']}", fmt(s["median_rel_err"])
        print(f"{name}: agreed {agreed[name]}, all steps {whole}, median rel err {err}", flush=True)
        lines.append(f"| {name} | {' '.join(map(str, agreed[name]))} | {whole} | {err} |")
    lines += ["", f"steps with a top-two tie per prompt in solo: {ties}", ""]
    report = {
        "model": str(args.model),
        "steps": steps,
        "ties": ties,
        "summaries": {name: r["summary"] for name, r in results.items()},
        "agreed": agreed,
    }
    (out / "selfcheck.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / "selfcheck.md").write_text("\n".join(lines))
    print(f"wrote {out}/selfcheck.json and {out}/selfcheck.md")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prompts", help="write seeded random prompts")
    p.add_argument("--vocab", type=int, help="vocabulary size; default: the --model config's")
    p.add_argument("--model", help="checkpoint whose special ids the prompts avoid")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    p.add_argument("--texts", action="store_true", help="chat prompts from fixed texts, tokenized by --model")
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_prompts)

    p = sub.add_parser("reference", help="greedy tokens and logits from transformers")
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--dtype", choices=["bfloat16", "float32", "float16"], default="bfloat16")
    p.add_argument("--attn", choices=["eager", "sdpa"], default="sdpa")
    p.add_argument("--device", help="default: cuda if present, else cpu")
    p.add_argument("--steps", type=int, help="default: the prompts file's")
    p.set_defaults(run=cmd_reference)

    p = sub.add_parser("compare", help="compare our run with one or two references")
    p.add_argument("--ours", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--ref2")
    p.add_argument("--out", required=True)
    p.add_argument("--markdown", help="also write the tables to this file")
    p.add_argument("--vocab", type=int, help="vocabulary size of logits.f32; default: from --model or the reference")
    p.add_argument("--model", help="checkpoint whose config.json gives the vocabulary size")
    p.set_defaults(run=cmd_compare)

    p = sub.add_parser("selfcheck", help="transformers bf16 against itself when only kernels change")
    p.add_argument("--model", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--out", required=True, help="directory for the run directories and selfcheck.json/.md")
    p.add_argument("--ours", help="our binary's run directory, also compared against the solo run")
    p.add_argument("--steps", type=int, help="default: the prompts file's")
    p.set_defaults(run=cmd_selfcheck)

    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()

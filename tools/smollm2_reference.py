#!/usr/bin/env python3
"""Greedy reference for the default GGUF: transformers' own GGUF loading (dequantized to f32)."""
import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers greater than 100.",
    "Translate 'good morning' into Spanish and German.",
    "def fibonacci(n):",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gguf", required=True, help="path to SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=64)
    args = ap.parse_args()
    path = Path(args.gguf)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, torch_dtype=torch.float32)
    model.eval()
    cases = []
    for i, prompt in enumerate(PROMPTS):
        chat = i < len(PROMPTS) - 1
        if chat:
            text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
        else:
            text = prompt
        ids = tok.encode(text, add_special_tokens=False)
        seq = torch.tensor([ids])
        out, past, first_top = [], None, None
        with torch.no_grad():
            step_in = seq
            for step in range(args.steps):
                res = model(input_ids=step_in, past_key_values=past, use_cache=True)
                past = res.past_key_values
                logits = res.logits[0, -1].float()
                if step == 0:
                    vals, idx = torch.topk(logits, 20)
                    first_top = [[int(j), float(v)] for j, v in zip(idx, vals)]
                nxt = int(torch.argmax(logits))
                out.append(nxt)
                step_in = torch.tensor([[nxt]])
        cases.append({"prompt": prompt, "chat": chat, "text": text, "prompt_ids": ids, "greedy": out, "first_top20": first_top})
        print(prompt, "->", repr(tok.decode(out)))
    Path(args.out).write_text(json.dumps({"model": path.name, "steps": args.steps, "cases": cases}, indent=1) + "\n")


if __name__ == "__main__":
    main()

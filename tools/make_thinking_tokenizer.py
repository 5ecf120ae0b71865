#!/usr/bin/env python3
"""Write the tokenizer of tests/data/thinking: the tiny Qwen3 golden's vocabulary (512 ids, byte-level BPE) with
`<think>` and `</think>` among its specials and a chat template that thinks as Qwen3's thinking models do (the
generation prompt opens `<think>`; `enable_thinking=False` writes an empty block instead).

    python3 tools/make_thinking_tokenizer.py --out tests/data/thinking
"""

import argparse
import json
import pathlib

from make_checkpoint import TINY_SPECIALS, build_tokenizer

VOCAB = 512
FIRST = VOCAB - TINY_SPECIALS
# After Qwen's <|endoftext|>, <|im_start|> and <|im_end|> at offsets 0, 1 and 2.
NAMED = {FIRST + 3: "<think>", FIRST + 4: "</think>"}
EOS = FIRST + 2
TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    tok, config = build_tokenizer("qwen3", VOCAB, None, None, NAMED)
    config["chat_template"] = TEMPLATE
    config["model_max_length"] = 256
    tok.save(str(args.out / "tokenizer.json"))
    (args.out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(json.dumps({"think": tok.token_to_id("<think>"), "end_think": tok.token_to_id("</think>"), "eos": EOS}))


if __name__ == "__main__":
    main()

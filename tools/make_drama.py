#!/usr/bin/env python3
"""Builds a small seeded Drama checkpoint (an Orpheus-layout Llama 3 and a SNAC codec) and its goldens.

    make_drama.py --out tests/data/drama [--codec tests/data/snac]
    make_drama.py --shape orpheus-3b --out DIR [--layers N] [--check TOKENS]   # see tools/drama_orpheus.py

The directory it writes is a Drama checkpoint as docs/speech.md describes it:

    config.json, model.safetensors          a Llama 3 (transformers LlamaForCausalLM), tied embeddings, bf16
    tokenizer.json, tokenizer_config.json   byte-level BPE with 300 text tokens, then the 256 Llama 3
    generation_config.json                  special tokens, then <custom_token_0> .. <custom_token_28682>
    snac/config.json, snac/model.safetensors  the decoder and quantizer tensors of --codec, in bf16
    goldens.json, goldens.safetensors       the reference's prompt ids, greedy tokens, frames and PCM

Real Orpheus ids are the text vocabulary's size plus fixed offsets; here the text vocabulary is small, so
every special and code token sits at another id and readers must find them by name.

A random LM puts a code token in the right slot of a frame one time in seven, so almost no frame would
form. A few hundred seeded optimizer steps on synthetic speech teach it the Orpheus pattern: seven code
tokens per frame, slot by slot, and end-of-speech after a frame whose last code is a terminal one.
The synthetic speech is a chain: voice v starts at member v of a small per-slot code set, keeps that
member through the frame and moves to the next member each frame, so greedy decoding of voice v gives
8 - v frames and then end-of-speech. Sampling strays from the chain, so seeds give different speech.

Goldens are computed from the checkpoint as saved, in float32 with eager attention, through
transformers' tokenizer and model, and the reference SNAC decode (the `snac` package) of the frames
the greedy tokens form, with every NoiseBlock's noise replaced by zeros as tools/make_snac.py does.
"""

import argparse
import json
import pathlib
import shutil
import sys

import numpy as np
import torch

TEXT_VOCAB = 300
CODEBOOK_SIZE = 4096
SLOTS = 7
# <custom_token_0> .. <custom_token_9> are control tokens; codes start at <custom_token_10>.
FIRST_CODE = 10
NUM_CUSTOM = FIRST_CODE + SLOTS * CODEBOOK_SIZE + 1

START_OF_SPEECH, END_OF_SPEECH, START_OF_HUMAN, END_OF_HUMAN, START_OF_AI, END_OF_AI = (
    f"<custom_token_{n}>" for n in range(1, 7)
)
BOS, EOT = "<|begin_of_text|>", "<|eot_id|>"

VOICES = ["tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"]
SET_SIZE = 8

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CORPUS = [
    "Hello there, how are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "I went to the market and bought some fresh bread.",
    "She said it would rain, but the sun came out instead.",
    "We should meet again tomorrow at the station.",
    "That is the funniest thing I have heard all week!",
    "Could you please speak a little more slowly?",
    "Caf\u00e9 cr\u00e8me, 42 times, and then the rest of it.",
    "There are 365 days in a year and 24 hours in a day.",
    "Well, um, I think that might actually work.",
] + [f"{v}: " for v in VOICES]

WORDS = " ".join(CORPUS).replace(",", "").replace(".", "").replace("!", "").replace("?", "").split()

# The goldens: (voice, text, max_tokens); the last runs out of tokens mid-frame.
INPUTS = [
    ("tara", "Hello there, how are you today?", 96),
    ("leo", "The quick brown fox <laugh> jumps over the lazy dog.", 96),
    ("leah", "Caf\u00e9 cr\u00e8me, 42 times!", 40),
]


def llama3_specials():
    """The names Llama 3 gives its 256 special tokens, in id order."""
    named = {
        0: "<|begin_of_text|>",
        1: "<|end_of_text|>",
        4: "<|finetune_right_pad_id|>",
        6: "<|start_header_id|>",
        7: "<|end_header_id|>",
        8: "<|eom_id|>",
        9: "<|eot_id|>",
        10: "<|python_tag|>",
    }
    names, reserved = [], 0
    for i in range(256):
        if i in named:
            names.append(named[i])
        else:
            names.append(f"<|reserved_special_token_{reserved}|>")
            reserved += 1
    return names


def build_tokenizer(out):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TEXT_VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer)
    assert tok.get_vocab_size() == TEXT_VOCAB, tok.get_vocab_size()

    # Specials and code tokens go into the BPE vocabulary so ids are explicit; only the Llama 3 specials
    # are also added tokens, as in Llama 3, which keeps the file small without 28683 added-token records.
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    specials = llama3_specials()
    for i, name in enumerate(specials):
        vocab[name] = TEXT_VOCAB + i
    first_custom = TEXT_VOCAB + len(specials)
    for n in range(NUM_CUSTOM):
        vocab[f"<custom_token_{n}>"] = first_custom + n
    spec["added_tokens"] = [
        {
            "id": TEXT_VOCAB + i,
            "content": name,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, name in enumerate(specials)
    ]
    tok = Tokenizer.from_str(json.dumps(spec))
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    tok.save(str(out / "tokenizer.json"), pretty=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    vocab_size = first_custom + NUM_CUSTOM
    assert tok.get_vocab_size() == vocab_size
    return tok, vocab_size


class Layout:
    """Token ids of the Orpheus layout, looked up by name."""

    def __init__(self, tok):
        ids = tok.convert_tokens_to_ids
        self.bos, self.eot = ids(BOS), ids(EOT)
        self.soh, self.eoh = ids(START_OF_HUMAN), ids(END_OF_HUMAN)
        self.soa, self.sos = ids(START_OF_AI), ids(START_OF_SPEECH)
        self.eos_speech, self.eoa = ids(END_OF_SPEECH), ids(END_OF_AI)
        self.first_code = ids(f"<custom_token_{FIRST_CODE}>")
        self.end_of_text = ids("<|end_of_text|>")
        self.eom = ids("<|eom_id|>")

    def code_token(self, slot, code):
        return self.first_code + slot * CODEBOOK_SIZE + code

    def stop_ids(self):
        return [self.eos_speech, self.eoa, self.eot, self.end_of_text, self.eom]


def code_sets(gen):
    """A small set of codes per slot; code 0 is in one, so its handling is exercised."""
    sets = torch.randint(1, CODEBOOK_SIZE, (SLOTS, SET_SIZE), generator=gen)
    sets[3, 2] = 0
    return sets.tolist()


def synthetic_speech(voice, sets, layout, gen, stray):
    """Code tokens of the chain for a voice; each member choice strays to a random one with `stray`."""
    tokens = []
    member = VOICES.index(voice)
    for _ in range(3 * SET_SIZE):
        for slot in range(SLOTS):
            if torch.rand((), generator=gen) < stray:
                member = int(torch.randint(0, SET_SIZE, (), generator=gen))
            tokens.append(layout.code_token(slot, sets[slot][member]))
        if member == SET_SIZE - 1:
            break
        member += 1
    return tokens + [layout.eos_speech, layout.eoa]


def prompt_ids(hf_tok, layout, voice, text):
    """The reference engine's prompt: control tokens around the tokenizer's "voice: text", which starts with BOS."""
    ids = hf_tok(f"{voice}: {text}")["input_ids"]
    assert ids[0] == layout.bos
    return [layout.soh] + ids + [layout.eot, layout.eoh, layout.soa, layout.sos]


def train(model, hf_tok, layout, sets, seed, steps):
    gen = torch.Generator().manual_seed(seed + 3)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        batch, targets = [], []
        for _ in range(16):
            voice = VOICES[int(torch.randint(0, len(VOICES), (), generator=gen))]
            num_words = int(torch.randint(1, 9, (), generator=gen))
            words = [WORDS[int(i)] for i in torch.randint(0, len(WORDS), (num_words,), generator=gen)]
            prompt = prompt_ids(hf_tok, layout, voice, " ".join(words))
            speech = synthetic_speech(voice, sets, layout, gen, stray=0.3)
            batch.append(prompt + speech)
            # Only speech is learned: from the start-of-speech position on.
            targets.append([-100] * (len(prompt) - 1) + speech + [-100])
        width = max(len(b) for b in batch)
        ids = torch.tensor([b + [layout.eoa] * (width - len(b)) for b in batch])
        labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])
        mask = torch.tensor([[1] * len(b) + [0] * (width - len(b)) for b in batch])
        hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
        keep = labels != -100
        logits = model.lm_head(hidden[keep])
        loss = torch.nn.functional.cross_entropy(logits, labels[keep])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step}: loss {loss.item():.3f}")
    model.eval()


def build_model(vocab_size, layout, seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        # Llama 3.2's scaling; an original context of 32 puts the tiny head_dim in all three bands.
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        tie_word_embeddings=True,
        bos_token_id=layout.bos,
        eos_token_id=[layout.end_of_text, layout.eom, layout.eot],
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


@torch.no_grad()
def greedy(model, prompt, max_tokens, stop_ids):
    """Argmax by full recomputation; returns the tokens before any stop token, the top-two margins, the stop."""
    tokens, margins = list(prompt), []
    for _ in range(max_tokens):
        logits = model(torch.tensor([tokens])).logits[0, -1]
        top = torch.topk(logits, 2).values
        margins.append(float(top[0] - top[1]))
        token = int(torch.argmax(logits))
        if token in stop_ids:
            return tokens[len(prompt) :], margins, token
        tokens.append(token)
    return tokens[len(prompt) :], margins, None


def assemble(tokens, layout):
    """Frames by the rule docs/speech.md states: non-code tokens and codes of an earlier slot are skipped;
    a code of a later slot takes the place but drops its frame; a partial frame at the end is discarded."""
    codes, dropped, slots, bad = [[], [], []], 0, [], False
    for t in tokens:
        offset = t - layout.first_code
        if offset < 0 or offset >= SLOTS * CODEBOOK_SIZE:
            continue
        code = offset - len(slots) * CODEBOOK_SIZE
        if code < 0:
            continue
        bad |= code >= CODEBOOK_SIZE
        slots.append(code)
        if len(slots) == SLOTS:
            if bad:
                dropped += 1
            else:
                codes[0] += [slots[0]]
                codes[1] += [slots[1], slots[4]]
                codes[2] += [slots[2], slots[3], slots[5], slots[6]]
            slots, bad = [], False
    return codes, dropped


def copy_codec(source, dest):
    """Copies the codec's config and its decoder and quantizer tensors, rounded to bf16 to stay small."""
    from safetensors.torch import load_file, save_file

    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source / "config.json", dest / "config.json")
    tensors = load_file(str(source / "model.safetensors"))
    kept = {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items() if not k.startswith("encoder.")}
    save_file(kept, str(dest / "model.safetensors"))


def reference_codec(directory):
    """The snac package's model holding the copied tensors in float32; its encoder stays unset."""
    from safetensors.torch import load_file
    from snac import SNAC

    config = json.loads((directory / "config.json").read_text())
    model = SNAC(**config).eval()
    state = {k: v.to(torch.float32) for k, v in load_file(str(directory / "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("encoder.") for k in missing), (missing, unexpected)
    return model


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=pathlib.Path)
    ap.add_argument("--codec", type=pathlib.Path, default=pathlib.Path("tests/data/snac"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--shape", choices=["test", "orpheus-3b"], default="test",
                    help="test: the small trained checkpoint and goldens; orpheus-3b: Orpheus 3B's shape, structured")
    ap.add_argument("--layers", type=int, default=28, help="orpheus-3b: keep the first N layers (a reduced copy)")
    ap.add_argument("--check", type=int, metavar="TOKENS", help="orpheus-3b: decode TOKENS with transformers and report")
    ap.add_argument("--device", help="orpheus-3b: where to build the weights (default: cuda if present, else cpu)")
    args = ap.parse_args()
    if args.shape == "orpheus-3b":
        import drama_orpheus

        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        drama_orpheus.build(args.out, args.seed, args.layers, device)
        if args.check:
            drama_orpheus.check(args.out, args.check, args.seed, device)
        return

    from safetensors.numpy import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    from make_snac import decode as snac_decode

    torch.use_deterministic_algorithms(True)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    _, vocab_size = build_tokenizer(out)
    hf_tok = AutoTokenizer.from_pretrained(out)
    layout = Layout(hf_tok)
    sets = code_sets(torch.Generator().manual_seed(args.seed + 1))

    model = build_model(vocab_size, layout, args.seed)
    train(model, hf_tok, layout, sets, args.seed, args.steps)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    copy_codec(args.codec, out / "snac")

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager").eval()
    codec = reference_codec(out / "snac")
    stops = layout.stop_ids()
    records, pcm = [], {}
    for i, (voice, text, max_tokens) in enumerate(INPUTS):
        prompt = prompt_ids(hf_tok, layout, voice, text)
        tokens, margins, stop = greedy(model, prompt, max_tokens, stops)
        codes, dropped = assemble(tokens, layout)
        frames = len(codes[0])
        print(f"{voice}: {len(tokens)} tokens, stop {stop}, {frames} frames, {dropped} dropped")
        print(f"  smallest top-two margin {min(margins):.3f}")
        # Goldens need frames to decode and margins wide enough that float rounding cannot flip a token.
        assert frames and min(margins) > 0.01, "train longer: greedy output is not yet decisive speech"
        records.append(
            {
                "voice": voice,
                "text": text,
                "max_tokens": max_tokens,
                "prompt_ids": prompt,
                "greedy": tokens,
                "greedy_stop": stop,
                "greedy_min_margin": round(min(margins), 4),
                "codes": codes,
                "dropped_frames": dropped,
            }
        )
        if frames:
            pcm[f"pcm.{i}"] = snac_decode(codec, [np.array(c) for c in codes])
    goldens = {"seed": args.seed, "stop_ids": stops, "inputs": records}
    (out / "goldens.json").write_text(json.dumps(goldens) + "\n")
    save_file(pcm, str(out / "goldens.safetensors"))


if __name__ == "__main__":
    main()

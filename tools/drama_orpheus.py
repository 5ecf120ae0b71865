"""The orpheus-3b shape of tools/make_drama.py: a seeded Drama checkpoint as large as Orpheus 3B that speaks in frames.

    make_drama.py --shape orpheus-3b --out DIR [--seed S] [--layers N] [--check TOKENS] [--device cuda|cpu]

The language model has the shape of Llama 3.2 3B (hidden 3072, 28 layers, 24 heads over 8 KV heads of 128,
intermediate 8192, rope_theta 500000 with llama3 scaling factor 32, low 1, high 4, original 8192,
max_position_embeddings 131072, RMSNorm eps 1e-5, tied embeddings, bf16: 6.4 GB) over the Orpheus vocabulary of
156940: 128000 byte-level BPE text tokens (merges enumerated as tools/make_checkpoint.py does, no training), Llama
3's 256 special tokens from id 128000 under their names, then `<custom_token_N>` at id 128256 + N for N = 0..28683.
DIR/snac holds a full-width SNAC 24 kHz decoder of random weights (tools/make_snac.py, `write_random_decoder`).

A random language model almost never puts a code in its slot, so the weights are built as an approximate bigram
chain instead of drawn at random. Hidden dimension 0 says "speech" (+1 in the embedding of every code token and of
start-of-speech, -1 in every other token's), dimensions 1 to 7 say the slot of a code token (+1 in its own), 8 marks
start-of-speech, 9 to 15 are zero, and 16 on hold random values (std 0.02) that give each token an identity:

- Eight units of the last layer's MLP map the slot: each gates on dimension 0, so it is silent for text, reads one
  slot dimension (or 8) and writes a target in dimensions 1 to 8, +1 at the next slot (slot 0 after
  start-of-speech) and -1 at the others, so after a code of slot s the residual stream points at slot s + 1 mod 7.
- The tied output rows are the same embeddings, and the final norm's gains turn the stream into logits of about
  +18 for every code of the next slot, -6 for codes of other slots and for start-of-speech, and -6 for text,
  end-of-speech and every special token: generation never stops by itself and reads `max_tokens` to its end.
- The final norm's gains on dimensions 16 on are random signs, so the identity part adds a random bilinear term of
  std 1 between the current token and each candidate: which of the 4096 codes comes next is random, depends on the
  context, and no token prefers to repeat itself (with gains of one sign the tied weights would echo the input).
- Every other weight is random: attention and the other MLP units read the stream, and o_proj and down_proj are
  scaled so that all layers together move the stream by about half the identity part's size, spread over
  all dimensions. That shifts the choice among the codes of a slot (a batching bug shows as other samples) but
  not the slot: the margin is 24 logits.

Every value comes from a counter-based hash of (seed, tensor name, element index), computed in int64 and float32
torch operations that round alike on any device, so the checkpoint is the same bits on a GPU (fast) and a CPU.
`--layers N` keeps the first N layers with the perturbation scaled to the same total (the mapping sits in the
last layer), a reduced copy whose other tensors are the full checkpoint's. `--check TOKENS` then decodes the
Drama prompt with transformers in float32 (on --device), greedily and with Orpheus sampling (temperature 0.6,
top-p 0.8, repetition penalty 1.3), and prints the share of tokens in their slot and of whole valid frames.
"""

import json
import math
import pathlib
import time
import zlib

import torch

import make_checkpoint
import make_drama
import make_snac

SHAPE = dict(
    vocab_size=156940,
    hidden_size=3072,
    intermediate_size=8192,
    num_hidden_layers=28,
    num_attention_heads=24,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=131072,
    rms_norm_eps=1e-5,
    rope_theta=500000.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
)
FIRST_SPECIAL, FIRST_CUSTOM = 128000, 128256
NUM_CUSTOM = SHAPE["vocab_size"] - FIRST_CUSTOM
BOS_ID, EOT_ID = 128000, 128009
EOS_IDS = [128001, 128008, 128009]

# Hidden dimensions of the chain: speech, the seven slots, start-of-speech; identity from RANDOM_FROM on.
SPEECH_DIM, SLOT_DIM, SOS_DIM, RANDOM_FROM = 0, 1, 8, 16
IDENTITY_STD = 0.02
# Logit terms: speech or not (+-), next slot or not (+-), and the random identity term's std.
LOGIT_SPEECH, LOGIT_SLOT, LOGIT_SPREAD = 6.0, 12.0, 1.0
# Pre-activation of the mapping units' gates and ups; silu(8) is 8 within 3e-3.
GATE = 8.0
# Norm of all layers' outputs together, as a share of the identity part's norm.
PERTURBATION = 0.5

M32 = 0xFFFFFFFF
CHUNK = 1 << 25


def mul32(x, c):
    """x * c mod 2^32 for x in [0, 2^32), without any product above 2^49."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & M32


def mix32(x):
    """A 32-bit integer hash (lowbias32): a bijection that mixes every input bit into every output bit."""
    x = x ^ (x >> 16)
    x = mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform(numel, seed, name, device):
    """numel floats in (0, 1), a function of (seed, name, index) alone, the same bits on every device."""
    key = zlib.crc32(f"{seed}:{name}".encode())
    out = torch.empty(numel, dtype=torch.float32, device=device)
    for start in range(0, numel, CHUNK):
        idx = torch.arange(start, min(start + CHUNK, numel), dtype=torch.int64, device=device)
        x = mix32(mix32(idx) ^ key)
        out[start : start + idx.numel()] = ((x >> 8).to(torch.float32) + 0.5) * 2.0**-24
    return out


def random_matrix(shape, std, seed, name, device):
    """Uniform values of standard deviation std, in bf16."""
    u = uniform(math.prod(shape), seed, name, device)
    return ((u * 2 - 1) * (std * math.sqrt(3))).to(torch.bfloat16).view(shape)


def random_signs(numel, seed, name, device):
    return torch.where(uniform(numel, seed, name, device) < 0.5, -1.0, 1.0)


class Chain:
    """The scales of the bigram chain for a hidden width and layer count, nominal values without perturbation."""

    def __init__(self, hidden, layers, intermediate):
        identity = IDENTITY_STD**2 * (hidden - RANDOM_FROM)
        # The stream of a code token (speech +1, its slot +1) and, after the mapping, eight slot dimensions at +-1.
        rms_in = math.sqrt((2 + identity) / hidden)
        self.rms_out = math.sqrt((1 + 8 + identity) / hidden)
        self.up = GATE * rms_in
        self.down = 1 / (GATE / (1 + math.exp(-GATE)) * GATE)
        self.gain_speech = LOGIT_SPEECH * self.rms_out
        self.gain_slot = LOGIT_SLOT * self.rms_out
        self.gain_identity = LOGIT_SPREAD * self.rms_out / (IDENTITY_STD**2 * math.sqrt(hidden - RANDOM_FROM))
        # Each of the 2 * layers sublayers adds an independent share; inputs are normed to rms 1 per dimension.
        share = PERTURBATION * math.sqrt(identity) / math.sqrt(2 * layers)
        self.o_std = share / hidden
        # silu(g) * u for g, u ~ N(0, 1) has an rms of about 0.6.
        self.down_std = share / (math.sqrt(hidden) * 0.6 * math.sqrt(intermediate))


def embeddings(chain, layout_ids, seed, device):
    v, h = SHAPE["vocab_size"], SHAPE["hidden_size"]
    e = torch.zeros(v, h, dtype=torch.bfloat16, device=device)
    e[:, RANDOM_FROM:] = random_matrix((v, h - RANDOM_FROM), IDENTITY_STD, seed, "identity", device)
    e[:, SPEECH_DIM] = -1.0
    first_code, sos = layout_ids
    codes = torch.arange(make_drama.SLOTS * make_drama.CODEBOOK_SIZE, device=device)
    e[first_code + codes, SPEECH_DIM] = 1.0
    e[first_code + codes, SLOT_DIM + codes // make_drama.CODEBOOK_SIZE] = 1.0
    e[sos, SPEECH_DIM] = 1.0
    e[sos, SOS_DIM] = 1.0
    return e


def map_slots(chain, gate, up, down):
    """Units 0..7 of the last MLP: after slot j (or start-of-speech, unit 7) the stream points at the next slot."""
    gate[:8] = 0
    up[:8] = 0
    down[:, :8] = 0
    for j in range(8):
        source = SLOT_DIM + j if j < 7 else SOS_DIM
        target = SLOT_DIM + (j + 1) % 7 if j < 7 else SLOT_DIM
        gate[j, SPEECH_DIM] = chain.up
        up[j, source] = chain.up
        delta = torch.full((SOS_DIM + 1,), -1.0, device=down.device)
        delta[SPEECH_DIM] = 0.0
        delta[target] = 1.0
        delta[source] -= 1.0
        down[: SOS_DIM + 1, j] = delta * chain.down


def weights(num_layers, seed, device, layout_ids):
    """Every tensor of the language model by its transformers name, in bf16 on `device`."""
    h, i = SHAPE["hidden_size"], SHAPE["intermediate_size"]
    q, kv = SHAPE["num_attention_heads"] * SHAPE["head_dim"], SHAPE["num_key_value_heads"] * SHAPE["head_dim"]
    chain = Chain(h, num_layers, i)
    read = h**-0.5
    ones = torch.ones(h, dtype=torch.bfloat16, device=device)
    out = {"model.embed_tokens.weight": embeddings(chain, layout_ids, seed, device)}
    for layer in range(num_layers):
        p = f"model.layers.{layer}"
        shapes = {
            "self_attn.q_proj": ((q, h), read),
            "self_attn.k_proj": ((kv, h), read),
            "self_attn.v_proj": ((kv, h), read),
            "self_attn.o_proj": ((h, q), chain.o_std),
            "mlp.gate_proj": ((i, h), read),
            "mlp.up_proj": ((i, h), read),
            "mlp.down_proj": ((h, i), chain.down_std),
        }
        for name, (shape, std) in shapes.items():
            out[f"{p}.{name}.weight"] = random_matrix(shape, std, seed, f"{p}.{name}", device)
        out[f"{p}.input_layernorm.weight"] = ones.clone()
        out[f"{p}.post_attention_layernorm.weight"] = ones.clone()
    last = f"model.layers.{num_layers - 1}.mlp"
    map_slots(chain, out[f"{last}.gate_proj.weight"], out[f"{last}.up_proj.weight"], out[f"{last}.down_proj.weight"])
    norm = torch.zeros(h, dtype=torch.float32, device=device)
    norm[SPEECH_DIM] = chain.gain_speech
    norm[SLOT_DIM : SOS_DIM + 1] = chain.gain_slot
    norm[RANDOM_FROM:] = chain.gain_identity * random_signs(h - RANDOM_FROM, seed, "norm", device)
    out["model.norm.weight"] = norm.to(torch.bfloat16)
    return out


def write_config(out, num_layers):
    config = dict(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        attention_bias=False,
        attention_dropout=0.0,
        hidden_act="silu",
        initializer_range=0.02,
        mlp_bias=False,
        pretraining_tp=1,
        tie_word_embeddings=True,
        torch_dtype="bfloat16",
        use_cache=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_IDS,
        **dict(SHAPE, num_hidden_layers=num_layers),
    )
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": BOS_ID, "eos_token_id": EOS_IDS}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def write_tokenizer(out):
    """make_checkpoint's enumerated byte-level BPE, with Llama 3's specials and the custom tokens by name."""
    named = {FIRST_SPECIAL + i: name for i, name in enumerate(make_drama.llama3_specials())}
    named.update({FIRST_CUSTOM + n: f"<custom_token_{n}>" for n in range(NUM_CUSTOM)})
    tok, config = make_checkpoint.build_tokenizer("llama", SHAPE["vocab_size"], BOS_ID, EOT_ID, named)
    config["model_max_length"] = SHAPE["max_position_embeddings"]
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tok


def build(out, seed, num_layers, device):
    from safetensors.torch import save_file

    start = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    tok = write_tokenizer(out)
    assert tok.encode("tara: some sentence", add_special_tokens=False).ids, "the text must tokenize"
    first_code = tok.token_to_id(f"<custom_token_{make_drama.FIRST_CODE}>")
    sos = tok.token_to_id(make_drama.START_OF_SPEECH)
    assert (first_code, sos) == (FIRST_CUSTOM + make_drama.FIRST_CODE, FIRST_CUSTOM + 1)
    print(f"tokenizer: {time.perf_counter() - start:.1f} s")
    write_config(out, num_layers)
    tensors = weights(num_layers, seed, device, (first_code, sos))
    if device != "cpu":
        torch.cuda.synchronize()
    print(f"weights on {device}: {time.perf_counter() - start:.1f} s")
    tensors = {name: t.cpu().contiguous() for name, t in tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    print(f"model.safetensors: {size / 1e9:.2f} GB, {time.perf_counter() - start:.1f} s")
    make_snac.write_random_decoder(make_snac.FULL, out / "snac", seed)
    print(f"done: {time.perf_counter() - start:.1f} s")


def slot_share(tokens, first_code):
    """Tokens that are codes of slot (index mod 7), and whole frames of such codes, as shares."""
    size = make_drama.CODEBOOK_SIZE
    in_slot = [0 <= t - first_code - (i % 7) * size < size for i, t in enumerate(tokens)]
    frames = [all(in_slot[f * 7 : f * 7 + 7]) for f in range(len(tokens) // 7)]
    return sum(in_slot) / len(tokens), sum(frames) / max(1, len(frames))


@torch.no_grad()
def check(out, num_tokens, seed, device):
    """Greedy and sampled decoding of the Drama prompt with transformers in float32; prints the frame shares."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    layout = make_drama.Layout(tok)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).to(device).eval()
    voice, text, _ = make_drama.INPUTS[0]
    prompt = torch.tensor([make_drama.prompt_ids(tok, layout, voice, text)], device=device)
    runs = {
        "greedy": dict(do_sample=False),
        "sampled": dict(do_sample=True, temperature=0.6, top_p=0.8, top_k=0, repetition_penalty=1.3),
        "sampled, seed + 1": dict(do_sample=True, temperature=0.6, top_p=0.8, top_k=0, repetition_penalty=1.3),
    }
    results = {}
    for i, (name, kwargs) in enumerate(runs.items()):
        torch.manual_seed(seed + i)
        ids = model.generate(
            prompt, max_new_tokens=num_tokens, eos_token_id=layout.stop_ids(), pad_token_id=layout.eoa, **kwargs
        )[0, prompt.shape[1] :].tolist()
        tokens, frames = slot_share(ids, layout.first_code)
        codes, dropped = make_drama.assemble(ids, layout)
        results[name] = ids
        print(f"{name}: {len(ids)} tokens, {tokens:.4f} in their slot, {frames:.4f} of {len(ids) // 7} frames valid;"
              f" assembled {len(codes[0])} frames, {dropped} dropped; {len(set(ids))} distinct tokens")
    same = sum(a == b for a, b in zip(results["sampled"], results["sampled, seed + 1"]))
    print(f"the two sampled runs agree on {same} of {num_tokens} tokens")
    # The same greedy run without the layers' random outputs: the mapping units alone.
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight[:, 8:] = 0
    ids = model.generate(
        prompt, max_new_tokens=num_tokens, do_sample=False, eos_token_id=layout.stop_ids(), pad_token_id=layout.eoa
    )[0, prompt.shape[1] :].tolist()
    same = sum(a == b for a, b in zip(results["greedy"], ids))
    tokens, frames = slot_share(ids, layout.first_code)
    print(f"greedy without the random layers: {frames:.4f} frames valid; agrees with greedy on {same} of {num_tokens}")

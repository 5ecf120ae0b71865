#!/usr/bin/env python3
"""Reference outputs of the hibari voice's acoustic network, for tests/hibari_acoustic.rs.

    python3 -m pip download --no-deps hibari-tts==0.2.1 -d WHEELS && unzip WHEELS/*.whl -d WHEEL
    hibari_reference.py --wheel WHEEL [--out tests/data/hibari/acoustic]

Needs numpy, onnx and onnxruntime. The wheel's hibari.onnx computes its pointwise layers with int8
weights and activations quantized to uint8 at run time (DynamicQuantizeLinear + MatMulInteger). This
tool first rewrites it into "the dequantized (f32) graph": every int8 weight becomes `q * scale` in
f32, and each DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(scale) chain becomes one float
MatMul with that weight. tensorfold implements that f32 graph, so the goldens come from it.

For each sentence (phoneme ids from the wheel's own G2P, so the Rust test needs no G2P) the f32 graph
runs with its speed, and the directory gets:
- `goldens.json`: per sentence its text, speed, ids, durations (frames of 25 ms per phoneme), the number
  of 12.5 ms frames, the saved bins of the spectral outputs, its first row in each tensor (`offset`) and
  whether its decoder input is saved (`has_dec_input`, the first sentences only);
- `goldens.safetensors`: f32 tensors `f0` [total frames], `lh`, `theta`, `ln`, `lr`, `phi`
  [total frames, saved bins] and `dec_input` [frames of the first sentences, 130] (the frame decoder's
  input, frame-major).
"""

import argparse
import json
import pathlib
import struct
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

SPECTRA = ["lh", "theta", "ln", "lr", "phi"]
NUM_BINS = 601
# NUM_SAVED bins BIN_STRIDE apart are saved, from an offset that moves with the sentence over 0..=45.
BIN_STRIDE = 37
NUM_SAVED = 16
# The decoder input is saved in full for the first sentences only, to keep the goldens small.
NUM_WITH_DEC_INPUT = 8
# Intermediates exposed as extra outputs: the decoder input and the rounded durations.
DEC_INPUT = "/Concat_43_output_0"
DURATIONS = "/Cast_32_output_0"
RAW_DURATIONS = "/Div_40_output_0"

SENTENCES = [
    ("Hello there.", 1.0),
    ("The quick brown fox jumps over the lazy dog.", 1.0),
    ("She sells sea shells by the sea shore.", 1.0),
    ("How are you doing today?", 1.0),
    ("Wait, what did you just say?", 1.0),
    ("I can't believe it's already Friday!", 1.0),
    ("Please call me back when you get this message.", 1.0),
    ("The meeting starts at nine thirty tomorrow morning.", 1.0),
    ("Rain is expected later this evening.", 1.0),
    ("Turn left at the next light, then keep going straight.", 1.0),
    ("Yes.", 1.0),
    ("No, thank you.", 1.0),
    ("Numbers like 42 and 1,250 are read aloud.", 1.0),
    ("Music fills the quiet room.", 1.0),
    ("Could you pass the salt, please?", 1.0),
    ("Every morning she walks her dog along the river.", 1.0),
    ("The library closes early on Sundays.", 1.0),
    ("Oh well; we tried our best.", 1.0),
    ("A journey of a thousand miles begins with a single step.", 1.0),
    ("Thank you for listening.", 1.0),
    ("Bright stars shine above the silent hills.", 1.0),
    ("Is this the right way to the station?", 1.0),
    ("The quick brown fox jumps over the lazy dog.", 1.25),
    ("Thank you for listening.", 0.8),
]


def dequantize_graph(model):
    """Rewrites every DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul chain into a float MatMul."""
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    drop, new_inits, replace = set(), {}, {}
    for n in g.node:
        if n.op_type != "MatMulInteger":
            continue
        a_q, b_q, _a_zp, b_zp = n.input
        dql = producer[a_q]
        assert dql.op_type == "DynamicQuantizeLinear", dql.op_type
        assert not numpy_helper.to_array(inits[b_zp]).any(), f"{b_zp}: weight zero point is not 0"
        (cast,) = consumers[n.output[0]]
        assert cast.op_type == "Cast"
        (mul,) = consumers[cast.output[0]]
        assert mul.op_type == "Mul"
        scales = producer[[i for i in mul.input if i != cast.output[0]][0]]
        assert scales.op_type == "Mul" and dql.output[1] in scales.input
        (b_scale,) = [i for i in scales.input if i != dql.output[1]]
        assert b_q.endswith("_quantized") and b_scale in inits
        w_name = b_q[: -len("_quantized")] + "_f32"
        if w_name not in new_inits:
            q = numpy_helper.to_array(inits[b_q]).astype(np.float32)
            scale = numpy_helper.to_array(inits[b_scale]).astype(np.float32)
            new_inits[w_name] = numpy_helper.from_array((q * scale).astype(np.float32), w_name)
        replace[id(mul)] = helper.make_node("MatMul", [dql.input[0], w_name], [mul.output[0]], name=mul.name + "_f32")
        drop.update(id(x) for x in (dql, n, cast, scales))
    nodes = []
    for n in g.node:
        if id(n) in drop:
            continue
        nodes.append(replace.get(id(n), n))
    del g.node[:]
    g.node.extend(nodes)
    used = {i for n in g.node for i in n.input}
    kept = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(kept + list(new_inits.values()))
    for name, ty, shape in [(DEC_INPUT, onnx.TensorProto.FLOAT, [1, 130, "F"]),
                            (DURATIONS, onnx.TensorProto.INT64, ["L"]), (RAW_DURATIONS, onnx.TensorProto.FLOAT, ["L"])]:
        g.output.append(helper.make_tensor_value_info(name, ty, shape))
    onnx.checker.check_model(model)
    return model, len(replace)


def session(model):
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def compact_json(meta):
    """The index with one line per sentence."""
    head = {k: v for k, v in meta.items() if k != "sentences"}
    lines = [json.dumps(s, ensure_ascii=False) for s in meta["sentences"]]
    body = json.dumps(head, ensure_ascii=False)[:-1]
    return body + ', "sentences": [\n' + ",\n".join(lines) + "\n]}\n"


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, arr in tensors.items():
        b = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(b)]}
        offset += len(b)
        blobs.append(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", required=True, help="the unpacked hibari-tts 0.2.1 wheel (holds hibari/)")
    ap.add_argument("--out", default="tests/data/hibari/acoustic")
    args = ap.parse_args()
    sys.path.insert(0, args.wheel)
    from hibari import Hibari

    tts = Hibari()
    onnx_path = pathlib.Path(args.wheel) / "hibari" / "assets" / "hibari.onnx"
    f32_model, num_rewritten = dequantize_graph(onnx.load(str(onnx_path)))
    sess = session(f32_model)
    quant = session(onnx.load(str(onnx_path)))
    print(f"rewrote {num_rewritten} quantized matmuls into float MatMuls; onnxruntime runs the f32 graph")

    index, chunks = [], {k: [] for k in ["f0", "dec_input", *SPECTRA]}
    total = 0
    for i, (text, speed) in enumerate(SENTENCES):
        phonemes = tts.phonemize(text)
        assert len(phonemes) == 1, f"{text!r} splits into {len(phonemes)} chunks"
        ids = tts.ids(phonemes[0])
        feed = {"ids": np.asarray([ids], np.int64), "speed": np.asarray([speed], np.float32)}
        out = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed)))
        num_frames = out["f0"].shape[1]
        durations = out[DURATIONS].astype(np.int64).tolist()
        assert 2 * sum(durations) == num_frames
        raw = out[RAW_DURATIONS].astype(np.float64)
        margin = float(np.min(np.abs(raw - np.floor(raw) - 0.5)))
        q_lh = quant.run(["lh"], feed)[0]
        bins = [(i * 13) % (NUM_BINS - (NUM_SAVED - 1) * BIN_STRIDE) + k * BIN_STRIDE for k in range(NUM_SAVED)]
        chunks["f0"].append(out["f0"][0])
        if i < NUM_WITH_DEC_INPUT:
            chunks["dec_input"].append(out[DEC_INPUT][0].T)
        for name in SPECTRA:
            chunks[name].append(out[name][0][bins].T)
        index.append({
            "text": text, "phonemes": phonemes[0], "speed": speed, "ids": ids, "durations": durations,
            "num_frames": num_frames, "offset": total, "bins": bins, "has_dec_input": i < NUM_WITH_DEC_INPUT,
        })
        total += num_frames
        # How far the shipped int8 graph lands from the f32 one, for information only.
        if q_lh.shape == out["lh"].shape:
            int8 = f"int8 graph: lh max diff {float(np.max(np.abs(q_lh - out['lh']))):.3f}"
        else:
            int8 = f"int8 graph: {q_lh.shape[2]} frames"
        print(f"{len(ids):4} ids {num_frames:4} frames  speed {speed}  rounding margin {margin:.4f}  {int8}  {text}")

    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: np.concatenate(v, axis=0).astype(np.float32) for k, v in chunks.items()}
    write_safetensors(out_dir / "goldens.safetensors", tensors)
    meta = {
        "model": "hibari-tts==0.2.1 hibari/assets/hibari.onnx, dequantized to f32",
        "bin_stride": BIN_STRIDE, "num_bins": NUM_BINS, "total_frames": total, "sentences": index,
    }
    with open(out_dir / "goldens.json", "w", encoding="utf-8") as f:
        f.write(compact_json(meta))
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    print(f"{len(index)} sentences, {total} frames, {size / 1e6:.2f} MB in {out_dir}")


if __name__ == "__main__":
    main()

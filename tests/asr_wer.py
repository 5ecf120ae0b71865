"""Word error rate of WAV files against reference texts, as heard by pocketsphinx (a recognizer we did not write).

Usage: asr_wer.py [--reverse | --noise] WAV TEXT [WAV TEXT ...]

Prints one JSON line per sentence and a final JSON line with the total WER (word edits / reference words).
--reverse plays each file backwards and --noise swaps it for white noise of the same length and loudness:
both are negative controls that an intelligibility gate must reject.
"""

import argparse
import array
import json
import math
import random
import re
import sys
import wave

from pocketsphinx import Decoder

TARGET_RATE = 16000
# Half-width of the anti-aliasing filter, in input samples.
TAPS_PER_SIDE = 8


def read_wav(path):
    """Mono 16-bit samples and the sample rate."""
    with wave.open(path, "rb") as wav:
        if wav.getnchannels() != 1 or wav.getsampwidth() != 2:
            shape = f"{wav.getnchannels()} channels of {wav.getsampwidth()} bytes"
            raise SystemExit(f"{path}: expected 16-bit mono, got {shape}")
        rate = wav.getframerate()
        samples = array.array("h", wav.readframes(wav.getnframes()))
    if sys.byteorder == "big":
        samples.byteswap()
    return samples, rate


def lowpass_kernel(cutoff, offset):
    """Hann-windowed sinc taps for `cutoff` (a fraction of the input rate) centred `offset` samples past a tap."""
    taps = []
    for k in range(-TAPS_PER_SIDE + 1, TAPS_PER_SIDE + 1):
        t = k - offset
        sinc = 2 * cutoff if t == 0 else math.sin(2 * math.pi * cutoff * t) / (math.pi * t)
        window = 0.5 + 0.5 * math.cos(math.pi * t / TAPS_PER_SIDE)
        taps.append(sinc * window)
    total = sum(taps)
    return [tap / total for tap in taps]


def resample(samples, rate):
    """Resample to 16 kHz with a windowed-sinc filter evaluated at each output instant."""
    if rate == TARGET_RATE:
        return list(samples)
    step = rate / TARGET_RATE
    # Cut below the output's Nyquist frequency so nothing above 8 kHz folds back into speech.
    cutoff = 0.45 * TARGET_RATE / rate
    kernels = {}
    padded = [0] * TAPS_PER_SIDE + list(samples) + [0] * TAPS_PER_SIDE
    out = []
    for j in range(int(len(samples) / step)):
        position = j * step
        base = int(position)
        offset = round(position - base, 6)
        kernel = kernels.get(offset)
        if kernel is None:
            kernel = kernels[offset] = lowpass_kernel(cutoff, offset)
        start = base + 1
        window = padded[start : start + len(kernel)]
        out.append(sum(a * b for a, b in zip(window, kernel)))
    return out


def to_pcm16(samples):
    clipped = array.array("h", (max(-32768, min(32767, int(round(s)))) for s in samples))
    if sys.byteorder == "big":
        clipped.byteswap()
    return clipped.tobytes()


def white_noise_like(samples, seed):
    """Gaussian noise with the same length and RMS as `samples`."""
    rms = math.sqrt(sum(s * s for s in samples) / max(1, len(samples)))
    rng = random.Random(seed)
    return [rng.gauss(0.0, rms) for _ in samples]


def normalise(text):
    """Lowercase words without punctuation; apostrophes inside words stay (don't, o'clock)."""
    text = text.lower().replace("-", " ")
    return re.findall(r"[a-z]+(?:'[a-z]+)*", text)


def word_edits(reference, hypothesis):
    """Levenshtein distance over words."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, 1):
        current = [i]
        for j, hyp_word in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word)))
        previous = current
    return previous[-1]


def transcribe(decoder, pcm):
    decoder.start_utt()
    decoder.process_raw(pcm, full_utt=True)
    decoder.end_utt()
    hyp = decoder.hyp()
    return hyp.hypstr if hyp is not None else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    control = parser.add_mutually_exclusive_group()
    control.add_argument("--reverse", action="store_true", help="recognise each file played backwards")
    control.add_argument("--noise", action="store_true", help="recognise white noise of each file's length")
    parser.add_argument("pairs", nargs="+", metavar="WAV TEXT")
    args = parser.parse_args()
    if len(args.pairs) % 2:
        parser.error("expected WAV TEXT pairs")

    decoder = Decoder(samprate=TARGET_RATE, loglevel="FATAL")
    total_edits = 0
    total_words = 0
    for index in range(0, len(args.pairs), 2):
        path, text = args.pairs[index], args.pairs[index + 1]
        samples, rate = read_wav(path)
        samples = resample(samples, rate)
        if args.reverse:
            samples.reverse()
        if args.noise:
            samples = white_noise_like(samples, seed=index)
        hypothesis_text = transcribe(decoder, to_pcm16(samples))
        reference = normalise(text)
        hypothesis = normalise(hypothesis_text)
        edits = word_edits(reference, hypothesis)
        total_edits += edits
        total_words += len(reference)
        line = {"wav": path, "reference": " ".join(reference), "hypothesis": hypothesis_text}
        print(json.dumps({**line, "edits": edits, "words": len(reference)}))

    wer = total_edits / total_words if total_words else 0.0
    print(json.dumps({"wer": wer, "edits": total_edits, "words": total_words, "sentences": len(args.pairs) // 2}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

//! The Hibari signal stage against the wheel's own dsp.synth, and windows and streams against one pass.

use std::path::{Path, PathBuf};

use tensorfold_audio::hibari::{Frames, PulsePhase, Vocoder, VocoderStream, CONTEXT_FRAMES, HOP, NUM_BINS};
use tensorfold_kernels::sampling::uniform;

/// Largest difference from the reference samples that passes; they are about unit RMS.
const PARITY: f32 = 1e-4;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/hibari_dsp")
}

/// Network outputs, frame-major, built as `inputs` in tools/hibari_dsp_goldens.py builds them.
struct Inputs {
    parts: [Vec<f32>; 5],
    f0: Vec<f32>,
}

const PART_NAMES: [&str; 5] = ["lh", "theta", "ln", "lr", "phi"];

impl Inputs {
    fn new(seed: u64, num_frames: usize) -> Inputs {
        let parts = std::array::from_fn(|p| {
            let mut values = Vec::with_capacity(num_frames * NUM_BINS);
            for cell in 0..num_frames * NUM_BINS {
                let u = uniform(seed, ((p as u64) << 32) | cell as u64);
                let value = match PART_NAMES[p] {
                    "theta" => -3.0 + 6.0 * u,
                    "phi" => -4.0 + 8.0 * u,
                    _ if u >= 0.9995 => 7.5,
                    _ => -8.0 + 10.0 * u,
                };
                values.push(value as f32);
            }
            values
        });
        let f0 = (0..num_frames)
            .map(|k| {
                let u = uniform(seed, (5 << 32) | k as u64);
                (match k % 9 {
                    5 => 0.0,
                    4 | 6 => 40.0 * u,
                    _ => 80.0 + 220.0 * u,
                }) as f32
            })
            .collect();
        Inputs { parts, f0 }
    }

    fn frames(&self) -> Frames<'_> {
        let [lh, theta, ln, lr, phi] = &self.parts;
        Frames { lh, theta, ln, lr, phi, f0: &self.f0 }
    }

    fn value(&self, name: &str, frame: usize, bin: usize) -> f32 {
        match PART_NAMES.iter().position(|n| *n == name) {
            Some(p) => self.parts[p][frame * NUM_BINS + bin],
            None => self.f0[frame],
        }
    }
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

fn bits(pcm: &[f32]) -> Vec<u32> {
    pcm.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn test_matches_the_reference_dsp_with_our_noise() {
    let dir = data_dir();
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let vocoder = Vocoder::new();
    let cases = index["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 5);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let num_frames = case["num_frames"].as_u64().unwrap() as usize;
        let inputs = Inputs::new(case["input_seed"].as_u64().unwrap(), num_frames);
        for (part, probes) in case["probes"].as_object().unwrap() {
            for probe in probes.as_array().unwrap() {
                let [frame, bin, want] = [0, 1, 2].map(|i| probe[i].as_f64().unwrap());
                let got = inputs.value(part, frame as usize, bin as usize);
                // serde_json may read the last digit of an f64 off by one ulp; the f32 it names is exact.
                assert_eq!(got, want as f32, "{name}: input {part} at frame {frame}, bin {bin}");
            }
        }
        let want = f32s(&std::fs::read(dir.join(case["audio"].as_str().unwrap())).unwrap());
        let got = vocoder.synthesize(&inputs.frames(), case["noise_seed"].as_u64().unwrap()).unwrap();
        assert_eq!(got.len(), num_frames * HOP, "{name}: sample count");
        let (at, diff) = want
            .iter()
            .zip(&got)
            .map(|(w, g)| (w - g).abs())
            .enumerate()
            .fold((0, 0.0f32), |best, (i, d)| if d > best.1 || d.is_nan() { (i, d) } else { best });
        eprintln!("{name}: max |diff| {diff:e} at sample {at}");
        assert!(diff <= PARITY, "{name}: sample {at} is {} against {}", got[at], want[at]);
    }
}

/// Decodes `inputs` window by window, keeping `step` frames per window with `context` frames each side.
fn by_windows(vocoder: &Vocoder, inputs: &Inputs, step: usize, context: usize, seed: u64) -> Vec<f32> {
    let frames = inputs.frames();
    let num_frames = frames.num_frames();
    let (mut pcm, mut phase) = (Vec::new(), PulsePhase::start());
    for start in (0..num_frames).step_by(step) {
        let end = (start + step).min(num_frames);
        let first = start.saturating_sub(context);
        let last = (end + context).min(num_frames);
        let window = frames.slice(first..last);
        let finished = last == num_frames;
        let audio =
            vocoder.synthesize_window(&window, first, start - first..end - first, seed, finished, phase).unwrap();
        assert_eq!(audio.samples.len(), (end - start) * HOP);
        pcm.extend(audio.samples);
        phase = audio.next_phase;
    }
    pcm
}

#[test]
fn test_windows_of_1_3_and_7_frames_equal_one_pass_bit_for_bit() {
    let vocoder = Vocoder::new();
    for (num_frames, seed) in [(40, 21), (9, 22), (3, 23)] {
        let inputs = Inputs::new(seed, num_frames);
        let whole = vocoder.synthesize(&inputs.frames(), 77).unwrap();
        for step in [1, 3, 7] {
            for context in [CONTEXT_FRAMES, CONTEXT_FRAMES + 2] {
                let windows = by_windows(&vocoder, &inputs, step, context, 77);
                assert_eq!(bits(&windows), bits(&whole), "{num_frames} frames, step {step}, context {context}");
            }
        }
    }
}

#[test]
fn test_less_context_than_needed_changes_samples_or_is_refused() {
    let vocoder = Vocoder::new();
    let inputs = Inputs::new(31, 30);
    let frames = inputs.frames();
    let whole = vocoder.synthesize(&frames, 5).unwrap();
    // One frame short on the right: the window thinks the stream ends there.
    let short = vocoder.synthesize_window(&frames.slice(0..12), 0, 0..9, 5, true, PulsePhase::start()).unwrap();
    assert_ne!(bits(&short.samples), bits(&whole[..9 * HOP]));
    assert!(vocoder.synthesize_window(&frames.slice(0..12), 0, 0..9, 5, false, PulsePhase::start()).is_err());
}

#[test]
fn test_stream_equals_one_pass_however_frames_arrive() {
    let vocoder = Vocoder::new();
    let inputs = Inputs::new(41, 37);
    let frames = inputs.frames();
    let whole = vocoder.synthesize(&frames, 9).unwrap();
    for chunks in [vec![1; 37], vec![5, 1, 12, 2, 17], vec![37], vec![3, 0, 4, 30]] {
        let mut stream = VocoderStream::new(9);
        let (mut pcm, mut at) = (Vec::new(), 0);
        for n in &chunks {
            stream.push(&frames.slice(at..at + n)).unwrap();
            at += n;
            pcm.extend(stream.pull(&vocoder).unwrap());
            assert_eq!(pcm.len(), vocoder.ready_frames(at, false) * HOP);
        }
        pcm.extend(stream.finish(&vocoder).unwrap());
        assert_eq!(bits(&pcm), bits(&whole), "chunks {chunks:?}");
    }
}

#[test]
fn test_noise_follows_the_seed_and_has_the_expected_level() {
    let vocoder = Vocoder::new();
    let inputs = Inputs::new(51, 40);
    let frames = inputs.frames();
    let a = vocoder.synthesize(&frames, 1).unwrap();
    assert_eq!(bits(&a), bits(&vocoder.synthesize(&frames, 1).unwrap()));
    assert_ne!(bits(&a), bits(&vocoder.synthesize(&frames, 2).unwrap()));
    // Unit-gain noise alone: each inverse FFT has variance (2 + 4·599) / N², and overlap-add divides it by 1.5.
    let (silent, unit) = (vec![f32::NEG_INFINITY; 40 * NUM_BINS], vec![0.0f32; 40 * NUM_BINS]);
    let only_noise = Frames { lh: &silent, ln: &unit, lr: &silent, ..frames };
    let noise = vocoder.synthesize(&only_noise, 1).unwrap();
    let inside = &noise[4 * HOP..36 * HOP];
    let rms = (inside.iter().map(|s| (*s as f64).powi(2)).sum::<f64>() / inside.len() as f64).sqrt();
    let want = ((2.0 + 4.0 * 599.0) / 1200f64.powi(2) / 1.5).sqrt();
    assert!((rms / want - 1.0).abs() < 0.05, "noise rms {rms}, expected {want}");
}

#[test]
fn test_no_frames_give_no_samples() {
    let frames = Frames { lh: &[], theta: &[], ln: &[], lr: &[], phi: &[], f0: &[] };
    assert!(Vocoder::new().synthesize(&frames, 0).unwrap().is_empty());
}

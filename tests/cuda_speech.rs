//! SNAC on the GPU: streamed windows equal the one-shot decode, a window's samples do not depend on the windows
//! decoded beside it, and the samples stay within a stated bound of the CPU's. Skips where no GPU is found.

mod common;

use std::path::PathBuf;

use common::cuda::gpu;
use common::Rng;
use tensorfold_audio::SnacDecoder;
use tensorfold_engine::boundary::{Codec, CodecJob};
use tensorfold_engine::speech::drama::cuda::CudaSnac;

/// Frames of context each side that make a window exact, as `SnacDecoder::context_frames` measures it.
const CONTEXT: usize = 3;
/// Most absolute difference from the CPU's samples: the kernels sum in another order, and CUDA's sinf and tanhf
/// are not the host's, so each layer rounds differently; PCM is in [-1, 1].
const MAX_CPU_DIFFERENCE: f32 = 1e-4;

fn codec_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/drama/snac")];
    dirs.extend(std::env::var_os("TENSORFOLD_SNAC_FULL").map(PathBuf::from));
    dirs
}

/// Codes of `frames` frames: 1, 2 and 4 a frame.
fn random_codes(rng: &mut Rng, frames: usize) -> Vec<Vec<u32>> {
    [1, 2, 4].iter().map(|per| (0..frames * per).map(|_| rng.below(4096) as u32).collect()).collect()
}

/// The window of frames `a..b` with up to `CONTEXT` frames each side, as a lane's codec job.
fn window(codes: &[Vec<u32>], frames: usize, a: usize, b: usize) -> CodecJob {
    let (first, end) = (a.saturating_sub(CONTEXT), (b + CONTEXT).min(frames));
    let codes = codes.iter().zip([1, 2, 4]).map(|(c, per)| c[first * per..end * per].to_vec()).collect();
    CodecJob { codes, first_frame: first, keep: a - first..b - first }
}

fn whole(codes: &[Vec<u32>], frames: usize) -> CodecJob {
    CodecJob { codes: codes.to_vec(), first_frame: 0, keep: 0..frames }
}

fn bits(pcm: &[f32]) -> Vec<u32> {
    pcm.iter().map(|s| s.to_bits()).collect()
}

/// Windows of 1, 2, 4, 8, 16 frames and what is left, as a stream cuts them.
fn stream_windows(frames: usize) -> Vec<(usize, usize)> {
    let (mut at, mut size, mut out) = (0, 1, Vec::new());
    while at < frames {
        let end = (at + size).min(frames);
        out.push((at, end));
        (at, size) = (end, (size * 2).min(16));
    }
    out
}

#[test]
fn test_gpu_windows_equal_the_one_shot_decode_and_ignore_their_neighbours() {
    let Some(dev) = gpu() else { return };
    for dir in codec_dirs() {
        let cpu = SnacDecoder::open(&dir).unwrap();
        let gpu_codec = dev.load_codec(&cpu).unwrap();
        let mut rng = Rng(91);
        let frames = 40;
        let codes = random_codes(&mut rng, frames);
        let one_shot = gpu_codec.decode(&whole(&codes, frames)).unwrap();
        assert_eq!(one_shot.len(), frames * 2048, "{}", dir.display());
        let jobs: Vec<CodecJob> = stream_windows(frames).iter().map(|&(a, b)| window(&codes, frames, a, b)).collect();
        // Each window alone, then all in one call among windows of other audio.
        let alone: Vec<f32> = jobs.iter().flat_map(|j| gpu_codec.decode(j).unwrap()).collect();
        assert!(bits(&alone) == bits(&one_shot), "{}: streamed windows differ from the one-shot decode", dir.display());
        let other = random_codes(&mut rng, 30);
        let mut mixed: Vec<CodecJob> = Vec::new();
        for (i, j) in jobs.iter().enumerate() {
            mixed.push(window(&other, 30, i % 25, i % 25 + 3));
            mixed.push(j.clone());
        }
        let refs: Vec<&CodecJob> = mixed.iter().collect();
        let together: Vec<Vec<f32>> = gpu_codec.decode_batch(&refs).into_iter().map(Result::unwrap).collect();
        let ours: Vec<f32> = together.iter().skip(1).step_by(2).flatten().copied().collect();
        assert!(bits(&ours) == bits(&one_shot), "{}: a window changed beside others in one call", dir.display());
        check_against_cpu(&cpu, &codes, &one_shot, &dir);
    }
}

fn check_against_cpu(cpu: &SnacDecoder, codes: &[Vec<u32>], gpu_pcm: &[f32], dir: &std::path::Path) {
    let want = cpu.decode([&codes[0], &codes[1], &codes[2]], None).unwrap();
    let max = want.iter().zip(gpu_pcm).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let signal: f64 = want.iter().map(|&v| (v as f64).powi(2)).sum();
    let noise: f64 = want.iter().zip(gpu_pcm).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
    let snr = 10.0 * (signal / noise.max(1e-300)).log10();
    let equal = bits(&want) == bits(gpu_pcm);
    eprintln!("{}: GPU against CPU: max difference {max:e}, SNR {snr:.1} dB, bit-equal {equal}", dir.display());
    assert!(max <= MAX_CPU_DIFFERENCE, "{}: the GPU's samples differ from the CPU's by {max}", dir.display());
}

#[test]
fn test_a_bad_window_fails_alone() {
    let Some(dev) = gpu() else { return };
    let cpu = SnacDecoder::open(&codec_dirs()[0]).unwrap();
    let gpu_codec: CudaSnac = dev.load_codec(&cpu).unwrap();
    let mut rng = Rng(5);
    let codes = random_codes(&mut rng, 8);
    let good = window(&codes, 8, 2, 4);
    let mut bad = good.clone();
    bad.codes[2].pop();
    let out = gpu_codec.decode_batch(&[&good, &bad, &good]);
    assert!(out[1].is_err(), "a window whose codebooks disagree was decoded");
    assert_eq!(out[0].as_ref().unwrap(), &gpu_codec.decode(&good).unwrap());
    assert_eq!(out[2].as_ref().unwrap(), out[0].as_ref().unwrap());
}

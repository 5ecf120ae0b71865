use super::*;
use crate::matmul::matmul;
use crate::quant::GgmlType;
use half::f16;

fn lcg(seed: &mut u64) -> f32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    ((*seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
}

const TYPES: [GgmlType; 6] =
    [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K];

/// Random blocks with small scales; Q8_0 bytes cover the whole i8 range, -128 included.
fn quant_weight(ty: GgmlType, rows: usize, cols: usize, seed: &mut u64) -> Weight {
    let n = rows * cols / ty.block_len() * ty.block_bytes();
    let mut data: Vec<u8> = (0..n).map(|_| ((lcg(seed) + 0.5) * 256.0) as u8).collect();
    for b in data.chunks_exact_mut(ty.block_bytes()) {
        let mut put =
            |at: usize, scale: f32| b[at..at + 2].copy_from_slice(&f16::from_f32(lcg(seed) * scale).to_le_bytes());
        match ty {
            GgmlType::Q4_1 => (put(0, 0.1), put(2, 0.1)),
            // The 6-bit scales and minimums multiply these.
            GgmlType::Q4K | GgmlType::Q5K => (put(0, 0.004), put(2, 0.004)),
            GgmlType::Q6K => (put(208, 0.002), ()),
            _ => (put(0, 0.1), ()),
        };
    }
    if ty == GgmlType::Q8_0 {
        data[2] = 0x80;
    }
    Weight::Quant { ty, rows, cols, data: data.into() }
}

/// Row widths to test a type on: odd and even counts of 32-element blocks, and the model's widths.
fn widths(ty: GgmlType) -> &'static [usize] {
    if ty.block_len() == 256 {
        &[256, 768, 1536]
    } else {
        &[32, 96, 160, 576, 1536]
    }
}

/// A width every type holds whole blocks of.
const K: usize = 768;

/// Rows of mixed magnitude, with an all-zero block and a block whose largest value is negative.
fn activations(num_rows: usize, cols: usize, seed: &mut u64) -> Vec<f32> {
    let mut x: Vec<f32> = (0..num_rows * cols).map(|i| lcg(seed) * (1.0 + (i % 7) as f32 * 3.0)).collect();
    x[..32].fill(0.0);
    if x.len() >= 64 {
        x[40] = -50.0;
    }
    x
}

fn run(isa: Isa, x: &[f32], num_rows: usize, w: &Weight) -> Vec<f32> {
    let mut out = vec![f32::NAN; num_rows * w.rows()];
    matmul_q8_on(isa, &Q8Rows::quantize(x, num_rows), w, &mut out);
    out
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn test_quantize_follows_the_q8_formula() {
    let mut x = vec![0f32; 64];
    x[0] = 2.54;
    x[1] = -1.0;
    x[2] = 0.01;
    x[3] = -2.54;
    let q = Q8Rows::quantize(&x, 1);
    let d = 2.54f32 / 127.0;
    assert_eq!(q.scales[0], d);
    assert_eq!(q.scales[7], d);
    let ints: Vec<i32> = q.biased[..4].iter().map(|&b| b as i32 - 128).collect();
    assert_eq!(ints, vec![127, (-1.0f32 / d).round() as i32, (0.01f32 / d).round() as i32, -127]);
    assert_eq!(q.sums[0], d * ints.iter().sum::<i32>() as f32);
    // An all-zero block has scale 0 and every q 0.
    assert_eq!(q.scales[8], 0.0);
    assert!(q.biased[32..].iter().all(|&b| b == 128));
    assert_eq!(q.sums[1], 0.0);
}

#[test]
fn test_every_isa_equals_scalar_bit_for_bit() {
    let mut seed = 5;
    let mut checked = Vec::new();
    for ty in TYPES {
        // Odd and even block counts, the model's widths among them.
        for &cols in widths(ty) {
            let w = quant_weight(ty, 37, cols, &mut seed);
            for num_rows in 1..=9 {
                let x = activations(num_rows, cols, &mut seed);
                let want = run(Isa::Scalar, &x, num_rows, &w);
                for isa in Isa::ALL.into_iter().filter(|i| *i != Isa::Scalar && i.available()) {
                    let got = run(isa, &x, num_rows, &w);
                    assert!(same_bits(&got, &want), "{isa:?} {ty:?} cols {cols} rows {num_rows}");
                    checked.push(isa);
                }
            }
        }
    }
    for isa in Isa::ALL.into_iter().filter(|i| !checked.contains(i) && *i != Isa::Scalar) {
        println!("skipping {isa:?}: not available on this machine");
    }
}

#[test]
fn test_row_alone_equals_row_in_batches_of_1_to_9() {
    let mut seed = 17;
    for ty in TYPES {
        let w = quant_weight(ty, 45, K, &mut seed);
        let k = w.cols();
        let pool = activations(9, k, &mut seed);
        let probe = &pool[3 * k..4 * k];
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
            let alone = run(isa, probe, 1, &w);
            for batch in 1..=9 {
                for at in 0..batch {
                    let mut x = pool[..batch * k].to_vec();
                    x[at * k..(at + 1) * k].copy_from_slice(probe);
                    let out = run(isa, &x, batch, &w);
                    let got = &out[at * w.rows()..(at + 1) * w.rows()];
                    assert!(same_bits(got, &alone), "{isa:?} {ty:?} batch {batch} at {at}");
                }
            }
        }
    }
}

#[test]
fn test_result_equals_dequantized_activations_times_weights() {
    let mut seed = 23;
    for ty in TYPES {
        let (n, k, num_rows) = (29, K, 3);
        let w = quant_weight(ty, n, k, &mut seed);
        let x = activations(num_rows, k, &mut seed);
        let q = Q8Rows::quantize(&x, num_rows);
        let got = run(Isa::best(), &x, num_rows, &w);
        let dense = w.to_f32();
        for m in 0..num_rows {
            let row = q.row(m);
            let xq: Vec<f64> =
                (0..k).map(|i| (row.biased[i] as f64 - 128.0) * row.scales[i / 32 * LANES] as f64).collect();
            for j in 0..n {
                let want: f64 = (0..k).map(|i| xq[i] * dense[j * k + i] as f64).sum();
                let scale: f64 = (0..k).map(|i| (xq[i] * dense[j * k + i] as f64).abs()).sum();
                let v = got[m * n + j] as f64;
                // Only the f32 rounding of the scales and sums separates the two.
                assert!((v - want).abs() <= 1e-5 * (scale + 1e-3), "{ty:?} ({m}, {j}): {v} vs {want}");
            }
        }
    }
}

#[test]
fn test_result_is_within_the_quantization_bound_of_f32() {
    let mut seed = 29;
    for ty in TYPES {
        let (n, k, num_rows) = (41, K, 5);
        let w = quant_weight(ty, n, k, &mut seed);
        let x = activations(num_rows, k, &mut seed);
        let got = run(Isa::best(), &x, num_rows, &w);
        let mut f32_path = vec![0f32; num_rows * n];
        matmul(&x, num_rows, &w, &mut f32_path);
        let dense = w.to_f32();
        let (mut err2, mut ref2) = (0f64, 0f64);
        for m in 0..num_rows {
            let xm = &x[m * k..(m + 1) * k];
            for j in 0..n {
                let wj = &dense[j * k..(j + 1) * k];
                let want: f64 = xm.iter().zip(wj).map(|(a, b)| *a as f64 * *b as f64).sum();
                // Each activation moves by at most half its block's step, d / 2 = max|x| / 254.
                let bound: f64 = xm
                    .chunks_exact(32)
                    .zip(wj.chunks_exact(32))
                    .map(|(xb, wb)| {
                        let half_step = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64 / 254.0;
                        half_step * wb.iter().map(|v| v.abs() as f64).sum::<f64>()
                    })
                    .sum();
                let v = got[m * n + j] as f64;
                assert!(
                    (v - want).abs() <= 1.001 * bound + 1e-5 * (1.0 + want.abs()),
                    "{ty:?} ({m}, {j}): {v} vs {want}"
                );
                err2 += (v - f32_path[m * n + j] as f64).powi(2);
                ref2 += want * want;
            }
        }
        let relative = (err2 / ref2).sqrt();
        assert!(relative < 0.02, "{ty:?}: relative error {relative} against the f32-activation path");
    }
}

#[test]
fn test_k_quant_sub_blocks_decode_to_the_dequantized_values() {
    let mut seed = 37;
    for ty in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
        let w = quant_weight(ty, 3, 512, &mut seed);
        let Weight::Quant { data, .. } = &w else { unreachable!() };
        let fmt = Format::of(ty).unwrap();
        let dense = w.to_f32();
        for (r, row) in data.chunks_exact(2 * ty.block_bytes()).enumerate() {
            for b in 0..16 {
                let (wq, dw, mw) = decode(fmt, row, b);
                for l in 0..BLOCK {
                    let v = dw[l / 16] * wq[l] as f32 + mw;
                    assert_eq!(v, dense[r * 512 + b * BLOCK + l], "{ty:?} row {r} block {b} element {l}");
                }
            }
        }
    }
}

#[test]
fn test_k_quants_take_the_f32_path_as_their_f32_values_do() {
    let mut seed = 43;
    for ty in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
        let w = quant_weight(ty, 37, K, &mut seed);
        let dense = Weight::F32 { rows: 37, cols: K, data: w.to_f32() };
        let x = activations(6, K, &mut seed);
        let (mut got, mut want) = (vec![0f32; 6 * 37], vec![0f32; 6 * 37]);
        matmul(&x, 6, &w, &mut got);
        matmul(&x, 6, &dense, &mut want);
        assert!(same_bits(&got, &want), "{ty:?}");
    }
}

#[test]
fn test_matmul_with_int8_uses_the_integer_path_and_f32_the_other() {
    let mut seed = 41;
    let w = quant_weight(GgmlType::Q4_1, 20, 96, &mut seed);
    let x = activations(3, 96, &mut seed);
    let mut int8 = vec![0f32; 60];
    crate::matmul::matmul_with(&x, 3, &w, &mut int8, crate::matmul::Activations::Int8);
    assert!(same_bits(&int8, &run(Isa::best(), &x, 3, &w)));
    let (mut f32_with, mut f32_plain) = (vec![0f32; 60], vec![0f32; 60]);
    crate::matmul::matmul_with(&x, 3, &w, &mut f32_with, crate::matmul::Activations::F32);
    matmul(&x, 3, &w, &mut f32_plain);
    assert!(same_bits(&f32_with, &f32_plain));
    assert!(!same_bits(&int8, &f32_plain));
}

/// Times both paths on the default model's shapes; `cargo test --release -- --ignored bench --nocapture`.
#[test]
#[ignore]
fn bench_int8_against_f32_on_model_shapes() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    let mut seed = 3;
    for (name, ty, n, k) in [
        ("qkv", GgmlType::Q4_1, 960, 576),
        ("gate_up", GgmlType::Q4_1, 3072, 576),
        ("down", GgmlType::Q4_1, 576, 1536),
        ("head", GgmlType::Q8_0, 49152, 576),
        ("down", GgmlType::Q4K, 576, 1536),
        ("down", GgmlType::Q5K, 576, 1536),
        ("down", GgmlType::Q6K, 576, 1536),
    ] {
        let w = quant_weight(ty, n, k, &mut seed);
        for num_rows in [1, 64] {
            let x = activations(num_rows, k, &mut seed);
            let mut out = vec![0f32; num_rows * n];
            let time = |f: &mut dyn FnMut()| {
                f();
                let reps = (2e8 / (n * k * num_rows) as f64).ceil() as u32;
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    f();
                }
                t.elapsed().as_secs_f64() * 1e3 / reps as f64
            };
            let f32_ms = pool.install(|| time(&mut || matmul(&x, num_rows, &w, &mut out)));
            let int8_ms = pool.install(|| time(&mut || matmul_q8(&Q8Rows::quantize(&x, num_rows), &w, &mut out)));
            println!(
                "{name} {ty:?} {n}x{k} rows {num_rows}: f32 {f32_ms:.3} ms, int8 {int8_ms:.3} ms ({:?})",
                Isa::best()
            );
        }
    }
}

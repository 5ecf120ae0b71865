//! On a GPU: Gated DeltaNet's recurrence over the state plane gives a position the same bits whole, in chunks that
//! start inside pages, and beside another lane, and stays close to a plain f64 recurrence. Skips with a one-line
//! reason where no GPU is found.

mod common;

use common::values;
use tensorfold_kernels::cuda::{DeltaNetLayer, DeltaNetRound, DevPtr, Gpu, KernelOptions};

const NK: usize = 2;
const NV: usize = 4;
const DK: usize = 128;
const DV: usize = 128;
const TAPS: usize = 4;
const PAGE: usize = 16;
const CONV_DIM: usize = 2 * NK * DK + NV * DV;
const WIDTH: usize = CONV_DIM + 2 * NV;
const STATE_ELEMS: usize = PAGE * WIDTH + NV * DK * DV;

/// One lane's inputs: per position its convolution inputs and its `ba` projection.
struct Lane {
    qkv: Vec<f32>,
    ba: Vec<f32>,
    pages: Vec<u32>,
}

struct Weights {
    conv: Vec<f32>,
    neg_a: Vec<f32>,
    dt_bias: Vec<f32>,
}

fn open() -> Option<std::sync::Arc<Gpu>> {
    match Gpu::open(0, None, KernelOptions::default()) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

fn weights() -> Weights {
    let neg_a = values(3, NV, 1.0).iter().map(|v| -0.2 - v.abs()).collect();
    Weights { conv: values(4, CONV_DIM * TAPS, 0.5), neg_a, dt_bias: values(5, NV, 0.5) }
}

fn lane(seed: u64, len: usize, first_page: u32) -> Lane {
    let pages = (0..len.div_ceil(PAGE) as u32).map(|p| first_page + p).collect();
    Lane { qkv: values(seed, len * CONV_DIM, 1.0), ba: values(seed + 1, len * 2 * NV, 2.0), pages }
}

/// Runs rounds over a fresh pool of `pages` pages; each round is (lane, first position, rows) steps; returns every
/// lane's outputs (positions x NV x DV) as written by the rounds.
fn run(g: &Gpu, w: &Weights, lanes: &[Lane], rounds: &[Vec<(usize, usize, usize)>], pages: usize) -> Vec<Vec<f32>> {
    let mut held: Vec<DevPtr> = vec![];
    let mut buf = |bytes: usize| {
        let p = g.malloc(bytes.max(4), false).unwrap();
        held.push(p);
        p
    };
    let states = buf(4 * pages * STATE_ELEMS);
    g.upload(states, &vec![0f32; pages * STATE_ELEMS]).unwrap();
    let (conv, neg_a, dt_bias) = (buf(4 * w.conv.len()), buf(4 * NV), buf(4 * NV));
    g.upload(conv, &w.conv).unwrap();
    g.upload(neg_a, &w.neg_a).unwrap();
    g.upload(dt_bias, &w.dt_bias).unwrap();
    let layer = DeltaNetLayer {
        states,
        state_elems: STATE_ELEMS,
        base: 0,
        page_tokens: PAGE,
        num_k_heads: NK,
        num_v_heads: NV,
        k_head_dim: DK,
        v_head_dim: DV,
        conv_kernel: TAPS,
    };
    let mut outs: Vec<Vec<f32>> = lanes.iter().map(|l| vec![f32::NAN; l.qkv.len() / CONV_DIM * NV * DV]).collect();
    for round in rounds {
        let (mut qkv, mut ba, mut pos, mut table_off, mut table, mut lane_table) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for &(l, start, n) in round {
            lane_table.extend([pos.len() as u32, start as u32, n as u32, table.len() as u32]);
            for t in start..start + n {
                qkv.extend_from_slice(&lanes[l].qkv[t * CONV_DIM..(t + 1) * CONV_DIM]);
                ba.extend_from_slice(&lanes[l].ba[t * 2 * NV..(t + 1) * 2 * NV]);
                pos.push(t as u32);
                table_off.push(table.len() as u32);
            }
            table.extend_from_slice(&lanes[l].pages);
        }
        let rows = pos.len();
        let up = |data: &[u32]| {
            let p = g.malloc(4 * data.len(), false).unwrap();
            g.upload(p, data).unwrap();
            p
        };
        let (pos_d, off_d, table_d, lanes_d) = (up(&pos), up(&table_off), up(&table), up(&lane_table));
        let (qkv_d, ba_d, core) = (buf(4 * qkv.len()), buf(4 * ba.len()), buf(4 * rows * NV * DV));
        g.upload(qkv_d, &qkv).unwrap();
        g.upload(ba_d, &ba).unwrap();
        let r = DeltaNetRound {
            rows,
            lanes: round.len(),
            pos: pos_d,
            table_off: off_d,
            page_table: table_d,
            lane_table: lanes_d,
        };
        g.deltanet_rows(&layer, &r, (qkv_d, ba_d), (neg_a, dt_bias)).unwrap();
        g.deltanet_heads(&layer, &r, conv, core).unwrap();
        let mut got = vec![0f32; rows * NV * DV];
        // SAFETY: core holds rows x NV x DV floats and `got` lives until the sync.
        unsafe { g.download_async(&mut got, core).unwrap() };
        g.sync().unwrap();
        let mut row = 0;
        for &(l, start, n) in round {
            outs[l][start * NV * DV..(start + n) * NV * DV].copy_from_slice(&got[row * NV * DV..(row + n) * NV * DV]);
            row += n;
        }
        for p in [pos_d, off_d, table_d, lanes_d] {
            g.free(p, false);
        }
    }
    for p in held {
        g.free(p, false);
    }
    outs
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The recurrence in f64, straight from its definition, for one lane.
fn reference(w: &Weights, l: &Lane, len: usize) -> Vec<f32> {
    let silu = |x: f64| x / (1.0 + (-x).exp());
    let mut state = vec![0f64; NV * DK * DV];
    let mut out = vec![0f32; len * NV * DV];
    for t in 0..len {
        let conv: Vec<f64> = (0..CONV_DIM)
            .map(|c| {
                let x: f64 = (0..TAPS)
                    .filter_map(|tap| (t + tap + 1).checked_sub(TAPS).map(|src| (tap, src)))
                    .map(|(tap, src)| w.conv[c * TAPS + tap] as f64 * l.qkv[src * CONV_DIM + c] as f64)
                    .sum();
                silu(x)
            })
            .collect();
        for h in 0..NV {
            let (kh, ratio) = (h / (NV / NK), NV / NK);
            let unit = |x: &[f64], scale: f64| {
                let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() + 1e-6).sqrt();
                x.iter().map(|v| v * inv * scale).collect::<Vec<f64>>()
            };
            let q = unit(&conv[kh * DK..(kh + 1) * DK], 1.0 / (DK as f64).sqrt());
            let k = unit(&conv[NK * DK + kh * DK..NK * DK + (kh + 1) * DK], 1.0);
            let v = &conv[2 * NK * DK + h * DV..2 * NK * DK + (h + 1) * DV];
            let (g, i) = (h / ratio, h % ratio);
            let ba = &l.ba[t * 2 * NV + g * 2 * ratio..];
            let (b, a) = (ba[i] as f64, ba[ratio + i] as f64);
            let decay = (w.neg_a[h] as f64 * (a + w.dt_bias[h] as f64).exp().ln_1p()).exp();
            let beta = 1.0 / (1.0 + (-b).exp());
            let s = &mut state[h * DK * DV..(h + 1) * DK * DV];
            s.iter_mut().for_each(|x| *x *= decay);
            for j in 0..DV {
                let kv: f64 = (0..DK).map(|i| s[i * DV + j] * k[i]).sum();
                let d = (v[j] - kv) * beta;
                (0..DK).for_each(|i| s[i * DV + j] += k[i] * d);
                out[(t * NV + h) * DV + j] = (0..DK).map(|i| s[i * DV + j] * q[i]).sum::<f64>() as f32;
            }
        }
    }
    out
}

#[test]
fn test_a_prompt_whole_equals_it_in_chunks_and_token_by_token() {
    let Some(g) = open() else { return };
    let (w, len) = (weights(), 100);
    let lanes = [lane(10, len, 0)];
    let whole = run(&g, &w, &lanes, &[vec![(0, 0, len)]], 8).remove(0);
    let expect = reference(&w, &lanes[0], len);
    let err = whole.iter().zip(&expect).map(|(a, b)| (a - b).powi(2)).sum::<f32>().sqrt();
    let norm = expect.iter().map(|b| b * b).sum::<f32>().sqrt();
    assert!(err / norm < 1e-4, "relative error {} against the f64 recurrence", err / norm);
    for size in [1, 7, 16, 33] {
        let rounds: Vec<Vec<(usize, usize, usize)>> =
            (0..len).step_by(size).map(|s| vec![(0, s, size.min(len - s))]).collect();
        let chunked = run(&g, &w, &lanes, &rounds, 8).remove(0);
        assert!(same_bits(&whole, &chunked), "chunks of {size} differ from the whole prompt");
    }
}

#[test]
fn test_a_lane_alone_equals_it_beside_another_lane() {
    let Some(g) = open() else { return };
    let (w, len) = (weights(), 60);
    let lanes = [lane(20, len, 0), lane(30, len, 4)];
    let alone = run(&g, &w, &lanes[..1], &[vec![(0, 0, 40)], vec![(0, 40, 20)]], 8).remove(0);
    // The other lane's steps start at other places, so the two lanes' pages end at different rounds.
    let beside = run(&g, &w, &lanes, &[vec![(1, 0, 9), (0, 0, 40)], vec![(0, 40, 20), (1, 9, 51)]], 8).remove(0);
    assert!(same_bits(&alone, &beside), "the lane differs beside another lane");
}

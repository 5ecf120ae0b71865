//! A whole Qwen3-MoE GGUF, its experts stacked and quantized, through the CPU model.

use tensorfold_kernels::GgmlType;

use crate::boundary::{KvPool, LaneStep, Logits};
use crate::checkpoint::gguf::write::{f32_bytes, GgufWriter};
use crate::checkpoint::gguf::Value;
use crate::checkpoint::gguf_model::GgufCheckpoint;
use crate::generate::PAGE_TOKENS;
use crate::llama::Llama;

const WIDTH: u64 = 64;
const VOCAB: u64 = 40;
const EXPERTS: u64 = 8;
const EXPERT_WIDTH: u64 = 32;

/// Seeded values in (-0.3, 0.3), or around one for norms.
fn values(seed: &mut u64, len: u64, around_one: bool) -> Vec<u8> {
    let v: Vec<f32> = (0..len)
        .map(|_| {
            *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (*seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            if around_one {
                1.0 + 0.2 * u
            } else {
                0.3 * u
            }
        })
        .collect();
    f32_bytes(&v)
}

/// Q8_0 blocks of seeded quants with a small scale each.
fn q8_0(seed: &mut u64, num_values: u64) -> Vec<u8> {
    (0..num_values / 32)
        .flat_map(|_| {
            let mut block = half::f16::from_f32(0.01).to_le_bytes().to_vec();
            block.extend((0..32).map(|_| {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (*seed >> 56) as u8
            }));
            block
        })
        .collect()
}

/// One layer, a mixture of 8 experts with top 2, 4 heads over 2 kv heads of 16.
fn tiny_qwen3moe() -> GgufWriter {
    let seed = &mut 9;
    let (f32t, u32v) = (GgmlType::F32, Value::U32);
    GgufWriter::new()
        .kv("general.architecture", Value::String("qwen3moe".into()))
        .kv("qwen3moe.block_count", u32v(1))
        .kv("qwen3moe.embedding_length", u32v(WIDTH as u32))
        .kv("qwen3moe.feed_forward_length", u32v(96))
        .kv("qwen3moe.expert_feed_forward_length", u32v(EXPERT_WIDTH as u32))
        .kv("qwen3moe.expert_count", u32v(EXPERTS as u32))
        .kv("qwen3moe.expert_used_count", u32v(2))
        .kv("qwen3moe.attention.head_count", u32v(4))
        .kv("qwen3moe.attention.head_count_kv", u32v(2))
        .kv("qwen3moe.attention.key_length", u32v(16))
        .kv("qwen3moe.attention.layer_norm_rms_epsilon", Value::F32(1e-6))
        .kv("qwen3moe.context_length", u32v(256))
        .tensor("token_embd.weight", &[WIDTH, VOCAB], f32t, values(seed, WIDTH * VOCAB, false))
        .tensor("output.weight", &[WIDTH, VOCAB], f32t, values(seed, WIDTH * VOCAB, false))
        .tensor("output_norm.weight", &[WIDTH], f32t, values(seed, WIDTH, true))
        .tensor("blk.0.attn_norm.weight", &[WIDTH], f32t, values(seed, WIDTH, true))
        .tensor("blk.0.ffn_norm.weight", &[WIDTH], f32t, values(seed, WIDTH, true))
        .tensor("blk.0.attn_q.weight", &[WIDTH, 64], f32t, values(seed, WIDTH * 64, false))
        .tensor("blk.0.attn_k.weight", &[WIDTH, 32], f32t, values(seed, WIDTH * 32, false))
        .tensor("blk.0.attn_v.weight", &[WIDTH, 32], f32t, values(seed, WIDTH * 32, false))
        .tensor("blk.0.attn_output.weight", &[64, WIDTH], f32t, values(seed, 64 * WIDTH, false))
        .tensor("blk.0.attn_q_norm.weight", &[16], f32t, values(seed, 16, true))
        .tensor("blk.0.attn_k_norm.weight", &[16], f32t, values(seed, 16, true))
        .tensor("blk.0.ffn_gate_inp.weight", &[WIDTH, EXPERTS], f32t, values(seed, WIDTH * EXPERTS, false))
        .tensor(
            "blk.0.ffn_gate_exps.weight",
            &[WIDTH, EXPERT_WIDTH, EXPERTS],
            GgmlType::Q8_0,
            q8_0(seed, WIDTH * EXPERT_WIDTH * EXPERTS),
        )
        .tensor(
            "blk.0.ffn_up_exps.weight",
            &[WIDTH, EXPERT_WIDTH, EXPERTS],
            GgmlType::Q8_0,
            q8_0(seed, WIDTH * EXPERT_WIDTH * EXPERTS),
        )
        .tensor(
            "blk.0.ffn_down_exps.weight",
            &[EXPERT_WIDTH, WIDTH, EXPERTS],
            GgmlType::Q8_0,
            q8_0(seed, WIDTH * EXPERT_WIDTH * EXPERTS),
        )
}

/// Each lane's logits of every position, the lanes run together in one round.
fn logits(llama: &Llama, prompts: &[&[u32]]) -> Vec<Vec<f32>> {
    let mut pool = KvPool::new(llama.config().kv_layout(PAGE_TOKENS), 4 * prompts.len());
    let pages: Vec<Vec<u32>> = (0..prompts.len() as u32).map(|i| (4 * i..4 * i + 4).collect()).collect();
    let lanes: Vec<LaneStep> = prompts
        .iter()
        .zip(&pages)
        .map(|(tokens, pages)| LaneStep { tokens, start_pos: 0, pages, logits: Logits::All, keep: None })
        .collect();
    llama.run(&mut pool, &lanes).into_iter().map(|rows| rows.values().unwrap().to_vec()).collect()
}

#[test]
fn test_a_quantized_moe_gguf_runs_and_a_lane_alone_equals_the_lane_among_others() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moe.gguf");
    std::fs::write(&path, tiny_qwen3moe().write().bytes).unwrap();
    let llama = Llama::load(&GgufCheckpoint::open(&path).unwrap()).unwrap();
    assert!(llama.config().is_moe_layer(0));
    let (probe, other): (&[u32], &[u32]) = (&[3, 17, 5, 39, 0, 22, 8], &[1, 2, 30]);
    let alone = logits(&llama, &[probe]).remove(0);
    let together = logits(&llama, &[other, probe]);
    assert_eq!(alone.len(), probe.len() * VOCAB as usize);
    assert!(alone.iter().all(|v| v.is_finite()) && alone.iter().any(|&v| v != alone[0]));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&alone), bits(&together[1]));
}

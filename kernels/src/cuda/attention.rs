//! Host side of the attention kernels (attention.cu): RoPE and the cache write, and paged attention.

use super::{Arg, DevPtr, Gpu, GpuError};

/// Positions in one attention split (ATT_SPLIT in attention.cu).
pub const ATTENTION_SPLIT: usize = 64;

/// Head sizes the attention kernels are built for (`attention_d{D}` in attention.cu).
pub const HEAD_DIMS: [usize; 5] = [32, 64, 96, 128, 256];

/// Warps of an attention block (ATT_WARPS in attention.cu); each takes up to 16 / group positions of a row group.
const ATTENTION_WARPS: usize = 4;

/// Dynamic shared memory of an attention block of head size `d`: two staged splits of bf16 keys and values.
pub(super) fn attention_smem(d: usize) -> u32 {
    (2 * 2 * ATTENTION_SPLIT * (d + 8) * 2) as u32
}

/// Warps of a wide decode block, each its own (row, KV head) (DEC_WARPS in attention_decode.cu).
const DECODE_WARPS: usize = 4;

/// Tiles in each decode warp's ring (DEC_SLOTS in attention_decode.cu).
const DECODE_SLOTS: usize = 3;

/// Key rows of a decode tile, half a split (DEC_KEYS in attention_decode.cu).
const DECODE_KEYS: usize = 32;

/// Dynamic shared memory of a wide decode block of head size `d`: each warp's ring of bf16 tiles (rows padded by 8),
/// where its rotated q heads also sit before the first copy.
pub(super) fn decode_smem(d: usize) -> u32 {
    (DECODE_WARPS * DECODE_SLOTS * DECODE_KEYS * (d + 8) * 2) as u32
}

/// Most consecutive positions of one lane that an attention block takes, for `group` query heads per KV head.
pub fn attention_group_rows(group: usize) -> usize {
    ATTENTION_WARPS * (16 / group)
}

/// Heads one `qkv_rope_store` block takes, a warp each (ROPE_HEADS in attention.cu).
const ROPE_HEADS: usize = 4;

impl Gpu {
    /// Per-head norm and RoPE of q and k in `qkv`, and k and v written to the cache at `kv_off[r] + layer_off`.
    pub fn qkv_rope_store(&self, a: &QkvArgs) -> Result<(), GpuError> {
        let dims =
            [a.num_heads, a.num_kv_heads, a.head_dim, a.interleaved as usize, a.rotary_dim].map(|v| Arg::Int(v as i32));
        let args = [
            Arg::Ptr(a.qkv),
            Arg::Ptr(a.pos),
            Arg::Ptr(a.kv_off),
            Arg::Ptr(a.inv_freq),
            Arg::Ptr(a.q_norm),
            Arg::Ptr(a.k_norm),
            Arg::Float(a.eps),
            Arg::Ptr(a.kcache),
            Arg::Ptr(a.vcache),
            Arg::Ptr(a.layer_off),
            dims[0],
            dims[1],
            dims[2],
            dims[3],
            dims[4],
        ];
        let blocks = (a.num_heads + 2 * a.num_kv_heads).div_ceil(ROPE_HEADS);
        self.launch(&self.f.qkv_rope_store, (a.rows, blocks, 1), 32 * ROPE_HEADS as u32, 0, &args)
    }

    /// Causal attention of each row over its lane's pages; out is bf16 rows of num_heads * head_dim.
    /// One block takes each row group (`groups`: first row and count). With `partial` (every group one row, room
    /// for `nsplit` split states per row and head), `splits` blocks per row run the splits side by side and the
    /// last to finish folds them; without, one block per group folds them: the bits are the same.
    /// With `rope` (a round where every lane decodes one token) it also does `qkv_rope_store`'s work, which the
    /// caller then skips: the same arithmetic, one launch fewer.
    pub fn paged_attention(&self, a: &AttentionArgs, rope: Option<&QkvArgs>) -> Result<(), GpuError> {
        let dims = [a.num_heads, a.num_kv_heads, a.page_tokens].map(|v| Arg::Int(v as i32));
        let args = [
            Arg::Ptr(a.qkv),
            Arg::Ptr(a.pos),
            Arg::Ptr(a.groups),
            Arg::Ptr(a.page_table),
            Arg::Ptr(a.table_off),
            Arg::Ptr(a.kcache),
            Arg::Ptr(a.vcache),
            Arg::Ptr(a.out),
            Arg::Ptr(a.partial),
            Arg::Ptr(a.tickets),
            dims[0],
            dims[1],
            dims[2],
            Arg::Ptr(a.page_stride),
            Arg::Ptr(a.layer_off),
            Arg::Float(a.scale),
            Arg::Int(a.nsplit as i32),
            Arg::Ptr(rope.map_or(0, |r| r.kv_off)),
            Arg::Ptr(rope.map_or(0, |r| r.inv_freq)),
            Arg::Ptr(rope.map_or(0, |r| r.q_norm)),
            Arg::Ptr(rope.map_or(0, |r| r.k_norm)),
            Arg::Float(rope.map_or(0.0, |r| r.eps)),
            Arg::Int(rope.is_some_and(|r| r.interleaved) as i32),
            Arg::Int(rope.is_some() as i32),
            Arg::Int(a.first_key as i32),
        ];
        let at = HEAD_DIMS.iter().position(|&d| d == a.head_dim).expect("a head size the attention kernels take");
        let from_zero = a.first_key == 0;
        if let (0, true, true, Some(decode)) = (a.partial, a.one_row_groups, from_zero, &self.f.attention_decode) {
            let chunks = self.decode_chunks(a);
            // The row kernel's arguments with the group count for partial and the split ones moved to the end.
            let mut args = Vec::from(args);
            args.pop();
            let nsplit = args.remove(16);
            args.remove(9);
            args[8] = Arg::Int(a.num_groups as i32);
            let (states, tickets) = if chunks > 1 { (a.states, a.tickets) } else { (0, 0) };
            args.extend([Arg::Ptr(states), Arg::Ptr(tickets), nsplit, Arg::Int(chunks as i32)]);
            let blocks = (a.num_groups * a.num_kv_heads * chunks).div_ceil(DECODE_WARPS);
            let block = 32 * DECODE_WARPS as u32;
            let kernel = &decode[at + if chunks > 1 { HEAD_DIMS.len() } else { 0 }];
            return self.launch(kernel, (blocks, 1, 1), block, decode_smem(a.head_dim), &args);
        }
        if let (Some(wg), true) = (&self.f.attention_wg, from_zero && rope.is_none() && self.wg_fits(a)) {
            let kv_dim = a.num_kv_heads * a.head_dim;
            // The cache as rows of kv_dim: a page's positions of a layer are consecutive rows.
            let kmap = self.tensor_map(a.kcache, WG_CACHE_ROWS, kv_dim, 16)?;
            let vmap = self.tensor_map(a.vcache, WG_CACHE_ROWS, kv_dim, 16)?;
            let args = [
                Arg::Map(kmap),
                Arg::Map(vmap),
                Arg::Ptr(a.qkv),
                Arg::Ptr(a.pos),
                Arg::Ptr(a.groups),
                Arg::Ptr(a.page_table),
                Arg::Ptr(a.table_off),
                Arg::Ptr(a.out),
                Arg::Int(a.num_heads as i32),
                Arg::Int(a.num_kv_heads as i32),
                Arg::Int((a.page_stride / kv_dim as u64) as i32),
                Arg::Int((a.layer_off / kv_dim as u64) as i32),
                Arg::Float(a.scale),
            ];
            return self.launch(wg, (a.num_kv_heads, a.num_groups, 1), 160, WG_SMEM, &args);
        }
        let z = if a.partial == 0 { 1 } else { a.splits.clamp(1, a.nsplit.max(1)) };
        let block = 32 * ATTENTION_WARPS as u32;
        self.launch(&self.f.attention[at], (a.num_kv_heads, a.num_groups, z), block, attention_smem(a.head_dim), &args)
    }

    /// Whether the wgmma prompt kernel takes the round: one block folding each group, head size 128, pages of 16
    /// positions, a KV group of 1 to 8 heads dividing 64 rows, the cache's pages and layers whole rows of kv_dim.
    fn wg_fits(&self, a: &AttentionArgs) -> bool {
        let kv_dim = (a.num_kv_heads * a.head_dim) as u64;
        let group = a.num_heads / a.num_kv_heads.max(1);
        a.partial == 0
            && a.head_dim == 128
            && a.page_tokens == 16
            && (1..=8).contains(&group)
            && 64usize.is_multiple_of(group)
            && a.page_stride.is_multiple_of(kv_dim)
            && a.layer_off.is_multiple_of(kv_dim)
            && a.page_stride / kv_dim < 1 << 20
    }

    /// Warps per (row, KV head) of a wide decode round: one where the pairs fill half the GPU's warps or more,
    /// else as many as fill one wave of them where `states` holds every row's split states. Fixed by the round's
    /// shape and the sizing alone, so a recorded graph stays right as contexts grow.
    pub fn decode_chunks(&self, a: &AttentionArgs) -> usize {
        let (units, slots) = (a.num_groups * a.num_kv_heads, self.sms * DECODE_WARPS_PER_SM);
        let want = match 2 * units <= slots {
            true => (slots / units.max(1)).min(MAX_DECODE_CHUNKS),
            false => 1,
        };
        let room = a.num_groups * a.num_heads * a.nsplit * (a.head_dim + 2) * 4;
        match want > 1 && a.states != 0 && room <= a.states_bytes && a.num_groups <= a.ticket_rows {
            true => want,
            false => 1,
        }
    }
}

/// Dynamic shared memory of the wgmma prompt kernel: q's two swizzled half heads, two stages of keys and values,
/// and room to align them to 1,024 bytes (WG_STAGES and WG_HALF in attention_wg.cu).
pub(super) const WG_SMEM: u32 = 2 * 8192 + 2 * 4 * 8192 + 1024;

/// Rows of kv_dim the cache maps describe: a bound, never reached, as only the pool's pages are asked for.
const WG_CACHE_ROWS: usize = 1 << 31;

/// Warps of the wide decode kernel an SM holds (two blocks).
const DECODE_WARPS_PER_SM: usize = 2 * DECODE_WARPS;

/// Most warps one (row, KV head) of a wide decode round is spread over.
const MAX_DECODE_CHUNKS: usize = 16;

/// Arguments of `qkv_rope_store`; pointers are device addresses, 0 for an absent norm.
pub struct QkvArgs {
    pub qkv: DevPtr,
    pub pos: DevPtr,
    pub kv_off: DevPtr,
    pub inv_freq: DevPtr,
    pub q_norm: DevPtr,
    pub k_norm: DevPtr,
    pub eps: f32,
    pub kcache: DevPtr,
    pub vcache: DevPtr,
    pub layer_off: u64,
    pub rows: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub interleaved: bool,
    /// Dimensions of each q and k head that RoPE rotates, from the first (partial rotary); head_dim for most models.
    pub rotary_dim: usize,
}

/// Arguments of `paged_attention`.
pub struct AttentionArgs {
    pub qkv: DevPtr,
    pub pos: DevPtr,
    pub page_table: DevPtr,
    pub table_off: DevPtr,
    pub kcache: DevPtr,
    pub vcache: DevPtr,
    pub out: DevPtr,
    /// Row groups, two u32 each (first row, count): consecutive positions of one lane, at most `attention_group_rows`.
    pub groups: DevPtr,
    pub num_groups: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub page_tokens: usize,
    pub page_stride: u64,
    pub layer_off: u64,
    pub scale: f32,
    /// Room for split states (`nsplit` per row and head, `head_dim + 2` floats each), or 0 to fold in one block;
    /// only where every group is one row.
    pub partial: DevPtr,
    /// A zeroed counter per (row, KV head) of a split round; the kernel leaves it zero.
    pub tickets: DevPtr,
    pub nsplit: usize,
    /// Blocks per row when splitting.
    pub splits: usize,
    /// Every group is one row (a decode round): without `partial`, one warp per (row, KV head) attends.
    pub one_row_groups: bool,
    /// Room for the wide decode kernel's split states (`nsplit` per row and head), where it may spread a row over
    /// several warps; 0 for none. `tickets` then needs a zeroed counter per (row, KV head) for `ticket_rows` rows.
    pub states: DevPtr,
    pub states_bytes: usize,
    pub ticket_rows: usize,
    /// The first key slot rows attend (a draft head's keys start at 1); above 0 only `attention_d{D}` runs.
    pub first_key: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_kernels_compile_with_an_attention_kernel_for_every_head_size() {
        match super::super::compile_ptx("sm_90") {
            Ok(ptx) => {
                for d in HEAD_DIMS {
                    assert!(ptx.contains(&format!(".entry attention_d{d}(")), "PTX lacks attention_d{d}");
                }
            }
            Err(GpuError::NoNvrtc) => eprintln!("skipped: no NVRTC library on this machine"),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn test_a_row_group_fills_the_16_mma_rows_of_each_warp() {
        for group in [1, 2, 4, 8] {
            assert_eq!(attention_group_rows(group) * group, 16 * ATTENTION_WARPS);
        }
    }
}

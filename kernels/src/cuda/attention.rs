//! Host side of the attention kernels (attention.cu): RoPE and the cache write, and paged attention.

use super::{Arg, DevPtr, Gpu, GpuError, MAX_HEAD_DIM};

/// Dynamic shared memory of an attention block: two staged tiles of 32 keys and values (attention.cu).
pub(super) const ATTENTION_SMEM: u32 = 2 * (32 * (MAX_HEAD_DIM as u32 + 4) + 32 * MAX_HEAD_DIM as u32) * 4;

/// Positions in one attention split (ATT_SPLIT in attention.cu).
pub const ATTENTION_SPLIT: usize = 64;

impl Gpu {
    /// Per-head norm and RoPE of q and k in `qkv`, and k and v written to the cache at `kv_off[r] + layer_off`.
    pub fn qkv_rope_store(&self, a: &QkvArgs) -> Result<(), GpuError> {
        let dims = [a.num_heads, a.num_kv_heads, a.head_dim, a.interleaved as usize].map(|v| Arg::Int(v as i32));
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
        ];
        self.launch(&self.f.qkv_rope_store, (a.rows, a.num_heads + 2 * a.num_kv_heads, 1), 32, 0, &args)
    }

    /// Causal attention of each row over its lane's pages; out is bf16 rows of num_heads * head_dim.
    /// With `partial` (room for `nsplit` split states per row and head), `splits` blocks per row run the splits
    /// side by side and the last to finish folds them; without, one block per row folds them: the bits are the same.
    /// With `rope` (a round where every lane decodes one token) it also does `qkv_rope_store`'s work, which the
    /// caller then skips: the same arithmetic, one launch fewer.
    pub fn paged_attention(&self, a: &AttentionArgs, rope: Option<&QkvArgs>) -> Result<(), GpuError> {
        let dims = [a.num_heads, a.num_kv_heads, a.head_dim, a.page_tokens].map(|v| Arg::Int(v as i32));
        let args = [
            Arg::Ptr(a.qkv),
            Arg::Ptr(a.pos),
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
            dims[3],
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
        ];
        let group = (a.num_heads / a.num_kv_heads) as u32;
        let z = if a.partial == 0 { 1 } else { a.splits.clamp(1, a.nsplit.max(1)) };
        self.launch(&self.f.paged_attention, (a.num_kv_heads, a.rows, z), 32 * group, ATTENTION_SMEM, &args)
    }
}

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
    pub rows: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub page_tokens: usize,
    pub page_stride: u64,
    pub layer_off: u64,
    pub scale: f32,
    /// Room for split states (`nsplit` per row and head, `head_dim + 2` floats each), or 0 to fold in one block.
    pub partial: DevPtr,
    /// A zeroed counter per (row, KV head) of a split round; the kernel leaves it zero.
    pub tickets: DevPtr,
    pub nsplit: usize,
    /// Blocks per row when splitting.
    pub splits: usize,
}

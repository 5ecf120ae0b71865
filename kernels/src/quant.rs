//! GGML block formats: sizes and dequantization to f32.

/// Tensor element types of GGUF files, with their on-disk type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl GgmlType {
    /// Maps a GGUF type id; `None` for types we do not support.
    pub fn from_id(id: u32) -> Option<Self> {
        todo!("{id}")
    }
    /// Elements per block.
    pub fn block_len(self) -> usize {
        todo!()
    }
    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        todo!()
    }
}

/// Dequantizes `out.len()` elements (a multiple of the block length) from `bytes`.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    let _ = (ty, bytes, out);
    todo!()
}

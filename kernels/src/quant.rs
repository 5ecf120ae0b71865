//! GGML block formats: sizes and dequantization to f32, rounded in the reference package's order.

use half::f16;

/// Elements in one super-block of the K-quants.
const QK_K: usize = 256;

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
        Some(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4K,
            13 => GgmlType::Q5K,
            14 => GgmlType::Q6K,
            30 => GgmlType::BF16,
            _ => return None,
        })
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q8_0 => 8,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::BF16 => 30,
        }
    }

    /// Elements per block.
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => 32,
            GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K => QK_K,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 2 + 16,
            GgmlType::Q4_1 => 2 + 2 + 16,
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q4K => 2 + 2 + 12 + QK_K / 2,
            GgmlType::Q5K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            GgmlType::Q6K => QK_K / 2 + QK_K / 4 + QK_K / 16 + 2,
        }
    }
}

/// Bytes of a row of `cols` elements; `None` when `cols` is not a whole number of blocks or overflows.
pub fn row_bytes(ty: GgmlType, cols: usize) -> Option<usize> {
    if !cols.is_multiple_of(ty.block_len()) {
        return None;
    }
    (cols / ty.block_len()).checked_mul(ty.block_bytes())
}

/// Dequantizes `out.len()` elements (whole blocks) from as many blocks of `bytes`; extras are left alone.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    let blocks = bytes.chunks_exact(ty.block_bytes());
    let outs = out.chunks_exact_mut(ty.block_len());
    match ty {
        GgmlType::F32 => blocks.zip(outs).for_each(|(b, y)| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        GgmlType::F16 => blocks.zip(outs).for_each(|(b, y)| y[0] = f16_at(b, 0)),
        GgmlType::BF16 => blocks.zip(outs).for_each(|(b, y)| y[0] = f32::from_bits((u16_at(b, 0) as u32) << 16)),
        GgmlType::Q4_0 => blocks.zip(outs).for_each(|(b, y)| dequantize_q4_0(b, y)),
        GgmlType::Q4_1 => blocks.zip(outs).for_each(|(b, y)| dequantize_q4_1(b, y)),
        GgmlType::Q8_0 => blocks.zip(outs).for_each(|(b, y)| dequantize_q8_0(b, y)),
        GgmlType::Q4K => blocks.zip(outs).for_each(|(b, y)| dequantize_q4_k(b, y)),
        GgmlType::Q5K => blocks.zip(outs).for_each(|(b, y)| dequantize_q5_k(b, y)),
        GgmlType::Q6K => blocks.zip(outs).for_each(|(b, y)| dequantize_q6_k(b, y)),
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16_at(b, at)).to_f32()
}

/// 32 elements: f16 scale `d`, then 16 bytes whose low nibbles are elements 0..16 and high 16..32.
fn dequantize_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (i, &q) in b[2..18].iter().enumerate() {
        y[i] = d * ((q & 0x0F) as i32 - 8) as f32;
        y[i + 16] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

/// 32 elements: f16 scale `d` and minimum `m`, then nibbles as in Q4_0, unsigned.
fn dequantize_q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    for (i, &q) in b[4..20].iter().enumerate() {
        y[i] = d * (q & 0x0F) as f32 + m;
        y[i + 16] = d * (q >> 4) as f32 + m;
    }
}

/// 32 elements: f16 scale `d`, then one signed byte per element.
fn dequantize_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (i, &q) in b[2..34].iter().enumerate() {
        y[i] = q as i8 as f32 * d;
    }
}

/// The 6-bit scale and minimum of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K.
pub(crate) fn k_scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 0x3F, s[j + 4] & 0x3F)
    } else {
        let sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        let m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        (sc, m)
    }
}

/// 256 elements, 8 sub-blocks with 6-bit scales and minimums; a 32-byte chunk holds two, low nibbles first.
fn dequantize_q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for j in 0..8 {
        let (sc, m) = k_scale_min(scales, j);
        let scale = d * sc as f32;
        let min = dmin * m as f32;
        let chunk = &qs[(j / 2) * 32..(j / 2) * 32 + 32];
        let shift = 4 * (j % 2);
        for (l, &q) in chunk.iter().enumerate() {
            y[j * 32 + l] = scale * ((q >> shift) & 0x0F) as f32 - min;
        }
    }
}

/// Q4_K plus a fifth bit per element: bit `j` of `qh[l]` belongs to element `l` of sub-block `j`.
fn dequantize_q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for j in 0..8 {
        let (sc, m) = k_scale_min(scales, j);
        let scale = d * sc as f32;
        let min = dmin * m as f32;
        let chunk = &qs[(j / 2) * 32..(j / 2) * 32 + 32];
        let shift = 4 * (j % 2);
        for l in 0..32 {
            let q = ((chunk[l] >> shift) & 0x0F) | (((qh[l] >> j) & 1) << 4);
            y[j * 32 + l] = scale * q as f32 - min;
        }
    }
}

/// 256 elements as two halves of 128: 4 low bits from `ql`, 2 high bits from `qh`, an i8 scale per 16.
fn dequantize_q6_k(b: &[u8], y: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = f16_at(b, 208);
    for half in 0..2 {
        for s in 0..4 {
            for l in 0..32 {
                let lo = (ql[64 * half + 32 * (s % 2) + l] >> (4 * (s / 2))) & 0x0F;
                let hi = (qh[32 * half + l] >> (2 * s)) & 0x03;
                let q = (lo | (hi << 4)) as i32 - 32;
                let e = 128 * half + 32 * s + l;
                let scale = d * scales[e / 16] as i8 as f32;
                y[e] = scale * q as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records of (type id, block bytes, expected f32) written by `tools/quant_goldens.py`.
    const GOLDENS: &[u8] = include_bytes!("../tests/data/quant_goldens.bin");

    fn read_u32(data: &[u8], at: &mut usize) -> u32 {
        let v = u32::from_le_bytes(data[*at..*at + 4].try_into().unwrap());
        *at += 4;
        v
    }

    fn goldens() -> Vec<(GgmlType, Vec<u8>, Vec<f32>)> {
        let mut at = 0;
        let mut records = Vec::new();
        while at < GOLDENS.len() {
            let ty = GgmlType::from_id(read_u32(GOLDENS, &mut at)).unwrap();
            let num_bytes = read_u32(GOLDENS, &mut at) as usize;
            let num_elements = read_u32(GOLDENS, &mut at) as usize;
            let bytes = GOLDENS[at..at + num_bytes].to_vec();
            at += num_bytes;
            let expected = GOLDENS[at..at + 4 * num_elements]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            at += 4 * num_elements;
            records.push((ty, bytes, expected));
        }
        records
    }

    #[test]
    fn test_dequantize_matches_reference_bit_exact() {
        let records = goldens();
        let mut seen = Vec::new();
        for (ty, bytes, expected) in records {
            assert_eq!(row_bytes(ty, expected.len()), Some(bytes.len()), "{ty:?}");
            let mut out = vec![f32::NAN; expected.len()];
            dequantize(ty, &bytes, &mut out);
            for (i, (got, want)) in out.iter().zip(&expected).enumerate() {
                assert_eq!(got.to_bits(), want.to_bits(), "{ty:?} element {i}: {got} vs {want}");
            }
            seen.push(ty);
        }
        for id in [0, 1, 2, 3, 8, 12, 13, 14, 30] {
            let ty = GgmlType::from_id(id).unwrap();
            assert!(seen.contains(&ty), "no golden for {ty:?}");
        }
    }

    #[test]
    fn test_type_ids_round_trip() {
        for id in 0..64 {
            if let Some(ty) = GgmlType::from_id(id) {
                assert_eq!(ty.id(), id);
            }
        }
        assert_eq!(GgmlType::from_id(6), None);
        assert_eq!(GgmlType::from_id(u32::MAX), None);
    }

    #[test]
    fn test_row_bytes() {
        assert_eq!(row_bytes(GgmlType::Q4_1, 576), Some(18 * 20));
        assert_eq!(row_bytes(GgmlType::Q6K, 512), Some(2 * 210));
        assert_eq!(row_bytes(GgmlType::F16, 3), Some(6));
        assert_eq!(row_bytes(GgmlType::Q4_0, 33), None);
        assert_eq!(row_bytes(GgmlType::Q4K, 128), None);
        assert_eq!(row_bytes(GgmlType::F32, usize::MAX), None);
    }
}

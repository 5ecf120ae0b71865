//! What `dot8`'s scalar and SIMD forms share: the weight formats, a quantized activation row, the lanes a block's
//! products are summed in, and the fixed sums that close a row.

use half::f16;

use crate::quant::GgmlType;

/// Elements per quantized activation block, as in the weight blocks it meets.
pub const BLOCK: usize = 32;
/// Partial-sum lanes per block: each sums 4 neighbouring products, as the dot instructions do.
pub(crate) const LANES: usize = 8;
/// Elements of a K-quant super-block.
pub(crate) const SUPER: usize = 256;

/// One quantized activation row.
#[derive(Clone, Copy)]
pub(crate) struct Row<'a> {
    pub biased: &'a [u8],
    pub scales: &'a [f32],
    pub sums: &'a [f32],
}

/// The weight formats with an integer path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    Q4_0,
    Q4_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl Format {
    pub(crate) fn of(ty: GgmlType) -> Option<Format> {
        match ty {
            GgmlType::Q4_0 => Some(Format::Q4_0),
            GgmlType::Q4_1 => Some(Format::Q4_1),
            GgmlType::Q8_0 => Some(Format::Q8_0),
            GgmlType::Q4K => Some(Format::Q4K),
            GgmlType::Q5K => Some(Format::Q5K),
            GgmlType::Q6K => Some(Format::Q6K),
            _ => None,
        }
    }

    /// Bytes of one stored block of `unit_len` elements.
    pub(crate) fn unit_bytes(self) -> usize {
        match self {
            Format::Q4_0 => 18,
            Format::Q4_1 => 20,
            Format::Q8_0 => 34,
            Format::Q4K => 144,
            Format::Q5K => 176,
            Format::Q6K => 210,
        }
    }

    /// Elements of one stored block: 32, or a K-quant's super-block of 256.
    pub(crate) fn unit_len(self) -> usize {
        if self.is_k() {
            SUPER
        } else {
            BLOCK
        }
    }

    pub(crate) fn is_k(self) -> bool {
        matches!(self, Format::Q4K | Format::Q5K | Format::Q6K)
    }

    /// Whether blocks carry a minimum, whose share meets the activations' block sums.
    pub(crate) fn has_mins(self) -> bool {
        matches!(self, Format::Q4_1 | Format::Q4K | Format::Q5K)
    }

    /// Where the bytes of 32-element block `b` of a row begin, near enough to prefetch by.
    pub(crate) fn byte_of(self, b: usize) -> usize {
        b * self.unit_bytes() * BLOCK / self.unit_len()
    }
}

pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// The fixed sum of the 16 lanes: lane l with lane l + 8, then the tree of `simd`'s 8-lane sum.
pub(crate) fn reduce16(a: &[f32; 2 * LANES]) -> f32 {
    let s: [f32; LANES] = std::array::from_fn(|l| a[l] + a[l + LANES]);
    ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]))
}

/// The lanes' sum plus, where blocks have minimums, the minimums' share.
pub(crate) fn finish(fmt: Format, lanes: f32, mins: f32) -> f32 {
    if fmt.has_mins() {
        lanes + mins
    } else {
        lanes
    }
}

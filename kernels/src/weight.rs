//! A weight matrix, kept in the format it was loaded in.

use std::ops::{Deref, Range};
use std::sync::Arc;

use crate::quant::{dequantize, GgmlType};

/// A row-major matrix of `rows` x `cols`; quantized rows are whole blocks.
#[derive(Clone, Debug)]
pub enum Weight {
    F32 { rows: usize, cols: usize, data: Vec<f32> },
    Quant { ty: GgmlType, rows: usize, cols: usize, data: QuantBytes },
}

/// A buffer that several weights may share, such as a memory-mapped file.
pub type SharedBuffer = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A quantized weight's bytes: its own, or a range of a shared buffer, whose pages a mapped file reads from disk
/// only when a kernel first touches them.
#[derive(Clone)]
pub enum QuantBytes {
    Owned(Vec<u8>),
    Shared { buffer: SharedBuffer, range: Range<usize> },
}

impl QuantBytes {
    /// `range` of `buffer`; None where the range runs past its end.
    pub fn shared(buffer: SharedBuffer, range: Range<usize>) -> Option<QuantBytes> {
        let fits = range.start <= range.end && range.end <= (*buffer).as_ref().len();
        fits.then_some(QuantBytes::Shared { buffer, range })
    }
}

impl Deref for QuantBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            QuantBytes::Owned(bytes) => bytes,
            QuantBytes::Shared { buffer, range } => &(**buffer).as_ref()[range.clone()],
        }
    }
}

impl From<Vec<u8>> for QuantBytes {
    fn from(bytes: Vec<u8>) -> Self {
        QuantBytes::Owned(bytes)
    }
}

impl PartialEq<[u8]> for QuantBytes {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<Vec<u8>> for QuantBytes {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

impl std::fmt::Debug for QuantBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if matches!(self, QuantBytes::Owned(_)) { "owned" } else { "shared" };
        write!(f, "{} {kind} bytes", self.len())
    }
}

impl Weight {
    pub fn rows(&self) -> usize {
        match self {
            Weight::F32 { rows, .. } | Weight::Quant { rows, .. } => *rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Weight::F32 { cols, .. } | Weight::Quant { cols, .. } => *cols,
        }
    }

    /// Bytes held by the weight.
    pub fn num_bytes(&self) -> usize {
        match self {
            Weight::F32 { data, .. } => data.len() * 4,
            Weight::Quant { data, .. } => data.len(),
        }
    }

    /// Copies row `r` out as f32.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        match self {
            Weight::F32 { cols, data, .. } => out.copy_from_slice(&data[r * cols..(r + 1) * cols]),
            Weight::Quant { ty, cols, data, .. } => {
                let row_bytes = cols / ty.block_len() * ty.block_bytes();
                dequantize(*ty, &data[r * row_bytes..(r + 1) * row_bytes], out);
            }
        }
    }

    /// The whole matrix as f32, row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows() * self.cols()];
        for (r, row) in out.chunks_mut(self.cols()).enumerate() {
            self.row_f32(r, row);
        }
        out
    }
}

impl Weight {
    /// The weight made of these rows, in this order, in the weight's own format.
    pub fn select_rows(&self, picks: &[usize]) -> Weight {
        let (rows, cols) = (picks.len(), self.cols());
        match self {
            Weight::F32 { data, .. } => Weight::F32 {
                rows,
                cols,
                data: picks.iter().flat_map(|&r| &data[r * cols..(r + 1) * cols]).copied().collect(),
            },
            Weight::Quant { ty, data, .. } => {
                let n = cols / ty.block_len() * ty.block_bytes();
                let bytes: Vec<u8> = picks.iter().flat_map(|&r| &data[r * n..(r + 1) * n]).copied().collect();
                Weight::Quant { ty: *ty, rows, cols, data: QuantBytes::Owned(bytes) }
            }
        }
    }
}

/// Stacks the rows of several weights of equal width; mixed formats fall back to f32.
pub fn concat_rows(parts: &[Weight]) -> Weight {
    let cols = parts[0].cols();
    assert!(parts.iter().all(|w| w.cols() == cols), "concat_rows: widths differ");
    let rows = parts.iter().map(Weight::rows).sum();
    let first_ty = match &parts[0] {
        Weight::Quant { ty, .. } => Some(*ty),
        Weight::F32 { .. } => None,
    };
    let same_quant = parts.iter().all(|w| matches!(w, Weight::Quant { ty, .. } if Some(*ty) == first_ty));
    match first_ty {
        Some(ty) if same_quant => {
            let data = parts.iter().flat_map(|w| match w {
                Weight::Quant { data, .. } => data.iter().copied(),
                Weight::F32 { .. } => unreachable!(),
            });
            Weight::Quant { ty, rows, cols, data: QuantBytes::Owned(data.collect()) }
        }
        _ => Weight::F32 { rows, cols, data: parts.iter().flat_map(|w| w.to_f32()).collect() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_selected_rows_are_the_rows_in_that_order_in_the_same_format() {
        let data: Vec<f32> = (0..3 * 32).map(|i| i as f32 / 7.0).collect();
        let f32 = Weight::F32 { rows: 3, cols: 32, data: data.clone() };
        let picked = f32.select_rows(&[2, 0]);
        assert_eq!(picked.to_f32(), [&data[64..96], &data[..32]].concat());
        // Q8_0: a block of 32 is a 2-byte scale and 32 bytes; each row here is one block, its bytes its number.
        let bytes: Vec<u8> = (0..3u8).flat_map(|r| std::iter::repeat_n(r, 34)).collect();
        let q = Weight::Quant { ty: GgmlType::Q8_0, rows: 3, cols: 32, data: QuantBytes::Owned(bytes) };
        let Weight::Quant { ty, rows, data, .. } = q.select_rows(&[1, 2, 1]) else { panic!("not quantized") };
        assert_eq!((ty, rows), (GgmlType::Q8_0, 3));
        assert_eq!(&*data, [[1u8; 34], [2; 34], [1; 34]].concat().as_slice());
    }
}

//! The codec's tensors from a memory-mapped `model.safetensors`, checked by name, shape and dtype.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, TensorInfo};
use safetensors::{SafeTensorError, SafeTensors};

use crate::error::CodecError;

/// A mapped safetensors file whose header has been parsed.
pub(crate) struct Tensors {
    path: PathBuf,
    mmap: Mmap,
    data_start: usize,
    by_name: HashMap<String, TensorInfo>,
}

impl Tensors {
    pub(crate) fn open(path: &Path) -> Result<Self, CodecError> {
        let file = File::open(path).map_err(|source| CodecError::Io { path: path.into(), source })?;
        // SAFETY: checkpoint files are treated as read-only while the process runs.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|source| CodecError::Io { path: path.into(), source })?;
        let (header_len, metadata) = SafeTensors::read_metadata(&mmap)
            .map_err(|err| CodecError::Format { path: path.into(), fault: describe(&err) })?;
        let by_name = metadata.tensors().into_iter().map(|(name, info)| (name, info.clone())).collect();
        Ok(Self { path: path.into(), mmap, data_start: 8 + header_len, by_name })
    }

    fn fault(&self, name: &str, fault: String) -> CodecError {
        CodecError::Tensor { path: self.path.clone(), name: name.into(), fault }
    }

    pub(crate) fn contains(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// The tensor `name` as f32, which must have exactly `shape`.
    pub(crate) fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, CodecError> {
        let info = self
            .by_name
            .get(name)
            .ok_or_else(|| CodecError::MissingTensor { path: self.path.clone(), name: name.into() })?;
        if info.shape != shape {
            return Err(self.fault(name, format!("shape {:?}, expected {shape:?}", info.shape)));
        }
        // read_metadata checked that the offsets lie inside the file.
        let (start, end) = info.data_offsets;
        let bytes = &self.mmap[self.data_start + start..self.data_start + end];
        let values = match info.dtype {
            Dtype::F32 => decode(bytes, f32::from_le_bytes),
            Dtype::F16 => decode(bytes, |b| half::f16::from_le_bytes(b).to_f32()),
            Dtype::BF16 => decode(bytes, |b| half::bf16::from_le_bytes(b).to_f32()),
            other => return Err(self.fault(name, format!("dtype {other:?}, expected F32, F16 or BF16"))),
        };
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(self.fault(name, format!("element {i} is {}", values[i])));
        }
        Ok(values)
    }

    /// A convolution weight of `shape` (dim 0 first), folding weight normalisation over dim 0.
    pub(crate) fn conv_weight(&self, prefix: &str, shape: &[usize]) -> Result<Vec<f32>, CodecError> {
        let g_shape: Vec<usize> = std::iter::once(shape[0]).chain(shape[1..].iter().map(|_| 1)).collect();
        for (g_name, v_name) in
            [("parametrizations.weight.original0", "parametrizations.weight.original1"), ("weight_g", "weight_v")]
        {
            let (g_name, v_name) = (format!("{prefix}.{g_name}"), format!("{prefix}.{v_name}"));
            if self.contains(&v_name) {
                let (g, v) = (self.get(&g_name, &g_shape)?, self.get(&v_name, shape)?);
                return fold_weight_norm(&g, v).map_err(|row| self.fault(&v_name, format!("row {row} has zero norm")));
            }
        }
        let plain = format!("{prefix}.weight");
        if self.contains(&plain) {
            return self.get(&plain, shape);
        }
        Err(CodecError::MissingTensor {
            path: self.path.clone(),
            name: format!("{prefix}.parametrizations.weight.original1 (or {prefix}.weight_v, {prefix}.weight)"),
        })
    }
}

/// `w = g · v / ‖v‖` per slice along dim 0, as `torch._weight_norm(v, g, 0)`; Err names a zero-norm slice.
pub(crate) fn fold_weight_norm(g: &[f32], mut v: Vec<f32>) -> Result<Vec<f32>, usize> {
    let len = v.len() / g.len();
    for (row, (slice, g)) in v.chunks_exact_mut(len).zip(g).enumerate() {
        let norm = slice.iter().map(|x| (*x as f64) * (*x as f64)).sum::<f64>().sqrt() as f32;
        if norm == 0.0 {
            return Err(row);
        }
        let scale = g / norm;
        slice.iter_mut().for_each(|x| *x *= scale);
    }
    Ok(v)
}

/// Little-endian elements of `N` bytes to f32; the mapped bytes need not be aligned.
fn decode<const N: usize>(bytes: &[u8], to_f32: fn([u8; N]) -> f32) -> Vec<f32> {
    bytes.chunks_exact(N).map(|chunk| to_f32(std::array::from_fn(|i| chunk[i]))).collect()
}

fn describe(err: &SafeTensorError) -> String {
    match err {
        SafeTensorError::HeaderTooSmall => "not safetensors: shorter than its 8-byte header length".into(),
        SafeTensorError::InvalidHeaderLength => "not safetensors: header runs past the end of the file".into(),
        SafeTensorError::MetadataIncompleteBuffer => "truncated: tensor data does not end where the file ends".into(),
        other => format!("bad safetensors header: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_weight_norm_fold_scales_each_output_slice_to_its_gain() {
        let v = vec![3.0, 4.0, 0.0, 0.0, 1.0, 0.0];
        let w = fold_weight_norm(&[10.0, 2.0], v).unwrap();
        assert_eq!(w, vec![6.0, 8.0, 0.0, 0.0, 2.0, 0.0]);
        assert_eq!(fold_weight_norm(&[1.0, 1.0], vec![1.0, 0.0, 0.0, 0.0]), Err(1));
    }
}

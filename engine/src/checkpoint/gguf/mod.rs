//! GGUF v2/v3 files, memory-mapped: header, metadata, tensor infos and tensor data.

mod read;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod write;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tensorfold_kernels::quant::row_bytes;
use tensorfold_kernels::{GgmlType, QuantBytes};

use crate::error::LoadError;

/// A metadata value of any GGUF value type.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// Any integer type as u64 (negative values give `None`).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer or float type as f64.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v as f64),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }
}

/// Where one tensor lives in the file.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions as GGUF lists them: the first is the fastest-varying (columns).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset from the start of the data section.
    pub offset: u64,
}

impl TensorInfo {
    /// Elements in the tensor; `None` when the count overflows.
    pub fn num_elements(&self) -> Option<usize> {
        self.dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
    }

    /// Bytes of the tensor's data; `None` when the first dim is not whole blocks or the size overflows.
    pub fn num_bytes(&self) -> Option<usize> {
        let cols = usize::try_from(self.dims.first().copied().unwrap_or(1)).ok()?;
        let rows = self.num_elements()?.checked_div(cols).unwrap_or(0);
        row_bytes(self.ty, cols)?.checked_mul(rows)
    }
}

/// What [`parse`] reads from the front of a GGUF file.
#[derive(Clone, Debug)]
pub struct ParsedGguf {
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    /// Every tensor's type, size and data range already checked against the file.
    pub tensors: Vec<TensorInfo>,
    /// Where the data section starts: the end of the tensor infos, aligned.
    pub data_offset: usize,
}

/// Parses a whole GGUF file; never panics, nor allocates more than `bytes` can justify; `path` names errors.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<ParsedGguf, LoadError> {
    read::parse(path, bytes)
}

/// A parsed GGUF file whose tensor data stays memory-mapped.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    mmap: Arc<memmap2::Mmap>,
    data_offset: usize,
    by_name: HashMap<String, usize>,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<GgufFile, LoadError> {
        let io = |source| LoadError::Io { path: path.into(), source };
        let file = File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; a file truncated under us is outside what a loader can guard.
        let mmap = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let parsed = parse(path, &mmap)?;
        let by_name = parsed.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(GgufFile {
            path: path.into(),
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            mmap: Arc::new(mmap),
            data_offset: parsed.data_offset,
            by_name,
        })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// The tensor of this GGUF name.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor's data; empty for an info whose range is not inside this file.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> &[u8] {
        let range = usize::try_from(info.offset).ok().and_then(|offset| {
            let start = self.data_offset.checked_add(offset)?;
            Some(start..start.checked_add(info.num_bytes()?)?)
        });
        range.and_then(|r| self.mmap.get(r)).unwrap_or(&[])
    }

    /// `part` of a tensor's bytes, still mapped, so no page of it is read before a kernel needs it.
    pub fn tensor_shared(&self, info: &TensorInfo, part: std::ops::Range<usize>) -> Option<QuantBytes> {
        let start = self.data_offset.checked_add(usize::try_from(info.offset).ok()?)?;
        if part.end > info.num_bytes()? {
            return None;
        }
        QuantBytes::shared(self.mmap.clone(), start + part.start..start + part.end)
    }
}

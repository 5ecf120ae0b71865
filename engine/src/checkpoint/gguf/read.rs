//! The GGUF byte layout, read from a slice with every length and count checked against the bytes left.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;

use tensorfold_kernels::GgmlType;

use super::{ParsedGguf, TensorInfo, Value};
use crate::error::LoadError;

pub(super) const MAGIC: &[u8; 4] = b"GGUF";
pub(super) const DEFAULT_ALIGNMENT: u64 = 32;
/// GGML tensors have at most four dimensions.
const MAX_DIMS: u32 = 4;
/// Deeper nesting than this is corruption, and unbounded recursion would overflow the stack.
const MAX_ARRAY_DEPTH: u32 = 8;
/// Smallest encoding of one tensor info: name length, dim count, type and offset.
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 4 + 8;
/// Smallest encoding of one key/value pair: key length, value type and a one-byte value.
const MIN_KV_BYTES: usize = 8 + 4 + 1;

/// GGUF metadata value type ids.
pub(super) mod value_type {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// Bytes the smallest value of a type takes; `None` for an unknown type.
fn min_value_bytes(ty: u32) -> Option<usize> {
    use value_type::*;
    Some(match ty {
        U8 | I8 | BOOL => 1,
        U16 | I16 => 2,
        U32 | I32 | F32 => 4,
        U64 | I64 | F64 | STRING => 8,
        ARRAY => 4 + 8,
        _ => return None,
    })
}

struct Reader<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn fault(&self, fault: String) -> LoadError {
        LoadError::format(self.path, fault)
    }

    fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8], LoadError> {
        let end = self.pos.checked_add(n).filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            return Err(self.fault(format!(
                "truncated: {} needs {n} bytes at offset {}, the file has {}",
                what(),
                self.pos,
                self.bytes.len()
            )));
        };
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], LoadError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, LoadError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, LoadError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count of items each at least `min_bytes` long, refused when the rest of the file cannot hold it.
    fn count(&mut self, min_bytes: usize, what: &dyn Fn() -> String) -> Result<usize, LoadError> {
        let at = self.pos;
        let count = self.u64(what)?;
        let fits =
            usize::try_from(count).ok().filter(|&n| n.checked_mul(min_bytes).is_some_and(|b| b <= self.remaining()));
        fits.ok_or_else(|| {
            self.fault(format!(
                "truncated or corrupt: {} of {count} at offset {at} cannot fit in the {} bytes left",
                what(),
                self.remaining()
            ))
        })
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, LoadError> {
        let len = self.count(1, &|| format!("length of {}", what()))?;
        let at = self.pos;
        let raw = self.take(len, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| self.fault(format!("{} at offset {at} is not valid UTF-8", what())))
    }

    fn value(&mut self, ty: u32, key: &str, depth: u32) -> Result<Value, LoadError> {
        use value_type::*;
        let what = || format!("value of {key}");
        Ok(match ty {
            U8 => Value::U8(self.array::<1>(&what)?[0]),
            I8 => Value::I8(i8::from_le_bytes(self.array(&what)?)),
            U16 => Value::U16(u16::from_le_bytes(self.array(&what)?)),
            I16 => Value::I16(i16::from_le_bytes(self.array(&what)?)),
            U32 => Value::U32(self.u32(&what)?),
            I32 => Value::I32(i32::from_le_bytes(self.array(&what)?)),
            F32 => Value::F32(f32::from_le_bytes(self.array(&what)?)),
            BOOL => Value::Bool(self.array::<1>(&what)?[0] != 0),
            STRING => Value::String(self.string(&what)?),
            ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.fault(format!("{key}: arrays nested deeper than {MAX_ARRAY_DEPTH}")));
                }
                let elem_ty = self.u32(&|| format!("element type of {key}"))?;
                let Some(min_bytes) = min_value_bytes(elem_ty) else {
                    return Err(self.fault(format!("{key}: unknown array element type {elem_ty}")));
                };
                let len = self.count(min_bytes, &|| format!("array {key}"))?;
                let mut items = Vec::with_capacity(len);
                for _ in 0..len {
                    items.push(self.value(elem_ty, key, depth + 1)?);
                }
                Value::Array(items)
            }
            U64 => Value::U64(self.u64(&what)?),
            I64 => Value::I64(i64::from_le_bytes(self.array(&what)?)),
            F64 => Value::F64(f64::from_le_bytes(self.array(&what)?)),
            _ => return Err(self.fault(format!("{key}: unknown value type {ty}"))),
        })
    }

    fn tensor_info(&mut self) -> Result<(TensorInfo, u32), LoadError> {
        let name = self.string(&|| "tensor name".to_string())?;
        let n_dims = self.u32(&|| format!("dim count of tensor {name}"))?;
        if n_dims > MAX_DIMS {
            return Err(tensor_fault(self.path, &name, format!("{n_dims} dims, at most {MAX_DIMS} are allowed")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(self.u64(&|| format!("dims of tensor {name}"))?);
        }
        let type_id = self.u32(&|| format!("type of tensor {name}"))?;
        let offset = self.u64(&|| format!("offset of tensor {name}"))?;
        // The type is checked by the caller, after the whole header is known to be readable.
        let info = TensorInfo { name, dims, ty: GgmlType::F32, offset };
        Ok((info, type_id))
    }
}

fn tensor_fault(path: &Path, name: &str, fault: String) -> LoadError {
    LoadError::Tensor { path: path.into(), name: name.into(), fault }
}

/// Bytes of a tensor's data: whole blocks along the first dim, times the other dims.
fn tensor_num_bytes(path: &Path, info: &TensorInfo) -> Result<u64, LoadError> {
    let fault = |fault: String| tensor_fault(path, &info.name, fault);
    let dims = &info.dims;
    let num_elements = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    let num_elements = num_elements
        .filter(|&n| usize::try_from(n).is_ok())
        .ok_or_else(|| fault(format!("dims {dims:?} overflow the element count")))?;
    let cols = dims.first().copied().unwrap_or(1);
    let block_len = info.ty.block_len() as u64;
    if cols % block_len != 0 {
        return Err(fault(format!("first dim {cols} is not a multiple of the {:?} block length {block_len}", info.ty)));
    }
    (num_elements / block_len)
        .checked_mul(info.ty.block_bytes() as u64)
        .ok_or_else(|| fault(format!("dims {dims:?} overflow the byte count")))
}

/// Parses the header, metadata and tensor infos of a whole GGUF file held in `bytes`.
pub(super) fn parse(path: &Path, bytes: &[u8]) -> Result<ParsedGguf, LoadError> {
    let mut r = Reader { path, bytes, pos: 0 };
    let magic = r.array::<4>(&|| "magic".to_string())?;
    if &magic != MAGIC {
        return Err(r.fault(format!("not a GGUF file: magic {magic:02x?}, expected \"GGUF\"")));
    }
    let version = r.u32(&|| "version".to_string())?;
    if !(2..=3).contains(&version) {
        let hint = if (2..=3).contains(&version.swap_bytes()) { " (big-endian files are not supported)" } else { "" };
        return Err(r.fault(format!("unsupported GGUF version {version}{hint}; this reader handles versions 2 and 3")));
    }
    let num_tensors = r.count(MIN_TENSOR_INFO_BYTES, &|| "tensor count".to_string())?;
    let num_kvs = r.count(MIN_KV_BYTES, &|| "metadata count".to_string())?;

    let mut metadata = BTreeMap::new();
    for _ in 0..num_kvs {
        let key = r.string(&|| "metadata key".to_string())?;
        let ty = r.u32(&|| format!("value type of {key}"))?;
        let value = r.value(ty, &key, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(r.fault(format!("duplicate metadata key {key}")));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => v
            .as_u64()
            .filter(|a| a.is_power_of_two())
            .ok_or_else(|| r.fault(format!("general.alignment {v:?} is not a power of two")))?,
    };

    let mut tensors = Vec::with_capacity(num_tensors);
    let mut type_ids = Vec::with_capacity(num_tensors);
    for _ in 0..num_tensors {
        let (info, type_id) = r.tensor_info()?;
        tensors.push(info);
        type_ids.push(type_id);
    }
    let data_offset = (r.pos as u64)
        .checked_next_multiple_of(alignment)
        .and_then(|o| usize::try_from(o).ok())
        .ok_or_else(|| r.fault(format!("data section offset overflows with alignment {alignment}")))?;

    let mut names = HashSet::with_capacity(num_tensors);
    for (info, type_id) in tensors.iter_mut().zip(type_ids) {
        let fault = |fault: String| tensor_fault(path, &info.name, fault);
        if !names.insert(info.name.clone()) {
            return Err(fault("appears twice".to_string()));
        }
        info.ty = GgmlType::from_id(type_id).ok_or_else(|| fault(format!("unsupported tensor type id {type_id}")))?;
        let num_bytes = tensor_num_bytes(path, info)?;
        if info.offset % alignment != 0 {
            let offset = info.offset;
            return Err(fault(format!("data offset {offset} is not a multiple of the alignment {alignment}")));
        }
        let end = (data_offset as u64).checked_add(info.offset).and_then(|start| start.checked_add(num_bytes));
        if end.is_none_or(|end| end > bytes.len() as u64) {
            return Err(fault(format!(
                "data of {num_bytes} bytes at data offset {} runs past the end of the file ({} bytes)",
                info.offset,
                bytes.len()
            )));
        }
    }
    Ok(ParsedGguf { version, metadata, tensors, data_offset })
}

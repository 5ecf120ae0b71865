//! A minimal GGUF writer for tests: it writes whatever it is given, valid or not.

use tensorfold_kernels::GgmlType;

use super::read::{value_type, DEFAULT_ALIGNMENT, MAGIC};
use super::Value;

pub(crate) struct TestTensor {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
}

/// A GGUF file under construction; `general.alignment` among the metadata sets the padding.
pub(crate) struct GgufWriter {
    pub version: u32,
    pub kvs: Vec<(String, Value)>,
    pub tensors: Vec<TestTensor>,
}

/// The bytes written, and where the fields a fuzzer wants to corrupt lie.
pub(crate) struct Written {
    pub bytes: Vec<u8>,
    /// Offsets of every u64 count or length: tensor and metadata counts, string and array lengths, dims.
    pub count_fields: Vec<usize>,
    /// Offsets of every u32 type id: value types, array element types, tensor types.
    pub type_fields: Vec<usize>,
}

pub(crate) fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

impl GgufWriter {
    pub fn new() -> Self {
        GgufWriter { version: 3, kvs: Vec::new(), tensors: Vec::new() }
    }

    pub fn kv(mut self, key: &str, value: Value) -> Self {
        self.kvs.push((key.into(), value));
        self
    }

    pub fn tensor(self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> Self {
        self.raw_tensor(name, dims, ty.id(), data)
    }

    pub fn raw_tensor(mut self, name: &str, dims: &[u64], type_id: u32, data: Vec<u8>) -> Self {
        self.tensors.push(TestTensor { name: name.into(), dims: dims.to_vec(), type_id, data });
        self
    }

    pub fn write(&self) -> Written {
        let mut w = Written { bytes: Vec::new(), count_fields: Vec::new(), type_fields: Vec::new() };
        w.bytes.extend_from_slice(MAGIC);
        w.bytes.extend_from_slice(&self.version.to_le_bytes());
        w.count(self.tensors.len() as u64);
        w.count(self.kvs.len() as u64);
        for (key, value) in &self.kvs {
            w.string(key);
            w.type_id(type_of(value));
            w.value(value);
        }
        let alignment = self
            .kvs
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT) as usize;
        let mut offset = 0;
        for t in &self.tensors {
            w.string(&t.name);
            w.bytes.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for &d in &t.dims {
                w.count(d);
            }
            w.type_id(t.type_id);
            w.bytes.extend_from_slice(&(offset as u64).to_le_bytes());
            offset = (offset + t.data.len()).next_multiple_of(alignment);
        }
        for t in &self.tensors {
            w.bytes.resize(w.bytes.len().next_multiple_of(alignment), 0);
            w.bytes.extend_from_slice(&t.data);
        }
        w
    }
}

fn type_of(value: &Value) -> u32 {
    use value_type::*;
    match value {
        Value::U8(_) => U8,
        Value::I8(_) => I8,
        Value::U16(_) => U16,
        Value::I16(_) => I16,
        Value::U32(_) => U32,
        Value::I32(_) => I32,
        Value::U64(_) => U64,
        Value::I64(_) => I64,
        Value::F32(_) => F32,
        Value::F64(_) => F64,
        Value::Bool(_) => BOOL,
        Value::String(_) => STRING,
        Value::Array(_) => ARRAY,
    }
}

impl Written {
    fn count(&mut self, n: u64) {
        self.count_fields.push(self.bytes.len());
        self.bytes.extend_from_slice(&n.to_le_bytes());
    }

    fn type_id(&mut self, ty: u32) {
        self.type_fields.push(self.bytes.len());
        self.bytes.extend_from_slice(&ty.to_le_bytes());
    }

    fn string(&mut self, s: &str) {
        self.count(s.len() as u64);
        self.bytes.extend_from_slice(s.as_bytes());
    }

    fn value(&mut self, value: &Value) {
        let b = &mut self.bytes;
        match value {
            Value::U8(v) => b.extend_from_slice(&v.to_le_bytes()),
            Value::I8(v) => b.extend_from_slice(&v.to_le_bytes()),
            Value::U16(v) => b.extend_from_slice(&v.to_le_bytes()),
            Value::I16(v) => b.extend_from_slice(&v.to_le_bytes()),
            Value::U32(v) => b.extend_from_slice(&v.to_le_bytes()),
            Value::I32(v) => b.extend_from_slice(&v.to_le_bytes()),
            Value::U64(v) => b.extend_from_slice(&v.to_le_bytes()),
            Value::I64(v) => b.extend_from_slice(&v.to_le_bytes()),
            Value::F32(v) => b.extend_from_slice(&v.to_le_bytes()),
            Value::F64(v) => b.extend_from_slice(&v.to_le_bytes()),
            Value::Bool(v) => b.push(u8::from(*v)),
            Value::String(s) => self.string(s),
            Value::Array(items) => {
                // An empty array's element type is lost in `Value`; any type reads back the same.
                self.type_id(items.first().map_or(value_type::U8, type_of));
                self.count(items.len() as u64);
                for item in items {
                    self.value(item);
                }
            }
        }
    }
}

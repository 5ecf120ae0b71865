//! A reader for ONNX model files: the graph's nodes, attributes and initializers, decoded from protobuf.

mod wire;

use std::path::{Path, PathBuf};

use wire::{Field, Reader, WireError};

/// ONNX element types this reader decodes.
pub mod dtype {
    pub const FLOAT: i32 = 1;
    pub const UINT8: i32 = 2;
    pub const INT8: i32 = 3;
    pub const INT32: i32 = 6;
    pub const INT64: i32 = 7;
    pub const BOOL: i32 = 9;
}

#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: not a valid ONNX file: {fault}", path.display())]
    Format { path: PathBuf, fault: String },
    #[error("tensor {name}: {fault}")]
    Tensor { name: String, fault: String },
}

/// A tensor as stored: its dims, element type and little-endian bytes (or typed values, widened).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub dims: Vec<i64>,
    pub data_type: i32,
    raw: Vec<u8>,
    floats: Vec<f32>,
    ints: Vec<i64>,
}

impl Tensor {
    pub fn num_elements(&self) -> usize {
        self.dims.iter().map(|d| (*d).max(0) as usize).product()
    }

    fn fault(&self, fault: impl Into<String>) -> OnnxError {
        OnnxError::Tensor { name: self.name.clone(), fault: fault.into() }
    }

    /// Raw bytes split into `N`-byte elements, checked against the dims.
    fn raw_elements<const N: usize>(&self) -> Result<impl Iterator<Item = [u8; N]> + '_, OnnxError> {
        if self.raw.len() != self.num_elements() * N {
            let want = self.num_elements() * N;
            return Err(self.fault(format!("holds {} bytes; dims {:?} need {want}", self.raw.len(), self.dims)));
        }
        Ok(self.raw.chunks_exact(N).map(|c| c.try_into().expect("chunks are N bytes")))
    }

    fn typed<T>(&self, values: Vec<T>) -> Result<Vec<T>, OnnxError> {
        match values.len() == self.num_elements() {
            true => Ok(values),
            false => Err(self.fault(format!("holds {} values; dims {:?} need more or fewer", values.len(), self.dims))),
        }
    }

    /// The values as f32; only FLOAT tensors.
    pub fn to_f32(&self) -> Result<Vec<f32>, OnnxError> {
        if self.data_type != dtype::FLOAT {
            return Err(self.fault(format!("element type {} is not FLOAT", self.data_type)));
        }
        match self.raw.is_empty() && self.num_elements() > 0 {
            true => self.typed(self.floats.clone()),
            false => Ok(self.raw_elements::<4>()?.map(f32::from_le_bytes).collect()),
        }
    }

    /// The values of an integer or boolean tensor, widened to i64.
    pub fn to_i64(&self) -> Result<Vec<i64>, OnnxError> {
        if !self.raw.is_empty() || self.num_elements() == 0 {
            return Ok(match self.data_type {
                dtype::INT64 => self.raw_elements::<8>()?.map(i64::from_le_bytes).collect(),
                dtype::INT32 => self.raw_elements::<4>()?.map(|b| i32::from_le_bytes(b) as i64).collect(),
                dtype::INT8 => self.raw_elements::<1>()?.map(|b| b[0] as i8 as i64).collect(),
                dtype::UINT8 | dtype::BOOL => self.raw_elements::<1>()?.map(|b| b[0] as i64).collect(),
                other => return Err(self.fault(format!("element type {other} is not an integer type"))),
            });
        }
        match self.data_type {
            dtype::INT64 | dtype::INT32 | dtype::INT8 | dtype::UINT8 | dtype::BOOL => self.typed(self.ints.clone()),
            other => Err(self.fault(format!("element type {other} is not an integer type"))),
        }
    }

    fn parse(bytes: &[u8]) -> Result<Tensor, WireError> {
        let mut t = Tensor::default();
        let mut r = Reader::new(bytes);
        while let Some((number, field)) = r.next_field()? {
            match (number, field) {
                (1, f) => f.push_ints(&mut t.dims)?,
                (2, Field::Varint(v)) => t.data_type = v as i32,
                (4, f) => f.push_floats(&mut t.floats)?,
                (5 | 7, f) => f.push_ints(&mut t.ints)?,
                (8, Field::Bytes(b)) => t.name = wire::string(b)?,
                (9, Field::Bytes(b)) => t.raw = b.to_vec(),
                (13, Field::Bytes(_)) => return Err(WireError("external tensor data is not supported".into())),
                _ => {}
            }
        }
        Ok(t)
    }
}

/// A node attribute's value; kinds the models here do not use are kept as `Other`.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    Float(f32),
    Int(i64),
    String(Vec<u8>),
    Tensor(Tensor),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    Other,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub op_type: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub attributes: Vec<(String, AttrValue)>,
}

impl Node {
    pub fn attr(&self, name: &str) -> Option<&AttrValue> {
        self.attributes.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    fn parse(bytes: &[u8]) -> Result<Node, WireError> {
        let mut node = Node {
            name: String::new(),
            op_type: String::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            attributes: Vec::new(),
        };
        let mut r = Reader::new(bytes);
        while let Some((number, field)) = r.next_field()? {
            match (number, field) {
                (1, Field::Bytes(b)) => node.inputs.push(wire::string(b)?),
                (2, Field::Bytes(b)) => node.outputs.push(wire::string(b)?),
                (3, Field::Bytes(b)) => node.name = wire::string(b)?,
                (4, Field::Bytes(b)) => node.op_type = wire::string(b)?,
                (5, Field::Bytes(b)) => node.attributes.push(parse_attribute(b)?),
                _ => {}
            }
        }
        Ok(node)
    }
}

fn parse_attribute(bytes: &[u8]) -> Result<(String, AttrValue), WireError> {
    let (mut name, mut value, mut floats, mut ints) = (String::new(), None, Vec::new(), Vec::new());
    let mut r = Reader::new(bytes);
    while let Some((number, field)) = r.next_field()? {
        match (number, field) {
            (1, Field::Bytes(b)) => name = wire::string(b)?,
            (2, Field::Fixed32(v)) => value = Some(AttrValue::Float(f32::from_bits(v))),
            (3, Field::Varint(v)) => value = Some(AttrValue::Int(v as i64)),
            (4, Field::Bytes(b)) => value = Some(AttrValue::String(b.to_vec())),
            (5, Field::Bytes(b)) => value = Some(AttrValue::Tensor(Tensor::parse(b)?)),
            (7, f) => f.push_floats(&mut floats)?,
            (8, f) => f.push_ints(&mut ints)?,
            _ => {}
        }
    }
    let value = match value {
        Some(v) => v,
        None if !floats.is_empty() => AttrValue::Floats(floats),
        None if !ints.is_empty() => AttrValue::Ints(ints),
        None => AttrValue::Other,
    };
    Ok((name, value))
}

/// The graph of an ONNX model: nodes in file order (ONNX requires topological order) and named tensors.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    pub nodes: Vec<Node>,
    pub initializers: Vec<Tensor>,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
}

impl Graph {
    pub fn initializer(&self, name: &str) -> Option<&Tensor> {
        self.initializers.iter().find(|t| t.name == name)
    }

    fn parse(bytes: &[u8]) -> Result<Graph, WireError> {
        let mut g = Graph::default();
        let mut r = Reader::new(bytes);
        while let Some((number, field)) = r.next_field()? {
            match (number, field) {
                (1, Field::Bytes(b)) => g.nodes.push(Node::parse(b)?),
                (5, Field::Bytes(b)) => g.initializers.push(Tensor::parse(b)?),
                (11, Field::Bytes(b)) => g.inputs.push(value_info_name(b)?),
                (12, Field::Bytes(b)) => g.outputs.push(value_info_name(b)?),
                (15, Field::Bytes(_)) => return Err(WireError("sparse initializers are not supported".into())),
                _ => {}
            }
        }
        Ok(g)
    }
}

fn value_info_name(bytes: &[u8]) -> Result<String, WireError> {
    let mut r = Reader::new(bytes);
    while let Some((number, field)) = r.next_field()? {
        if let (1, Field::Bytes(b)) = (number, field) {
            return wire::string(b);
        }
    }
    Ok(String::new())
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct OnnxModel {
    /// (domain, version) of each operator set the model imports; "" is the default domain.
    pub opsets: Vec<(String, i64)>,
    pub graph: Graph,
}

impl OnnxModel {
    pub fn open(path: &Path) -> Result<OnnxModel, OnnxError> {
        let bytes = std::fs::read(path).map_err(|source| OnnxError::Io { path: path.into(), source })?;
        OnnxModel::parse(&bytes).map_err(|e| OnnxError::Format { path: path.into(), fault: e.0 })
    }

    fn parse(bytes: &[u8]) -> Result<OnnxModel, WireError> {
        let (mut model, mut graph) = (OnnxModel::default(), None);
        let mut r = Reader::new(bytes);
        while let Some((number, field)) = r.next_field()? {
            match (number, field) {
                (7, Field::Bytes(b)) => graph = Some(Graph::parse(b)?),
                (8, Field::Bytes(b)) => model.opsets.push(parse_opset(b)?),
                _ => {}
            }
        }
        model.graph = graph.ok_or_else(|| WireError("no graph".into()))?;
        Ok(model)
    }
}

fn parse_opset(bytes: &[u8]) -> Result<(String, i64), WireError> {
    let (mut domain, mut version) = (String::new(), 0);
    let mut r = Reader::new(bytes);
    while let Some((number, field)) = r.next_field()? {
        match (number, field) {
            (1, Field::Bytes(b)) => domain = wire::string(b)?,
            (2, Field::Varint(v)) => version = v as i64,
            _ => {}
        }
    }
    Ok((domain, version))
}

#[cfg(test)]
mod tests;

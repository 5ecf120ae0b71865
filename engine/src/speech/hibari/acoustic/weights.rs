//! The network's weights, read from hibari.onnx by initializer name; int8 weights are dequantized at load.
//!
//! The graph keeps each pointwise weight as an int8 initializer `…_quantized` with one f32 scale and
//! zero point 0, used through DynamicQuantizeLinear → MatMulInteger → Cast → Mul(activation scale ·
//! weight scale) → Add(bias). The chain is followed from each MatMulInteger to find the weight's scale
//! and the bias it feeds, and the weight is then known by that bias's name (its checkpoint key).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tensorfold_kernels::int8::Int8Matrix;
use tensorfold_kernels::Weight;

use super::AcousticError;
use crate::checkpoint::onnx::{dtype, AttrValue, Graph, Node, OnnxModel, Tensor};

/// An int8 weight `[c_in][c_out]` and its scale.
#[derive(Clone, Debug, PartialEq)]
struct Quantized {
    weight: String,
    scale: f32,
}

pub struct GraphWeights {
    path: PathBuf,
    graph: Graph,
    by_name: HashMap<String, usize>,
    /// Bias initializer name → the int8 weight whose product it is added to.
    quantized: HashMap<String, Quantized>,
}

impl GraphWeights {
    pub fn open(path: &Path) -> Result<Self, AcousticError> {
        let graph = OnnxModel::open(path)?.graph;
        let by_name = graph.initializers.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        let mut w = Self { path: path.into(), graph, by_name, quantized: HashMap::new() };
        w.quantized = w.find_quantized()?;
        Ok(w)
    }

    fn fault(&self, fault: impl Into<String>) -> AcousticError {
        AcousticError::Graph { path: self.path.clone(), fault: fault.into() }
    }

    fn tensor(&self, name: &str) -> Result<&Tensor, AcousticError> {
        let i = self.by_name.get(name).ok_or_else(|| self.fault(format!("no initializer {name}")))?;
        Ok(&self.graph.initializers[*i])
    }

    pub fn has(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// An f32 initializer of `len` values.
    pub fn f32(&self, name: &str, len: usize) -> Result<Vec<f32>, AcousticError> {
        let values = self.tensor(name)?.to_f32()?;
        match values.len() == len {
            true => Ok(values),
            false => Err(self.fault(format!("{name} holds {} values, not {len}", values.len()))),
        }
    }

    /// The int8 weight feeding bias `bias_name` laid out `[c_out][c_in]`, and its scale.
    fn int8(&self, bias_name: &str, c_in: usize, c_out: usize) -> Result<(Vec<i8>, f32), AcousticError> {
        let q = self.quantized.get(bias_name).ok_or_else(|| self.fault(format!("no int8 weight feeds {bias_name}")))?;
        let t = self.tensor(&q.weight)?;
        if t.data_type != dtype::INT8 || t.dims != [c_in as i64, c_out as i64] {
            return Err(
                self.fault(format!("{} is {:?} of type {}, not int8 {c_in} x {c_out}", q.weight, t.dims, t.data_type))
            );
        }
        let values = t.to_i64()?;
        let mut data = vec![0i8; c_in * c_out];
        for i in 0..c_in {
            for o in 0..c_out {
                data[o * c_in + i] = values[i * c_out + o] as i8;
            }
        }
        Ok((data, q.scale))
    }

    /// The int8 weight feeding bias `bias_name`, as `q · scale` in f32, laid out `[c_out][c_in]`.
    pub fn dequantized(&self, bias_name: &str, c_in: usize, c_out: usize) -> Result<Weight, AcousticError> {
        let (q, scale) = self.int8(bias_name, c_in, c_out)?;
        let data = q.iter().map(|&v| v as f32 * scale).collect();
        Ok(Weight::F32 { rows: c_out, cols: c_in, data })
    }

    /// The int8 weight feeding bias `bias_name`, kept in int8 for the integer matmul.
    pub fn quantized(&self, bias_name: &str, c_in: usize, c_out: usize) -> Result<Int8Matrix, AcousticError> {
        let (q, scale) = self.int8(bias_name, c_in, c_out)?;
        Ok(Int8Matrix::new(&q, c_out, c_in, scale))
    }

    /// How many nodes read initializer `name` (a shared layer is read once per application).
    pub fn num_uses(&self, name: &str) -> usize {
        self.graph.nodes.iter().filter(|n| n.inputs.iter().any(|i| i == name)).count()
    }

    /// The dilation of the Conv node whose weight is `weight_name`.
    pub fn conv_dilation(&self, weight_name: &str) -> Result<usize, AcousticError> {
        let node =
            self.graph.nodes.iter().find(|n| n.op_type == "Conv" && n.inputs.get(1).is_some_and(|i| i == weight_name));
        let node = node.ok_or_else(|| self.fault(format!("no Conv reads {weight_name}")))?;
        match node.attr("dilations") {
            Some(AttrValue::Ints(d)) if d.len() == 1 && d[0] > 0 => Ok(d[0] as usize),
            None => Ok(1),
            other => Err(self.fault(format!("{weight_name}: dilations {other:?}"))),
        }
    }

    fn find_quantized(&self) -> Result<HashMap<String, Quantized>, AcousticError> {
        let nodes = &self.graph.nodes;
        let mut consumers: HashMap<&str, Vec<&Node>> = HashMap::new();
        let mut producer: HashMap<&str, &Node> = HashMap::new();
        for n in nodes {
            n.inputs.iter().for_each(|i| consumers.entry(i.as_str()).or_default().push(n));
            n.outputs.iter().for_each(|o| {
                producer.insert(o.as_str(), n);
            });
        }
        let only = |name: &str, op: &str| -> Result<&Node, AcousticError> {
            match consumers.get(name).map(Vec::as_slice) {
                Some([n]) if n.op_type == op => Ok(n),
                _ => Err(self.fault(format!("{name} does not feed exactly one {op}"))),
            }
        };
        let mut found = HashMap::new();
        for mm in nodes.iter().filter(|n| n.op_type == "MatMulInteger") {
            let [a_q, b_q, _, b_zp] = mm.inputs.as_slice() else {
                return Err(self.fault(format!("MatMulInteger {} has {} inputs", mm.name, mm.inputs.len())));
            };
            if self.tensor(b_zp)?.to_i64()?.iter().any(|z| *z != 0) {
                return Err(self.fault(format!("{b_zp}: weight zero point is not 0")));
            }
            let dql = producer.get(a_q.as_str()).filter(|n| n.op_type == "DynamicQuantizeLinear");
            let dql = dql.ok_or_else(|| self.fault(format!("{a_q} is not quantized at run time")))?;
            let cast = only(&mm.outputs[0], "Cast")?;
            let mul = only(&cast.outputs[0], "Mul")?;
            let scales = mul.inputs.iter().find(|i| **i != cast.outputs[0]).and_then(|i| producer.get(i.as_str()));
            let scales = scales.filter(|n| n.op_type == "Mul" && n.inputs.contains(&dql.outputs[1]));
            let scales = scales.ok_or_else(|| self.fault(format!("{}: no scale product", mm.name)))?;
            let scale_name =
                scales.inputs.iter().find(|i| self.has(i)).ok_or_else(|| self.fault("scale is not stored"))?;
            let scale = match self.tensor(scale_name)?.to_f32()?.as_slice() {
                [s] => *s,
                other => return Err(self.fault(format!("{scale_name}: {} scales, not one", other.len()))),
            };
            let add = only(&mul.outputs[0], "Add")?;
            let bias = add.inputs.iter().find(|i| self.has(i)).ok_or_else(|| self.fault("bias is not stored"))?;
            let q = Quantized { weight: b_q.clone(), scale };
            match found.insert(bias.clone(), q.clone()) {
                Some(prev) if prev != q => return Err(self.fault(format!("{bias} follows two different weights"))),
                _ => {}
            }
        }
        Ok(found)
    }
}

//! Unknown words: oov.onnx's character transformer run natively, `slots` outputs per character read CTC-style.

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;
use tensorfold_kernels::ops::{argmax, dot};
use tensorfold_kernels::simd::{f32_dot, Tile};

use super::files;
use super::G2pError;
use crate::checkpoint::onnx::{AttrValue, Graph, OnnxModel};

#[derive(Deserialize)]
struct Meta {
    #[serde(rename = "in")]
    inputs: Vec<String>,
    #[serde(rename = "out")]
    outputs: Vec<String>,
    slots: usize,
    maxlen: usize,
}

/// `x @ w + b` with `w` kept row per output, so each output is one contiguous dot product.
struct Linear {
    weight: Vec<f32>,
    bias: Vec<f32>,
    num_in: usize,
    num_out: usize,
}

impl Linear {
    fn forward(&self, x: &[f32], out: &mut Vec<f32>) {
        let rows: Vec<&[f32]> = x.chunks_exact(self.num_in).collect();
        out.clear();
        out.resize(rows.len() * self.num_out, 0.0);
        for (tile, dst) in rows.chunks(4).zip(out.chunks_mut(4 * self.num_out)) {
            match tile.len() {
                4 => self.tile::<4>(tile, dst),
                3 => self.tile::<3>(tile, dst),
                2 => self.tile::<2>(tile, dst),
                _ => self.tile::<1>(tile, dst),
            }
        }
    }

    /// `R` activation rows against every weight row, each weight row read once for the tile.
    fn tile<const R: usize>(&self, rows: &[&[f32]], dst: &mut [f32]) {
        let tile = Tile::<R> { rows: std::array::from_fn(|r| rows[r]), block_sums: [&[][..]; R] };
        for (j, (w, b)) in self.weight.chunks_exact(self.num_in).zip(&self.bias).enumerate() {
            let mut res = [0f32; R];
            f32_dot(w, &tile, &mut res);
            for (r, v) in res.iter().enumerate() {
                dst[r * self.num_out + j] = b + v;
            }
        }
    }
}

struct LayerNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

impl LayerNorm {
    fn forward(&self, x: &[f32], out: &mut Vec<f32>) {
        out.clear();
        let n = self.weight.len();
        for row in x.chunks_exact(n) {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
            let inv = 1.0 / (var + self.eps as f64).sqrt();
            for ((v, w), b) in row.iter().zip(&self.weight).zip(&self.bias) {
                out.push((((*v as f64 - mean) * inv) as f32) * w + b);
            }
        }
    }
}

struct Layer {
    norm1: LayerNorm,
    in_proj: Linear,
    out_proj: Linear,
    norm2: LayerNorm,
    linear1: Linear,
    linear2: Linear,
}

/// The OOV network and its character tables.
pub struct Oov {
    chars: HashMap<char, usize>,
    outputs: Vec<String>,
    max_len: usize,
    slots: usize,
    num_heads: usize,
    width: usize,
    embedding: Vec<f32>,
    positions: Vec<f32>,
    layers: Vec<Layer>,
    norm: LayerNorm,
    head: Linear,
}

/// The graph's pieces by role, in node order.
struct GraphParts<'a> {
    graph: &'a Graph,
    path: &'a Path,
}

impl GraphParts<'_> {
    fn fault(&self, reason: impl Into<String>) -> G2pError {
        G2pError::Format { path: self.path.to_path_buf(), reason: reason.into() }
    }

    fn floats(&self, name: &str) -> Result<(Vec<f32>, Vec<i64>), G2pError> {
        let t = self.graph.initializer(name).ok_or_else(|| self.fault(format!("no initializer {name}")))?;
        let values = t.to_f32().map_err(|e| self.fault(e.to_string()))?;
        Ok((values, t.dims.clone()))
    }

    /// Each MatMul by a weight, with the bias its Add puts on, as a row-per-output `Linear`.
    fn linears(&self) -> Result<Vec<Linear>, G2pError> {
        let mut out = Vec::new();
        for node in self.graph.nodes.iter().filter(|n| n.op_type == "MatMul") {
            let Some(weight_name) = node.inputs.get(1).filter(|i| self.graph.initializer(i).is_some()) else {
                continue;
            };
            let (w, dims) = self.floats(weight_name)?;
            let add = self.graph.nodes.iter().find(|n| n.op_type == "Add" && n.inputs.contains(&node.outputs[0]));
            let bias_name = add
                .and_then(|a| a.inputs.iter().find(|i| self.graph.initializer(i).is_some()))
                .ok_or_else(|| self.fault(format!("no bias after {weight_name}")))?;
            let (bias, _) = self.floats(bias_name)?;
            if dims.len() != 2 || bias.len() != dims[1] as usize {
                return Err(self.fault(format!("{weight_name} {dims:?} does not fit its bias of {}", bias.len())));
            }
            let (num_in, num_out) = (dims[0] as usize, dims[1] as usize);
            let mut weight = vec![0f32; num_in * num_out];
            for i in 0..num_in {
                for o in 0..num_out {
                    weight[o * num_in + i] = w[i * num_out + o];
                }
            }
            out.push(Linear { weight, bias, num_in, num_out });
        }
        Ok(out)
    }

    fn layer_norms(&self) -> Result<Vec<LayerNorm>, G2pError> {
        let mut out = Vec::new();
        for node in self.graph.nodes.iter().filter(|n| n.op_type == "LayerNormalization") {
            let (weight, _) = self.floats(&node.inputs[1])?;
            let (bias, _) = self.floats(node.inputs.get(2).ok_or_else(|| self.fault("LayerNorm without bias"))?)?;
            let eps = match node.attr("epsilon") {
                Some(AttrValue::Float(e)) => *e,
                _ => 1e-5,
            };
            out.push(LayerNorm { weight, bias, eps });
        }
        Ok(out)
    }

    /// The head count, the third dim of the first 4-d reshape target (batch, length, heads, head width).
    fn num_heads(&self) -> Result<usize, G2pError> {
        let concat = self.graph.nodes.iter().find(|n| n.op_type == "Concat" && n.inputs.len() == 4);
        let name = concat.map(|c| &c.inputs[2]).ok_or_else(|| self.fault("no head reshape"))?;
        let constant = self.graph.nodes.iter().find(|n| n.op_type == "Constant" && n.outputs.contains(name));
        match constant.and_then(|c| c.attr("value")) {
            Some(AttrValue::Tensor(t)) => match t.to_i64().ok().and_then(|v| v.first().copied()) {
                Some(h) if h > 0 => Ok(h as usize),
                _ => Err(self.fault("bad head count")),
            },
            _ => Err(self.fault("head count is not a constant")),
        }
    }

    /// The initializer a node of `op_type` reads first (the embedding's Gather, the positions' Slice).
    fn input_table(&self, op_type: &str) -> Result<(Vec<f32>, Vec<i64>), G2pError> {
        let node =
            self.graph.nodes.iter().find(|n| n.op_type == op_type && self.graph.initializer(&n.inputs[0]).is_some());
        self.floats(&node.ok_or_else(|| self.fault(format!("no {op_type} of a table")))?.inputs[0])
    }
}

impl Oov {
    pub fn load(dir: &Path) -> Result<Oov, G2pError> {
        let meta: Meta = files::json(dir, "oov.json")?;
        let path = dir.join("oov.onnx");
        let model = OnnxModel::open(&path).map_err(|source| G2pError::Onnx { path: path.clone(), source })?;
        let parts = GraphParts { graph: &model.graph, path: &path };
        let mut linears = parts.linears()?;
        let mut norms = parts.layer_norms()?;
        let (embedding, emb_dims) = parts.input_table("Gather")?;
        let (positions, pos_dims) = parts.input_table("Slice")?;
        let num_layers = linears.len().saturating_sub(1) / 4;
        let width = emb_dims.get(1).copied().unwrap_or(0) as usize;
        let num_classes = meta.outputs.len() + 1;
        let head = linears.pop().ok_or_else(|| parts.fault("no head"))?;
        let norm = norms.pop().ok_or_else(|| parts.fault("no final norm"))?;
        if linears.len() != num_layers * 4 || norms.len() != num_layers * 2 || head.num_out != meta.slots * num_classes
        {
            return Err(parts.fault(format!(
                "{} projections, {} norms and a head of {} do not make a {num_layers}-layer encoder with {} slots",
                linears.len(),
                norms.len(),
                head.num_out,
                meta.slots
            )));
        }
        let rows = |dims: &[i64]| dims.first().map_or(0, |&r| r as usize);
        if pos_dims.get(1) != emb_dims.get(1) || rows(&pos_dims) < meta.maxlen || rows(&emb_dims) <= meta.inputs.len() {
            let what = format!(
                "positions {pos_dims:?} and embedding {emb_dims:?} do not fit {} characters",
                meta.inputs.len()
            );
            return Err(parts.fault(what));
        }
        let num_heads = parts.num_heads()?;
        let fits = |l: &Linear, num_in: usize, num_out: usize| l.num_in == num_in && l.num_out == num_out;
        let ffn = linears.get(2).map_or(0, |l| l.num_out);
        for (i, l) in linears.chunks_exact(4).enumerate() {
            let ok = fits(&l[0], width, 3 * width)
                && fits(&l[1], width, width)
                && fits(&l[2], width, ffn)
                && fits(&l[3], ffn, width);
            if !ok || head.num_in != width || !width.is_multiple_of(num_heads) {
                return Err(parts.fault(format!("layer {i} does not fit a width of {width} with {num_heads} heads")));
            }
        }
        let mut linears = linears.into_iter();
        let mut norms = norms.into_iter();
        let mut layers = Vec::with_capacity(num_layers);
        for _ in 0..num_layers {
            let (Some(in_proj), Some(out_proj), Some(linear1), Some(linear2)) =
                (linears.next(), linears.next(), linears.next(), linears.next())
            else {
                break;
            };
            let (Some(norm1), Some(norm2)) = (norms.next(), norms.next()) else { break };
            layers.push(Layer { norm1, in_proj, out_proj, norm2, linear1, linear2 });
        }
        let chars = meta
            .inputs
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let mut it = s.chars();
                match (it.next(), it.next()) {
                    (Some(c), None) => Some((c, i + 1)),
                    _ => None,
                }
            })
            .collect();
        Ok(Oov {
            chars,
            outputs: meta.outputs,
            max_len: meta.maxlen,
            slots: meta.slots,
            num_heads,
            width,
            embedding,
            positions,
            layers,
            norm,
            head,
        })
    }

    /// Self-attention over the whole word (no mask): `qkv` rows are [q | k | v].
    fn attention(&self, qkv: &[f32], len: usize) -> Vec<f32> {
        let (d, heads) = (self.width, self.num_heads);
        let hd = d / heads;
        let scale = (hd as f32).powf(0.5);
        let mut out = vec![0f32; len * d];
        let mut scores = vec![0f32; len];
        for h in 0..heads {
            for i in 0..len {
                let q = &qkv[i * 3 * d + h * hd..][..hd];
                for (j, s) in scores.iter_mut().enumerate() {
                    let k = &qkv[j * 3 * d + d + h * hd..][..hd];
                    *s = dot(q, k) / scale;
                }
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                scores.iter_mut().for_each(|s| *s = (*s - max).exp());
                let sum: f32 = scores.iter().sum();
                let o = &mut out[i * d + h * hd..][..hd];
                for (j, s) in scores.iter().enumerate() {
                    let v = &qkv[j * 3 * d + 2 * d + h * hd..][..hd];
                    let p = s / sum;
                    o.iter_mut().zip(v).for_each(|(o, v)| *o += p * v);
                }
            }
        }
        out
    }

    /// The network's class per output position for character ids.
    fn classes(&self, ids: &[usize]) -> Vec<usize> {
        let (len, d) = (ids.len(), self.width);
        let mut h = Vec::with_capacity(len * d);
        for (t, &id) in ids.iter().enumerate() {
            let (e, p) = (&self.embedding[id * d..][..d], &self.positions[t * d..][..d]);
            h.extend(e.iter().zip(p).map(|(e, p)| e + p));
        }
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        for layer in &self.layers {
            layer.norm1.forward(&h, &mut a);
            layer.in_proj.forward(&a, &mut b);
            let attended = self.attention(&b, len);
            layer.out_proj.forward(&attended, &mut c);
            h.iter_mut().zip(&c).for_each(|(h, c)| *h += c);
            layer.norm2.forward(&h, &mut a);
            layer.linear1.forward(&a, &mut b);
            for v in b.iter_mut() {
                *v = *v * ((libm::erf((*v / std::f32::consts::SQRT_2) as f64) as f32) + 1.0) * 0.5;
            }
            layer.linear2.forward(&b, &mut c);
            h.iter_mut().zip(&c).for_each(|(h, c)| *h += c);
        }
        self.norm.forward(&h, &mut a);
        self.head.forward(&a, &mut b);
        b.chunks_exact(self.head.num_out / self.slots).map(argmax).collect()
    }

    /// The phonemes of an unknown word; None when none of its characters is in the network's alphabet.
    pub fn read(&self, word: &str) -> Option<String> {
        let ids: Vec<usize> = word.chars().filter_map(|c| self.chars.get(&c).copied()).take(self.max_len).collect();
        if ids.is_empty() {
            return None;
        }
        let mut out = String::new();
        let mut prev = 0;
        for class in self.classes(&ids) {
            if class != prev && class != 0 {
                out.push_str(&self.outputs[class - 1]);
            }
            prev = class;
        }
        Some(out)
    }
}

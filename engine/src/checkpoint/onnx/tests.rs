//! The reader on hand-encoded messages, on damaged bytes, and on the hibari voice's model when it is cached.

use super::*;

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(number: u64, payload: &[u8], out: &mut Vec<u8>) {
    varint(number << 3 | 2, out);
    varint(payload.len() as u64, out);
    out.extend_from_slice(payload);
}

fn varint_field(number: u64, v: u64, out: &mut Vec<u8>) {
    varint(number << 3, out);
    varint(v, out);
}

/// A FLOAT tensor with raw data, or an INT64 tensor with unpacked values.
fn tensor(name: &str, dims: &[u64], floats: Option<&[f32]>, ints: &[i64]) -> Vec<u8> {
    let mut t = Vec::new();
    for d in dims {
        varint_field(1, *d, &mut t);
    }
    varint_field(2, if floats.is_some() { 1 } else { 7 }, &mut t);
    for i in ints {
        varint_field(7, *i as u64, &mut t);
    }
    bytes_field(8, name.as_bytes(), &mut t);
    if let Some(f) = floats {
        bytes_field(9, &f.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>(), &mut t);
    }
    t
}

fn model() -> Vec<u8> {
    let mut node = Vec::new();
    bytes_field(1, b"x", &mut node);
    bytes_field(1, b"w", &mut node);
    bytes_field(2, b"y", &mut node);
    bytes_field(3, b"/mm", &mut node);
    bytes_field(4, b"MatMul", &mut node);
    let mut attr = Vec::new();
    bytes_field(1, b"axes", &mut attr);
    let mut packed = Vec::new();
    for v in [1u64, 2, 300] {
        varint(v, &mut packed);
    }
    bytes_field(8, &packed, &mut attr);
    bytes_field(5, &attr, &mut node);
    let mut graph = Vec::new();
    bytes_field(1, &node, &mut graph);
    bytes_field(5, &tensor("w", &[2, 2], Some(&[1.0, -2.5, 3.0, 0.125]), &[]), &mut graph);
    bytes_field(5, &tensor("shape", &[3], None, &[-1, 4, 7]), &mut graph);
    let mut input = Vec::new();
    bytes_field(1, b"x", &mut input);
    bytes_field(11, &input, &mut graph);
    let mut model = Vec::new();
    varint_field(1, 8, &mut model);
    let mut opset = Vec::new();
    varint_field(2, 17, &mut opset);
    bytes_field(8, &opset, &mut model);
    bytes_field(7, &graph, &mut model);
    model
}

#[test]
fn test_a_hand_encoded_model_reads_back() {
    let m = OnnxModel::parse(&model()).unwrap();
    assert_eq!(m.opsets, [(String::new(), 17)]);
    let node = &m.graph.nodes[0];
    assert_eq!((node.op_type.as_str(), node.name.as_str()), ("MatMul", "/mm"));
    assert_eq!((node.inputs.clone(), node.outputs.clone()), (vec!["x".into(), "w".into()], vec!["y".into()]));
    assert_eq!(node.attr("axes"), Some(&AttrValue::Ints(vec![1, 2, 300])));
    assert_eq!(m.graph.initializer("w").unwrap().to_f32().unwrap(), [1.0, -2.5, 3.0, 0.125]);
    assert_eq!(m.graph.initializer("shape").unwrap().to_i64().unwrap(), [-1, 4, 7]);
    assert_eq!(m.graph.inputs, ["x"]);
}

#[test]
fn test_wrong_types_and_sizes_are_errors_naming_the_tensor() {
    let m = OnnxModel::parse(&model()).unwrap();
    let err = m.graph.initializer("shape").unwrap().to_f32().unwrap_err().to_string();
    assert!(err.contains("shape") && err.contains("not FLOAT"), "{err}");
    let mut short = m.graph.initializer("w").unwrap().clone();
    short.dims = vec![3, 2];
    let err = short.to_f32().unwrap_err().to_string();
    assert!(err.contains("16 bytes") && err.contains("24"), "{err}");
}

#[test]
fn test_every_truncation_and_many_mutations_fail_cleanly() {
    let good = model();
    for n in 0..good.len() {
        // Truncation lands inside some field, except at boundaries between top-level fields.
        let _ = OnnxModel::parse(&good[..n]);
    }
    assert!(OnnxModel::parse(&good[..good.len() - 1]).is_err());
    let mut state = 0x9e3779b97f4a7c15u64;
    for _ in 0..2000 {
        let mut bad = good.clone();
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let at = (state >> 33) as usize % bad.len();
        bad[at] = (state >> 17) as u8;
        let _ = OnnxModel::parse(&bad);
    }
    let err = OnnxModel::parse(&[0x0a, 0xff, 0xff]).unwrap_err();
    assert!(err.0.contains("past the end") || err.0.contains("varint"), "{err:?}");
}

#[test]
fn test_the_hibari_model_reads_with_its_known_tensors() {
    let Ok(dir) = crate::fetch::test_fetcher().hibari_dir() else {
        assert!(std::env::var_os("CI").is_none(), "CI fetches the hibari voice first");
        return println!("skipping: the hibari voice could not be fetched");
    };
    let m = OnnxModel::open(&dir.join("hibari.onnx")).unwrap();
    assert_eq!((m.graph.nodes.len(), m.graph.initializers.len()), (1731, 296));
    assert_eq!(m.graph.inputs, ["ids", "speed"]);
    assert_eq!(m.graph.outputs, ["lh", "theta", "ln", "lr", "phi", "f0"]);
    let emb = m.graph.initializer("m.text.emb.weight").unwrap();
    assert_eq!(emb.dims, [178, 128]);
    let values = emb.to_f32().unwrap();
    assert_eq!(values[..3], [-1.179_909, -1.173_117, -0.339_246_24]);
    assert!((values.iter().map(|v| *v as f64).sum::<f64>() + 189.450_136).abs() < 1e-3);
    let head = m.graph.initializer("/head/Transpose_output_0_quantized").unwrap();
    assert_eq!((head.data_type, head.dims.clone()), (dtype::INT8, vec![256, 3005]));
    let q = head.to_i64().unwrap();
    assert_eq!((q[..5].to_vec(), q.iter().sum::<i64>()), (vec![1, -1, 12, 1, 22], 238_584));
    assert_eq!(m.graph.nodes.iter().filter(|n| n.op_type == "Conv").count(), 23);
}

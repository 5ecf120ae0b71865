use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use tensorfold_kernels::GgmlType;

use super::write::{f32_bytes, GgufWriter};
use super::{parse, GgufFile, Value};

const PATH: &str = "test.gguf";

fn sample_metadata() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String("llama".into())),
        ("general.alignment", Value::U32(64)),
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-7)),
        ("t.u16", Value::U16(65000)),
        ("t.i16", Value::I16(-300)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-5)),
        ("t.u64", Value::U64(1 << 40)),
        ("t.i64", Value::I64(-(1 << 40))),
        ("t.f32", Value::F32(1.5e-5)),
        ("t.f64", Value::F64(-2.25)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::String("héllo ▁world".into())),
        ("t.empty", Value::Array(vec![])),
        ("t.strings", Value::Array(vec![Value::String("a".into()), Value::String("".into())])),
        (
            "t.nested",
            Value::Array(vec![
                Value::Array(vec![Value::I32(1), Value::I32(2)]),
                Value::Array(vec![Value::Array(vec![Value::F64(3.0)])]),
            ]),
        ),
    ]
}

fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in sample_metadata() {
        w = w.kv(k, v);
    }
    let q4_0: Vec<u8> = (0..2 * 18).map(|i| i as u8).collect();
    let q6_k: Vec<u8> = (0..210).map(|i| (i * 7) as u8).collect();
    w.tensor("norm.weight", &[4], GgmlType::F32, f32_bytes(&[1.0, 2.0, 3.0, 4.0]))
        .tensor("half.weight", &[3, 2], GgmlType::F16, vec![0x3c; 12])
        .tensor("bf.weight", &[2], GgmlType::BF16, vec![0x80, 0x3f, 0x00, 0x40])
        .tensor("q.weight", &[32, 2], GgmlType::Q4_0, q4_0)
        .tensor("k.weight", &[256, 1], GgmlType::Q6K, q6_k)
}

fn err_text(bytes: &[u8]) -> String {
    match parse(Path::new(PATH), bytes) {
        Ok(_) => panic!("parse accepted a bad file"),
        Err(e) => e.to_string(),
    }
}

fn assert_fault(bytes: &[u8], wanted: &[&str]) {
    let text = err_text(bytes);
    assert!(text.starts_with(PATH), "error does not name the file: {text}");
    for w in wanted {
        assert!(text.contains(w), "error {text:?} lacks {w:?}");
    }
}

#[test]
fn test_round_trip_through_a_file() {
    let writer = sample_writer();
    let written = writer.write();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sample.gguf");
    std::fs::write(&path, &written.bytes).unwrap();
    let file = GgufFile::open(&path).unwrap();

    assert_eq!(file.version, 3);
    let expected: BTreeMap<String, Value> = sample_metadata().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    assert_eq!(file.metadata, expected);
    assert_eq!(file.get("t.u32").and_then(Value::as_u64), Some(4_000_000_000));
    assert_eq!(file.tensors.len(), writer.tensors.len());
    for (info, t) in file.tensors.iter().zip(&writer.tensors) {
        assert_eq!(info.name, t.name);
        assert_eq!(info.dims, t.dims);
        assert_eq!(info.ty.id(), t.type_id);
        assert_eq!(info.offset % 64, 0, "{} is not aligned", info.name);
        assert_eq!(file.tensor_bytes(info), &t.data[..], "{}", info.name);
        assert_eq!(file.tensor(&t.name).map(|i| i.offset), Some(info.offset));
    }
    assert!(file.tensor("missing").is_none());
}

#[test]
fn test_version_2_parses() {
    let mut writer = sample_writer();
    writer.version = 2;
    let parsed = parse(Path::new(PATH), &writer.write().bytes).unwrap();
    assert_eq!(parsed.version, 2);
    assert_eq!(parsed.tensors.len(), 5);
}

#[test]
fn test_default_alignment_is_32() {
    let w = GgufWriter::new().tensor("a", &[3], GgmlType::F32, f32_bytes(&[1.0, 2.0, 3.0])).tensor(
        "b",
        &[1],
        GgmlType::F32,
        f32_bytes(&[4.0]),
    );
    let parsed = parse(Path::new(PATH), &w.write().bytes).unwrap();
    assert_eq!(parsed.data_offset % 32, 0);
    assert_eq!(parsed.tensors[1].offset, 32);
}

#[test]
fn test_value_accessors() {
    assert_eq!(Value::I32(-1).as_u64(), None);
    assert_eq!(Value::I64(7).as_u64(), Some(7));
    assert_eq!(Value::U16(9).as_f64(), Some(9.0));
    assert_eq!(Value::F32(0.5).as_f64(), Some(0.5));
    assert_eq!(Value::F32(0.5).as_u64(), None);
    assert_eq!(Value::Bool(true).as_bool(), Some(true));
    assert_eq!(Value::String("x".into()).as_str(), Some("x"));
    assert_eq!(Value::U8(1).as_str(), None);
    assert_eq!(Value::Array(vec![Value::U8(1)]).as_array().map(<[Value]>::len), Some(1));
}

#[test]
fn test_wrong_magic() {
    let mut bytes = sample_writer().write().bytes;
    bytes[..4].copy_from_slice(b"GGML");
    assert_fault(&bytes, &["not a GGUF file"]);
}

#[test]
fn test_version_1_is_unsupported() {
    let mut writer = sample_writer();
    writer.version = 1;
    assert_fault(&writer.write().bytes, &["unsupported GGUF version 1"]);
    writer.version = 3u32.swap_bytes();
    assert_fault(&writer.write().bytes, &["big-endian"]);
}

#[test]
fn test_truncated_header() {
    let bytes = sample_writer().write().bytes;
    assert_fault(&bytes[..2], &["truncated", "magic"]);
    assert_fault(&bytes[..12], &["truncated", "tensor count"]);
    assert_fault(&[], &["truncated"]);
}

#[test]
fn test_truncated_metadata() {
    let w = GgufWriter::new().kv("general.name", Value::String("a long enough name".into())).write();
    let cut = w.bytes.len() - 5;
    assert_fault(&w.bytes[..cut], &["truncated", "value of general.name"]);
}

#[test]
fn test_truncated_tensor_info() {
    let writer = GgufWriter::new().tensor("only.weight", &[2], GgmlType::F32, f32_bytes(&[1.0, 2.0]));
    let bytes = writer.write().bytes;
    // The info is name (8 + 11), dim count 4, one dim 8, type 4, offset 8, after a 24-byte header.
    let cut = 24 + 19 + 4 + 8 + 2;
    assert_fault(&bytes[..cut], &["truncated", "type of tensor only.weight"]);
}

#[test]
fn test_tensor_data_past_the_end() {
    let bytes = sample_writer().write().bytes;
    assert_fault(&bytes[..bytes.len() - 1], &["tensor k.weight", "runs past the end of the file"]);
}

#[test]
fn test_unsupported_tensor_type() {
    let bytes = GgufWriter::new().raw_tensor("blk.0.attn_q.weight", &[32], 6, vec![0; 22]).write().bytes;
    assert_fault(&bytes, &["tensor blk.0.attn_q.weight", "unsupported tensor type id 6"]);
}

#[test]
fn test_dims_overflow() {
    let bytes = GgufWriter::new().tensor("big", &[1 << 40, 1 << 40], GgmlType::F32, vec![]).write().bytes;
    assert_fault(&bytes, &["tensor big", "overflow"]);
    let bytes = GgufWriter::new().tensor("wide", &[1 << 62, 2], GgmlType::F32, vec![]).write().bytes;
    assert_fault(&bytes, &["tensor wide", "overflow"]);
}

#[test]
fn test_dims_not_whole_blocks() {
    let bytes = GgufWriter::new().tensor("odd", &[48, 2], GgmlType::Q4_0, vec![0; 54]).write().bytes;
    assert_fault(&bytes, &["tensor odd", "first dim 48 is not a multiple of the Q4_0 block length 32"]);
}

#[test]
fn test_too_many_dims() {
    let bytes = GgufWriter::new().tensor("cube", &[1; 5], GgmlType::F32, vec![0; 4]).write().bytes;
    assert_fault(&bytes, &["tensor cube", "5 dims"]);
}

#[test]
fn test_absurd_counts_are_refused_before_allocating() {
    let written = sample_writer().write();
    let patched = |at: usize, value: u64| {
        let mut bytes = written.bytes.clone();
        bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
        bytes
    };
    let fields = &written.count_fields;
    assert_fault(&patched(fields[0], u64::MAX), &["tensor count of 18446744073709551615", "cannot fit"]);
    assert_fault(&patched(fields[1], 1 << 40), &["metadata count", "cannot fit"]);
    // Field 2 is the first key's length, field 3 the architecture string's length.
    assert_fault(&patched(fields[3], u64::MAX / 2), &["length of value of general.architecture", "cannot fit"]);
    // An array's length follows its key, the value type and the element type.
    let key = b"t.strings";
    let key_at = written.bytes.windows(key.len()).position(|w| w == key).unwrap();
    assert_fault(&patched(key_at + key.len() + 8, 1 << 61), &["array t.strings", "cannot fit"]);
}

#[test]
fn test_bad_alignment() {
    let bytes = GgufWriter::new().kv("general.alignment", Value::U32(3)).write().bytes;
    assert_fault(&bytes, &["general.alignment", "not a power of two"]);
    let bytes = GgufWriter::new().kv("general.alignment", Value::U32(0)).write().bytes;
    assert_fault(&bytes, &["general.alignment", "not a power of two"]);
}

#[test]
fn test_duplicates_are_refused() {
    let bytes = GgufWriter::new().kv("a", Value::U8(1)).kv("a", Value::U8(2)).write().bytes;
    assert_fault(&bytes, &["duplicate metadata key a"]);
    let data = f32_bytes(&[1.0]);
    let bytes = GgufWriter::new()
        .tensor("t", &[1], GgmlType::F32, data.clone())
        .tensor("t", &[1], GgmlType::F32, data)
        .write()
        .bytes;
    assert_fault(&bytes, &["tensor t", "appears twice"]);
}

#[test]
fn test_deep_nesting_is_refused() {
    let mut value = Value::U8(0);
    for _ in 0..20 {
        value = Value::Array(vec![value]);
    }
    let bytes = GgufWriter::new().kv("deep", value).write().bytes;
    assert_fault(&bytes, &["deep", "nested deeper"]);
}

#[test]
fn test_unknown_value_type() {
    let written = GgufWriter::new().kv("k", Value::U8(1)).write();
    let mut bytes = written.bytes.clone();
    let at = written.type_fields[0];
    bytes[at..at + 4].copy_from_slice(&13u32.to_le_bytes());
    assert_fault(&bytes, &["k: unknown value type 13"]);
}

/// SplitMix64: a deterministic stream for the fuzz test, no dependency needed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn test_fuzzed_files_never_panic() {
    let written = sample_writer().write();
    let base = &written.bytes;
    let mut rng = Rng(0x6767_7566);
    let (mut num_ok, mut num_err) = (0, 0);
    for case in 0..480 {
        let mut bytes = base.clone();
        let what = match case % 4 {
            0 => {
                for _ in 0..1 + rng.below(4) {
                    // Half the flips land in the header, where they change the most.
                    let limit = if rng.below(2) == 0 { 400.min(bytes.len()) } else { bytes.len() };
                    let at = rng.below(limit);
                    bytes[at] ^= 1 + rng.below(255) as u8;
                }
                "byte flips"
            }
            1 => {
                bytes.truncate(rng.below(base.len()));
                "truncation"
            }
            2 => {
                let at = written.count_fields[rng.below(written.count_fields.len())];
                let value = match rng.below(5) {
                    0 => u64::MAX,
                    1 => 1 << (32 + rng.below(32)),
                    2 => base.len() as u64 + rng.below(64) as u64,
                    3 => rng.below(64) as u64,
                    _ => rng.next(),
                };
                bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
                "count write"
            }
            _ => {
                let at = written.type_fields[rng.below(written.type_fields.len())];
                let value = if rng.below(2) == 0 { rng.below(40) as u32 } else { rng.next() as u32 };
                bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
                "type write"
            }
        };
        let result = catch_unwind(AssertUnwindSafe(|| parse(Path::new(PATH), &bytes)));
        match result {
            Err(_) => panic!("case {case} ({what}) panicked"),
            Ok(Err(_)) => num_err += 1,
            Ok(Ok(parsed)) => {
                num_ok += 1;
                for t in &parsed.tensors {
                    let start = parsed.data_offset.checked_add(t.offset as usize);
                    let end = start.zip(t.num_bytes()).and_then(|(s, n)| s.checked_add(n));
                    assert!(end.is_some_and(|e| e <= bytes.len()), "case {case} ({what}): {} escapes", t.name);
                }
            }
        }
    }
    assert!(num_err > 100 && num_ok > 10, "{num_ok} ok, {num_err} errors");
}

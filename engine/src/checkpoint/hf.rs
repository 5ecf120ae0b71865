//! Hugging Face checkpoints: `config.json` plus one or more memory-mapped safetensors files.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use rayon::prelude::*;
use safetensors::tensor::{Dtype, TensorInfo};
use safetensors::{SafeTensorError, SafeTensors};
use serde::Deserialize;
use tensorfold_kernels::Weight;

use crate::checkpoint::hf_config::RawConfig;
use crate::checkpoint::{Bf16Rows, Checkpoint};
use crate::error::LoadError;
use crate::llama::config::ModelConfig;

const CONFIG_FILE: &str = "config.json";
const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";
/// The endings of transformers 5's stacked expert tensors.
const STACKED_GATE_UP: &str = ".experts.gate_up_proj";
const STACKED_DOWN: &str = ".experts.down_proj";

/// A Hugging Face model directory, its tensors mapped from disk and converted on demand.
pub struct HfCheckpoint {
    dir: PathBuf,
    config: ModelConfig,
    tensors: TensorTable,
}

/// Every mapped file and where each tensor lives in them.
#[derive(Default)]
struct TensorTable {
    shards: Vec<Shard>,
    by_name: HashMap<String, TensorEntry>,
}

/// One safetensors file and where its tensor data starts.
struct Shard {
    path: PathBuf,
    mmap: Mmap,
    data_start: usize,
}

struct TensorEntry {
    shard: usize,
    info: TensorInfo,
}

#[derive(Deserialize)]
struct RawIndex {
    weight_map: HashMap<String, String>,
}

impl HfCheckpoint {
    /// Opens a model directory: reads `config.json`, maps every safetensors file and checks headers.
    pub fn open(dir: &Path) -> Result<HfCheckpoint, LoadError> {
        let config_path = dir.join(CONFIG_FILE);
        let raw_config: RawConfig = serde_json::from_str(&read_text(&config_path)?)
            .map_err(|err| LoadError::format(&config_path, json_fault(&err)))?;
        let mut tensors = TensorTable::default();
        let single = dir.join(SINGLE_FILE);
        let index = dir.join(INDEX_FILE);
        if single.is_file() {
            tensors.add_shard(single)?;
        } else if index.is_file() {
            for shard_path in shard_paths(dir, &index)? {
                tensors.add_shard(shard_path)?;
            }
        } else {
            return Err(LoadError::format(dir, format!("neither {SINGLE_FILE} nor {INDEX_FILE} is present")));
        }
        tensors.unstack_experts()?;
        let config = raw_config.into_model_config(&config_path, |name| tensors.by_name.contains_key(name))?;
        Ok(HfCheckpoint { dir: dir.to_path_buf(), config, tensors })
    }
}

impl TensorTable {
    fn add_shard(&mut self, path: PathBuf) -> Result<(), LoadError> {
        let file = File::open(&path).map_err(io_error(&path))?;
        // Safety: checkpoint files are treated as read-only while the process runs.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_error(&path))?;
        let (header_len, metadata) = SafeTensors::read_metadata(&mmap)
            .map_err(|err| LoadError::format(&path, describe_safetensors_error(&err)))?;
        let shard = self.shards.len();
        for (name, info) in metadata.tensors() {
            if self.by_name.contains_key(&name) {
                return Err(LoadError::Tensor { path, name, fault: "appears in more than one shard".into() });
            }
            self.by_name.insert(name, TensorEntry { shard, info: info.clone() });
        }
        self.shards.push(Shard { path, mmap, data_start: 8 + header_len });
        Ok(())
    }

    /// Names each expert's slice of stacked expert tensors (transformers 5's `experts.gate_up_proj`, experts x
    /// [gate; up] x hidden, and `experts.down_proj`) as published per-expert checkpoints name it, so loaders read
    /// one layout.
    fn unstack_experts(&mut self) -> Result<(), LoadError> {
        let stacked: Vec<String> = self
            .by_name
            .keys()
            .filter(|n| n.ends_with(STACKED_GATE_UP) || n.ends_with(STACKED_DOWN))
            .cloned()
            .collect();
        for name in stacked {
            let TensorEntry { shard, info } = &self.by_name[&name];
            let (shard, info) = (*shard, info.clone());
            let fault =
                |fault: String| LoadError::Tensor { path: self.shards[shard].path.clone(), name: name.clone(), fault };
            let [num_experts, rows, cols] = info.shape[..] else {
                return Err(fault(format!("shape {:?} is not experts x rows x cols", info.shape)));
            };
            let (prefix, parts) = match name.strip_suffix(STACKED_GATE_UP) {
                Some(_) if rows % 2 != 0 => return Err(fault(format!("{rows} rows do not split into gate and up"))),
                Some(prefix) => (prefix, vec![("gate_proj.weight", rows / 2), ("up_proj.weight", rows / 2)]),
                None => (name.strip_suffix(STACKED_DOWN).unwrap_or(&name), vec![("down_proj.weight", rows)]),
            };
            let (start, end) = info.data_offsets;
            let expert_bytes = rows * cols * info.dtype.size();
            if end - start != num_experts * expert_bytes {
                return Err(fault(format!("holds {} bytes, not {num_experts} x {rows} x {cols}", end - start)));
            }
            let mut entries = Vec::with_capacity(num_experts * parts.len());
            for e in 0..num_experts {
                let mut at = start + e * expert_bytes;
                for &(tail, part_rows) in &parts {
                    let part_name = format!("{prefix}.experts.{e}.{tail}");
                    if self.by_name.contains_key(&part_name) {
                        return Err(fault(format!("{part_name} is also stored on its own")));
                    }
                    let len = part_rows * cols * info.dtype.size();
                    let info =
                        TensorInfo { dtype: info.dtype, shape: vec![part_rows, cols], data_offsets: (at, at + len) };
                    entries.push((part_name, TensorEntry { shard, info }));
                    at += len;
                }
            }
            self.by_name.extend(entries);
        }
        Ok(())
    }
}

impl Checkpoint for HfCheckpoint {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn contains(&self, name: &str) -> bool {
        self.tensors.by_name.contains_key(name)
    }

    fn bf16_rows(&self, name: &str) -> Option<Bf16Rows<'_>> {
        let entry = self.tensors.by_name.get(name).filter(|e| e.info.dtype == Dtype::BF16)?;
        let shard = &self.tensors.shards[entry.shard];
        let (rows, cols) = match entry.info.shape[..] {
            [cols] => (1, cols),
            [rows, cols] => (rows, cols),
            _ => return None,
        };
        let (start, end) = entry.info.data_offsets;
        let bytes = &shard.mmap[shard.data_start + start..shard.data_start + end];
        (bytes.len() == 2 * rows * cols).then_some(Bf16Rows { rows, cols, bytes })
    }

    fn weight(&self, name: &str) -> Result<Weight, LoadError> {
        let entry = self
            .tensors
            .by_name
            .get(name)
            .ok_or_else(|| LoadError::MissingTensor { path: self.dir.clone(), name: name.into() })?;
        let shard = &self.tensors.shards[entry.shard];
        let fault = |fault: String| LoadError::Tensor { path: shard.path.clone(), name: name.into(), fault };
        let (rows, cols) = match entry.info.shape[..] {
            [cols] => (1, cols),
            // A depthwise convolution's channels x 1 x taps.
            [rows, cols] | [rows, 1, cols] => (rows, cols),
            ref shape => return Err(fault(format!("shape {shape:?} is not 1-D, 2-D or channels x 1 x taps"))),
        };
        let (start, end) = entry.info.data_offsets;
        let bytes = &shard.mmap[shard.data_start + start..shard.data_start + end];
        let data = match entry.info.dtype {
            Dtype::F32 => decode(bytes, f32::from_le_bytes),
            Dtype::BF16 => decode(bytes, |b| half::bf16::from_le_bytes(b).to_f32()),
            Dtype::F16 => decode(bytes, |b| half::f16::from_le_bytes(b).to_f32()),
            other => return Err(fault(format!("unsupported dtype {other:?} (expected BF16, F16 or F32)"))),
        };
        Ok(Weight::F32 { rows, cols, data })
    }
}

/// Little-endian elements of `N` bytes to f32; the mapped bytes need not be aligned.
fn decode<const N: usize>(bytes: &[u8], to_f32: fn([u8; N]) -> f32) -> Vec<f32> {
    let element = |chunk: &[u8]| to_f32(std::array::from_fn(|i| chunk[i]));
    bytes.par_chunks_exact(N).map(element).collect()
}

/// The shard files named by an index, each once.
fn shard_paths(dir: &Path, index_path: &Path) -> Result<Vec<PathBuf>, LoadError> {
    let index: RawIndex =
        serde_json::from_str(&read_text(index_path)?).map_err(|err| LoadError::format(index_path, json_fault(&err)))?;
    let mut files: Vec<&String> = index.weight_map.values().collect();
    files.sort();
    files.dedup();
    let mut paths = Vec::with_capacity(files.len());
    for file in files {
        // Shards live beside the index; a path elsewhere is a malformed or hostile index.
        if file.is_empty() || file.contains(['/', '\\']) || file == ".." {
            return Err(LoadError::format(index_path, format!("shard name {file:?} is not a plain file name")));
        }
        let path = dir.join(file);
        if !path.is_file() {
            return Err(LoadError::format(path, format!("missing shard listed in {INDEX_FILE}")));
        }
        paths.push(path);
    }
    Ok(paths)
}

fn read_text(path: &Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path).map_err(io_error(path))
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> LoadError + '_ {
    move |source| LoadError::Io { path: path.into(), source }
}

fn json_fault(err: &serde_json::Error) -> String {
    match err.classify() {
        serde_json::error::Category::Data => format!("unexpected content: {err}"),
        _ => format!("bad JSON: {err}"),
    }
}

fn describe_safetensors_error(err: &SafeTensorError) -> String {
    match err {
        SafeTensorError::HeaderTooSmall => "truncated: shorter than its 8-byte header length".into(),
        SafeTensorError::InvalidHeaderLength => "truncated: header runs past the end of the file".into(),
        SafeTensorError::MetadataIncompleteBuffer => {
            "truncated or corrupt: tensor data does not end where the file ends".into()
        }
        SafeTensorError::InvalidOffset(name) => {
            format!("bad header: tensor {name} has bad offsets")
        }
        other => format!("bad safetensors header: {other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use safetensors::tensor::TensorView;
    use serde_json::{json, Value};

    use super::*;

    type Tensor<'a> = (&'a str, Dtype, &'a [usize], Vec<u8>);

    fn le_bytes<T: Copy, const N: usize>(values: &[T], to_le: fn(T) -> [u8; N]) -> Vec<u8> {
        values.iter().flat_map(|v| to_le(*v)).collect()
    }

    fn f32_tensor<'a>(name: &'a str, shape: &'a [usize], values: &[f32]) -> Tensor<'a> {
        (name, Dtype::F32, shape, le_bytes(values, f32::to_le_bytes))
    }

    fn write_tensors(path: &Path, tensors: &[Tensor]) {
        let views = tensors.iter().map(|(name, dtype, shape, bytes)| {
            let view = TensorView::new(*dtype, shape.to_vec(), bytes).unwrap();
            (*name, view)
        });
        safetensors::serialize_to_file(views, &None, path).unwrap();
    }

    fn llama_config() -> Value {
        json!({
            "model_type": "llama", "vocab_size": 4, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 64,
            "tie_word_embeddings": false,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
        })
    }

    fn embed_values() -> Vec<f32> {
        (0..8).map(|i| i as f32 * 0.5 - 1.0).collect()
    }

    /// A checkpoint directory with `config` and `tensors` in `model.safetensors`.
    fn checkpoint_dir(config: &Value, tensors: &[Tensor]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(CONFIG_FILE), config.to_string()).unwrap();
        write_tensors(&dir.path().join(SINGLE_FILE), tensors);
        dir
    }

    fn llama_dir() -> tempfile::TempDir {
        let embed = f32_tensor("model.embed_tokens.weight", &[4, 2], &embed_values());
        let norm = f32_tensor("model.norm.weight", &[2], &[1.5, -2.0]);
        checkpoint_dir(&llama_config(), &[embed, norm])
    }

    fn open_err(dir: &Path) -> String {
        HfCheckpoint::open(dir).err().expect("open should fail").to_string()
    }

    fn assert_mentions(err: &str, parts: &[&str]) {
        assert!(parts.iter().all(|part| err.contains(part)), "{err} lacks one of {parts:?}");
    }

    #[test]
    fn test_open_single_file_reads_config_and_weights() {
        let dir = llama_dir();
        let ckpt = HfCheckpoint::open(dir.path()).unwrap();
        let config = ckpt.config();
        assert_eq!((config.num_kv_heads, config.head_dim), (1, 4));
        assert_eq!((config.rms_eps, config.rope_theta), (1e-5, 500000.0));
        assert!(!config.tie_embeddings && !config.attn_bias && !config.qk_norm);
        assert!(config.arch == "llama" && !config.rope_interleaved);
        let scaling = config.rope_scaling.as_ref().unwrap();
        assert_eq!((scaling.factor, scaling.original_max_position), (8.0, 32));
        let embed = ckpt.weight("model.embed_tokens.weight").unwrap();
        assert_eq!((embed.rows(), embed.cols()), (4, 2));
        assert_eq!(embed.to_f32(), embed_values());
        let norm = ckpt.weight("model.norm.weight").unwrap();
        assert_eq!((norm.rows(), norm.cols()), (1, 2));
        assert_eq!(norm.to_f32(), [1.5, -2.0]);
        assert!(ckpt.contains("model.norm.weight") && !ckpt.contains("lm_head.weight"));
        assert_eq!(ckpt.path(), dir.path());
    }

    #[test]
    fn test_open_sharded_reads_every_shard() {
        let dir = llama_dir();
        std::fs::remove_file(dir.path().join(SINGLE_FILE)).unwrap();
        let shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"];
        write_tensors(&dir.path().join(shards[0]), &[f32_tensor("a", &[1, 1], &[1.0])]);
        write_tensors(&dir.path().join(shards[1]), &[f32_tensor("b", &[1], &[2.0])]);
        let index = json!({"metadata": {}, "weight_map": {"a": shards[0], "b": shards[1]}});
        std::fs::write(dir.path().join(INDEX_FILE), index.to_string()).unwrap();
        let ckpt = HfCheckpoint::open(dir.path()).unwrap();
        assert_eq!(ckpt.weight("a").unwrap().to_f32(), [1.0]);
        assert_eq!(ckpt.weight("b").unwrap().to_f32(), [2.0]);
    }

    #[test]
    fn test_bf16_and_f16_convert_exactly() {
        let bf16_bits = [0x3f80u16, 0xc000, 0x0001, 0x7f7f, 0x8080, 0x3eab, 0x7f80];
        let f16_bits = [0x3c00u16, 0xc000, 0x7bff, 0x0001, 0x3555, 0xfc00];
        let f16_values = [1.0, -2.0, 65504.0, 5.960_464_5e-8, 0.333_251_95, f32::NEG_INFINITY];
        let bf16 = ("a", Dtype::BF16, &[7][..], le_bytes(&bf16_bits, u16::to_le_bytes));
        let f16 = ("b", Dtype::F16, &[1, 6][..], le_bytes(&f16_bits, u16::to_le_bytes));
        let dir = checkpoint_dir(&llama_config(), &[bf16, f16]);
        let ckpt = HfCheckpoint::open(dir.path()).unwrap();
        let got = ckpt.weight("a").unwrap().to_f32();
        let want = bf16_bits.map(|b| f32::from_bits((b as u32) << 16));
        assert_eq!(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want.map(f32::to_bits));
        assert_eq!(ckpt.weight("b").unwrap().to_f32(), f16_values);
    }

    #[test]
    fn test_qwen2_detects_bias_and_applies_defaults() {
        let mut config = llama_config();
        let fields = config.as_object_mut().unwrap();
        let defaulted = ["num_key_value_heads", "rope_theta", "rope_scaling", "rms_norm_eps"];
        for key in defaulted {
            fields.remove(key);
        }
        config["model_type"] = json!("qwen2");
        config["tie_word_embeddings"] = json!(true);
        let bias = f32_tensor("model.layers.0.self_attn.q_proj.bias", &[8], &[0.0; 8]);
        let dir = checkpoint_dir(&config, &[bias]);
        let config = HfCheckpoint::open(dir.path()).unwrap().config().clone();
        assert!(config.attn_bias && config.tie_embeddings && !config.qk_norm);
        assert_eq!((config.num_kv_heads, config.head_dim), (2, 4));
        assert_eq!((config.rope_theta, config.rms_eps), (10_000.0, 1e-6));
        assert_eq!(config.rope_scaling, None);
    }

    #[test]
    fn test_qwen3_detects_qk_norm_and_explicit_head_dim() {
        let mut config = llama_config();
        config["model_type"] = json!("qwen3");
        config["head_dim"] = json!(16);
        config["rope_scaling"] = json!(null);
        let norm = f32_tensor("model.layers.0.self_attn.q_norm.weight", &[16], &[1.0; 16]);
        let dir = checkpoint_dir(&config, &[norm]);
        let config = HfCheckpoint::open(dir.path()).unwrap().config().clone();
        assert!(config.qk_norm && !config.attn_bias);
        assert_eq!((config.head_dim, config.rope_scaling), (16, None));
    }

    #[test]
    fn test_transformers5_rope_parameters_are_read() {
        let mut config = llama_config();
        let mut rope = config["rope_scaling"].take();
        rope["rope_theta"] = json!(250000.0);
        config.as_object_mut().unwrap().remove("rope_theta");
        config["rope_parameters"] = rope;
        config["layer_types"] = json!(["full_attention"]);
        let ckpt = HfCheckpoint::open(checkpoint_dir(&config, &[]).path()).unwrap();
        assert_eq!(ckpt.config().rope_theta, 250000.0);
        assert_eq!(ckpt.config().rope_scaling.as_ref().map(|scaling| scaling.high_freq_factor), Some(4.0));
        config["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 1e6});
        let ckpt = HfCheckpoint::open(checkpoint_dir(&config, &[]).path()).unwrap();
        assert_eq!((ckpt.config().rope_theta, ckpt.config().rope_scaling.as_ref()), (1e6, None));
    }

    #[test]
    fn test_opens_the_committed_transformers_checkpoints() {
        let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/golden");
        let open = |shape: &str| HfCheckpoint::open(&golden.join(shape)).unwrap();
        let llama3 = open("tiny-llama3");
        let config = llama3.config();
        assert!(llama3.tensors.shards.len() > 1 && config.rope_scaling.is_some() && !config.tie_embeddings);
        assert_eq!((config.num_heads, config.num_kv_heads, config.head_dim, config.rope_theta), (4, 2, 16, 500000.0));
        let q = llama3.weight("model.layers.1.self_attn.q_proj.weight").unwrap();
        assert_eq!((q.rows(), q.cols()), (64, 64));
        let qwen2 = open("tiny-qwen2");
        let config = qwen2.config();
        assert!(config.attn_bias && config.tie_embeddings && !qwen2.contains("lm_head.weight"));
        let qwen3 = open("tiny-qwen3");
        assert!(qwen3.config().qk_norm && qwen3.config().head_dim == 32 && qwen3.config().num_layers == 3);
        let k_norm = qwen3.weight("model.layers.2.self_attn.k_norm.weight").unwrap();
        assert_eq!((k_norm.rows(), k_norm.cols()), (1, 32));
        let qwen3_moe = open("tiny-qwen3-moe");
        let moe = qwen3_moe.config().moe.clone().unwrap();
        assert_eq!((moe.num_experts, moe.num_experts_per_tok, moe.expert_intermediate_size), (16, 4, 32));
        assert!(moe.norm_topk_prob && !qwen3_moe.config().is_moe_layer(1) && qwen3_moe.config().is_moe_layer(2));
        assert!(qwen3_moe.contains("model.layers.2.mlp.experts.15.down_proj.weight"));
        let mixtral = open("tiny-mixtral");
        let moe = mixtral.config().moe.clone().unwrap();
        assert_eq!((moe.num_experts, moe.num_experts_per_tok, moe.expert_intermediate_size), (8, 2, 48));
        assert!(mixtral.contains("model.layers.1.block_sparse_moe.experts.7.w2.weight"));
        let llama2 = open("tiny-llama2");
        assert_eq!((llama2.config().num_kv_heads, llama2.config().rope_scaling.as_ref()), (4, None));
        assert_eq!(llama2.weight("lm_head.weight").unwrap().rows(), 512);
    }

    #[test]
    fn test_config_faults_name_the_file_and_the_fault() {
        let with = |key: &str, value: Value| {
            let mut config = llama_config();
            config[key] = value;
            config.to_string()
        };
        let cases = [
            ("{\"model_type\": ".into(), "bad JSON"),
            ("{\"model_type\": \"llama\"}".into(), "missing field `vocab_size`"),
            (with("model_type", json!("gpt2")), "model_type \"gpt2\""),
            (with("rope_scaling", json!({"rope_type": "yarn"})), "\"yarn\""),
            (with("rope_scaling", json!({"rope_type": "llama3"})), "missing `factor`"),
            (with("num_key_value_heads", json!(0)), "multiple of kv heads"),
            (with("num_key_value_heads", json!(-1)), "unexpected content"),
            (with("layer_types", json!(["sliding_attention"])), "full_attention"),
            (with("rope_scaling", json!({"full_attention": {"rope_type": "default"}})), "no rope_type"),
        ];
        let dir = llama_dir();
        for (text, fault) in cases {
            std::fs::write(dir.path().join(CONFIG_FILE), text).unwrap();
            assert_mentions(&open_err(dir.path()), &[CONFIG_FILE, fault]);
        }
        std::fs::remove_file(dir.path().join(CONFIG_FILE)).unwrap();
        assert!(open_err(dir.path()).contains(CONFIG_FILE));
    }

    #[test]
    fn test_missing_shard_names_the_shard() {
        let dir = llama_dir();
        std::fs::remove_file(dir.path().join(SINGLE_FILE)).unwrap();
        assert_mentions(&open_err(dir.path()), &["neither model.safetensors nor"]);
        let shard = "model-00001-of-00001.safetensors";
        let index = json!({"weight_map": {"model.norm.weight": shard}});
        std::fs::write(dir.path().join(INDEX_FILE), index.to_string()).unwrap();
        assert_mentions(&open_err(dir.path()), &[shard, "missing shard"]);
        let index = json!({"weight_map": {"model.norm.weight": "../model.safetensors"}});
        std::fs::write(dir.path().join(INDEX_FILE), index.to_string()).unwrap();
        assert!(open_err(dir.path()).contains("not a plain file name"));
    }

    #[test]
    fn test_unsupported_dtype_or_shape_names_file_and_tensor() {
        let ids = ("ids", Dtype::I64, &[1][..], vec![0; 8]);
        let dir = checkpoint_dir(&llama_config(), &[ids, f32_tensor("cube", &[1, 2, 1], &[0.0; 2])]);
        let ckpt = HfCheckpoint::open(dir.path()).unwrap();
        let err = ckpt.weight("ids").unwrap_err().to_string();
        assert_mentions(&err, &[SINGLE_FILE, "tensor ids", "I64"]);
        let err = ckpt.weight("cube").unwrap_err().to_string();
        assert_mentions(&err, &[SINGLE_FILE, "tensor cube", "not 1-D, 2-D or channels x 1 x taps"]);
    }

    #[test]
    fn test_truncated_file_names_the_file() {
        let dir = llama_dir();
        let path = dir.path().join(SINGLE_FILE);
        let bytes = std::fs::read(&path).unwrap();
        for len in [bytes.len() - 3, 20, 4] {
            std::fs::write(&path, &bytes[..len]).unwrap();
            assert_mentions(&open_err(dir.path()), &[SINGLE_FILE, "truncated"]);
        }
    }

    #[test]
    fn test_stacked_experts_read_as_per_expert_matrices() {
        // Two experts of [gate; up] 2+2 rows by 3 columns, and down 3 rows by 2 columns.
        let gate_up: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let down: Vec<f32> = (0..12).map(|v| -(v as f32)).collect();
        let tensors = [
            f32_tensor("model.layers.0.mlp.experts.gate_up_proj", &[2, 4, 3], &gate_up),
            f32_tensor("model.layers.0.mlp.experts.down_proj", &[2, 3, 2], &down),
        ];
        let ckpt = HfCheckpoint::open(checkpoint_dir(&llama_config(), &tensors).path()).unwrap();
        let read = |name: &str| ckpt.weight(&format!("model.layers.0.mlp.experts.{name}")).unwrap();
        assert_eq!(read("0.gate_proj.weight").to_f32(), gate_up[0..6]);
        assert_eq!(read("0.up_proj.weight").to_f32(), gate_up[6..12]);
        assert_eq!(read("1.gate_proj.weight").to_f32(), gate_up[12..18]);
        let up = read("1.up_proj.weight");
        assert_eq!((up.rows(), up.cols(), up.to_f32()), (2, 3, gate_up[18..24].to_vec()));
        let down1 = read("1.down_proj.weight");
        assert_eq!((down1.rows(), down1.cols(), down1.to_f32()), (3, 2, down[6..12].to_vec()));
        assert!(!ckpt.contains("model.layers.0.mlp.experts.2.down_proj.weight"));
    }

    #[test]
    fn test_malformed_stacked_experts_name_the_tensor() {
        let name = "model.layers.0.mlp.experts.gate_up_proj";
        let cases: [(&[usize], &str); 2] = [(&[2, 3, 2], "do not split into gate and up"), (&[12], "experts x rows")];
        for (shape, fault) in cases {
            let dir = checkpoint_dir(&llama_config(), &[f32_tensor(name, shape, &[0.0; 12])]);
            assert_mentions(&open_err(dir.path()), &[SINGLE_FILE, name, fault]);
        }
        let both = [
            f32_tensor(name, &[1, 2, 1], &[0.0; 2]),
            f32_tensor("model.layers.0.mlp.experts.0.up_proj.weight", &[1, 1], &[0.0]),
        ];
        let dir = checkpoint_dir(&llama_config(), &both);
        assert_mentions(&open_err(dir.path()), &[name, "also stored on its own"]);
    }

    #[test]
    fn test_missing_tensor_names_the_tensor() {
        let dir = llama_dir();
        let ckpt = HfCheckpoint::open(dir.path()).unwrap();
        let err = ckpt.weight("lm_head.weight").unwrap_err().to_string();
        assert_mentions(&err, &["missing tensor lm_head.weight"]);
    }
}

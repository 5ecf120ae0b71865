//! Opens a model by path: a `.gguf` file or a Hugging Face directory, with its tokenizer.

use std::path::Path;
use std::sync::Arc;

use tensorfold_kernels::cuda::Gpu;

use crate::checkpoint::gguf_model::GgufCheckpoint;
use crate::checkpoint::hf::HfCheckpoint;
use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::llama::cuda::{CudaLlama, CudaOptions, Sizing};
use crate::llama::Llama;
use crate::memory::Alloc;
use crate::text::tokenizer::Tokenizer;

/// A model ready to run: weights and tokenizer.
pub struct LoadedModel {
    pub name: String,
    pub llama: Llama,
    pub tokenizer: Tokenizer,
}

/// A model on the GPU: weights and tokenizer.
pub struct CudaModel {
    pub name: String,
    pub llama: CudaLlama,
    pub tokenizer: Tokenizer,
}

/// Loads weights and tokenizer; `progress(done, total)` follows the layers.
pub fn load(path: &Path, progress: &mut dyn FnMut(usize, usize)) -> Result<LoadedModel, LoadError> {
    let (name, ckpt, tokenizer) = open(path)?;
    Ok(LoadedModel { name, llama: Llama::load_with_progress(ckpt.as_ref(), progress)?, tokenizer })
}

/// Loads weights onto `gpu` through `alloc`, and the tokenizer.
pub fn load_cuda(
    path: &Path,
    gpu: Arc<Gpu>,
    sizing: Sizing,
    options: CudaOptions,
    alloc: &mut Alloc,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<CudaModel, LoadError> {
    let (name, ckpt, tokenizer) = open(path)?;
    Ok(CudaModel { name, llama: CudaLlama::load(ckpt.as_ref(), gpu, sizing, options, alloc, progress)?, tokenizer })
}

fn open(path: &Path) -> Result<(String, Box<dyn Checkpoint>, Tokenizer), LoadError> {
    let name = path.file_stem().map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    if path.is_dir() {
        let tokenizer = Tokenizer::from_hf_dir(path)?;
        let ckpt = HfCheckpoint::open(path)?;
        check_vocab(&ckpt, &tokenizer)?;
        return Ok((name, Box::new(ckpt), tokenizer));
    }
    if !path.exists() {
        return Err(LoadError::format(path, "no such file or directory"));
    }
    let ckpt = GgufCheckpoint::open(path)?;
    let tokenizer = Tokenizer::from_gguf(ckpt.file())?;
    check_vocab(&ckpt, &tokenizer)?;
    Ok((name, Box::new(ckpt), tokenizer))
}

/// Fails naming the architecture where `engine` cannot run its linear attention or mixture of experts yet.
pub fn refuse_moe(ckpt: &dyn Checkpoint, engine: &str) -> Result<(), LoadError> {
    if ckpt.config().hybrid.is_some() {
        let arch = &ckpt.config().arch;
        let fault = format!("{arch} is a hybrid linear-attention model, which {engine} cannot run yet");
        return Err(LoadError::format(ckpt.path(), fault));
    }
    match ckpt.config().moe {
        Some(_) => {
            let arch = &ckpt.config().arch;
            Err(LoadError::format(
                ckpt.path(),
                format!("{arch} is a mixture-of-experts model, which {engine} cannot run yet"),
            ))
        }
        None => Ok(()),
    }
}

/// The tokenizer may not produce ids the embedding lacks.
fn check_vocab(ckpt: &dyn Checkpoint, tok: &Tokenizer) -> Result<(), LoadError> {
    let vocab = ckpt.config().vocab_size;
    if tok.vocab_size() > vocab {
        let fault = format!("the tokenizer has {} tokens but the model's vocabulary is {vocab}", tok.vocab_size());
        return Err(LoadError::Tokenizer { path: ckpt.path().into(), fault });
    }
    Ok(())
}

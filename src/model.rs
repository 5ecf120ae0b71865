//! Opens a model by path: a `.gguf` file or a Hugging Face directory, with its tokenizer.

use std::path::Path;

use crate::checkpoint::Checkpoint;
use crate::error::LoadError;
use crate::gguf_model::GgufCheckpoint;
use crate::hf::HfCheckpoint;
use crate::llama::Llama;
use crate::tokenizer::Tokenizer;

/// A model ready to run: weights and tokenizer.
pub struct LoadedModel {
    pub name: String,
    pub llama: Llama,
    pub tokenizer: Tokenizer,
}

/// Loads weights and tokenizer; `progress(done, total)` follows the layers.
pub fn load(path: &Path, progress: &mut dyn FnMut(usize, usize)) -> Result<LoadedModel, LoadError> {
    let name = path.file_stem().map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    if path.is_dir() {
        let tokenizer = Tokenizer::from_hf_dir(path)?;
        let ckpt = HfCheckpoint::open(path)?;
        check_vocab(&ckpt, &tokenizer)?;
        return Ok(LoadedModel { name, llama: Llama::load_with_progress(&ckpt, progress)?, tokenizer });
    }
    if !path.exists() {
        return Err(LoadError::format(path, "no such file or directory"));
    }
    let ckpt = GgufCheckpoint::open(path)?;
    let tokenizer = Tokenizer::from_gguf(ckpt.file())?;
    check_vocab(&ckpt, &tokenizer)?;
    Ok(LoadedModel { name, llama: Llama::load_with_progress(&ckpt, progress)?, tokenizer })
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

//! Shared set-up for the integration tests: the default model, loaded once per test binary.

pub mod server;
use std::sync::OnceLock;

use tensorfold::model::LoadedModel;

/// The default SmolLM2 GGUF, fetched through the same code path as the CLI.
pub fn default_model() -> &'static LoadedModel {
    static MODEL: OnceLock<LoadedModel> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = tensorfold::fetch::default_model_path().expect("fetching the default model");
        tensorfold::model::load(&path, &mut |_, _| {}).expect("loading the default model")
    })
}

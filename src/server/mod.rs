//! The OpenAI-compatible HTTP layer; the only part of tensorfold that knows actix-web.

pub mod body;
pub mod error;
pub mod messages;
pub mod openapi;
pub mod responses;
pub mod routes;
#[cfg(test)]
mod routes_tests;
pub mod speech;
pub mod starting;
pub mod text;
pub mod turn;

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tensorfold_actors::request_types::{Event, SubmitError, ValidRequest};
use tensorfold_actors::runtime::{Limits, Runtime};
use tokio::sync::mpsc;

pub use error::ApiError;
pub use responses::Responses;
pub use routes::{app, app_over, configure, Slot};
pub use starting::Starting;

use tensorfold_engine::speech::speakers::Speakers;
use tensorfold_engine::text::grammar::Grammars;
use tensorfold_engine::text::tokenizer::Tokenizer;

/// What the handlers need from the runtime; `Runtime` is the one real implementation.
pub trait Backend: Clone + 'static {
    /// The limits of the registered model `model`.
    fn limits(&self, model: &str) -> Limits;
    /// Queues a text, speech or voice request on the model it names; dropping the receiver cancels it.
    fn submit(&self, request: ValidRequest) -> impl Future<Output = Result<mpsc::Receiver<Event>, SubmitError>>;
    fn is_ready(&self) -> bool;
    /// Every metric; the router-read names carry `model_name` as their label.
    fn metrics_text(&self, model_name: &str) -> impl Future<Output = String>;
}

impl Backend for Runtime {
    fn limits(&self, model: &str) -> Limits {
        // A model that is not registered fits nothing: every request would exceed a context of 0.
        Runtime::limits(self, model).unwrap_or(Limits { context: 0, max_waiting: 0, embeds: false })
    }

    fn submit(&self, request: ValidRequest) -> impl Future<Output = Result<mpsc::Receiver<Event>, SubmitError>> {
        Runtime::submit(self, request)
    }

    fn is_ready(&self) -> bool {
        Runtime::is_ready(self)
    }

    fn metrics_text(&self, model_name: &str) -> impl Future<Output = String> {
        Runtime::metrics_text(self, model_name)
    }
}

/// Everything a handler reads; shared by every worker.
#[derive(Clone)]
pub struct AppState<B = Runtime> {
    pub runtime: B,
    pub tokenizer: Arc<Tokenizer>,
    /// The text model's registered name, which replies carry whatever name the request used.
    pub model_name: String,
    /// When set, every route but `/health` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Unix seconds, reported as the model's `created`.
    pub created: u64,
    /// The speakers behind `/v1/audio/speech`; empty when no speech model is loaded.
    pub speakers: Arc<Speakers>,
    /// The text model's `response_format` compiler; its tables are built on the first grammar.
    pub grammars: Grammars,
    /// Stored and background responses of `/v1/responses`.
    pub responses: Arc<Responses>,
}

impl<B: Backend> AppState<B> {
    pub fn new(runtime: B, tokenizer: Arc<Tokenizer>, model_name: String, api_key: Option<String>) -> AppState<B> {
        let grammars = Grammars::new(Arc::clone(&tokenizer));
        let (speakers, responses) = (Arc::default(), Arc::default());
        AppState { runtime, tokenizer, model_name, api_key, created: unix_now(), speakers, grammars, responses }
    }

    /// The one rule of `model` on the text routes (chat, completions, embeddings): any name, or none, stands for
    /// the text model this server runs, and replies carry its name; a speech model's name is refused.
    pub fn text_model_for(&self, requested: Option<&str>) -> Result<&str, SubmitError> {
        match requested {
            Some(name) if name != self.model_name && self.speakers.names().any(|s| s == name) => {
                Err(SubmitError::WrongKind { model: name.to_string(), runs: "speech" })
            }
            _ => Ok(&self.model_name),
        }
    }
}

/// Where and how to listen.
#[derive(Clone)]
pub struct ServeConfig {
    pub host: String,
    /// 0 asks the OS for a free port; the bound one is printed.
    pub port: u16,
    /// Larger request bodies get a 413.
    pub max_body_bytes: usize,
    /// When set, every route but `/health` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// On SIGTERM or SIGINT, how long running requests have to finish.
    pub drain: Duration,
    /// Most time a client may take to send a request's head (408 after), its body (408), and between requests on
    /// a kept-alive connection (closed after).
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub keep_alive: Duration,
}

// By hand, so the key never reaches a log.
impl std::fmt::Debug for ServeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("drain", &self.drain)
            .field("header_timeout", &self.header_timeout)
            .field("body_timeout", &self.body_timeout)
            .field("keep_alive", &self.keep_alive)
            .finish()
    }
}

/// Hands the loaded models to the server `starting` runs, and serves until it is shut down.
pub async fn run(
    config: ServeConfig,
    starting: Starting,
    runtime: Runtime,
    tokenizer: Arc<Tokenizer>,
    model_name: String,
    speakers: Speakers,
    responses: Responses,
) -> std::io::Result<()> {
    let (speakers, responses) = (Arc::new(speakers), Arc::new(responses));
    let state = AppState::new(runtime, tokenizer, model_name, config.api_key);
    starting.serve(AppState { speakers, responses, ..state }).await
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// 64 unpredictable bits for ids and default seeds: std's per-process random hash keys over a counter.
pub(crate) fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    hasher.finish()
}

/// A word-level tokenizer small enough to write out in a test.
#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::{Arc, OnceLock};

    use tensorfold_engine::text::tokenizer::Tokenizer;

    const VOCAB: &[&str] = &["<s>", "</s>", "<unk>", "hello", "world", "user", "assistant", "system", ":"];
    const TEMPLATE: &str = "{% if messages[0].role == 'assistant' %}{{ raise_exception('conversations must start with \
        a user or system message') }}{% endif %}{% for m in messages %}{{ m.role }} : {{ m.content }} {% endfor %}\
        {% if add_generation_prompt %}assistant :{% endif %}";

    fn build() -> Tokenizer {
        let vocab: serde_json::Map<String, serde_json::Value> =
            VOCAB.iter().enumerate().map(|(id, t)| (t.to_string(), id.into())).collect();
        let special = |id: usize| {
            serde_json::json!({"id": id, "content": VOCAB[id], "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        };
        let tokenizer = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [special(0), special(1)],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
        });
        let config = serde_json::json!({"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": true,
            "chat_template": TEMPLATE});
        let dir = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(dir.path().join("tokenizer.json"), tokenizer.to_string()).expect("writes tokenizer.json");
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).expect("writes the config");
        Tokenizer::from_hf_dir(dir.path()).expect("the test tokenizer loads")
    }

    pub fn tokenizer() -> Arc<Tokenizer> {
        static TOKENIZER: OnceLock<Arc<Tokenizer>> = OnceLock::new();
        Arc::clone(TOKENIZER.get_or_init(|| Arc::new(build())))
    }
}

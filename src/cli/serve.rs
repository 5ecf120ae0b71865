//! `tensorfold serve`: the text model, the speech models and the default voice, registered by name, behind HTTP.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use tensorfold_actors::coordinator::Schedule;
use tensorfold_actors::runtime::{ModelKind, RuntimeConfig};
use tensorfold_engine::fetch::Fetcher;
use tensorfold_engine::llama::cuda::Sizing;
use tensorfold_engine::speech::speakers::{Speaker, Speakers};

use crate::carveout;
use crate::server::responses::store::{Store, StoreLimits};
use crate::server::{Responses, ServeConfig, Starting};
use crate::settings::cli::{MODEL, SERVE, SPEECH};
use crate::settings::{Key, Settings, TableArgs};
use crate::wiring::{
    context, draft_spec, drama, hibari_speaker, load, model_path, same_path, start_runtime, DramaLanes,
};

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub table: TableArgs<{ MODEL | SERVE | SPEECH }>,
}

pub fn serve(settings: &Settings) -> Result<()> {
    let size = |key| settings.size(key).expect("the table gives it a default");
    let seconds = |key| Duration::from_secs(settings.count(key).expect("the table gives it a default"));
    let (parallel, round_tokens, page_tokens) = (size(Key::Parallel), size(Key::RoundTokens), size(Key::PageTokens));
    let speech_model = settings.path(Key::SpeechModel);
    let memory_limit = settings.size(Key::MemoryLimit);
    let sizing = Sizing {
        max_tokens: round_tokens.max(parallel),
        max_lanes: parallel,
        context: settings.size(Key::Context).unwrap_or(4096),
    };
    let serve = ServeConfig {
        host: settings.text(Key::Host).unwrap_or("127.0.0.1").to_string(),
        port: settings.count(Key::Port).map_or(8000, |p| p as u16),
        max_body_bytes: size(Key::MaxBodyBytes),
        api_key: settings.text(Key::ApiKey).map(str::to_string),
        drain: seconds(Key::DrainSeconds),
        header_timeout: seconds(Key::HeaderTimeout),
        body_timeout: seconds(Key::BodyTimeout),
        keep_alive: seconds(Key::KeepAlive),
    };
    let request_timeout = settings.count(Key::RequestTimeout).map(Duration::from_secs);
    // Bound first, so probes and routers see 503 while the models load and a taken port fails at once.
    let starting = Starting::bind(&serve)?;
    // Claimed before the weights load, so a refusal is logged early; the lent memory waits for the KV pool.
    let lent = carveout::requested(settings).and_then(|request| carveout::open(&request));
    let model = load(settings, sizing, memory_limit)?;
    let context = context(settings, model.config().max_position)?;
    let draft = match settings.path(Key::DraftModel) {
        Some(path) => Some(draft_spec(&model, path, sizing, context, round_tokens)?),
        None => None,
    };
    // On a GPU the KV pages take what the ledger's cap leaves.
    let memory_limit = model.backend.memory_limit(memory_limit);
    let fetcher = settings.fetcher()?;
    let text_path = model_path(settings, &fetcher)?;
    let drama = match speech_model {
        Some(dir) => Some(drama(&model, dir, same_path(dir, &text_path), sizing, round_tokens, parallel)?),
        None => None,
    };
    let mut drafting = model.backend.drafting(settings.size(Key::DraftTokens));
    drafting.timed &= settings.is_on(Key::DraftTiming);
    let (text, tokenizer, device) = model.into_spec(context, round_tokens, parallel);
    let schedule = Schedule { round_tokens, parallel, max_waiting: size(Key::MaxWaiting), drafting };
    let prefix_cache_tokens = match settings.is_on(Key::PrefixCache) {
        true => settings.size(Key::PrefixCacheTokens).unwrap_or(usize::MAX),
        false => 0,
    };
    let kv_pages = settings.size(Key::KvPages);
    let cfg = RuntimeConfig { page_tokens, kv_pages, memory_limit, schedule, prefix_cache_tokens };
    let name = text.name.clone();
    let mut models: Vec<_> = std::iter::once(text).chain(draft).collect();
    let mut speakers = Speakers::default();
    if let Some((mut front, lanes)) = drama {
        tracing::info!(model = %front.model, voices = front.voices().names().join(","), "speech model loaded");
        match lanes {
            DramaLanes::Own(spec) => models.push(spec),
            DramaLanes::Shared(codec) => {
                front.model = name.clone();
                if let ModelKind::Tokens { codec: text_codec, .. } = &mut models[0].kind {
                    *text_codec = Some(codec);
                }
            }
        }
        speakers.push(Speaker::Drama(Arc::new(front)));
    }
    if !settings.is_on(Key::NoVoice) {
        let (spec, speaker) = hibari_speaker(&fetcher)?;
        tracing::info!(voices = speaker.voices().names().join(","), "default voice loaded");
        models.push(spec);
        speakers.push(speaker);
    }
    let responses = responses_store(settings, &fetcher)?;
    actix_web::rt::System::new().block_on(async move {
        let runtime = start_runtime(device, models, cfg, lent).await?.with_request_timeout(request_timeout);
        crate::server::run(serve, starting, runtime, Arc::new(tokenizer), name, speakers, responses).await?;
        Ok(())
    })
}

/// The response store the settings name: a file, the cache's by default, or none.
fn responses_store(settings: &Settings, fetcher: &Fetcher) -> Result<Responses> {
    let count = |key| settings.count(key).expect("the table gives it a default");
    let limits = StoreLimits {
        max_bytes: count(Key::ResponsesStoreMb) << 20,
        max_age_secs: count(Key::ResponsesStoreDays) * 86_400,
    };
    let path = match settings.text(Key::ResponsesStore) {
        Some("none") => return Ok(Responses::new(Store::off())),
        Some(path) => PathBuf::from(path),
        None => fetcher.cache_dir.join("responses.sqlite3"),
    };
    let store = Store::open(&path, limits).map_err(|e| anyhow::anyhow!("--responses-store: {e}"))?;
    Ok(Responses::new(store))
}

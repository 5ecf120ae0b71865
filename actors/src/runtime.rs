//! The handle the HTTP layer holds: submit a validated request, get its events; read metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::mpsc;

use std::collections::HashMap;

use tensorfold_engine::boundary::{Codec, EmbedWork, Engine, Output, Synth, TokenWork, VoiceInput, Work};
use tensorfold_lend::Lent;

use crate::coordinator::{Coordinator, Schedule};
use crate::memory::device::{cpu_driver, Adopt, Adoption, DeviceActor, Snapshot};
use crate::memory::kv::KvPages;
use crate::memory::kv_room::kv_room;
use crate::memory::ledger::{Ledger, MemoryKind};
use crate::messages::{Close, Enqueue, EnqueueEmbed, EnqueueVoice};
use crate::metrics::Metrics;
use crate::model_slot::ModelSlot;
use crate::request::{Abort, RequestActor, Stream};
use crate::request_types::{Event, SubmitError, ValidRequest};
use crate::round::ModelId;
use crate::runner::EngineRunner;
pub use crate::start_error::StartError;

/// Most audio windows a voice request may have queued for its client.
const MAX_VOICE_EVENTS: usize = 1 << 14;

/// Limits the HTTP layer validates against before submitting.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most positions one request may use, prompt plus generated tokens.
    pub context: usize,
    pub max_waiting: usize,
    /// Whether the model's engine returns hidden states, so it serves embeddings.
    pub embeds: bool,
}

/// How the runtime sizes its memory and schedules its rounds.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    pub page_tokens: usize,
    /// KV pages per model; by default each model's share of what the memory limit leaves, or enough for every lane.
    pub kv_pages: Option<usize>,
    /// Cap on device plus pinned host bytes.
    pub memory_limit: Option<usize>,
    pub schedule: Schedule,
    /// Positions each model's prefix cache may hold (at most its pool); 0 turns the cache off.
    pub prefix_cache_tokens: usize,
}

/// How a model runs its lanes.
pub enum ModelKind {
    /// Token lanes over a KV pool; a speech model's codec decodes its lanes' frames in the same rounds.
    Tokens { engine: Box<dyn Engine>, codec: Option<Box<dyn Codec>> },
    /// Voice lanes: a sentence step, then a window of audio per round.
    Voice(Box<dyn Synth>),
    /// A draft model of the token model named `target`, with the same vocabulary: requests do not name it; it
    /// drafts for the target's lanes in the same rounds.
    Draft { engine: Box<dyn Engine>, target: String },
}

/// One model the runtime serves; requests name it.
pub struct ModelSpec {
    /// The name requests use; unique among the runtime's models.
    pub name: String,
    pub kind: ModelKind,
    /// Most positions one request may use.
    pub context: usize,
    /// Bytes the loaded weights hold, accounted under the cap.
    pub weight_bytes: usize,
    /// Bytes reserved for one round's activations.
    pub activation_bytes: usize,
}

/// What a registered model runs, as requests are checked against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Runs {
    Tokens,
    Voice,
}

impl Runs {
    fn as_str(self) -> &'static str {
        match self {
            Runs::Tokens => "token lanes",
            Runs::Voice => "voice lanes",
        }
    }
}

/// A model as the runtime registered it.
#[derive(Clone, Copy, Debug)]
struct Registered {
    id: ModelId,
    runs: Runs,
    limits: Limits,
}

/// A cheap, cloneable handle to the running runtime.
#[derive(Clone)]
pub struct Runtime {
    models: Arc<HashMap<String, Registered>>,
    coordinator: Addr<Coordinator>,
    device: Addr<DeviceActor>,
    metrics: Arc<Metrics>,
    next_lane: Arc<AtomicU64>,
    /// How long a request may take, queued and running, before it ends with `EngineError::TimedOut`.
    request_timeout: Option<Duration>,
    /// Start-up accounting that lives as long as the runtime.
    _held: Arc<Vec<Adoption>>,
}

impl Runtime {
    /// Starts the device actor, allocates each model's KV pool through the ledger, and starts the coordinator.
    pub async fn start(models: Vec<ModelSpec>, cfg: RuntimeConfig) -> Result<Runtime, StartError> {
        Runtime::start_lent(models, cfg, None).await
    }

    /// As `start`, and the first token model's KV pool grows by the whole pages `lent` memory holds.
    pub async fn start_lent(
        models: Vec<ModelSpec>,
        cfg: RuntimeConfig,
        lent: Option<Lent>,
    ) -> Result<Runtime, StartError> {
        let device = DeviceActor::new(Ledger::new(cfg.memory_limit, cpu_driver())).start();
        Runtime::start_on_lent(device, models, cfg, lent).await
    }

    /// Starts on a running device actor, whose ledger may already hold the models' weights.
    pub async fn start_on(
        device: Addr<DeviceActor>,
        models: Vec<ModelSpec>,
        cfg: RuntimeConfig,
    ) -> Result<Runtime, StartError> {
        Runtime::start_on_lent(device, models, cfg, None).await
    }

    /// As `start_on`, with lent memory for the first token model's KV pool.
    pub async fn start_on_lent(
        device: Addr<DeviceActor>,
        models: Vec<ModelSpec>,
        cfg: RuntimeConfig,
        mut lent: Option<Lent>,
    ) -> Result<Runtime, StartError> {
        let gone = |_| StartError::DeviceGone;
        let mut names = std::collections::HashSet::new();
        if let Some(m) = models.iter().find(|m| !names.insert(m.name.as_str())) {
            return Err(StartError::DuplicateName(m.name.clone()));
        }
        let mut held = Vec::new();
        for m in &models {
            held.push(device.send(Adopt { kind: MemoryKind::Weights, bytes: m.weight_bytes }).await.map_err(gone)??);
            let bytes = m.activation_bytes;
            held.push(device.send(Adopt { kind: MemoryKind::Activations, bytes }).await.map_err(gone)??);
        }
        let fixed = device.send(Snapshot).await.map_err(gone)?.total_used;
        let num_models = models.len().max(1);
        let (mut slots, mut pages, mut registry) = (Vec::new(), Vec::new(), HashMap::new());
        let (mut drafts, mut vocabs, mut own_heads) = (Vec::new(), Vec::new(), Vec::new());
        for m in models {
            let mut limits = Limits { context: m.context, max_waiting: cfg.schedule.max_waiting, embeds: false };
            let (engine, target) = match m.kind {
                ModelKind::Tokens { engine, codec } => ((engine, codec), None),
                ModelKind::Draft { engine, target } => ((engine, None), Some(target)),
                ModelKind::Voice(voice) => {
                    registry.insert(m.name, Registered { id: slots.len(), runs: Runs::Voice, limits });
                    slots.push(ModelSlot::Voice(voice));
                    vocabs.push(0);
                    pages.push((0, cfg.page_tokens, false));
                    continue;
                }
            };
            limits.embeds = engine.0.embeds();
            let layout = engine.0.kv_layout(cfg.page_tokens);
            let page_bytes = layout.page_bytes();
            let num_pages = match (cfg.kv_pages, cfg.memory_limit) {
                (Some(n), _) => n,
                (None, Some(cap)) => {
                    let room = cap.saturating_sub(fixed) / num_models;
                    match room / page_bytes {
                        0 => return Err(StartError::NoRoom { room, page_bytes }),
                        n => n,
                    }
                }
                (None, None) => (cfg.schedule.parallel * m.context.min(2048)).max(m.context).div_ceil(cfg.page_tokens),
            };
            let lent = if target.is_none() { lent.take() } else { None };
            let room = kv_room(&device, layout, num_pages, lent).await?;
            let (pool, num_pages) = (room.pool, room.num_pages);
            held.extend(room.held);
            let snap = device.send(Snapshot).await.map_err(gone)?;
            tracing::info!(
                model = %m.name,
                weights_held = snap.used[MemoryKind::Weights],
                activations_held = snap.used[MemoryKind::Activations] + snap.used[MemoryKind::PinnedHost],
                kv_pages = num_pages,
                kv_lent_pages = room.num_lent_pages,
                kv_bytes = num_pages * page_bytes,
                kv_tokens = num_pages * cfg.page_tokens,
                "memory"
            );
            let vocab = engine.0.vocab_size();
            vocabs.push(vocab);
            own_heads.push((slots.len(), engine.0.has_draft_head()));
            // A draft model's pool keeps no prefix cache: its lanes catch up on their prompts in the rounds.
            pages.push((num_pages, cfg.page_tokens, target.is_none()));
            match target {
                Some(target) => drafts.push((m.name, target, slots.len(), vocab)),
                None => _ = registry.insert(m.name, Registered { id: slots.len(), runs: Runs::Tokens, limits }),
            }
            slots.push(ModelSlot::Tokens { engine: engine.0, pool, codec: engine.1 });
        }
        let mut draft_of = vec![None; slots.len()];
        for (draft, target, id, draft_vocab) in drafts {
            let found = registry.get(&target).filter(|r| r.runs == Runs::Tokens).map(|r| r.id);
            let Some(t) = found else { return Err(StartError::NoDraftTarget { draft, target }) };
            if vocabs[t] != draft_vocab {
                return Err(StartError::DraftVocabulary { draft, draft_vocab, target_vocab: vocabs[t] });
            }
            draft_of[t] = Some(id);
        }
        // A model with a draft head of its own drafts with it, unless a draft model was named for it.
        for (t, own) in own_heads {
            if own && draft_of[t].is_none() {
                draft_of[t] = Some(t);
            }
        }
        let drafting = cfg.schedule.drafting;
        let runner = EngineRunner::spawn(slots, if drafting.timed { drafting.tokens + 1 } else { 0 })?;
        let metrics = Arc::new(Metrics::default());
        let (schedule, m, cache_tokens) = (cfg.schedule, metrics.clone(), cfg.prefix_cache_tokens);
        let arbiter = Arbiter::new();
        let coordinator = Coordinator::start_in_arbiter(&arbiter.handle(), move |_| {
            let pool = |(n, t, caches): (usize, usize, bool)| KvPages::new(n, t, if caches { cache_tokens } else { 0 });
            Coordinator::new(runner, pages.into_iter().map(pool).collect(), draft_of, schedule, m)
        });
        Ok(Runtime {
            models: Arc::new(registry),
            coordinator,
            device,
            metrics,
            next_lane: Arc::new(AtomicU64::new(1)),
            request_timeout: None,
            _held: Arc::new(held),
        })
    }

    /// The runtime with every later request ending with `EngineError::TimedOut` once it has taken `limit`.
    pub fn with_request_timeout(self, limit: Option<Duration>) -> Runtime {
        Runtime { request_timeout: limit, ..self }
    }

    /// The limits of the model named `model`, or `None` if no such model is registered.
    pub fn limits(&self, model: &str) -> Option<Limits> {
        self.models.get(model).map(|m| m.limits)
    }

    /// Queues a request on the model it names; its events arrive on the receiver, and dropping the receiver cancels it.
    pub async fn submit(&self, request: ValidRequest) -> Result<mpsc::Receiver<Event>, SubmitError> {
        let Some(model) = self.models.get(&request.model).copied() else {
            return Err(SubmitError::NoModel(request.model));
        };
        let runs = match &request.work {
            Work::Tokens(_) | Work::Embed(_) => Runs::Tokens,
            Work::Voice(_) => Runs::Voice,
        };
        if runs != model.runs {
            return Err(SubmitError::WrongKind { model: request.model, runs: model.runs.as_str() });
        }
        if matches!(request.work, Work::Embed(_)) && !model.limits.embeds {
            return Err(SubmitError::Unsupported { model: request.model, what: "embeddings" });
        }
        let lane_id = self.next_lane.fetch_add(1, Ordering::Relaxed);
        match request.work {
            Work::Tokens(work) => self.submit_tokens(lane_id, model.id, work).await,
            Work::Voice(input) => self.submit_voice(lane_id, model.id, input).await,
            Work::Embed(work) => self.submit_embed(lane_id, model.id, work).await,
        }
    }

    async fn submit_tokens(
        &self,
        lane_id: u64,
        model: ModelId,
        work: TokenWork,
    ) -> Result<mpsc::Receiver<Event>, SubmitError> {
        let (events, receiver) = mpsc::channel(work.max_tokens + 4);
        let (stream, frames) = match work.output {
            Output::Text(decoder) => (Stream::Text { decoder, stop_strings: work.stop_strings }, None),
            Output::Speech(frames) => (Stream::Speech, Some(frames)),
        };
        let actor = self.start_actor(lane_id, work.prompt.len(), stream, events);
        let enqueue = Enqueue {
            lane_id,
            model,
            prompt: work.prompt,
            max_tokens: work.max_tokens,
            sampling: work.sampling,
            stop_ids: work.stop_ids,
            logprobs: work.logprobs,
            cache: work.cache,
            keep_reply: work.keep_reply,
            draft: work.draft,
            rules: Arc::new(work.rules),
            constraint: work.constraint,
            frames,
            to: actor.clone().recipient(),
            pcm: actor.clone().recipient(),
            failed: actor.clone().recipient(),
        };
        queued(&actor, self.coordinator.send(enqueue).await, receiver)
    }

    async fn submit_voice(
        &self,
        lane_id: u64,
        model: ModelId,
        input: VoiceInput,
    ) -> Result<mpsc::Receiver<Event>, SubmitError> {
        let num_ids = input.chunks.iter().map(Vec::len).sum();
        // Windows are not known in advance; this bounds the audio a slow client can leave unread.
        let (events, receiver) = mpsc::channel(MAX_VOICE_EVENTS);
        let actor = self.start_actor(lane_id, num_ids, Stream::Voice, events);
        let enqueue = EnqueueVoice { lane_id, model, input, to: actor.clone().recipient() };
        queued(&actor, self.coordinator.send(enqueue).await, receiver)
    }

    /// An embedding lane: its prompt's hidden states pooled into one vector, sent as the one event.
    async fn submit_embed(
        &self,
        lane_id: u64,
        model: ModelId,
        work: EmbedWork,
    ) -> Result<mpsc::Receiver<Event>, SubmitError> {
        let (events, receiver) = mpsc::channel(2);
        let actor = self.start_actor(lane_id, work.prompt.len(), Stream::Embed, events);
        let (prompt, cache, to) = (work.prompt, work.cache, actor.clone().recipient());
        queued(&actor, self.coordinator.send(EnqueueEmbed { lane_id, model, prompt, cache, to }).await, receiver)
    }

    /// Starts lane `lane_id`'s request actor, ended by the runtime's request timeout if it has one.
    fn start_actor(
        &self,
        lane_id: u64,
        prompt_tokens: usize,
        stream: Stream,
        events: mpsc::Sender<Event>,
    ) -> Addr<RequestActor> {
        let (coordinator, metrics) = (self.coordinator.clone(), self.metrics.clone());
        let actor = RequestActor::new(lane_id, prompt_tokens, stream, events, coordinator.recipient(), metrics);
        actor.with_deadline(self.request_timeout).start()
    }

    /// Whether the model is loaded and the coordinator is running.
    pub fn is_ready(&self) -> bool {
        self.coordinator.connected() && self.device.connected()
    }

    /// Whether any request is running or waiting for a lane.
    pub fn is_busy(&self) -> bool {
        self.metrics.requests_running() + self.metrics.requests_waiting() > 0
    }

    /// Refuses every later request and ends every queued and running one with `EngineError::ShuttingDown`.
    pub async fn close(&self) {
        let _ = self.coordinator.send(Close).await;
    }

    /// Every metric in Prometheus text format: ours, then vLLM's names labelled with `model_name`.
    pub async fn metrics_text(&self, model_name: &str) -> String {
        match self.device.send(Snapshot).await {
            Ok(ledger) => self.metrics.render(&ledger) + &self.metrics.render_vllm(model_name),
            Err(_) => String::new(),
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

/// The events' receiver once the coordinator queued the lane; otherwise the request's actor stops and the refusal
/// (or `Closed`, when the coordinator is gone) comes back.
fn queued(
    actor: &Addr<RequestActor>,
    sent: Result<Result<(), SubmitError>, MailboxError>,
    receiver: mpsc::Receiver<Event>,
) -> Result<mpsc::Receiver<Event>, SubmitError> {
    let result = sent.unwrap_or(Err(SubmitError::Closed));
    if result.is_err() {
        actor.do_send(Abort);
    }
    result.map(|()| receiver)
}

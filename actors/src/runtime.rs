//! The handle the HTTP layer holds: submit a validated request, get its events; read metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::mpsc;

use crate::coordinator::{Coordinator, Enqueue, Schedule};
use crate::device::{cpu_driver, Adopt, Adoption, Allocate, DeviceActor, Snapshot};
use crate::engine::{Codec, Engine, KvPool, ModelId};
use crate::kv::PagePool;
use crate::ledger::{Ledger, LedgerError, MemoryKind};
use crate::metrics::Metrics;
use crate::request::{Abort, RequestActor};
use crate::request_types::{Event, SubmitError, ValidRequest};
use crate::runner::{EngineRunner, ModelSlot};
use crate::voice::{EnqueueVoice, Voice, VoiceInput};

/// Most audio windows a voice request may have queued for its client.
const MAX_VOICE_EVENTS: usize = 1 << 14;

/// Limits the HTTP layer validates against before submitting.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most positions one request may use, prompt plus generated tokens.
    pub context: usize,
    pub max_waiting: usize,
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
}

/// How a model runs its lanes.
pub enum ModelKind {
    /// Token lanes over a KV pool; a speech model's codec decodes its lanes' frames in the same rounds.
    Tokens { engine: Box<dyn Engine>, codec: Option<Box<dyn Codec>> },
    /// Voice lanes: a sentence step, then a window of audio per round.
    Voice(Box<dyn Voice>),
}

/// One model the runtime serves; lanes name it by its index in the list.
pub struct ModelSpec {
    pub kind: ModelKind,
    /// Most positions one request may use.
    pub context: usize,
    /// Bytes the loaded weights hold, accounted under the cap.
    pub weight_bytes: usize,
    /// Bytes reserved for one round's activations.
    pub activation_bytes: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("memory: {0}")]
    Memory(#[from] LedgerError),
    #[error("no room for KV pages: the memory limit leaves {room} bytes and one page needs {page_bytes}")]
    NoRoom { room: usize, page_bytes: usize },
    #[error("starting the engine thread: {0}")]
    Io(#[from] std::io::Error),
    #[error("the device actor stopped during start-up")]
    DeviceGone,
}

/// A cheap, cloneable handle to the running runtime.
#[derive(Clone)]
pub struct Runtime {
    limits: Arc<Vec<Limits>>,
    coordinator: Addr<Coordinator>,
    device: Addr<DeviceActor>,
    metrics: Arc<Metrics>,
    next_lane: Arc<AtomicU64>,
    /// Start-up accounting that lives as long as the runtime.
    _held: Arc<Vec<Adoption>>,
}

impl Runtime {
    /// Starts the device actor, allocates each model's KV pool through the ledger, and starts the coordinator.
    pub async fn start(models: Vec<ModelSpec>, cfg: RuntimeConfig) -> Result<Runtime, StartError> {
        let device = DeviceActor::new(Ledger::new(cfg.memory_limit, cpu_driver())).start();
        Runtime::start_on(device, models, cfg).await
    }

    /// Starts on a running device actor, whose ledger may already hold the models' weights.
    pub async fn start_on(
        device: Addr<DeviceActor>,
        models: Vec<ModelSpec>,
        cfg: RuntimeConfig,
    ) -> Result<Runtime, StartError> {
        let gone = |_| StartError::DeviceGone;
        let mut held = Vec::new();
        for m in &models {
            held.push(device.send(Adopt { kind: MemoryKind::Weights, bytes: m.weight_bytes }).await.map_err(gone)??);
            let bytes = m.activation_bytes;
            held.push(device.send(Adopt { kind: MemoryKind::Activations, bytes }).await.map_err(gone)??);
        }
        let fixed = device.send(Snapshot).await.map_err(gone)?.total_used;
        let num_models = models.len().max(1);
        let (mut slots, mut pages, mut limits) = (Vec::new(), Vec::new(), Vec::new());
        let mut is_voice = Vec::new();
        for m in models {
            let engine = match m.kind {
                ModelKind::Tokens { engine, codec } => (engine, codec),
                ModelKind::Voice(voice) => {
                    slots.push(ModelSlot::Voice(voice));
                    pages.push((0, cfg.page_tokens));
                    limits.push(Limits { context: m.context, max_waiting: cfg.schedule.max_waiting });
                    is_voice.push(true);
                    continue;
                }
            };
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
            let floats = num_pages * layout.page_floats();
            let keys = device.send(Allocate { kind: MemoryKind::KvCache, bytes: floats * 4 }).await.map_err(gone)??;
            let values =
                device.send(Allocate { kind: MemoryKind::KvCache, bytes: floats * 4 }).await.map_err(gone)??;
            let pool = match keys.is_host_addressable() {
                true => KvPool::with_storage(layout, num_pages, Box::new(keys), Box::new(values)),
                false => {
                    let ptrs = [keys.ptr().0, values.ptr().0];
                    KvPool::on_device(layout, num_pages, Box::new(keys), Box::new(values), ptrs)
                }
            };
            let snap = device.send(Snapshot).await.map_err(gone)?;
            tracing::info!(
                model = slots.len(),
                weights_held = snap.used[MemoryKind::Weights],
                activations_held = snap.used[MemoryKind::Activations] + snap.used[MemoryKind::PinnedHost],
                kv_pages = num_pages,
                kv_bytes = num_pages * page_bytes,
                kv_tokens = num_pages * cfg.page_tokens,
                "memory"
            );
            slots.push(ModelSlot::Tokens { engine: engine.0, pool, codec: engine.1 });
            pages.push((num_pages, cfg.page_tokens));
            limits.push(Limits { context: m.context, max_waiting: cfg.schedule.max_waiting });
            is_voice.push(false);
        }
        let runner = EngineRunner::spawn(slots)?;
        let metrics = Arc::new(Metrics::default());
        let (schedule, m) = (cfg.schedule, metrics.clone());
        let arbiter = Arbiter::new();
        let coordinator = Coordinator::start_in_arbiter(&arbiter.handle(), move |_| {
            let pools = pages.into_iter().map(|(n, t)| PagePool::new(n, t)).collect();
            Coordinator::new(runner, pools, is_voice, schedule, m)
        });
        Ok(Runtime {
            limits: Arc::new(limits),
            coordinator,
            device,
            metrics,
            next_lane: Arc::new(AtomicU64::new(1)),
            _held: Arc::new(held),
        })
    }

    /// The limits of model `model`, or `None` if no such model is loaded.
    pub fn limits(&self, model: ModelId) -> Option<Limits> {
        self.limits.get(model).copied()
    }

    /// Queues a request; its events arrive on the receiver, and dropping the receiver cancels it.
    pub async fn submit(&self, request: ValidRequest) -> Result<mpsc::Receiver<Event>, SubmitError> {
        let lane_id = self.next_lane.fetch_add(1, Ordering::Relaxed);
        let (events, receiver) = mpsc::channel(request.max_tokens + 4);
        let actor = RequestActor::new(
            lane_id,
            request.model,
            request.prompt.len(),
            request.output,
            request.stop_strings,
            events,
            self.coordinator.clone(),
            self.metrics.clone(),
        )
        .start();
        let enqueue = Enqueue {
            lane_id,
            model: request.model,
            prompt: request.prompt,
            max_tokens: request.max_tokens,
            sampling: request.sampling,
            stop_ids: request.stop_ids,
            logprobs: request.logprobs,
            to: actor.clone().recipient(),
            failed: actor.clone().recipient(),
        };
        let result = match self.coordinator.send(enqueue).await {
            Ok(result) => result,
            Err(_) => Err(SubmitError::Closed),
        };
        if result.is_err() {
            actor.do_send(Abort);
        }
        result.map(|()| receiver)
    }

    /// Queues a voice request on voice model `model`; its audio arrives as events, and dropping the receiver cancels it.
    pub async fn submit_voice(&self, model: ModelId, input: VoiceInput) -> Result<mpsc::Receiver<Event>, SubmitError> {
        let lane_id = self.next_lane.fetch_add(1, Ordering::Relaxed);
        let num_ids = input.chunks.iter().map(Vec::len).sum();
        // Windows are not known in advance; this bounds the audio a slow client can leave unread.
        let (events, receiver) = mpsc::channel(MAX_VOICE_EVENTS);
        let actor = RequestActor::new_voice(lane_id, num_ids, events, self.coordinator.clone(), self.metrics.clone());
        let actor = actor.start();
        let enqueue = EnqueueVoice { lane_id, model, input, to: actor.clone().recipient() };
        let result = match self.coordinator.send(enqueue).await {
            Ok(result) => result,
            Err(_) => Err(SubmitError::Closed),
        };
        if result.is_err() {
            actor.do_send(Abort);
        }
        result.map(|()| receiver)
    }

    /// Whether the model is loaded and the coordinator is running.
    pub fn is_ready(&self) -> bool {
        self.coordinator.connected() && self.device.connected()
    }

    /// Every metric in Prometheus text format.
    pub async fn metrics_text(&self) -> String {
        match self.device.send(Snapshot).await {
            Ok(ledger) => self.metrics.render(&ledger),
            Err(_) => String::new(),
        }
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

//! The handle the HTTP layer holds: submit a validated request, get its events; read metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::mpsc;

use crate::coordinator::{Coordinator, Enqueue, Schedule};
use crate::device::{cpu_driver, Adopt, Adoption, Allocate, DeviceActor, Snapshot};
use crate::engine::{Engine, KvPool};
use crate::kv::PagePool;
use crate::ledger::{Ledger, LedgerError, MemoryKind};
use crate::metrics::Metrics;
use crate::request::{Abort, RequestActor};
use crate::request_types::{Event, SubmitError, ValidRequest};
use crate::runner::EngineRunner;

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
    /// KV pages to allocate; by default what the memory limit leaves, or enough for every lane's context.
    pub kv_pages: Option<usize>,
    /// Cap on device plus pinned host bytes.
    pub memory_limit: Option<usize>,
    pub schedule: Schedule,
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
    limits: Limits,
    coordinator: Addr<Coordinator>,
    device: Addr<DeviceActor>,
    metrics: Arc<Metrics>,
    next_lane: Arc<AtomicU64>,
    /// Start-up accounting that lives as long as the runtime.
    _held: Arc<Vec<Adoption>>,
}

impl Runtime {
    /// Starts the device actor, allocates the KV pool through the ledger, and starts the coordinator.
    pub async fn start(engine: Box<dyn Engine>, cfg: RuntimeConfig) -> Result<Runtime, StartError> {
        let device = DeviceActor::new(Ledger::new(cfg.memory_limit, cpu_driver())).start();
        let gone = |_| StartError::DeviceGone;
        let weights =
            device.send(Adopt { kind: MemoryKind::Weights, bytes: cfg.weight_bytes }).await.map_err(gone)??;
        let activations =
            device.send(Adopt { kind: MemoryKind::Activations, bytes: cfg.activation_bytes }).await.map_err(gone)??;
        let layout = engine.kv_layout(cfg.page_tokens);
        let page_bytes = layout.page_bytes();
        let num_pages = match (cfg.kv_pages, cfg.memory_limit) {
            (Some(n), _) => n,
            (None, Some(cap)) => {
                let room = cap.saturating_sub(cfg.weight_bytes + cfg.activation_bytes);
                match room / page_bytes {
                    0 => return Err(StartError::NoRoom { room, page_bytes }),
                    n => n,
                }
            }
            (None, None) => (cfg.schedule.parallel * cfg.context.min(2048)).max(cfg.context).div_ceil(cfg.page_tokens),
        };
        let floats = num_pages * layout.page_floats();
        let keys = device.send(Allocate { kind: MemoryKind::KvCache, bytes: floats * 4 }).await.map_err(gone)??;
        let values = device.send(Allocate { kind: MemoryKind::KvCache, bytes: floats * 4 }).await.map_err(gone)??;
        let pool = KvPool::with_storage(layout, num_pages, Box::new(keys), Box::new(values));
        tracing::info!(
            weight_bytes = cfg.weight_bytes,
            activation_bytes = cfg.activation_bytes,
            kv_pages = num_pages,
            kv_bytes = num_pages * page_bytes,
            kv_tokens = num_pages * cfg.page_tokens,
            "memory"
        );
        let runner = EngineRunner::spawn(engine, pool)?;
        let metrics = Arc::new(Metrics::default());
        let (schedule, page_tokens, m) = (cfg.schedule, cfg.page_tokens, metrics.clone());
        let arbiter = Arbiter::new();
        let coordinator = Coordinator::start_in_arbiter(&arbiter.handle(), move |_| {
            Coordinator::new(runner, PagePool::new(num_pages, page_tokens), schedule, m)
        });
        Ok(Runtime {
            limits: Limits { context: cfg.context, max_waiting: cfg.schedule.max_waiting },
            coordinator,
            device,
            metrics,
            next_lane: Arc::new(AtomicU64::new(1)),
            _held: Arc::new(vec![weights, activations]),
        })
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Queues a request; its events arrive on the receiver, and dropping the receiver cancels it.
    pub async fn submit(&self, request: ValidRequest) -> Result<mpsc::Receiver<Event>, SubmitError> {
        let lane_id = self.next_lane.fetch_add(1, Ordering::Relaxed);
        let (events, receiver) = mpsc::channel(request.max_tokens + 4);
        let actor = RequestActor::new(
            lane_id,
            request.prompt.len(),
            request.decoder,
            request.stop_strings,
            events,
            self.coordinator.clone(),
            self.metrics.clone(),
        )
        .start();
        let enqueue = Enqueue {
            lane_id,
            prompt: request.prompt,
            max_tokens: request.max_tokens,
            sampling: request.sampling,
            stop_ids: request.stop_ids,
            logprobs: request.logprobs,
            to: actor.clone().recipient(),
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

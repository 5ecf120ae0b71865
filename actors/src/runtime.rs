//! The handle the HTTP layer holds: submit a validated request, get its events; read metrics.

use tokio::sync::mpsc;

use crate::request_types::{Event, SubmitError, ValidRequest};

/// Limits the HTTP layer validates against before submitting.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most positions one request may use, prompt plus generated tokens.
    pub context: usize,
    pub max_waiting: usize,
}

/// A cheap, cloneable handle to the running runtime.
#[derive(Clone)]
pub struct Runtime {
    limits: Limits,
}

impl Runtime {
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Queues a request; its events arrive on the receiver, and dropping the receiver cancels it.
    pub async fn submit(&self, request: ValidRequest) -> Result<mpsc::Receiver<Event>, SubmitError> {
        let _ = request;
        todo!()
    }

    /// Whether the model is loaded and the coordinator is running.
    pub fn is_ready(&self) -> bool {
        todo!()
    }

    /// Every metric in Prometheus text format.
    pub async fn metrics_text(&self) -> String {
        todo!()
    }
}

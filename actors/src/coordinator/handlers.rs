//! What the coordinator is sent: requests to queue, lanes to release, and the close that ends them all.

use actix::prelude::*;
use tensorfold_engine::boundary::EngineError;

use super::{Coordinator, Enqueue, EnqueueEmbed, EnqueueVoice};
use crate::embed::EmbedRequest;
use crate::messages::{LaneFailed, Release};
use crate::request_types::SubmitError;
use crate::round::ModelId;
use crate::voice::VoiceRequest;

/// Shutdown: refuses every later request, and ends every queued and running one with `EngineError::ShuttingDown`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Close;

impl Coordinator {
    /// Whether a request may wait for a lane: the coordinator is open, `positions` on the model fit its KV pool
    /// when given, and the queue has room.
    fn may_queue(&self, positions: Option<(ModelId, usize)>) -> Result<(), SubmitError> {
        if self.closed {
            return Err(SubmitError::Closed);
        }
        if let Some((model, positions)) = positions {
            let pages = &self.pages[model];
            let needed = pages.pages_for(positions);
            if needed > pages.num_total() {
                return Err(SubmitError::TooLarge { needed, total: pages.num_total() });
            }
        }
        if self.num_waiting() >= self.schedule.max_waiting {
            return Err(SubmitError::QueueFull(self.num_waiting()));
        }
        Ok(())
    }
}

impl Handler<Enqueue> for Coordinator {
    type Result = Result<(), SubmitError>;

    fn handle(&mut self, msg: Enqueue, ctx: &mut Context<Self>) -> Self::Result {
        self.may_queue(Some((msg.model, msg.prompt.len() + msg.max_tokens)))?;
        self.metrics.inc_requests();
        self.waiting.push_back(msg);
        self.tick(ctx);
        Ok(())
    }
}

impl Handler<EnqueueVoice> for Coordinator {
    type Result = Result<(), SubmitError>;

    fn handle(&mut self, msg: EnqueueVoice, ctx: &mut Context<Self>) -> Self::Result {
        self.may_queue(None)?;
        self.metrics.inc_requests();
        self.voices.enqueue(VoiceRequest { lane_id: msg.lane_id, model: msg.model, input: msg.input, to: msg.to });
        self.tick(ctx);
        Ok(())
    }
}

impl Handler<Release> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Release, ctx: &mut Context<Self>) {
        self.waiting.retain(|r| r.lane_id != msg.lane_id);
        self.lanes.retain(|l| l.request.lane_id != msg.lane_id);
        self.codec.retain(|w| w.lane_id != msg.lane_id);
        self.voices.release(msg.lane_id);
        self.embeds.release(msg.lane_id);
        self.publish();
        self.tick(ctx);
    }
}

impl Handler<EnqueueEmbed> for Coordinator {
    type Result = Result<(), SubmitError>;

    fn handle(&mut self, msg: EnqueueEmbed, ctx: &mut Context<Self>) -> Self::Result {
        self.may_queue(Some((msg.model, msg.prompt.len())))?;
        self.metrics.inc_requests();
        let EnqueueEmbed { lane_id, model, prompt, cache, to } = msg;
        self.embeds.enqueue(EmbedRequest { lane_id, model, prompt, cache, to });
        self.tick(ctx);
        Ok(())
    }
}

impl Handler<Close> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: Close, _: &mut Context<Self>) {
        self.closed = true;
        let why = EngineError::ShuttingDown;
        tracing::info!(running = self.num_running(), waiting = self.num_waiting(), "ending every request");
        let mut outbox = self.fail_all(&why);
        for request in self.waiting.drain(..) {
            outbox.failed.push((request.failed, LaneFailed { error: why.clone() }));
        }
        self.voices.fail_waiting(&why);
        self.embeds.fail_waiting(&why);
        self.publish();
        outbox.send();
    }
}

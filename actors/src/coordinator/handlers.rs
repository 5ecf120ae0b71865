//! What the coordinator is sent: requests to queue, lanes to release, and the close that ends them all.

use actix::prelude::*;
use tensorfold_engine::boundary::EngineError;

use super::Coordinator;
use crate::messages::{Close, Enqueue, EnqueueEmbed, EnqueueVoice, Release};
use crate::request_types::SubmitError;
use crate::round::ModelId;

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
        self.books.tokens.enqueue(msg);
        self.tick(ctx);
        Ok(())
    }
}

impl Handler<EnqueueVoice> for Coordinator {
    type Result = Result<(), SubmitError>;

    fn handle(&mut self, msg: EnqueueVoice, ctx: &mut Context<Self>) -> Self::Result {
        self.may_queue(None)?;
        self.metrics.inc_requests();
        self.books.voices.enqueue(msg);
        self.tick(ctx);
        Ok(())
    }
}

impl Handler<EnqueueEmbed> for Coordinator {
    type Result = Result<(), SubmitError>;

    fn handle(&mut self, msg: EnqueueEmbed, ctx: &mut Context<Self>) -> Self::Result {
        self.may_queue(Some((msg.model, msg.prompt.len())))?;
        self.metrics.inc_requests();
        self.books.embeds.enqueue(msg);
        self.tick(ctx);
        Ok(())
    }
}

impl Handler<Release> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Release, ctx: &mut Context<Self>) {
        for book in self.books.all() {
            book.release(msg.lane_id);
        }
        self.publish();
        self.tick(ctx);
    }
}

impl Handler<Close> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: Close, _: &mut Context<Self>) {
        self.closed = true;
        let why = EngineError::ShuttingDown;
        tracing::info!(running = self.num_running(), waiting = self.num_waiting(), "ending every request");
        let mut outbox = self.fail_all(&why);
        for book in self.books.all() {
            book.fail_waiting(&why, &mut outbox);
        }
        self.publish();
        outbox.send();
    }
}

//! The request actor: one per request; turns its lane's tokens into text events and stops with its client.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use tokio::sync::mpsc;

use crate::coordinator::{Coordinator, LaneToken, Release};
use crate::metrics::Metrics;
use crate::request_types::{Event, FinishReason, TextDecoder, Usage};
use crate::stop::StopMatcher;

/// Ends a request that was never admitted.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Abort;

pub struct RequestActor {
    lane_id: u64,
    decoder: Box<dyn TextDecoder>,
    stops: StopMatcher,
    events: mpsc::Sender<Event>,
    coordinator: Addr<Coordinator>,
    usage: Usage,
    submitted: Instant,
    last_token: Option<Instant>,
    metrics: Arc<Metrics>,
}

impl RequestActor {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        lane_id: u64,
        prompt_tokens: usize,
        decoder: Box<dyn TextDecoder>,
        stop_strings: Vec<String>,
        events: mpsc::Sender<Event>,
        coordinator: Addr<Coordinator>,
        metrics: Arc<Metrics>,
    ) -> RequestActor {
        RequestActor {
            lane_id,
            decoder,
            stops: StopMatcher::new(stop_strings),
            events,
            coordinator,
            usage: Usage { prompt_tokens, completion_tokens: 0 },
            submitted: Instant::now(),
            last_token: None,
            metrics,
        }
    }

    /// Sends an event; a closed stream means the client left, so the actor stops.
    fn send(&mut self, event: Event, ctx: &mut Context<Self>) {
        if self.events.try_send(event).is_err() {
            ctx.stop();
        }
    }

    fn finish(&mut self, finish: FinishReason, ctx: &mut Context<Self>) {
        self.send(Event::Done { finish, usage: self.usage }, ctx);
        ctx.stop();
    }

    fn observe_latency(&mut self) {
        let now = Instant::now();
        match self.last_token {
            None => self.metrics.observe_ttft((now - self.submitted).as_secs_f64()),
            Some(last) => self.metrics.observe_itl((now - last).as_secs_f64()),
        }
        self.last_token = Some(now);
    }
}

impl Actor for RequestActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // The receiver is dropped when the client disconnects, also during a long prefill.
        let events = self.events.clone();
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(async move { events.closed().await })
                .map(|(), _: &mut Self, ctx| ctx.stop()),
        );
    }

    fn stopping(&mut self, _: &mut Context<Self>) -> Running {
        self.coordinator.do_send(Release { lane_id: self.lane_id });
        Running::Stop
    }
}

impl Handler<LaneToken> for RequestActor {
    type Result = ();

    fn handle(&mut self, msg: LaneToken, ctx: &mut Context<Self>) {
        self.observe_latency();
        self.usage.completion_tokens += 1;
        let mut text = if msg.is_stop_token { String::new() } else { self.decoder.push(msg.id) };
        if msg.finish.is_some() {
            text.push_str(&self.decoder.finish());
        }
        let mut released = self.stops.push(&text);
        if msg.finish.is_some() && !released.stopped {
            released.text.push_str(&self.stops.finish());
        }
        self.send(Event::Token { id: msg.id, text: released.text, logprob: msg.logprob }, ctx);
        if released.stopped {
            self.finish(FinishReason::Stop, ctx);
        } else if let Some(finish) = msg.finish {
            self.finish(finish, ctx);
        }
    }
}

impl Handler<Abort> for RequestActor {
    type Result = ();

    fn handle(&mut self, _: Abort, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

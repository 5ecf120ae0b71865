//! The request actor: one per request; turns its lane's tokens into text or audio events and stops with its client.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tensorfold_engine::boundary::{EngineError, TextDecoder};
use tokio::sync::mpsc;

use crate::messages::{LaneEmbedding, LaneFailed, LanePcm, LaneToken, Release, VoiceAudio};
use crate::metrics::Metrics;
use crate::request_types::{Event, FinishReason, Usage};
use crate::stop::StopMatcher;

/// Ends a request that was never admitted.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Abort;

/// A speech request's audio: windows decoded so far, and how many its lane queued once generation ended.
#[derive(Default)]
struct Speech {
    num_decoded: usize,
    end: Option<(FinishReason, usize)>,
}

/// What the request's lane makes.
pub enum Stream {
    Text {
        decoder: Box<dyn TextDecoder>,
        stop_strings: Vec<String>,
    },
    /// Codec windows, assembled by the coordinator.
    Speech,
    /// Audio made by a voice lane, which has no tokens.
    Voice,
    /// One pooled vector of an embedding lane, which draws no tokens.
    Embed,
}

enum Tokens {
    Text { decoder: Box<dyn TextDecoder>, stops: StopMatcher },
    Speech(Speech),
    Voice,
    Embed,
}

pub struct RequestActor {
    lane_id: u64,
    tokens: Tokens,
    events: mpsc::Sender<Event>,
    coordinator: Recipient<Release>,
    usage: Usage,
    submitted: Instant,
    last_token: Option<Instant>,
    /// When set, the request ends with `EngineError::TimedOut` this long after it was submitted.
    deadline: Option<Duration>,
    metrics: Arc<Metrics>,
}

impl RequestActor {
    /// A request actor for lane `lane_id`, whose input has `prompt_tokens` tokens or ids.
    pub fn new(
        lane_id: u64,
        prompt_tokens: usize,
        stream: Stream,
        events: mpsc::Sender<Event>,
        coordinator: Recipient<Release>,
        metrics: Arc<Metrics>,
    ) -> RequestActor {
        let tokens = match stream {
            Stream::Text { decoder, stop_strings } => Tokens::Text { decoder, stops: StopMatcher::new(stop_strings) },
            Stream::Speech => Tokens::Speech(Speech::default()),
            Stream::Voice => Tokens::Voice,
            Stream::Embed => Tokens::Embed,
        };
        RequestActor {
            lane_id,
            tokens,
            events,
            coordinator,
            usage: Usage { prompt_tokens, completion_tokens: 0, cached_tokens: 0 },
            submitted: Instant::now(),
            last_token: None,
            deadline: None,
            metrics,
        }
    }

    /// The same request, ended with `EngineError::TimedOut` once `limit` has passed since it was submitted.
    pub fn with_deadline(self, limit: Option<Duration>) -> RequestActor {
        RequestActor { deadline: limit, ..self }
    }

    /// Sends an event; a closed stream means the client left, so the actor stops.
    fn send(&mut self, event: Event, ctx: &mut Context<Self>) {
        if self.events.try_send(event).is_err() {
            ctx.stop();
        }
    }

    /// Ends the request with `error`, its last event.
    fn fail(&mut self, error: EngineError, ctx: &mut Context<Self>) {
        self.send(Event::Error(error), ctx);
        ctx.stop();
    }

    fn finish(&mut self, finish: FinishReason, ctx: &mut Context<Self>) {
        self.finish_at(finish, None, ctx);
    }

    /// Ends the request; `stop_sequence` is the stop string that ended its text, if one did.
    fn finish_at(&mut self, finish: FinishReason, stop_sequence: Option<String>, ctx: &mut Context<Self>) {
        self.send(Event::Done { finish, usage: self.usage, stop_sequence }, ctx);
        ctx.stop();
    }

    /// Ends a speech request once generation is over and its last window is decoded.
    fn finish_speech_if_done(&mut self, ctx: &mut Context<Self>) {
        if let Tokens::Speech(Speech { num_decoded, end: Some((finish, num_windows)) }) = self.tokens {
            if num_decoded == num_windows {
                self.finish(finish, ctx);
            }
        }
    }

    fn text_token(&mut self, msg: LaneToken, ctx: &mut Context<Self>) {
        let Tokens::Text { decoder, stops } = &mut self.tokens else { return };
        let mut text = if msg.is_stop_token { String::new() } else { decoder.push(msg.id) };
        if msg.finish.is_some() {
            text.push_str(&decoder.finish());
        }
        let mut released = stops.push(&text);
        if msg.finish.is_some() && released.stopped.is_none() {
            released.text.push_str(&stops.finish());
        }
        self.send(Event::Token { id: msg.id, text: released.text, logprob: msg.logprob }, ctx);
        if let Some(stop) = released.stopped {
            self.finish_at(FinishReason::Stop, Some(stop), ctx);
        } else if let Some(finish) = msg.finish {
            self.finish(finish, ctx);
        }
    }

    fn speech_token(&mut self, msg: LaneToken, ctx: &mut Context<Self>) {
        let Tokens::Speech(speech) = &mut self.tokens else { return };
        if let Some(finish) = msg.finish {
            speech.end = Some((finish, msg.num_windows));
        }
        self.finish_speech_if_done(ctx);
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
        if let Some(limit) = self.deadline {
            ctx.run_later(limit, move |act, ctx| act.fail(EngineError::TimedOut(limit), ctx));
        }
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
        self.usage.cached_tokens = msg.cached_tokens;
        match self.tokens {
            Tokens::Text { .. } => self.text_token(msg, ctx),
            Tokens::Speech(_) => self.speech_token(msg, ctx),
            Tokens::Voice | Tokens::Embed => {}
        }
    }
}

impl Handler<LanePcm> for RequestActor {
    type Result = ();

    fn handle(&mut self, msg: LanePcm, ctx: &mut Context<Self>) {
        let Tokens::Speech(speech) = &mut self.tokens else { return };
        speech.num_decoded += 1;
        match msg.0 {
            Ok(pcm) if pcm.is_empty() => {}
            Ok(pcm) => self.send(Event::Audio { pcm }, ctx),
            Err(error) => return self.fail(error, ctx),
        }
        self.finish_speech_if_done(ctx);
    }
}

impl Handler<Abort> for RequestActor {
    type Result = ();

    fn handle(&mut self, _: Abort, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

impl Handler<VoiceAudio> for RequestActor {
    type Result = ();

    fn handle(&mut self, msg: VoiceAudio, ctx: &mut Context<Self>) {
        match msg.pcm {
            Ok(pcm) if pcm.is_empty() => {}
            Ok(pcm) => {
                self.observe_latency();
                self.usage.completion_tokens += 1;
                self.send(Event::Audio { pcm }, ctx);
            }
            Err(error) => return self.fail(error, ctx),
        }
        if msg.finished {
            self.finish(FinishReason::Stop, ctx);
        }
    }
}

impl Handler<LaneFailed> for RequestActor {
    type Result = ();

    fn handle(&mut self, msg: LaneFailed, ctx: &mut Context<Self>) {
        self.fail(msg.error, ctx);
    }
}

impl Handler<LaneEmbedding> for RequestActor {
    type Result = ();

    fn handle(&mut self, msg: LaneEmbedding, ctx: &mut Context<Self>) {
        self.observe_latency();
        match msg.0 {
            Ok(vector) => self.send(Event::Embedding { vector, usage: self.usage }, ctx),
            Err(error) => self.send(Event::Error(error), ctx),
        }
        ctx.stop();
    }
}

//! The request actor: one per request; turns its lane's tokens into text or audio events and stops with its client.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use tokio::sync::mpsc;

use crate::coordinator::{Coordinator, Decode, LaneFailed, LanePcm, LaneToken, Release};
use crate::engine::{CodecJob, ModelId};
use crate::metrics::Metrics;
use crate::request_types::{Event, FinishReason, FrameSink, Output, TextDecoder, Usage};
use crate::stop::StopMatcher;
use crate::voice::VoiceAudio;

/// Ends a request that was never admitted.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Abort;

/// A speech request's codec state: its frames, and the windows sent but not yet decoded.
struct Speech {
    sink: Box<dyn FrameSink>,
    pending: usize,
    finish: Option<FinishReason>,
}

enum Tokens {
    Text {
        decoder: Box<dyn TextDecoder>,
        stops: StopMatcher,
    },
    Speech(Speech),
    /// A voice lane: audio arrives already made.
    Voice,
}

pub struct RequestActor {
    lane_id: u64,
    model: ModelId,
    tokens: Tokens,
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
        model: ModelId,
        prompt_tokens: usize,
        output: Output,
        stop_strings: Vec<String>,
        events: mpsc::Sender<Event>,
        coordinator: Addr<Coordinator>,
        metrics: Arc<Metrics>,
    ) -> RequestActor {
        let tokens = match output {
            Output::Text(decoder) => Tokens::Text { decoder, stops: StopMatcher::new(stop_strings) },
            Output::Speech(sink) => Tokens::Speech(Speech { sink, pending: 0, finish: None }),
            Output::None => Tokens::Voice,
        };
        RequestActor {
            lane_id,
            model,
            tokens,
            events,
            coordinator,
            usage: Usage { prompt_tokens, completion_tokens: 0 },
            submitted: Instant::now(),
            last_token: None,
            metrics,
        }
    }

    /// A request actor for a voice lane, whose input has `num_ids` ids.
    pub fn new_voice(
        lane_id: u64,
        num_ids: usize,
        events: mpsc::Sender<Event>,
        coordinator: Addr<Coordinator>,
        metrics: Arc<Metrics>,
    ) -> RequestActor {
        RequestActor::new(lane_id, 0, num_ids, Output::None, Vec::new(), events, coordinator, metrics)
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

    fn decode(&mut self, job: Option<CodecJob>, ctx: &mut Context<Self>) {
        let (Some(job), Tokens::Speech(speech)) = (job, &mut self.tokens) else { return };
        speech.pending += 1;
        let to = ctx.address().recipient();
        self.coordinator.do_send(Decode { lane_id: self.lane_id, model: self.model, job, to });
    }

    /// Ends a speech request once generation is over and its last window is decoded.
    fn finish_speech_if_done(&mut self, ctx: &mut Context<Self>) {
        if let Tokens::Speech(Speech { pending: 0, finish: Some(finish), .. }) = self.tokens {
            self.finish(finish, ctx);
        }
    }

    fn text_token(&mut self, msg: LaneToken, ctx: &mut Context<Self>) {
        let Tokens::Text { decoder, stops } = &mut self.tokens else { return };
        let mut text = if msg.is_stop_token { String::new() } else { decoder.push(msg.id) };
        if msg.finish.is_some() {
            text.push_str(&decoder.finish());
        }
        let mut released = stops.push(&text);
        if msg.finish.is_some() && !released.stopped {
            released.text.push_str(&stops.finish());
        }
        self.send(Event::Token { id: msg.id, text: released.text, logprob: msg.logprob }, ctx);
        if released.stopped {
            self.finish(FinishReason::Stop, ctx);
        } else if let Some(finish) = msg.finish {
            self.finish(finish, ctx);
        }
    }

    fn speech_token(&mut self, msg: LaneToken, ctx: &mut Context<Self>) {
        let Tokens::Speech(speech) = &mut self.tokens else { return };
        let mut job = if msg.is_stop_token { None } else { speech.sink.push(msg.id) };
        if let Some(finish) = msg.finish {
            speech.finish = Some(finish);
            if let Some(last) = speech.sink.finish() {
                self.decode(job.take(), ctx);
                job = Some(last);
            }
        }
        self.decode(job, ctx);
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
        match self.tokens {
            Tokens::Text { .. } => self.text_token(msg, ctx),
            Tokens::Speech(_) => self.speech_token(msg, ctx),
            Tokens::Voice => {}
        }
    }
}

impl Handler<LanePcm> for RequestActor {
    type Result = ();

    fn handle(&mut self, msg: LanePcm, ctx: &mut Context<Self>) {
        let Tokens::Speech(speech) = &mut self.tokens else { return };
        speech.pending -= 1;
        match msg.0 {
            Ok(pcm) if pcm.is_empty() => {}
            Ok(pcm) => self.send(Event::Audio { pcm }, ctx),
            Err(message) => {
                self.send(Event::Error { message: format!("decoding audio: {message}") }, ctx);
                return ctx.stop();
            }
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
            Err(message) => {
                self.send(Event::Error { message: format!("synthesizing audio: {message}") }, ctx);
                return ctx.stop();
            }
        }
        if msg.finished {
            self.finish(FinishReason::Stop, ctx);
        }
    }
}

impl Handler<LaneFailed> for RequestActor {
    type Result = ();

    fn handle(&mut self, msg: LaneFailed, ctx: &mut Context<Self>) {
        self.send(Event::Error { message: msg.message }, ctx);
        ctx.stop();
    }
}

//! The frame-round coordinator: admits lanes when the KV pool has room and ticks one batched round at a time.

use std::collections::VecDeque;
use std::sync::Arc;

use actix::prelude::*;
use tensorfold_kernels::sampling::SamplingParams;

use crate::engine::{CodecJob, ModelId};
use crate::kv::{Lease, PagePool};
use crate::metrics::Metrics;
use crate::request_types::{FinishReason, SubmitError, TokenLogprob};
use crate::round::{PlannedCodec, PlannedLane, RoundOutput, RoundPlan, SampleSpec};
use crate::runner::EngineRunner;
use crate::voice::{EnqueueVoice, VoiceLanes};

/// A token for a request actor; `finish` is set on its lane's last token.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LaneToken {
    pub id: u32,
    pub logprob: Option<TokenLogprob>,
    /// The token ended generation (EOS or end of turn) and carries no text.
    pub is_stop_token: bool,
    pub finish: Option<FinishReason>,
}

/// The request's lane failed; the last message it gets.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LaneFailed {
    pub message: String,
}

/// A request waiting for a lane.
#[derive(Message)]
#[rtype(result = "Result<(), SubmitError>")]
pub struct Enqueue {
    pub lane_id: u64,
    pub model: ModelId,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_ids: Vec<u32>,
    pub logprobs: Option<usize>,
    pub to: Recipient<LaneToken>,
    pub failed: Recipient<LaneFailed>,
}

/// A speech request's codec window, to decode in the next round.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Decode {
    pub lane_id: u64,
    pub model: ModelId,
    pub job: CodecJob,
    pub to: Recipient<LanePcm>,
}

/// The PCM of one decoded window, or why decoding failed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LanePcm(pub Result<Vec<f32>, String>);

/// The request is gone (finished, failed or its client left): drop its lane and lease now.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Release {
    pub lane_id: u64,
}

/// Scheduling limits.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    /// Most tokens in one round's forward pass.
    pub round_tokens: usize,
    /// Most lanes running at once.
    pub parallel: usize,
    pub max_waiting: usize,
}

struct Lane {
    request: Enqueue,
    tokens: Vec<u32>,
    /// Tokens whose KV is computed or in the round in flight.
    num_planned: usize,
    num_generated: usize,
    lease: Lease,
}

impl Lane {
    fn prompt_len(&self) -> usize {
        self.request.prompt.len()
    }
}

/// Messages for request actors from one round, sent once the next round is on its way.
#[derive(Default)]
struct Outbox {
    tokens: Vec<(Recipient<LaneToken>, LaneToken)>,
    pcm: Vec<(Recipient<LanePcm>, LanePcm)>,
}

impl Outbox {
    fn send(self) {
        for (to, token) in self.tokens {
            to.do_send(token);
        }
        for (to, pcm) in self.pcm {
            to.do_send(pcm);
        }
    }
}

pub struct Coordinator {
    runner: EngineRunner,
    /// One page pool per model.
    pages: Vec<PagePool>,
    schedule: Schedule,
    waiting: VecDeque<Enqueue>,
    lanes: Vec<Lane>,
    /// Codec windows waiting for the next round.
    codec: VecDeque<Decode>,
    /// Where the PCM of the round in flight goes, in plan order.
    decoding: Vec<Recipient<LanePcm>>,
    voices: VoiceLanes,
    /// Which models are voices rather than token models.
    is_voice: Vec<bool>,
    in_flight: bool,
    metrics: Arc<Metrics>,
}

impl Coordinator {
    /// `pages` has one pool per model (empty for voices); `is_voice` says which models are voices.
    pub fn new(
        runner: EngineRunner,
        pages: Vec<PagePool>,
        is_voice: Vec<bool>,
        schedule: Schedule,
        metrics: Arc<Metrics>,
    ) -> Coordinator {
        let coordinator = Coordinator {
            runner,
            pages,
            schedule,
            waiting: VecDeque::new(),
            lanes: Vec::new(),
            codec: VecDeque::new(),
            decoding: Vec::new(),
            voices: VoiceLanes::default(),
            is_voice,
            in_flight: false,
            metrics,
        };
        coordinator.publish();
        coordinator
    }

    /// One round: admit, plan, run off-thread, apply, repeat while there is work.
    fn tick(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight {
            return;
        }
        self.admit();
        let plan = self.plan();
        self.publish();
        if plan.is_empty() {
            return;
        }
        self.in_flight = true;
        let output = self.runner.run(plan);
        ctx.spawn(actix::fut::wrap_future::<_, Self>(output).map(|output, act: &mut Self, ctx| {
            act.in_flight = false;
            let outbox = match output {
                Ok(output) => act.apply(output),
                Err(_) => {
                    act.fail_all("the round failed on the engine thread");
                    Outbox::default()
                }
            };
            // The next round goes to the engine before the requests hear of this one.
            act.tick(ctx);
            outbox.send();
        }));
    }

    fn num_running(&self) -> usize {
        self.lanes.len() + self.voices.num_running()
    }

    /// Token and voice requests take free lanes in turn.
    fn admit(&mut self) {
        let mut progress = true;
        while progress {
            progress = false;
            if self.num_running() < self.schedule.parallel {
                progress |= self.admit_tokens();
            }
            if self.num_running() < self.schedule.parallel {
                progress |= self.voices.admit_one();
            }
        }
    }

    fn admit_tokens(&mut self) -> bool {
        let Some(next) = self.waiting.front() else { return false };
        let Some(lease) = self.pages[next.model].admit(next.prompt.len() + next.max_tokens) else { return false };
        let request = self.waiting.pop_front().expect("front exists");
        self.metrics.add_prompt(request.prompt.len());
        let tokens = request.prompt.clone();
        self.lanes.push(Lane { request, tokens, num_planned: 0, num_generated: 0, lease });
        true
    }

    /// Decode lanes take one token each, then prefill chunks share what is left of the token budget.
    fn plan(&mut self) -> RoundPlan {
        let mut budget = self.schedule.round_tokens;
        let mut plan = RoundPlan::default();
        let decoding = |l: &Lane| l.num_planned >= l.prompt_len();
        for pass_decode in [true, false] {
            for lane in self.lanes.iter_mut().filter(|l| decoding(l) == pass_decode) {
                let start = lane.num_planned;
                let end = (start + budget).min(lane.tokens.len());
                if end <= start {
                    continue;
                }
                budget -= end - start;
                lane.lease.grow_to(end);
                lane.num_planned = end;
                let sample = (end == lane.tokens.len()).then(|| SampleSpec {
                    params: lane.request.sampling.clone(),
                    history: if lane.request.sampling.repetition_penalty != 1.0 {
                        lane.tokens.clone()
                    } else {
                        Vec::new()
                    },
                    position: end as u64,
                    logprobs: lane.request.logprobs,
                });
                plan.lanes.push(PlannedLane {
                    lane_id: lane.request.lane_id,
                    model: lane.request.model,
                    tokens: lane.tokens[start..end].to_vec(),
                    start_pos: start,
                    pages: lane.lease.pages().to_vec(),
                    sample,
                });
            }
        }
        for decode in self.codec.drain(..) {
            plan.codec.push(PlannedCodec { lane_id: decode.lane_id, model: decode.model, job: decode.job });
            self.decoding.push(decode.to);
        }
        plan.voices = self.voices.plan();
        plan
    }

    /// Takes a round's results into the lanes; what the requests must hear goes in the returned outbox.
    fn apply(&mut self, output: RoundOutput) -> Outbox {
        let mut outbox = Outbox::default();
        self.metrics.inc_rounds();
        self.metrics.add_generated(output.sampled.len());
        for s in output.sampled {
            let Some(i) = self.lanes.iter().position(|l| l.request.lane_id == s.lane_id) else { continue };
            let lane = &mut self.lanes[i];
            lane.tokens.push(s.id);
            lane.num_generated += 1;
            let is_stop_token = lane.request.stop_ids.contains(&s.id);
            let finish = if is_stop_token {
                Some(FinishReason::Stop)
            } else if lane.num_generated >= lane.request.max_tokens {
                Some(FinishReason::Length)
            } else {
                None
            };
            outbox
                .tokens
                .push((lane.request.to.clone(), LaneToken { id: s.id, logprob: s.logprob, is_stop_token, finish }));
            if finish.is_some() {
                self.lanes.swap_remove(i);
            }
        }
        for ((_, pcm), to) in output.audio.into_iter().zip(self.decoding.drain(..)) {
            outbox.pcm.push((to, LanePcm(pcm)));
        }
        self.voices.apply(output.voices);
        outbox
    }

    /// Ends every running lane and every queued codec window with an error to its request.
    fn fail_all(&mut self, why: &str) {
        tracing::error!(why, lanes = self.num_running(), "failing every running lane");
        for lane in self.lanes.drain(..) {
            lane.request.failed.do_send(LaneFailed { message: why.to_string() });
        }
        for to in self.decoding.drain(..).chain(self.codec.drain(..).map(|d| d.to)) {
            to.do_send(LanePcm(Err(why.to_string())));
        }
        self.voices.fail_running(why);
    }

    fn publish(&self) {
        self.metrics.set_running(self.num_running());
        self.metrics.set_waiting(self.waiting.len() + self.voices.num_waiting());
        let used = self.pages.iter().map(PagePool::num_used).sum();
        self.metrics.set_kv_pages(used, self.pages.iter().map(PagePool::num_total).sum());
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;
}

impl Handler<Enqueue> for Coordinator {
    type Result = Result<(), SubmitError>;

    fn handle(&mut self, msg: Enqueue, ctx: &mut Context<Self>) -> Self::Result {
        if self.is_voice.get(msg.model) != Some(&false) {
            return Err(SubmitError::NoModel(msg.model));
        }
        let pages = &self.pages[msg.model];
        let needed = pages.pages_for(msg.prompt.len() + msg.max_tokens);
        if needed > pages.num_total() {
            return Err(SubmitError::TooLarge { needed, total: pages.num_total() });
        }
        let num_waiting = self.waiting.len() + self.voices.num_waiting();
        if num_waiting >= self.schedule.max_waiting {
            return Err(SubmitError::QueueFull(num_waiting));
        }
        self.metrics.inc_requests();
        self.waiting.push_back(msg);
        self.tick(ctx);
        Ok(())
    }
}

impl Handler<Release> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Release, ctx: &mut Context<Self>) {
        self.waiting.retain(|r| r.lane_id != msg.lane_id);
        self.lanes.retain(|l| l.request.lane_id != msg.lane_id);
        self.codec.retain(|d| d.lane_id != msg.lane_id);
        self.voices.release(msg.lane_id);
        self.publish();
        self.tick(ctx);
    }
}

impl Handler<Decode> for Coordinator {
    type Result = ();

    fn handle(&mut self, msg: Decode, ctx: &mut Context<Self>) {
        self.codec.push_back(msg);
        self.tick(ctx);
    }
}

impl Handler<EnqueueVoice> for Coordinator {
    type Result = Result<(), SubmitError>;

    fn handle(&mut self, msg: EnqueueVoice, ctx: &mut Context<Self>) -> Self::Result {
        if self.is_voice.get(msg.model) != Some(&true) {
            return Err(SubmitError::NoModel(msg.model));
        }
        if self.waiting.len() + self.voices.num_waiting() >= self.schedule.max_waiting {
            return Err(SubmitError::QueueFull(self.waiting.len() + self.voices.num_waiting()));
        }
        self.metrics.inc_requests();
        self.voices.enqueue(msg);
        self.tick(ctx);
        Ok(())
    }
}

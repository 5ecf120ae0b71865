//! The frame-round coordinator: admits lanes when the KV pool has room and ticks one batched round at a time.

use std::collections::VecDeque;
use std::sync::Arc;

use actix::prelude::*;
use tensorfold_engine::boundary::{CodecJob, Constraint, EngineError, FrameSink, LogitRules};
use tensorfold_kernels::sampling::SamplingParams;

use crate::draft::Drafter;
use crate::embed::EmbedLanes;
use crate::kv::{Lease, PagePool};
use crate::messages::{LaneEmbedding, LaneFailed, LanePcm, LaneToken, VoiceAudio};
use crate::metrics::Metrics;
use crate::outbox::Outbox;
use crate::request_types::{FinishReason, SubmitError};
use crate::round::{LaneGrammar, ModelId, PlannedCodec, PlannedDraft, PlannedLane, RoundOutput, RoundPlan, SampleSpec};
use crate::runner::EngineRunner;
use crate::voice::VoiceLanes;

mod handlers;
#[cfg(test)]
mod outbox_tests;

pub use handlers::Close;

/// Most tokens a draft model may lag its lane by and still draft this round; a longer lag catches up first.
const DRAFT_MAX_LAG: usize = 16;

/// A token request waiting for a lane.
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
    /// Whether the prompt may resume from the prefix cache and its pages be cached.
    pub cache: bool,
    /// Whether the lane may draft tokens and verify them.
    pub draft: bool,
    pub rules: Arc<LogitRules>,
    /// The lane's grammar; it moves to the engine thread for each round the lane draws in, and back.
    pub constraint: Option<Box<dyn Constraint>>,
    /// A speech lane's frame assembly, which turns its tokens into codec windows as they are drawn.
    pub frames: Option<Box<dyn FrameSink>>,
    pub to: Recipient<LaneToken>,
    pub pcm: Recipient<LanePcm>,
    pub failed: Recipient<LaneFailed>,
}

/// A voice request waiting for a lane.
#[derive(Message)]
#[rtype(result = "Result<(), SubmitError>")]
pub struct EnqueueVoice {
    pub lane_id: u64,
    pub model: ModelId,
    pub input: tensorfold_engine::boundary::VoiceInput,
    pub to: Recipient<VoiceAudio>,
}

/// An embedding request waiting for a lane.
#[derive(Message)]
#[rtype(result = "Result<(), SubmitError>")]
pub struct EnqueueEmbed {
    pub lane_id: u64,
    pub model: ModelId,
    pub prompt: Vec<u32>,
    pub cache: bool,
    pub to: Recipient<LaneEmbedding>,
}

/// Scheduling limits.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    /// Most tokens in one round's forward pass.
    pub round_tokens: usize,
    /// Most lanes running at once.
    pub parallel: usize,
    pub max_waiting: usize,
    pub drafting: Drafting,
}

/// How decoding lanes draft.
#[derive(Clone, Copy, Debug)]
pub struct Drafting {
    /// Most tokens a lane proposes and verifies in one step; 0 turns drafting off.
    pub tokens: usize,
    /// Most rounds a lane waits after a draft of which nothing was kept, doubling from one.
    pub max_wait: u32,
    /// Whether each engine's steps are timed at start-up; untimed, a verify row counts as free (a test's engine,
    /// whose times say nothing of a device).
    pub timed: bool,
}

impl Drafting {
    pub const OFF: Drafting = Drafting { tokens: 0, max_wait: 0, timed: false };

    /// Where each row of a step costs compute, a lane whose drafts fail probes rarely.
    pub fn on_cpu(tokens: usize) -> Drafting {
        Drafting { tokens, max_wait: 64, timed: true }
    }

    /// Where a step of tens of rows costs about what one row does, a failed draft costs little.
    pub fn on_gpu(tokens: usize) -> Drafting {
        Drafting { tokens, max_wait: 2, timed: true }
    }
}

struct Lane {
    request: Enqueue,
    tokens: Vec<u32>,
    /// Tokens whose KV is computed or in the round in flight.
    num_planned: usize,
    num_generated: usize,
    /// Codec windows queued for a speech lane so far.
    num_windows: usize,
    lease: Lease,
    drafter: Drafter,
    shadow: Option<Shadow>,
}

/// A lane's place in its model's draft model: a lease in the draft model's pool, and how far its KV reaches.
struct Shadow {
    model: ModelId,
    lease: Lease,
    /// The lane's tokens whose KV the draft model holds.
    seen: usize,
    /// The end of a catch-up in the round in flight.
    catch_up: Option<usize>,
    /// The lane's length when the round in flight drafted for it.
    drafted_from: Option<usize>,
}

impl Lane {
    fn prompt_len(&self) -> usize {
        self.request.prompt.len()
    }
}

/// A speech lane's codec window, waiting for the next round.
struct Window {
    lane_id: u64,
    model: ModelId,
    job: CodecJob,
    to: Recipient<LanePcm>,
}

pub struct Coordinator {
    runner: EngineRunner,
    /// One page pool per model.
    pages: Vec<PagePool>,
    /// Each model's draft model, if it has one.
    drafts: Vec<Option<ModelId>>,
    schedule: Schedule,
    waiting: VecDeque<Enqueue>,
    lanes: Vec<Lane>,
    /// Codec windows waiting for the next round.
    codec: VecDeque<Window>,
    /// Where the PCM of the round in flight goes, in plan order.
    decoding: Vec<Recipient<LanePcm>>,
    voices: VoiceLanes,
    embeds: EmbedLanes,
    in_flight: bool,
    /// Set by `Close`: every later request is refused.
    closed: bool,
    metrics: Arc<Metrics>,
}

impl Coordinator {
    /// `pages` has one pool per model, empty for voices; `drafts` names each model's draft model.
    pub fn new(
        runner: EngineRunner,
        pages: Vec<PagePool>,
        drafts: Vec<Option<ModelId>>,
        schedule: Schedule,
        metrics: Arc<Metrics>,
    ) -> Coordinator {
        let coordinator = Coordinator {
            runner,
            pages,
            drafts,
            schedule,
            waiting: VecDeque::new(),
            lanes: Vec::new(),
            codec: VecDeque::new(),
            decoding: Vec::new(),
            voices: VoiceLanes::default(),
            embeds: EmbedLanes::default(),
            in_flight: false,
            closed: false,
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
                    tracing::error!(lanes = act.num_running(), "the engine thread stopped; failing every running lane");
                    act.fail_all(&EngineError::Stopped)
                }
            };
            // The next round goes to the engine before the requests hear of this one, of every kind of lane.
            act.tick(ctx);
            outbox.send();
        }));
    }

    fn num_running(&self) -> usize {
        self.lanes.len() + self.voices.num_running() + self.embeds.num_running()
    }

    fn num_waiting(&self) -> usize {
        self.waiting.len() + self.voices.num_waiting() + self.embeds.num_waiting()
    }

    /// Token, voice and embedding requests take free lanes in the order they came (lane ids rise with it); a
    /// queue whose first request cannot start yet lets the next oldest try.
    fn admit(&mut self) {
        while self.num_running() < self.schedule.parallel {
            let mut fronts = [
                (0, self.waiting.front().map(|r| r.lane_id)),
                (1, self.voices.front_lane()),
                (2, self.embeds.front_lane()),
            ];
            fronts.sort_by_key(|&(_, lane)| lane.unwrap_or(u64::MAX));
            let admitted = fronts.iter().filter(|(_, lane)| lane.is_some()).any(|&(queue, _)| match queue {
                0 => self.admit_tokens(),
                1 => self.voices.admit_one(),
                _ => self.embeds.admit_one(&self.pages),
            });
            if !admitted {
                return;
            }
        }
    }

    fn admit_tokens(&mut self) -> bool {
        let Some(next) = self.waiting.front() else { return false };
        let pool = &self.pages[next.model];
        let lookup = next.cache && pool.caches();
        let prompt = lookup.then_some(&next.prompt[..]);
        let Some(lease) = pool.admit(next.prompt.len() + next.max_tokens, prompt) else { return false };
        let request = self.waiting.pop_front().expect("front exists");
        self.metrics.add_prompt(request.prompt.len());
        if lookup {
            self.metrics.add_prefix_lookup(request.prompt.len(), lease.cached());
        }
        let tokens = request.prompt.clone();
        let num_planned = lease.cached();
        let drafter = Drafter::default();
        // Without room in the draft model's pool the lane drafts from its own text.
        let draft_model = self.drafts.get(request.model).copied().flatten().filter(|_| request.draft);
        let shadow = draft_model.and_then(|model| {
            let lease = self.pages[model].admit(request.prompt.len() + request.max_tokens, None)?;
            Some(Shadow { model, lease, seen: 0, catch_up: None, drafted_from: None })
        });
        let num_generated = 0;
        self.lanes.push(Lane { request, tokens, num_planned, num_generated, num_windows: 0, lease, drafter, shadow });
        true
    }

    /// Decode lanes take one token each, then prefill chunks share what is left of the token budget.
    fn plan(&mut self) -> RoundPlan {
        let mut budget = self.schedule.round_tokens;
        let mut plan = RoundPlan::default();
        let decoding = |l: &Lane| l.num_planned >= l.prompt_len();
        let num_decoding = self.lanes.iter().filter(|l| decoding(l)).count();
        let mut rows = num_decoding;
        for pass_decode in [true, false] {
            for lane in self.lanes.iter_mut().filter(|l| decoding(l) == pass_decode) {
                let start = lane.num_planned;
                let end = (start + budget).min(lane.tokens.len());
                if end <= start {
                    continue;
                }
                budget -= end - start;
                // A decoding lane may carry a draft, within the round's budget and its own token budget.
                let left = lane.request.max_tokens - lane.num_generated;
                let most = self.schedule.drafting.tokens.min(budget).min(left.saturating_sub(1));
                let most = match pass_decode && lane.request.draft {
                    true => lane.drafter.length(most, num_decoding, rows, self.runner.step_cost(lane.request.model)),
                    false => 0,
                };
                // Positions the draft takes: the lookup's tokens, or the draft model's, which the runner fills in.
                let (mut draft, mut reserved) = (Vec::new(), 0);
                if most > 0 {
                    match lane.shadow.as_mut() {
                        Some(s) if end.saturating_sub(s.seen) <= DRAFT_MAX_LAG => {
                            reserved = most;
                            s.lease.grow_to(end + most);
                            s.drafted_from = Some(end);
                            plan.drafts.push(PlannedDraft {
                                lane_id: lane.request.lane_id,
                                model: s.model,
                                tokens: lane.tokens[s.seen..end].to_vec(),
                                start_pos: s.seen,
                                pages: s.lease.pages().to_vec(),
                                most,
                            });
                        }
                        // Without a draft model, or while it catches up, the lane drafts from its own text.
                        _ => {
                            draft = crate::draft::lookup(&lane.tokens, most);
                            reserved = draft.len();
                            lane.drafter.pending = draft.len();
                        }
                    }
                }
                budget -= reserved;
                rows += reserved;
                lane.lease.grow_to(end + reserved);
                lane.num_planned = end + reserved;
                let draws = end == lane.tokens.len();
                let grammar = if draws { lane.request.constraint.take() } else { None };
                let rules = &lane.request.rules;
                let penalized =
                    lane.request.sampling.repetition_penalty != 1.0 || rules.presence != 0.0 || rules.frequency != 0.0;
                let sample = draws.then(|| SampleSpec {
                    params: lane.request.sampling.clone(),
                    history: if penalized { lane.tokens.clone() } else { Vec::new() },
                    prompt_len: lane.prompt_len(),
                    rules: Arc::clone(rules),
                    masked: grammar.is_some(),
                    position: end as u64,
                    logprobs: lane.request.logprobs,
                    draft: draft.clone(),
                });
                plan.lanes.push(PlannedLane {
                    lane_id: lane.request.lane_id,
                    model: lane.request.model,
                    tokens: [&lane.tokens[start..end], &draft[..]].concat(),
                    start_pos: start,
                    pages: lane.lease.pages().to_vec(),
                    sample,
                    embed: false,
                });
                if let Some(grammar) = grammar {
                    plan.grammars.push(LaneGrammar { lane_id: lane.request.lane_id, grammar });
                }
            }
        }
        self.plan_embeds(&mut plan);
        self.plan_catch_ups(&mut plan);
        for window in self.codec.drain(..) {
            plan.codec.push(PlannedCodec { lane_id: window.lane_id, model: window.model, job: window.job });
            self.decoding.push(window.to);
        }
        plan.voices = self.voices.plan();
        plan
    }

    /// Embedding lanes' prompt chunks share what the token lanes left of the round's budget.
    fn plan_embeds(&mut self, plan: &mut RoundPlan) {
        let used: usize = plan.lanes.iter().map(|l| l.tokens.len()).sum();
        self.embeds.plan(self.schedule.round_tokens.saturating_sub(used), &mut plan.lanes);
    }

    /// Draft models that lag their lanes take the lanes' known tokens, within a round's token budget of their own.
    fn plan_catch_ups(&mut self, plan: &mut RoundPlan) {
        let mut budget = self.schedule.round_tokens;
        for lane in &mut self.lanes {
            let Some(s) = lane.shadow.as_mut().filter(|s| s.drafted_from.is_none()) else { continue };
            // The last token waits for the step that drafts after it.
            let end = (s.seen + budget).min(lane.tokens.len().saturating_sub(1));
            if end <= s.seen {
                continue;
            }
            budget -= end - s.seen;
            s.lease.grow_to(end);
            s.catch_up = Some(end);
            let (lane_id, model, start_pos) = (lane.request.lane_id, s.model, s.seen);
            let (tokens, pages) = (lane.tokens[s.seen..end].to_vec(), s.lease.pages().to_vec());
            plan.drafts.push(PlannedDraft { lane_id, model, tokens, start_pos, pages, most: 0 });
        }
    }

    /// Takes a round's results into the lanes; what the requests must hear goes in the returned outbox.
    fn apply(&mut self, mut output: RoundOutput) -> Outbox {
        let mut outbox = Outbox::default();
        self.metrics.inc_rounds();
        self.metrics.add_generated(output.sampled.len());
        for (lane_id, error) in &output.failed {
            if let Some(i) = self.lanes.iter().position(|l| l.request.lane_id == *lane_id) {
                let lane = self.lanes.swap_remove(i);
                outbox.failed.push((lane.request.failed, LaneFailed { error: error.clone() }));
            }
            self.voices.fail(*lane_id, error, &mut outbox);
            self.embeds.fail(*lane_id, error, &mut outbox);
        }
        self.embeds.apply(std::mem::take(&mut output.hidden), &mut outbox);
        for g in std::mem::take(&mut output.grammars) {
            if let Some(lane) = self.lanes.iter_mut().find(|l| l.request.lane_id == g.lane_id) {
                lane.request.constraint = Some(g.grammar);
            }
        }
        for (lane_id, drafted) in &output.drafts {
            if let Some(lane) = self.lanes.iter_mut().find(|l| l.request.lane_id == *lane_id) {
                lane.drafter.pending = *drafted;
            }
        }
        for s in output.sampled {
            let Some(i) = self.lanes.iter().position(|l| l.request.lane_id == s.lane_id) else { continue };
            let lane = &mut self.lanes[i];
            if lane.tokens.len() > lane.num_planned {
                // A draft's token after the first of the round: the one before it equaled its draft.
                lane.drafter.accepted += 1;
            }
            lane.tokens.push(s.id);
            lane.num_generated += 1;
            // Positions past the drafts accepted hold stale KV, which the next steps write over.
            lane.num_planned = lane.tokens.len() - 1;
            if lane.num_generated == 1 && lane.request.cache {
                // The prompt's KV is all computed now: its pages may serve later prompts.
                lane.lease.cache_prompt(&lane.request.prompt);
            }
            let is_stop_token = lane.request.stop_ids.contains(&s.id);
            let finish = if is_stop_token {
                Some(FinishReason::Stop)
            } else if lane.num_generated >= lane.request.max_tokens {
                Some(FinishReason::Length)
            } else {
                None
            };
            // A speech lane's frames are assembled here, so a window is decoded in the very next round.
            if let Some(frames) = lane.request.frames.as_mut() {
                let drawn = if is_stop_token { None } else { frames.push(s.id) };
                let last = finish.and_then(|_| frames.finish());
                for job in drawn.into_iter().chain(last) {
                    lane.num_windows += 1;
                    let (lane_id, model, to) = (lane.request.lane_id, lane.request.model, lane.request.pcm.clone());
                    self.codec.push_back(Window { lane_id, model, job, to });
                }
            }
            let token = LaneToken {
                id: s.id,
                logprob: s.logprob,
                is_stop_token,
                finish,
                num_windows: lane.num_windows,
                cached_tokens: lane.lease.cached(),
            };
            outbox.tokens.push((lane.request.to.clone(), token));
            if finish.is_some() {
                let mut lane = self.lanes.swap_remove(i);
                // Drafts past the lane's last token were never in question: they count as neither kept nor not.
                lane.drafter.pending = lane.drafter.pending.min(lane.drafter.accepted);
                self.metrics.add_draft(lane.drafter.settle(self.schedule.drafting.max_wait));
            }
        }
        for lane in &mut self.lanes {
            if let Some(s) = lane.shadow.as_mut() {
                s.seen = s.catch_up.take().unwrap_or(s.seen);
                // The draft model took every drafted token but its last; those accepted are the lane's now.
                if let Some(from) = s.drafted_from.take() {
                    let (drafted, accepted) = (lane.drafter.pending, lane.drafter.accepted);
                    s.seen = if drafted == 0 { 0 } else { from + accepted.min(drafted - 1) };
                }
            }
            self.metrics.add_draft(lane.drafter.settle(self.schedule.drafting.max_wait));
        }
        let mut audio = output.audio.into_iter();
        for to in self.decoding.drain(..) {
            let pcm = match audio.next() {
                Some((_, pcm)) => pcm,
                None => Err(output.failed.first().map_or(EngineError::Stopped, |(_, e)| e.clone())),
            };
            outbox.pcm.push((to, LanePcm(pcm)));
        }
        self.voices.apply(output.voices, &mut outbox);
        outbox
    }

    /// Ends every running lane and every queued codec window with an error to its request.
    fn fail_all(&mut self, why: &EngineError) -> Outbox {
        let mut outbox = Outbox::default();
        for lane in self.lanes.drain(..) {
            outbox.failed.push((lane.request.failed, LaneFailed { error: why.clone() }));
        }
        for to in self.decoding.drain(..).chain(self.codec.drain(..).map(|w| w.to)) {
            outbox.pcm.push((to, LanePcm(Err(why.clone()))));
        }
        self.voices.fail_running(why, &mut outbox);
        self.embeds.fail_running(why, &mut outbox);
        // A failed round may have left pages half written: no later prompt resumes from them.
        for pool in &self.pages {
            pool.clear_cache();
        }
        outbox
    }

    fn publish(&self) {
        self.metrics.set_running(self.num_running());
        self.metrics.set_waiting(self.num_waiting());
        let used = self.pages.iter().map(PagePool::num_used).sum();
        self.metrics.set_kv_pages(used, self.pages.iter().map(PagePool::num_total).sum());
        self.metrics.set_kv_pages_cached(self.pages.iter().map(PagePool::num_cached).sum());
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;
}

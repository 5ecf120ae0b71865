//! The token book: lanes that draw tokens (text, and speech whose tokens become codec windows), each with its KV
//! lease, its draft state and its place in its model's draft model.

use std::collections::VecDeque;
use std::sync::Arc;

use actix::prelude::*;
use tensorfold_engine::boundary::{CodecJob, EngineError};

use super::book::{LaneBook, Room};
use super::draft::{self, Drafter};
use super::queue::{OfLane, Queue};
use crate::memory::kv::Lease;
use crate::messages::{Enqueue, LaneFailed, LanePcm, LaneToken};
use crate::outbox::Outbox;
use crate::request_types::FinishReason;
use crate::round::{LaneGrammar, ModelId, PlannedCodec, PlannedDraft, PlannedLane, RoundOutput, RoundPlan, SampleSpec};

/// Most tokens a draft model may lag its lane by and still draft this round; a longer lag catches up first.
const DRAFT_MAX_LAG: usize = 16;

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
    /// Tokens whose KV was computed before the round being planned: the positions a draft head may read.
    num_done: usize,
}

/// A lane's place in its model's draft model: a lease in the draft model's pool, and how far its KV reaches.
struct Shadow {
    model: ModelId,
    /// Pages in the draft model's pool; none for the model's own draft head, which reads the lane's pages.
    lease: Option<Lease>,
    /// The lane's tokens whose KV the draft model holds.
    seen: usize,
    /// The end of a catch-up in the round in flight.
    catch_up: Option<usize>,
    /// The lane's length when the round in flight drafted for it.
    drafted_from: Option<usize>,
}

impl OfLane for Lane {
    fn lane_id(&self) -> u64 {
        self.request.lane_id
    }
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

/// The token lanes, their queue, and the codec windows of speech lanes.
pub struct TokenBook {
    queue: Queue<Enqueue, Lane>,
    /// Each model's draft model, if it has one.
    drafts: Vec<Option<ModelId>>,
    /// Codec windows waiting for the next round.
    codec: VecDeque<Window>,
    /// Where the PCM of the round in flight goes, in plan order.
    decoding: Vec<Recipient<LanePcm>>,
}

impl TokenBook {
    /// `drafts` names each model's draft model.
    pub fn new(drafts: Vec<Option<ModelId>>) -> TokenBook {
        TokenBook { queue: Queue::default(), drafts, codec: VecDeque::new(), decoding: Vec::new() }
    }

    pub fn enqueue(&mut self, request: Enqueue) {
        self.queue.waiting.push_back(request);
    }

    /// Draft models that lag their lanes take the lanes' known tokens, within what is left of `budget`, the tokens a
    /// round's first draft pass may take (as many as the engines are sized for).
    fn plan_catch_ups(&mut self, mut budget: usize, plan: &mut RoundPlan) {
        for lane in &mut self.queue.lanes {
            let Some(s) = lane.shadow.as_mut().filter(|s| s.drafted_from.is_none()) else { continue };
            // The last token waits for the step that drafts after it; an own head reads only computed positions.
            let mut end = (s.seen + budget).min(lane.tokens.len().saturating_sub(1));
            if s.lease.is_none() {
                end = end.min(lane.num_done + 1);
            }
            if end <= s.seen {
                continue;
            }
            budget -= end - s.seen;
            s.catch_up = Some(end);
            let (lane_id, model, start_pos, own_head) = (lane.request.lane_id, s.model, s.seen, s.lease.is_none());
            let tokens = lane.tokens[s.seen..end].to_vec();
            let pages = match s.lease.as_mut() {
                Some(lease) => {
                    lease.grow_to(end);
                    lease.pages().to_vec()
                }
                None => lane.lease.pages().to_vec(),
            };
            plan.drafts.push(PlannedDraft { lane_id, model, tokens, start_pos, pages, most: 0, own_head });
        }
    }
}

impl LaneBook for TokenBook {
    fn num_running(&self) -> usize {
        self.queue.num_running()
    }

    fn num_waiting(&self) -> usize {
        self.queue.num_waiting()
    }

    fn front_lane(&self) -> Option<u64> {
        self.queue.front_lane()
    }

    fn admit_one(&mut self, room: &Room) -> bool {
        let Some(next) = self.queue.waiting.front() else { return false };
        let pool = &room.pages[next.model];
        let lookup = next.cache && pool.caches();
        let prompt = lookup.then_some(&next.prompt[..]);
        let Some(lease) = pool.admit(next.prompt.len() + next.max_tokens, prompt) else { return false };
        let request = self.queue.waiting.pop_front().expect("front exists");
        room.metrics.add_prompt(request.prompt.len());
        if lookup {
            room.metrics.add_prefix_lookup(request.prompt.len(), lease.cached());
        }
        let tokens = request.prompt.clone();
        let num_planned = lease.cached();
        let drafter = Drafter::default();
        // Without room in the draft model's pool the lane drafts from its own text.
        let draft_model = self.drafts.get(request.model).copied().flatten().filter(|_| request.draft);
        let shadow = draft_model.and_then(|model| {
            // A model that drafts with its own head has no second pool.
            let lease = match model == request.model {
                true => None,
                false => Some(room.pages[model].admit(request.prompt.len() + request.max_tokens, None)?),
            };
            Some(Shadow { model, lease, seen: 0, catch_up: None, drafted_from: None })
        });
        let num_generated = 0;
        self.queue.lanes.push(Lane {
            request,
            tokens,
            num_planned,
            num_generated,
            num_windows: 0,
            lease,
            drafter,
            shadow,
            num_done: num_planned,
        });
        true
    }

    /// Decode lanes take one token each, then prefill chunks share what is left of the token budget.
    fn plan(&mut self, room: &Room, plan: &mut RoundPlan) {
        let mut budget = room.schedule.round_tokens;
        // The first draft pass takes each drafting lane's and each catch-up's tokens: a round's worth at most.
        let mut shadow_budget = room.schedule.round_tokens;
        self.queue.lanes.iter_mut().for_each(|l| l.num_done = l.num_planned);
        let decoding = |l: &Lane| l.num_planned >= l.prompt_len();
        let num_decoding = self.queue.lanes.iter().filter(|l| decoding(l)).count();
        let mut rows = num_decoding;
        for pass_decode in [true, false] {
            for lane in self.queue.lanes.iter_mut().filter(|l| decoding(l) == pass_decode) {
                let start = lane.num_planned;
                let end = (start + budget).min(lane.tokens.len());
                if end <= start {
                    continue;
                }
                budget -= end - start;
                // A decoding lane may carry a draft, within the round's budget and its own token budget.
                let left = lane.request.max_tokens - lane.num_generated;
                let most = room.schedule.drafting.tokens.min(budget).min(left.saturating_sub(1));
                let most = match pass_decode && lane.request.draft {
                    true => lane.drafter.length(most, num_decoding, rows, room.runner.step_cost(lane.request.model)),
                    false => 0,
                };
                // Positions the draft takes: the lookup's tokens, or the draft model's, which the runner fills in.
                let (mut draft, mut reserved) = (Vec::new(), 0);
                if most > 0 {
                    match lane.shadow.as_mut() {
                        Some(s) if end.saturating_sub(s.seen) <= DRAFT_MAX_LAG.min(shadow_budget) => {
                            shadow_budget -= end.saturating_sub(s.seen);
                            reserved = most;
                            s.drafted_from = Some(end);
                            let pages = match s.lease.as_mut() {
                                Some(lease) => {
                                    lease.grow_to(end + most);
                                    lease.pages().to_vec()
                                }
                                // The head's guesses sit in the lane's own positions, which the draft reserves.
                                None => {
                                    lane.lease.grow_to(end + most);
                                    lane.lease.pages().to_vec()
                                }
                            };
                            plan.drafts.push(PlannedDraft {
                                lane_id: lane.request.lane_id,
                                model: s.model,
                                tokens: lane.tokens[s.seen..end].to_vec(),
                                start_pos: s.seen,
                                pages,
                                most,
                                own_head: s.lease.is_none(),
                            });
                        }
                        // Without a draft model, or while it catches up, the lane drafts from its own text.
                        _ => {
                            draft = draft::lookup(&lane.tokens, most);
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
        self.plan_catch_ups(shadow_budget, plan);
        for window in self.codec.drain(..) {
            plan.codec.push(PlannedCodec { lane_id: window.lane_id, model: window.model, job: window.job });
            self.decoding.push(window.to);
        }
    }

    /// Takes the drawn tokens, grammars and drafts into the lanes, and the round's PCM to the speech lanes.
    fn apply(&mut self, room: &Room, output: &mut RoundOutput, outbox: &mut Outbox) {
        for g in std::mem::take(&mut output.grammars) {
            if let Some(lane) = self.queue.lanes.iter_mut().find(|l| l.request.lane_id == g.lane_id) {
                lane.request.constraint = Some(g.grammar);
            }
        }
        for (lane_id, drafted) in &output.drafts {
            if let Some(lane) = self.queue.lanes.iter_mut().find(|l| l.request.lane_id == *lane_id) {
                lane.drafter.pending = *drafted;
                if lane.shadow.as_ref().is_some_and(|s| s.lease.is_none()) {
                    room.metrics.add_head_draft(*drafted);
                }
            }
        }
        for s in std::mem::take(&mut output.sampled) {
            let Some(i) = self.queue.position(s.lane_id) else { continue };
            let lane = &mut self.queue.lanes[i];
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
            if finish.is_some() && lane.request.cache && lane.request.keep_reply {
                // Every position but the last token's has its KV: the reply resumes a turn that continues it.
                lane.lease.cache_prompt(&lane.tokens[..lane.tokens.len() - 1]);
            }
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
                let mut lane = self.queue.lanes.swap_remove(i);
                // Drafts past the lane's last token were never in question: they count as neither kept nor not.
                lane.drafter.pending = lane.drafter.pending.min(lane.drafter.accepted);
                room.metrics.add_draft(lane.drafter.settle(room.schedule.drafting.max_wait));
            }
        }
        for lane in &mut self.queue.lanes {
            if let Some(s) = lane.shadow.as_mut() {
                // A failed pass took no token: the shadow takes them again from where it was.
                if output.draft_failed.contains(&lane.request.lane_id) {
                    (s.catch_up, s.drafted_from) = (None, None);
                }
                s.seen = s.catch_up.take().unwrap_or(s.seen);
                // The draft model took every drafted token but its last; those accepted are the lane's now. An own
                // head read its own guesses' states there, so it takes those positions again from the model's.
                if let Some(from) = s.drafted_from.take() {
                    let (drafted, accepted) = (lane.drafter.pending, lane.drafter.accepted);
                    s.seen = match (drafted, &s.lease) {
                        // An own head's earlier rows stay right; a draft model's pool may have lost them.
                        (0, None) => s.seen,
                        (0, Some(_)) => 0,
                        (_, None) => from,
                        (_, Some(_)) => from + accepted.min(drafted - 1),
                    };
                }
            }
            room.metrics.add_draft(lane.drafter.settle(room.schedule.drafting.max_wait));
        }
        let mut audio = std::mem::take(&mut output.audio).into_iter();
        for to in self.decoding.drain(..) {
            let pcm = match audio.next() {
                Some((_, pcm)) => pcm,
                None => Err(output.failed.first().map_or(EngineError::Stopped, |(_, e)| e.clone())),
            };
            outbox.pcm.push((to, LanePcm(pcm)));
        }
    }

    fn release(&mut self, lane_id: u64) {
        self.queue.release(lane_id);
        self.codec.retain(|w| w.lane_id != lane_id);
    }

    fn fail(&mut self, lane_id: u64, why: &EngineError, outbox: &mut Outbox) {
        if let Some(lane) = self.queue.take(lane_id) {
            outbox.failed.push((lane.request.failed, LaneFailed { error: why.clone() }));
        }
    }

    /// Ends every running lane and every queued codec window.
    fn fail_running(&mut self, why: &EngineError, outbox: &mut Outbox) {
        for lane in self.queue.lanes.drain(..) {
            outbox.failed.push((lane.request.failed, LaneFailed { error: why.clone() }));
        }
        for to in self.decoding.drain(..).chain(self.codec.drain(..).map(|w| w.to)) {
            outbox.pcm.push((to, LanePcm(Err(why.clone()))));
        }
    }

    fn fail_waiting(&mut self, why: &EngineError, outbox: &mut Outbox) {
        for request in self.queue.waiting.drain(..) {
            outbox.failed.push((request.failed, LaneFailed { error: why.clone() }));
        }
    }
}

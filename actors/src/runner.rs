//! The engine thread: runs each round plan as one batched forward pass off the actix arbiters.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use std::collections::HashMap;

use tensorfold_kernels::sampling::{distinct, log_softmax, sample, sample_kept, SamplingParams};
use tokio::sync::oneshot;

use tensorfold_engine::boundary::{Engine, EngineError, Keep, LaneStep, Logits, Synth};

use crate::draft::{StepCost, TIMED_WIDTHS};
use crate::model_slot::ModelSlot;
use crate::request_types::TokenLogprob;
use crate::round::{LaneGrammar, PlannedLane, RoundOutput, RoundPlan, SampleSpec, Sampled, VoiceOutput};
use crate::rules::{row_masks, shape_row, Masks, RowMasks};
use voice::run_step;

mod voice;

struct Job {
    plan: RoundPlan,
    reply: oneshot::Sender<RoundOutput>,
}

/// A handle to the engine thread; dropping it ends the thread after the current round.
pub struct EngineRunner {
    jobs: mpsc::Sender<Job>,
    /// What a step costs on each model, for drafting's choices.
    step_costs: Vec<StepCost>,
}

impl EngineRunner {
    /// Starts the engine thread; with `probe_rows` above 1, first times each token model's steps of one row and of
    /// 1, 2 and 4 times that many (what a verify step costs on this device).
    pub fn spawn(mut models: Vec<ModelSlot>, probe_rows: usize) -> std::io::Result<EngineRunner> {
        let step_costs = models.iter_mut().map(|m| measure_step_cost(m, probe_rows)).collect();
        let (jobs, inbox) = mpsc::channel::<Job>();
        thread::Builder::new().name("tensorfold-engine".into()).spawn(move || {
            let mut idle_since = Instant::now();
            while let Some(job) = next_job(&inbox) {
                let (idle, started) = (idle_since.elapsed(), Instant::now());
                // Engines report faults as errors; a panic is a bug, which fails the round's lanes and spares the thread.
                let lanes = lane_ids(&job.plan);
                let round = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_round(&mut models, job.plan)));
                let output = round.unwrap_or_else(|panic| {
                    let why = panic_message(panic.as_ref());
                    tracing::error!(why, "a round panicked on the engine thread");
                    let failed = lanes.into_iter().map(|id| (id, EngineError::Panicked(why.clone()))).collect();
                    RoundOutput { failed, ..RoundOutput::default() }
                });
                tracing::debug!(
                    idle_us = idle.as_micros() as u64,
                    round_us = started.elapsed().as_micros() as u64,
                    "round"
                );
                idle_since = Instant::now();
                // The coordinator may have stopped; then nobody wants the output.
                let _ = job.reply.send(output);
            }
        })?;
        Ok(EngineRunner { jobs, step_costs })
    }

    /// What a step costs on `model` (one of the models `spawn` was given, as the page pools are indexed).
    pub fn step_cost(&self, model: usize) -> &StepCost {
        &self.step_costs[model]
    }

    /// Queues a round; the receiver yields its output, or an error if the round failed or the engine thread died.
    pub fn run(&self, plan: RoundPlan) -> oneshot::Receiver<RoundOutput> {
        let (reply, output) = oneshot::channel();
        // A dead engine thread drops the reply sender, which the receiver reports.
        let _ = self.jobs.send(Job { plan, reply });
        output
    }
}

/// Times a token model's steps of one row and of `TIMED_WIDTHS` times `rows` rows, the fastest of three each after a
/// warm-up, on KV pages no lane holds yet (a lane writes every position it reads).
fn measure_step_cost(slot: &mut ModelSlot, rows: usize) -> StepCost {
    let ModelSlot::Tokens { engine, pool, .. } = slot else { return StepCost::unknown() };
    let widest = rows * TIMED_WIDTHS[TIMED_WIDTHS.len() - 1];
    let pages: Vec<u32> = (0..widest.div_ceil(pool.layout().page_tokens) as u32).collect();
    if rows < 2 || pages.len() > pool.num_pages() {
        return StepCost::unknown();
    }
    let tokens = vec![1u32.min(engine.vocab_size() as u32 - 1); widest];
    let mut time = |n: usize| -> Result<(usize, f64), EngineError> {
        let logits = if n == 1 { Logits::Argmax } else { Logits::Picks };
        let step = LaneStep { tokens: &tokens[..n], start_pos: 0, pages: &pages, logits, keep: None };
        let mut best = f64::INFINITY;
        for i in 0..4 {
            let started = Instant::now();
            engine.forward(pool, std::slice::from_ref(&step))?;
            best = if i == 0 { best } else { best.min(started.elapsed().as_secs_f64()) };
        }
        Ok((n, best))
    };
    let widths = std::iter::once(1).chain(TIMED_WIDTHS.iter().map(|w| w * rows));
    match widths.map(&mut time).collect::<Result<Vec<_>, _>>() {
        Ok(points) => {
            let micros: Vec<(usize, u64)> = points.iter().map(|&(n, s)| (n, (s * 1e6) as u64)).collect();
            tracing::info!(?micros, "step cost (rows, us)");
            StepCost::from_points(points)
        }
        Err(e) => {
            tracing::warn!(error = %e, "timing a step failed; drafting assumes rows are free");
            StepCost::unknown()
        }
    }
}

/// How long the engine thread polls for the next round before it sleeps: the coordinator plans it within tens of
/// microseconds of the last, sooner than a sleeping thread wakes.
const POLL: Duration = Duration::from_micros(500);

/// The next job, or `None` once every sender is gone.
fn next_job(inbox: &mpsc::Receiver<Job>) -> Option<Job> {
    let until = Instant::now() + POLL;
    while Instant::now() < until {
        match inbox.try_recv() {
            Ok(job) => return Some(job),
            Err(mpsc::TryRecvError::Disconnected) => return None,
            Err(mpsc::TryRecvError::Empty) => std::hint::spin_loop(),
        }
    }
    inbox.recv().ok()
}

/// Every lane of a plan: token lanes, codec windows and voice lanes.
fn lane_ids(plan: &RoundPlan) -> Vec<u64> {
    let tokens = plan.lanes.iter().map(|l| l.lane_id);
    let windows = plan.codec.iter().map(|c| c.lane_id);
    tokens.chain(windows).chain(plan.voices.iter().map(|v| v.lane_id)).collect()
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".into(),
    }
}

/// Draft models' steps, each model's lanes in one batched forward pass, then the round's codec windows.
fn run_round(models: &mut [ModelSlot], mut plan: RoundPlan) -> RoundOutput {
    let drafts = crate::draft_model::draft(models, &mut plan);
    let grammars = std::mem::take(&mut plan.grammars);
    // Grammars make their masks while the forward passes run, so a mask costs the round nothing it would wait on.
    let (passes, masks) = rayon::join(|| forward_all(models, &plan.lanes), || row_masks(grammars, &plan.lanes));
    let (drawn, grammars) = draw_all(&plan.lanes, passes, masks);
    let Drawn { sampled, failed, hidden } = drawn;
    // Each model's codec takes all of the round's windows for it in one call.
    let mut by_model: std::collections::BTreeMap<usize, Vec<_>> = std::collections::BTreeMap::new();
    plan.codec.iter().for_each(|c| by_model.entry(c.model).or_default().push(c));
    let mut audio = Vec::with_capacity(plan.codec.len());
    let started = Instant::now();
    for (m, windows) in by_model {
        let pcm = match models.get(m) {
            Some(ModelSlot::Tokens { codec: Some(codec), .. }) => {
                codec.decode_batch(&windows.iter().map(|c| &c.job).collect::<Vec<_>>())
            }
            _ => windows.iter().map(|_| Err(EngineError::Codec(format!("model {m} has no codec")))).collect(),
        };
        audio.extend(windows.iter().map(|c| c.lane_id).zip(pcm));
    }
    if !plan.codec.is_empty() {
        tracing::debug!(windows = plan.codec.len(), codec_us = started.elapsed().as_micros() as u64, "codec");
    }
    let voices: Vec<Option<&dyn Synth>> = models
        .iter()
        .map(|m| match m {
            ModelSlot::Voice(v) => Some(v.as_ref()),
            ModelSlot::Tokens { .. } => None,
        })
        .collect();
    // Each voice lane's step is its own work, so lanes run side by side.
    let voices = plan
        .voices
        .into_par_iter()
        .map(|v| match voices.get(v.model).copied().flatten() {
            Some(voice) => run_step(voice, v),
            None => {
                let result = Err(EngineError::Voice(format!("model {} is not a voice", v.model)));
                VoiceOutput { lane_id: v.lane_id, state: None, result }
            }
        })
        .collect();
    RoundOutput { sampled, drafts, audio, voices, failed, hidden, grammars }
}

/// One model's forward pass: its lanes as indices into the plan, whether each lane's row came back kept, the rows.
struct Pass {
    lanes: Vec<usize>,
    kept: Vec<bool>,
    logits: Result<Vec<Vec<f32>>, EngineError>,
    forward: Duration,
}

/// What the round's passes give back: drawn tokens, lanes that failed, embedding lanes' hidden rows.
#[derive(Default)]
struct Drawn {
    sampled: Vec<Sampled>,
    failed: Vec<(u64, EngineError)>,
    hidden: Vec<(u64, Vec<f32>)>,
}

/// Each model's lanes in one batched forward pass.
fn forward_all(models: &mut [ModelSlot], planned: &[PlannedLane]) -> Vec<Pass> {
    let mut passes = Vec::new();
    for (m, slot) in models.iter_mut().enumerate() {
        let ModelSlot::Tokens { engine, pool, .. } = slot else { continue };
        let lanes: Vec<&PlannedLane> = planned.iter().filter(|l| l.model == m).collect();
        if lanes.is_empty() {
            continue;
        }
        // An engine that keeps rows cuts a sampled lane's last row to the tokens its draw can take.
        let keeps = engine.keeps_rows();
        let kept: Vec<bool> = lanes.iter().map(|l| keeps && l.sample.as_ref().is_some_and(is_kept_draw)).collect();
        let histories: Vec<Vec<u32>> = lanes
            .par_iter()
            .zip(&kept)
            .map(|(l, &k)| match (k, l.sample.as_ref()) {
                (true, Some(spec)) if spec.params.repetition_penalty != 1.0 => distinct(&spec.history),
                _ => Vec::new(),
            })
            .collect();
        let steps: Vec<LaneStep> = lanes
            .iter()
            .zip(kept.iter().zip(&histories))
            .map(|(l, (&k, history))| LaneStep {
                tokens: &l.tokens,
                start_pos: l.start_pos,
                pages: &l.pages,
                logits: match l.embed {
                    true => Logits::Hidden,
                    false => l.sample.as_ref().map_or(Logits::None, logits_for),
                },
                keep: l.sample.as_ref().filter(|_| k).map(|spec| Keep {
                    temperature: spec.params.temperature,
                    repetition_penalty: spec.params.repetition_penalty,
                    history,
                }),
            })
            .collect();
        let started = Instant::now();
        let logits = engine.forward(pool, &steps);
        if let Err(e) = &logits {
            tracing::error!(model = m, lanes = lanes.len(), error = %e, "a forward pass failed");
        }
        let lanes = (0..planned.len()).filter(|&i| planned[i].model == m).collect();
        passes.push(Pass { lanes, kept, logits, forward: started.elapsed() });
    }
    passes
}

/// Every lane's draw from its rows, then its grammar takes the drawn tokens; a lane whose pass or grammar failed ends.
fn draw_all(planned: &[PlannedLane], passes: Vec<Pass>, masks: Vec<RowMasks>) -> (Drawn, Vec<LaneGrammar>) {
    // The grammars stay out of the parallel draw, which reads only their masks.
    let (grammars, masks): (Vec<LaneGrammar>, HashMap<u64, Masks>) =
        masks.into_iter().map(|m| (m.grammar.lane_id, m)).map(|(id, m)| (m.grammar, (id, m.masks))).unzip();
    let Drawn { mut sampled, mut failed, mut hidden } = Drawn::default();
    for pass in passes {
        let logits = match pass.logits {
            Ok(logits) => logits,
            Err(e) => {
                failed.extend(pass.lanes.iter().map(|&i| (planned[i].lane_id, e.clone())));
                continue;
            }
        };
        let started = Instant::now();
        let (embeds, lanes): (Vec<_>, Vec<_>) =
            pass.lanes.iter().zip(logits).zip(&pass.kept).partition(|((&i, _), _)| planned[i].embed);
        let rows = embeds.into_iter().map(|((&i, rows), _)| (planned[i].lane_id, rows));
        hidden.extend(rows.filter(|(id, _)| !failed.iter().any(|(f, _)| f == id)));
        // Each lane's draw reads only its own logits, so the lanes draw side by side, in plan order.
        let drawn: Vec<Result<Vec<Sampled>, (u64, EngineError)>> = lanes
            .into_par_iter()
            .map(|((&i, logits), &kept)| {
                let lane = &planned[i];
                let fail = |why: String| (lane.lane_id, EngineError::Grammar(why));
                match (kept, masks.get(&lane.lane_id)) {
                    (true, _) => Ok(draw_kept(lane, &logits)),
                    (false, None) => draw(lane, &logits, None).map_err(fail),
                    (false, Some(Ok(rows))) => draw(lane, &logits, Some(rows)).map_err(fail),
                    (false, Some(Err(why))) => Err(fail(why.clone())),
                }
            })
            .collect();
        for lane in drawn {
            match lane {
                Ok(tokens) => sampled.extend(tokens),
                Err(lane_failed) => failed.push(lane_failed),
            }
        }
        tracing::debug!(
            forward_us = pass.forward.as_micros() as u64,
            draw_us = started.elapsed().as_micros() as u64,
            "forward"
        );
    }
    let mut kept = Vec::with_capacity(grammars.len());
    for mut grammar in grammars {
        let lane_id = grammar.lane_id;
        if failed.iter().any(|(id, _)| *id == lane_id) {
            continue;
        }
        let taken = sampled.iter().filter(|s| s.lane_id == lane_id).try_for_each(|s| grammar.grammar.commit(s.id));
        match taken {
            Ok(()) => kept.push(grammar),
            Err(why) => failed.push((lane_id, EngineError::Grammar(why))),
        }
    }
    (Drawn { sampled, failed, hidden }, kept)
}

/// Whether a lane's rows change before its draw: a grammar's mask, a bias or a presence or frequency penalty.
fn is_shaped(spec: &SampleSpec) -> bool {
    spec.masked || !spec.rules.is_empty()
}

/// A greedy lane without log-probabilities or shaping needs only the index of its largest logit, which the engine
/// finds, in every row when it verifies a draft; other lanes need the last row, or every row with a draft.
fn logits_for(spec: &SampleSpec) -> Logits {
    match (spec.draft.is_empty(), spec.params.is_greedy() && spec.logprobs.is_none() && !is_shaped(spec)) {
        (true, true) => Logits::Argmax,
        (false, true) => Logits::Picks,
        (true, false) => Logits::Last,
        (false, false) => Logits::All,
    }
}

/// Whether a lane's draw is of its last row alone, sampled: the draw an engine that keeps rows can cut short. A lane
/// asking for log-probabilities needs its whole row (their sum runs over the vocabulary); at temperature 0 no cut
/// is defined.
fn is_kept_draw(spec: &SampleSpec) -> bool {
    logits_for(spec) == Logits::Last && !is_shaped(spec) && spec.logprobs.is_none() && spec.params.temperature > 0.0
}

/// A sampled lane's token from its last row cut to the tokens its draw can take: (id bits, logit) pairs.
fn draw_kept(lane: &PlannedLane, pairs: &[f32]) -> Vec<Sampled> {
    let Some(spec) = lane.sample.as_ref() else { return Vec::new() };
    let ids: Vec<u32> = pairs.iter().step_by(2).map(|id| id.to_bits()).collect();
    let logits: Vec<f32> = pairs.iter().skip(1).step_by(2).copied().collect();
    let id = sample_kept(&ids, &logits, &spec.params, spec.position);
    vec![Sampled { lane_id: lane.lane_id, id, logprob: None }]
}

/// The lane's drawn tokens: one, or with a draft the draw of each row while the one before equaled its draft.
/// Row j draws at position + j with the history and mask plain decoding would have there, so the tokens are the same.
/// Log-probabilities are the model's own, before penalties, bias and mask.
fn draw(lane: &PlannedLane, logits: &[f32], masks: Option<&[Vec<u32>]>) -> Result<Vec<Sampled>, String> {
    let Some(spec) = lane.sample.as_ref() else { return Ok(Vec::new()) };
    if matches!(logits_for(spec), Logits::Argmax | Logits::Picks) {
        // Row j's pick is kept while the row before it equaled its draft.
        let kept = logits.iter().enumerate().take_while(|&(j, _)| j == 0 || spec.draft[j - 1] == logits[j - 1] as u32);
        return Ok(kept.map(|(_, &id)| Sampled { lane_id: lane.lane_id, id: id as u32, logprob: None }).collect());
    }
    let rows = spec.draft.len() + 1;
    let vocab = logits.len() / rows;
    let shaped = masks.is_some() || !spec.rules.is_empty();
    let grows = spec.params.repetition_penalty != 1.0 || spec.rules.presence != 0.0 || spec.rules.frequency != 0.0;
    // A shaped row has its repetition penalty already.
    let unpenalized = SamplingParams { repetition_penalty: 1.0, ..spec.params.clone() };
    let mut history = std::borrow::Cow::Borrowed(&spec.history[..]);
    let mut out = Vec::with_capacity(rows);
    for j in 0..rows {
        let row = &logits[j * vocab..(j + 1) * vocab];
        let position = spec.position + j as u64;
        let id = match (shaped, masks.map(|m| m.get(j))) {
            (_, Some(None)) => break,
            (true, mask) => {
                let mask = mask.flatten().map(Vec::as_slice);
                let generated = history.get(spec.prompt_len..).unwrap_or_default();
                let shaped = shape_row(row, &spec.params, &spec.rules, &history, generated, mask);
                if shaped.iter().all(|l| *l == f32::NEG_INFINITY) {
                    return Err(format!("no token of the vocabulary of {vocab} is allowed at position {position}"));
                }
                sample(&shaped, &unpenalized, &[], position)
            }
            (false, _) => sample(row, &spec.params, &history, position),
        };
        out.push(Sampled { lane_id: lane.lane_id, id, logprob: spec.logprobs.map(|n| logprob(row, id, n)) });
        if spec.draft.get(j) != Some(&id) {
            break;
        }
        if grows {
            history.to_mut().push(id);
        }
    }
    Ok(out)
}

/// The drawn token's log-probability and the `n` most likely, ties to the lower id.
fn logprob(logits: &[f32], id: u32, n: usize) -> TokenLogprob {
    let lp = log_softmax(logits);
    let mut order: Vec<usize> = (0..lp.len()).collect();
    order.select_nth_unstable_by(n.min(lp.len() - 1), |&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
    order.truncate(n);
    order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
    TokenLogprob { logprob: lp[id as usize], top: order.iter().map(|&i| (i as u32, lp[i])).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensorfold_kernels::sampling::SamplingParams;

    /// A lane whose step carries `draft`, seeded and hot so each position's draw differs, with a penalty.
    fn drafting_lane(draft: Vec<u32>) -> PlannedLane {
        let params = SamplingParams { temperature: 1.5, repetition_penalty: 1.2, seed: 9, ..Default::default() };
        let (rules, history) = (Default::default(), vec![3, 4, 5]);
        let sample =
            SampleSpec { params, history, prompt_len: 3, rules, masked: false, position: 40, logprobs: Some(2), draft };
        let (tokens, pages) = (Vec::new(), Vec::new());
        PlannedLane { lane_id: 1, model: 0, tokens, start_pos: 39, pages, sample: Some(sample), embed: false }
    }

    #[test]
    fn test_a_drafted_step_draws_at_each_row_what_plain_decoding_draws_there() {
        let vocab = 50;
        let rows: Vec<Vec<f32>> =
            (0..5).map(|r| (0..vocab).map(|v| ((r * 13 + v * 7) % 11) as f32 * 0.1).collect()).collect();
        // Plain decoding: one row a step, at positions 40, 41, ..., each with the history before it.
        let mut plain = drafting_lane(Vec::new());
        let mut ids = Vec::new();
        for (j, row) in rows.iter().enumerate() {
            let spec = plain.sample.as_mut().unwrap();
            spec.position = 40 + j as u64;
            let s = draw(&plain, row, None).unwrap().remove(0);
            plain.sample.as_mut().unwrap().history.push(s.id);
            ids.push(s);
        }
        assert!(ids.windows(2).any(|w| w[0].id != w[1].id), "the rows draw different tokens");
        let flat: Vec<f32> = rows.concat();
        // A draft of the plain tokens is kept whole, and the row after it draws the next one.
        let all = draw(&drafting_lane(ids[..4].iter().map(|s| s.id).collect()), &flat, None).unwrap();
        let got: Vec<(u32, Option<TokenLogprob>)> = all.iter().map(|s| (s.id, s.logprob.clone())).collect();
        let want: Vec<(u32, Option<TokenLogprob>)> = ids.iter().map(|s| (s.id, s.logprob.clone())).collect();
        assert_eq!(got, want);
        // A draft that goes wrong at its third token keeps the first two and the row that disagreed.
        let mut wrong: Vec<u32> = ids[..4].iter().map(|s| s.id).collect();
        wrong[2] = (wrong[2] + 1) % vocab as u32;
        let some = draw(&drafting_lane(wrong), &flat, None).unwrap();
        assert_eq!(some.iter().map(|s| s.id).collect::<Vec<_>>(), ids[..3].iter().map(|s| s.id).collect::<Vec<_>>());
    }

    #[test]
    fn test_a_greedy_drafted_step_keeps_the_engines_picks_while_the_row_before_equaled_its_draft() {
        let mut lane = drafting_lane(vec![5, 7, 3]);
        lane.sample.as_mut().unwrap().params = SamplingParams { temperature: 0.0, ..Default::default() };
        lane.sample.as_mut().unwrap().logprobs = None;
        assert_eq!(logits_for(lane.sample.as_ref().unwrap()), Logits::Picks);
        let ids = |s: Result<Vec<Sampled>, String>| s.unwrap().iter().map(|s| s.id).collect::<Vec<_>>();
        assert_eq!(
            ids(draw(&lane, &[5.0, 7.0, 9.0, 2.0], None)),
            vec![5, 7, 9],
            "the third draft failed: its row's pick ends it"
        );
        assert_eq!(ids(draw(&lane, &[5.0, 7.0, 3.0, 2.0], None)), vec![5, 7, 3, 2], "all kept, and the row after");
        assert_eq!(ids(draw(&lane, &[6.0, 7.0, 3.0, 2.0], None)), vec![6], "the first failed");
    }

    fn job() -> (Job, oneshot::Receiver<RoundOutput>) {
        let (reply, rx) = oneshot::channel();
        (Job { plan: RoundPlan::default(), reply }, rx)
    }

    #[test]
    fn test_next_job_takes_jobs_while_polling_and_after_sleeping_then_ends_with_the_senders() {
        let (jobs, inbox) = mpsc::channel();
        let (first, mut first_rx) = job();
        jobs.send(first).unwrap();
        let got = next_job(&inbox).expect("a queued job");
        assert!(got.reply.send(RoundOutput::default()).is_ok());
        assert!(first_rx.try_recv().is_ok(), "the queued job came back");
        // A job sent well after the poll window reaches a sleeping receiver.
        let (late, mut late_rx) = job();
        let sender = thread::spawn(move || {
            thread::sleep(POLL * 20);
            jobs.send(late).unwrap();
        });
        let got = next_job(&inbox).expect("the late job");
        assert!(got.reply.send(RoundOutput::default()).is_ok());
        assert!(late_rx.try_recv().is_ok(), "the late job came back");
        sender.join().unwrap();
        assert!(next_job(&inbox).is_none(), "no job once the sender is gone");
    }
}

//! The engine thread: runs each round plan as one batched forward pass off the actix arbiters.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rayon::prelude::*;
use tensorfold_engine::boundary::{Engine, EngineError, Keep, LaneStep, Logits, Synth};
use tensorfold_kernels::sampling::distinct;
use tokio::sync::oneshot;

use crate::model_slot::ModelSlot;
use crate::round::{PlannedLane, RoundOutput, RoundPlan, VoiceOutput};
use cost::measure_step_cost;
use draw::{draw_all, is_kept_draw, logits_for, Drawn, Pass};
use rules::row_masks;
use voice::run_step;

mod cost;
mod draft_model;
mod draw;
mod rules;
mod voice;

pub use cost::{StepCost, TIMED_WIDTHS};

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

    /// What a step costs on `model` (one of the models `spawn` was given, as its KV pages are indexed).
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
    let (drafts, draft_failed) = draft_model::draft(models, &mut plan);
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
    RoundOutput { sampled, drafts, draft_failed, audio, voices, failed, hidden, grammars }
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
        passes.push(Pass { lanes, rows: logits, forward: started.elapsed() });
    }
    passes
}

#[cfg(test)]
mod tests {
    use super::*;

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

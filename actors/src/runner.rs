//! The engine thread: runs each round plan as one batched forward pass off the actix arbiters.

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use rayon::prelude::*;

use tensorfold_kernels::sampling::{log_softmax, sample};
use tokio::sync::oneshot;

use tensorfold_engine::boundary::{Codec, Engine, EngineError, KvPool, LaneStep, Logits, Voice};

use crate::request_types::TokenLogprob;
use crate::round::{PlannedLane, RoundOutput, RoundPlan, SampleSpec, Sampled};
use crate::voice::{run_step, VoiceOutput};

struct Job {
    plan: RoundPlan,
    reply: oneshot::Sender<RoundOutput>,
}

/// One model as the engine thread holds it: a token model with its KV pool (and codec, for speech), or a voice.
pub enum ModelSlot {
    Tokens { engine: Box<dyn Engine>, pool: KvPool, codec: Option<Box<dyn Codec>> },
    Voice(Box<dyn Voice>),
}

/// A handle to the engine thread; dropping it ends the thread after the current round.
pub struct EngineRunner {
    jobs: mpsc::Sender<Job>,
}

impl EngineRunner {
    pub fn spawn(mut models: Vec<ModelSlot>) -> std::io::Result<EngineRunner> {
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
        Ok(EngineRunner { jobs })
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

/// Each model's lanes in one batched forward pass, then the round's codec windows.
fn run_round(models: &mut [ModelSlot], plan: RoundPlan) -> RoundOutput {
    let (mut sampled, mut failed) = (Vec::new(), Vec::new());
    for (m, slot) in models.iter_mut().enumerate() {
        let ModelSlot::Tokens { engine, pool, .. } = slot else { continue };
        let lanes: Vec<&PlannedLane> = plan.lanes.iter().filter(|l| l.model == m).collect();
        if lanes.is_empty() {
            continue;
        }
        let steps: Vec<LaneStep> = lanes
            .iter()
            .map(|l| LaneStep {
                tokens: &l.tokens,
                start_pos: l.start_pos,
                pages: &l.pages,
                logits: l.sample.as_ref().map_or(Logits::None, logits_for),
            })
            .collect();
        let started = Instant::now();
        let logits = match engine.forward(pool, &steps) {
            Ok(logits) => logits,
            Err(e) => {
                tracing::error!(model = m, lanes = lanes.len(), error = %e, "a forward pass failed");
                failed.extend(lanes.iter().map(|l| (l.lane_id, e.clone())));
                continue;
            }
        };
        let forward = started.elapsed();
        // Each lane's draw reads only its own logits, so the lanes draw side by side, in plan order.
        let drawn: Vec<Sampled> =
            lanes.par_iter().zip(&logits).filter_map(|(lane, logits)| draw(lane, logits)).collect();
        sampled.extend(drawn);
        tracing::debug!(
            forward_us = forward.as_micros() as u64,
            draw_us = (started.elapsed() - forward).as_micros() as u64,
            "forward"
        );
    }
    // Windows are independent, so the round decodes them side by side.
    let codecs: Vec<Option<&dyn Codec>> = models
        .iter()
        .map(|m| match m {
            ModelSlot::Tokens { codec, .. } => codec.as_deref(),
            ModelSlot::Voice(_) => None,
        })
        .collect();
    let audio = plan
        .codec
        .par_iter()
        .map(|c| {
            let pcm = match codecs.get(c.model).copied().flatten() {
                Some(codec) => codec.decode(&c.job),
                None => Err(EngineError::Codec(format!("model {} has no codec", c.model))),
            };
            (c.lane_id, pcm)
        })
        .collect();
    let voices: Vec<Option<&dyn Voice>> = models
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
    RoundOutput { sampled, audio, voices, failed }
}

/// A greedy lane without log-probabilities needs only the index of its largest logit, which the engine finds.
fn logits_for(spec: &SampleSpec) -> Logits {
    match spec.params.is_greedy() && spec.logprobs.is_none() {
        true => Logits::Argmax,
        false => Logits::Last,
    }
}

fn draw(lane: &PlannedLane, logits: &[f32]) -> Option<Sampled> {
    let spec = lane.sample.as_ref()?;
    let id = match logits_for(spec) {
        Logits::Argmax => *logits.first()? as u32,
        _ => sample(logits, &spec.params, &spec.history, spec.position),
    };
    let logprob = spec.logprobs.map(|n| {
        let lp = log_softmax(logits);
        let mut order: Vec<usize> = (0..lp.len()).collect();
        order.select_nth_unstable_by(n.min(lp.len() - 1), |&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
        order.truncate(n);
        order.sort_by(|&a, &b| lp[b].total_cmp(&lp[a]).then(a.cmp(&b)));
        TokenLogprob { logprob: lp[id as usize], top: order.iter().map(|&i| (i as u32, lp[i])).collect() }
    });
    Some(Sampled { lane_id: lane.lane_id, id, logprob })
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

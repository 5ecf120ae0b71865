//! The voice book: lanes that speak without tokens; a lane prepares each sentence in one round, then makes audio
//! a window per round.

use std::collections::VecDeque;

use actix::prelude::*;
use tensorfold_engine::boundary::EngineError;

use super::book::{LaneBook, Room};
use crate::messages::{EnqueueVoice, VoiceAudio};
use crate::outbox::Outbox;
use crate::round::{ModelId, PlannedVoice, RoundOutput, RoundPlan, VoiceWork};

struct VoiceLane {
    lane_id: u64,
    model: ModelId,
    to: Recipient<VoiceAudio>,
    /// `None` while the lane's step is in the round in flight.
    work: Option<VoiceWork>,
}

/// The voice lanes and their queue.
#[derive(Default)]
pub struct VoiceBook {
    waiting: VecDeque<EnqueueVoice>,
    lanes: Vec<VoiceLane>,
}

impl VoiceBook {
    pub fn enqueue(&mut self, request: EnqueueVoice) {
        self.waiting.push_back(request);
    }
}

fn ended(to: Recipient<VoiceAudio>, pcm: Result<Vec<f32>, EngineError>) -> (Recipient<VoiceAudio>, VoiceAudio) {
    (to, VoiceAudio { pcm, finished: true })
}

impl LaneBook for VoiceBook {
    fn num_running(&self) -> usize {
        self.lanes.len()
    }

    fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    fn front_lane(&self) -> Option<u64> {
        self.waiting.front().map(|r| r.lane_id)
    }

    fn admit_one(&mut self, _: &Room) -> bool {
        let Some(r) = self.waiting.pop_front() else { return false };
        let work = Some(VoiceWork::Start(r.input));
        self.lanes.push(VoiceLane { lane_id: r.lane_id, model: r.model, to: r.to, work });
        true
    }

    /// One step for every lane not already in flight.
    fn plan(&mut self, _: &Room, plan: &mut RoundPlan) {
        let ready = self.lanes.iter_mut().filter_map(|l| Some((l.lane_id, l.model, l.work.take()?)));
        plan.voices.extend(ready.map(|(lane_id, model, work)| PlannedVoice { lane_id, model, work }));
    }

    /// Puts each step's audio in the outbox; a lane whose audio is complete or failed ends.
    fn apply(&mut self, _: &Room, output: &mut RoundOutput, outbox: &mut Outbox) {
        for out in std::mem::take(&mut output.voices) {
            let Some(i) = self.lanes.iter().position(|l| l.lane_id == out.lane_id) else { continue };
            let reply = match (out.result, out.state) {
                (Ok(Some(pcm)), Some(state)) => {
                    self.lanes[i].work = Some(VoiceWork::Step(state));
                    (self.lanes[i].to.clone(), VoiceAudio { pcm: Ok(pcm), finished: false })
                }
                (Ok(_), _) => ended(self.lanes.swap_remove(i).to, Ok(Vec::new())),
                (Err(e), _) => ended(self.lanes.swap_remove(i).to, Err(e)),
            };
            outbox.voices.push(reply);
        }
    }

    fn release(&mut self, lane_id: u64) {
        self.waiting.retain(|r| r.lane_id != lane_id);
        self.lanes.retain(|l| l.lane_id != lane_id);
    }

    fn fail(&mut self, lane_id: u64, why: &EngineError, outbox: &mut Outbox) {
        if let Some(i) = self.lanes.iter().position(|l| l.lane_id == lane_id) {
            outbox.voices.push(ended(self.lanes.swap_remove(i).to, Err(why.clone())));
        }
    }

    fn fail_running(&mut self, why: &EngineError, outbox: &mut Outbox) {
        outbox.voices.extend(self.lanes.drain(..).map(|l| ended(l.to, Err(why.clone()))));
    }

    fn fail_waiting(&mut self, why: &EngineError, outbox: &mut Outbox) {
        outbox.voices.extend(self.waiting.drain(..).map(|r| ended(r.to, Err(why.clone()))));
    }
}

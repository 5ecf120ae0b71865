//! Voice lanes, which speak without tokens: a lane prepares each sentence in one round, then makes audio a window per round.

use actix::prelude::*;
use tensorfold_engine::boundary::{EngineError, Synth, VoiceInput};

use crate::messages::VoiceAudio;
use crate::outbox::Outbox;
use crate::round::{ModelId, PlannedVoice, VoiceOutput, VoiceWork};

/// Runs one planned step on the engine thread.
pub fn run_step(voice: &dyn Synth, planned: PlannedVoice) -> VoiceOutput {
    let mut state = match planned.work {
        VoiceWork::Start(input) => voice.start(input),
        VoiceWork::Step(state) => state,
    };
    let result = state.step();
    VoiceOutput { lane_id: planned.lane_id, state: Some(state), result }
}

/// A voice request waiting for a lane.
pub struct VoiceRequest {
    pub lane_id: u64,
    pub model: ModelId,
    pub input: VoiceInput,
    pub to: Recipient<VoiceAudio>,
}

struct VoiceLane {
    lane_id: u64,
    model: ModelId,
    to: Recipient<VoiceAudio>,
    /// `None` while the lane's step is in the round in flight.
    work: Option<VoiceWork>,
}

/// The coordinator's voice lanes and their queue.
#[derive(Default)]
pub struct VoiceLanes {
    waiting: std::collections::VecDeque<VoiceRequest>,
    lanes: Vec<VoiceLane>,
}

impl VoiceLanes {
    pub fn num_running(&self) -> usize {
        self.lanes.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The lane of the request that waits longest.
    pub fn front_lane(&self) -> Option<u64> {
        self.waiting.front().map(|r| r.lane_id)
    }

    pub fn enqueue(&mut self, request: VoiceRequest) {
        self.waiting.push_back(request);
    }

    /// Gives the first waiting request a lane; false when none waits.
    pub fn admit_one(&mut self) -> bool {
        let Some(r) = self.waiting.pop_front() else { return false };
        let work = Some(VoiceWork::Start(r.input));
        self.lanes.push(VoiceLane { lane_id: r.lane_id, model: r.model, to: r.to, work });
        true
    }

    /// One step for every lane not already in flight.
    pub fn plan(&mut self) -> Vec<PlannedVoice> {
        let ready = self.lanes.iter_mut().filter_map(|l| Some((l.lane_id, l.model, l.work.take()?)));
        ready.map(|(lane_id, model, work)| PlannedVoice { lane_id, model, work }).collect()
    }

    /// Puts each step's audio in the outbox; a lane whose audio is complete or failed ends.
    pub fn apply(&mut self, outputs: Vec<VoiceOutput>, outbox: &mut Outbox) {
        for out in outputs {
            let Some(i) = self.lanes.iter().position(|l| l.lane_id == out.lane_id) else { continue };
            let (to, audio) = match (out.result, out.state) {
                (Ok(Some(pcm)), Some(state)) => {
                    self.lanes[i].work = Some(VoiceWork::Step(state));
                    (self.lanes[i].to.clone(), VoiceAudio { pcm: Ok(pcm), finished: false })
                }
                (Ok(_), _) => (self.lanes.swap_remove(i).to, VoiceAudio { pcm: Ok(Vec::new()), finished: true }),
                (Err(e), _) => (self.lanes.swap_remove(i).to, VoiceAudio { pcm: Err(e), finished: true }),
            };
            outbox.voices.push((to, audio));
        }
    }

    pub fn release(&mut self, lane_id: u64) {
        self.waiting.retain(|r| r.lane_id != lane_id);
        self.lanes.retain(|l| l.lane_id != lane_id);
    }

    /// Ends the running lane `lane_id`, if it is a voice lane, with `why` in the outbox.
    pub fn fail(&mut self, lane_id: u64, why: &EngineError, outbox: &mut Outbox) {
        if let Some(i) = self.lanes.iter().position(|l| l.lane_id == lane_id) {
            outbox.voices.push((self.lanes.swap_remove(i).to, VoiceAudio { pcm: Err(why.clone()), finished: true }));
        }
    }

    /// Ends every running lane with `why` in the outbox; waiting requests keep their place.
    pub fn fail_running(&mut self, why: &EngineError, outbox: &mut Outbox) {
        for lane in self.lanes.drain(..) {
            outbox.voices.push((lane.to, VoiceAudio { pcm: Err(why.clone()), finished: true }));
        }
    }

    /// Ends every waiting request with `why`.
    pub fn fail_waiting(&mut self, why: &EngineError) {
        for request in self.waiting.drain(..) {
            request.to.do_send(VoiceAudio { pcm: Err(why.clone()), finished: true });
        }
    }
}

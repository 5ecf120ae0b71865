//! Voice steps on the engine thread: a lane's first step prepares its sentence, each later one makes a window.

use tensorfold_engine::boundary::Synth;

use crate::round::{PlannedVoice, VoiceOutput, VoiceWork};

/// Runs one planned step.
pub fn run_step(voice: &dyn Synth, planned: PlannedVoice) -> VoiceOutput {
    let mut state = match planned.work {
        VoiceWork::Start(input) => voice.start(input),
        VoiceWork::Step(state) => state,
    };
    let result = state.step();
    VoiceOutput { lane_id: planned.lane_id, state: Some(state), result }
}

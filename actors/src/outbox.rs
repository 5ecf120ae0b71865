//! What the requests hear of a round: collected while the round's output is applied, sent once the next round is on
//! its way to the engine, for every kind of lane.

use actix::Recipient;

use crate::messages::{LaneEmbedding, LaneFailed, LanePcm, LaneToken, VoiceAudio};

/// Messages for request actors from one round, in the order each lane's were made.
#[derive(Default)]
pub struct Outbox {
    pub tokens: Vec<(Recipient<LaneToken>, LaneToken)>,
    pub pcm: Vec<(Recipient<LanePcm>, LanePcm)>,
    pub voices: Vec<(Recipient<VoiceAudio>, VoiceAudio)>,
    pub embeddings: Vec<(Recipient<LaneEmbedding>, LaneEmbedding)>,
    pub failed: Vec<(Recipient<LaneFailed>, LaneFailed)>,
}

impl Outbox {
    pub fn send(self) {
        for (to, token) in self.tokens {
            to.do_send(token);
        }
        for (to, pcm) in self.pcm {
            to.do_send(pcm);
        }
        for (to, audio) in self.voices {
            to.do_send(audio);
        }
        for (to, embedding) in self.embeddings {
            to.do_send(embedding);
        }
        for (to, failed) in self.failed {
            to.do_send(failed);
        }
    }
}

//! A voice lane's and an embedding lane's replies wait in the round's outbox, which the coordinator sends only once
//! the next round is on its way to the engine, as a text lane's tokens do.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tensorfold_engine::boundary::{EngineError, VoiceInput, VoiceState};

use super::{Coordinator, Drafting, Schedule};
use crate::memory::kv::KvPages;
use crate::messages::{EnqueueEmbed, EnqueueVoice};
use crate::messages::{LaneEmbedding, VoiceAudio};
use crate::metrics::Metrics;
use crate::round::{RoundOutput, VoiceOutput};
use crate::runner::EngineRunner;

/// Counts what reaches it, on an arbiter of its own: a request actor on another thread, as an HTTP worker's.
struct Request(Arc<AtomicUsize>);

impl Actor for Request {
    type Context = Context<Self>;
}

impl Handler<VoiceAudio> for Request {
    type Result = ();
    fn handle(&mut self, _: VoiceAudio, _: &mut Context<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Handler<LaneEmbedding> for Request {
    type Result = ();
    fn handle(&mut self, _: LaneEmbedding, _: &mut Context<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A voice state with nothing more to say.
struct Done;

impl VoiceState for Done {
    fn step(&mut self) -> Result<Option<Vec<f32>>, EngineError> {
        Ok(None)
    }
}

#[actix::test]
async fn test_voice_and_embedding_replies_reach_requests_only_when_the_outbox_is_sent() {
    let runner = EngineRunner::spawn(Vec::new(), 0).unwrap();
    let schedule = Schedule { round_tokens: 8, parallel: 4, max_waiting: 8, drafting: Drafting::OFF };
    let pages = vec![KvPages::new(16, 4, 0)];
    let mut c = Coordinator::new(runner, pages, vec![None], schedule, Arc::new(Metrics::default()));
    let heard = Arc::new(AtomicUsize::new(0));
    let request = {
        let heard = heard.clone();
        Request::start_in_arbiter(&Arbiter::new().handle(), move |_| Request(heard))
    };
    let input = VoiceInput { chunks: vec![vec![1, 2]], speed: 1.0, seed: 0 };
    c.books.voices.enqueue(EnqueueVoice { lane_id: 1, model: 0, input, to: request.clone().recipient() });
    let to = request.clone().recipient();
    c.books.embeds.enqueue(EnqueueEmbed { lane_id: 2, model: 0, prompt: vec![5, 6, 7], cache: false, to });
    c.admit();
    let plan = c.plan();
    assert_eq!((plan.voices.len(), plan.lanes.len()), (1, 1));

    // The round's output: a window of audio for the voice lane, every prompt row for the embedding lane.
    let voice = VoiceOutput { lane_id: 1, state: Some(Box::new(Done)), result: Ok(Some(vec![0.5; 3])) };
    let output = RoundOutput { voices: vec![voice], hidden: vec![(2, vec![0.25; 3 * 4])], ..Default::default() };
    let outbox = c.apply(output);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(heard.load(Ordering::SeqCst), 0, "a reply reached its request before the round's outbox was sent");

    outbox.send();
    let deadline = Instant::now() + Duration::from_secs(5);
    while heard.load(Ordering::SeqCst) < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(heard.load(Ordering::SeqCst), 2, "the voice window and the embedding arrive once the outbox is sent");
}

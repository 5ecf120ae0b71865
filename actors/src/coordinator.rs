//! The frame-round coordinator: admits lanes when the KV pool has room and ticks one batched round at a time.
//!
//! Each kind of lane has its book (`tokens`, `voices`, `embeds`) behind `LaneBook`; this loop admits the oldest
//! request across the books, lets each plan its part of the round, and sends what the books put in the outbox
//! only once the next round is on its way to the engine.

use std::sync::Arc;

use actix::prelude::*;
use tensorfold_engine::boundary::EngineError;

use crate::memory::kv::KvPages;
use crate::metrics::Metrics;
use crate::outbox::Outbox;
use crate::round::{ModelId, RoundOutput, RoundPlan};
use crate::runner::EngineRunner;

mod book;
pub mod draft;
mod embeds;
mod handlers;
mod queue;
mod schedule;
mod tokens;
mod voices;

#[cfg(test)]
mod outbox_tests;

pub use book::{LaneBook, Room};
pub use schedule::{Drafting, Schedule};

/// One book per kind of lane.
struct Books {
    tokens: tokens::TokenBook,
    voices: voices::VoiceBook,
    embeds: embeds::EmbedBook,
}

impl Books {
    /// Every book, in the order they plan: token lanes first, embeddings in what they leave, then voices.
    fn all(&mut self) -> [&mut dyn LaneBook; 3] {
        [&mut self.tokens, &mut self.embeds, &mut self.voices]
    }

    /// Every book, to read.
    fn each(&self) -> [&dyn LaneBook; 3] {
        [&self.tokens, &self.embeds, &self.voices]
    }

    fn num_running(&self) -> usize {
        self.each().iter().map(|b| b.num_running()).sum()
    }

    fn num_waiting(&self) -> usize {
        self.each().iter().map(|b| b.num_waiting()).sum()
    }
}

pub struct Coordinator {
    runner: EngineRunner,
    /// Each model's KV pages.
    pages: Vec<KvPages>,
    schedule: Schedule,
    books: Books,
    in_flight: bool,
    /// Set by `Close`: every later request is refused.
    closed: bool,
    metrics: Arc<Metrics>,
}

impl Coordinator {
    /// `pages` has one pool per model, empty for voices; `drafts` names each model's draft model.
    pub fn new(
        runner: EngineRunner,
        pages: Vec<KvPages>,
        drafts: Vec<Option<ModelId>>,
        schedule: Schedule,
        metrics: Arc<Metrics>,
    ) -> Coordinator {
        let books = Books {
            tokens: tokens::TokenBook::new(drafts),
            voices: voices::VoiceBook::default(),
            embeds: embeds::EmbedBook::default(),
        };
        let coordinator = Coordinator { runner, pages, schedule, books, in_flight: false, closed: false, metrics };
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
        self.books.num_running()
    }

    fn num_waiting(&self) -> usize {
        self.books.num_waiting()
    }

    /// Requests of every kind take free lanes in the order they came (lane ids rise with it); a book whose first
    /// request cannot start yet lets the next oldest try.
    fn admit(&mut self) {
        let room = Room { pages: &self.pages, schedule: &self.schedule, runner: &self.runner, metrics: &self.metrics };
        while self.books.num_running() < self.schedule.parallel {
            let mut books = self.books.all();
            books.sort_by_key(|b| b.front_lane().unwrap_or(u64::MAX));
            if !books.into_iter().filter(|b| b.front_lane().is_some()).any(|b| b.admit_one(&room)) {
                return;
            }
        }
    }

    /// Every book's part of the next round.
    fn plan(&mut self) -> RoundPlan {
        let room = Room { pages: &self.pages, schedule: &self.schedule, runner: &self.runner, metrics: &self.metrics };
        let mut plan = RoundPlan::default();
        for book in self.books.all() {
            book.plan(&room, &mut plan);
        }
        plan
    }

    /// Takes a round's results into the books; what the requests must hear goes in the returned outbox.
    fn apply(&mut self, mut output: RoundOutput) -> Outbox {
        let mut outbox = Outbox::default();
        self.metrics.inc_rounds();
        self.metrics.add_generated(output.sampled.len());
        let room = Room { pages: &self.pages, schedule: &self.schedule, runner: &self.runner, metrics: &self.metrics };
        for (lane_id, error) in &output.failed {
            for book in self.books.all() {
                book.fail(*lane_id, error, &mut outbox);
            }
        }
        for book in self.books.all() {
            book.apply(&room, &mut output, &mut outbox);
        }
        outbox
    }

    /// Ends every running lane with an error to its request.
    fn fail_all(&mut self, why: &EngineError) -> Outbox {
        let mut outbox = Outbox::default();
        for book in self.books.all() {
            book.fail_running(why, &mut outbox);
        }
        // A failed round may have left pages half written: no later prompt resumes from them.
        for pool in &self.pages {
            pool.clear_cache();
        }
        outbox
    }

    fn publish(&self) {
        self.metrics.set_running(self.num_running());
        self.metrics.set_waiting(self.num_waiting());
        let used = self.pages.iter().map(KvPages::num_used).sum();
        self.metrics.set_kv_pages(used, self.pages.iter().map(KvPages::num_total).sum());
        self.metrics.set_kv_pages_cached(self.pages.iter().map(KvPages::num_cached).sum());
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;
}

//! The coordinator's limits: tokens per round, lanes at once, the queue's length, and how lanes draft.

/// Scheduling limits.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    /// Most tokens in one round's forward pass.
    pub round_tokens: usize,
    /// Most lanes running at once.
    pub parallel: usize,
    pub max_waiting: usize,
    pub drafting: Drafting,
}

/// How decoding lanes draft.
#[derive(Clone, Copy, Debug)]
pub struct Drafting {
    /// Most tokens a lane proposes and verifies in one step; 0 turns drafting off.
    pub tokens: usize,
    /// Most rounds a lane waits after a draft of which nothing was kept, doubling from one.
    pub max_wait: u32,
    /// Whether each engine's steps are timed at start-up; untimed, a verify row counts as free (a test's engine,
    /// whose times say nothing of a device).
    pub timed: bool,
}

impl Drafting {
    pub const OFF: Drafting = Drafting { tokens: 0, max_wait: 0, timed: false };

    /// Where each row of a step costs compute, a lane whose drafts fail probes rarely.
    pub fn on_cpu(tokens: usize) -> Drafting {
        Drafting { tokens, max_wait: 64, timed: true }
    }

    /// Where a step of tens of rows costs about what one row does, a failed draft costs little.
    pub fn on_gpu(tokens: usize) -> Drafting {
        Drafting { tokens, max_wait: 2, timed: true }
    }
}

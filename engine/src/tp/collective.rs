//! The ranks' one collective call, and a host group of threads that implements it for the CPU and for tests.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

/// Why a collective call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("tensor-parallel rank {rank}: {why}")]
pub struct CollectiveError {
    pub rank: usize,
    pub why: String,
}

/// One rank's side of its group's calls; every rank of the group makes the same calls in the same order.
pub trait Collective: Send + Sync {
    fn rank(&self) -> usize;
    fn ranks(&self) -> usize;
    /// Every rank's `values` become the sum of all ranks' `values`, added in rank order (0, then 1, and so on)
    /// element by element: the same bits on every rank whatever the length, so a row's sum never depends on the
    /// rows beside it.
    fn all_reduce_sum(&self, values: &mut [f32]) -> Result<(), CollectiveError>;
}

/// Where a group's ranks wait for each other; the group's driver breaks it when a rank fails in a round, so the
/// others stop waiting for a rank that will not come.
pub struct Rendezvous {
    ranks: usize,
    /// Ranks arrived, the count of completed waits, and whether the group is broken.
    state: Mutex<(usize, u64, bool)>,
    turn: Condvar,
}

impl Rendezvous {
    pub fn new(ranks: usize) -> Arc<Rendezvous> {
        Arc::new(Rendezvous { ranks, state: Mutex::new((0, 0, false)), turn: Condvar::new() })
    }

    fn lock(&self) -> MutexGuard<'_, (usize, u64, bool)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns once every rank has arrived; `Err` when the group is broken first.
    pub fn wait(&self, rank: usize) -> Result<(), CollectiveError> {
        let broken = || CollectiveError { rank, why: "another rank failed in this round".into() };
        let mut s = self.lock();
        if s.2 {
            return Err(broken());
        }
        s.0 += 1;
        if s.0 == self.ranks {
            (s.0, s.1) = (0, s.1 + 1);
            self.turn.notify_all();
            return Ok(());
        }
        let generation = s.1;
        while s.1 == generation && !s.2 {
            s = self.turn.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        match s.1 == generation {
            true => Err(broken()),
            false => Ok(()),
        }
    }

    /// Every rank waiting now or later gets an error, until `reset`; says whether this call broke the group.
    pub fn break_all(&self) -> bool {
        let first = !std::mem::replace(&mut self.lock().2, true);
        self.turn.notify_all();
        first
    }

    /// Mends the group between rounds, when no rank is waiting.
    pub fn reset(&self) {
        *self.lock() = (0, 0, false);
    }
}

struct Shared {
    slots: RwLock<Vec<Vec<f32>>>,
    meet: Arc<Rendezvous>,
}

/// A rank of a group of threads in one process.
pub struct HostRank {
    rank: usize,
    ranks: usize,
    shared: Arc<Shared>,
}

/// `ranks` members of one host group, rank 0 first; each must be driven from its own thread.
pub fn host_group(ranks: usize) -> Vec<HostRank> {
    let shared = Arc::new(Shared { slots: RwLock::new(vec![Vec::new(); ranks]), meet: Rendezvous::new(ranks) });
    (0..ranks).map(|rank| HostRank { rank, ranks, shared: shared.clone() }).collect()
}

impl HostRank {
    /// Where the group's ranks wait, for the driver to break when a rank fails.
    pub fn rendezvous(&self) -> Arc<Rendezvous> {
        self.shared.meet.clone()
    }
}

impl Collective for HostRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn ranks(&self) -> usize {
        self.ranks
    }

    fn all_reduce_sum(&self, values: &mut [f32]) -> Result<(), CollectiveError> {
        let fault = |why: String| CollectiveError { rank: self.rank, why };
        {
            let mut slots = self.shared.slots.write().map_err(|_| fault("a rank panicked".into()))?;
            slots[self.rank].clear();
            slots[self.rank].extend_from_slice(values);
        }
        // Every rank's values are in before any rank sums, and every sum is read before any slot is written again.
        self.shared.meet.wait(self.rank)?;
        let summed = {
            let slots = self.shared.slots.read().map_err(|_| fault("a rank panicked".into()))?;
            match slots.iter().position(|s| s.len() != values.len()) {
                Some(other) => {
                    Err(fault(format!("{} values where rank {other} gave {}", values.len(), slots[other].len())))
                }
                None => {
                    for (i, v) in values.iter_mut().enumerate() {
                        *v = slots[1..].iter().fold(slots[0][i], |sum, s| sum + s[i]);
                    }
                    Ok(())
                }
            }
        };
        self.shared.meet.wait(self.rank)?;
        summed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_every_rank_gets_the_sum_in_rank_order_with_the_same_bits() {
        let parts: Vec<Vec<f32>> = vec![vec![1e8, 1.0, -3.5], vec![1.0, 2.0, 0.25], vec![-1e8, 4.0, 0.125]];
        let got: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = host_group(3)
                .into_iter()
                .zip(parts.clone())
                .map(|(member, mut values)| {
                    s.spawn(move || {
                        member.all_reduce_sum(&mut values).unwrap();
                        values
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // (1e8 + 1) rounds to 1e8 in f32 before -1e8 is added: rank order, not any other, gives 0.
        let want = [(1e8f32 + 1.0) - 1e8, 7.0, -3.125];
        assert_eq!(want[0], 0.0);
        for values in &got {
            assert_eq!(
                values.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn test_ranks_that_disagree_on_the_length_get_an_error_naming_it() {
        let errors: Vec<Result<(), CollectiveError>> = std::thread::scope(|s| {
            let handles: Vec<_> = host_group(2)
                .into_iter()
                .map(|member| s.spawn(move || member.all_reduce_sum(&mut vec![0.0; 2 + member.rank()])))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(errors.iter().all(|e| e.as_ref().is_err_and(|e| e.why.contains("where rank"))), "{errors:?}");
    }

    #[test]
    fn test_a_broken_group_releases_the_rank_waiting_in_a_sum_and_serves_again_once_mended() {
        let members = host_group(2);
        let meet = members[0].rendezvous();
        let got = std::thread::scope(|s| {
            let waiting = s.spawn(|| members[0].all_reduce_sum(&mut [1.0]));
            std::thread::sleep(std::time::Duration::from_millis(50));
            meet.break_all();
            waiting.join().unwrap()
        });
        assert!(got.is_err_and(|e| e.why.contains("another rank failed")));
        meet.reset();
        let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = members
                .iter()
                .map(|m| {
                    s.spawn(move || {
                        let mut v = [2.0];
                        m.all_reduce_sum(&mut v).unwrap();
                        v.to_vec()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(sums, vec![vec![4.0], vec![4.0]]);
    }

    #[test]
    fn test_one_rank_keeps_its_values() {
        let mut values = vec![0.1f32, -2.0];
        host_group(1).remove(0).all_reduce_sum(&mut values).unwrap();
        assert_eq!(values, vec![0.1, -2.0]);
    }
}

//! What a lending daemon lends from: a pool of whole slices, each loan one descriptor.

use std::ffi::CString;
use std::os::fd::OwnedFd;

use nix::fcntl::{fallocate, FallocateFlags};
use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::unistd::ftruncate;

use crate::SLICE_BYTES;

/// Why a pool did not lend.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("{asked} slices asked for, {free} free")]
    NoRoom { asked: usize, free: usize },
    #[error("making the loan's memory failed: {0}")]
    Backing(String),
}

/// One loan: the descriptor handed to the client, and the slices it counts.
#[derive(Debug)]
pub struct Loan {
    pub memory: OwnedFd,
    pub num_slices: usize,
}

impl Loan {
    pub fn bytes(&self) -> u64 {
        self.num_slices as u64 * SLICE_BYTES
    }
}

/// A pool of whole slices. Host memory from `memfd_create` is one kind; device memory exported as a POSIX
/// descriptor would be another behind the same calls.
pub trait Pool: Send {
    /// What the pool lends, for the daemon's log.
    fn describe(&self) -> String;
    /// Its slices, and how many are out on loan.
    fn slices(&self) -> Slices;
    fn num_slices(&self) -> usize {
        self.slices().total
    }
    fn num_free(&self) -> usize {
        self.slices().free()
    }
    /// Lends `num_slices` whole slices as one descriptor, or refuses with the room it has.
    fn lend(&mut self, num_slices: usize) -> Result<Loan, PoolError>;
    /// Takes a loan back once its client's connection has closed.
    fn take_back(&mut self, loan: Loan);
}

/// A pool's slices and how many of them are out on loan.
#[derive(Clone, Copy, Debug)]
pub struct Slices {
    pub total: usize,
    pub lent: usize,
}

impl Slices {
    pub fn new(total: usize) -> Slices {
        Slices { total, lent: 0 }
    }

    pub fn free(&self) -> usize {
        self.total - self.lent
    }

    /// Counts `asked` slices out, or refuses an ask of none or of more than are free.
    pub fn lend(&mut self, asked: usize) -> Result<(), PoolError> {
        if asked == 0 || asked > self.free() {
            return Err(PoolError::NoRoom { asked, free: self.free() });
        }
        self.lent += asked;
        Ok(())
    }

    pub fn take_back(&mut self, num: usize) {
        self.lent -= num.min(self.lent);
    }
}

/// Host memory: each loan is a fresh memfd of its slices, committed before it is lent, so no client sees another's
/// bytes and a grant is memory that exists.
pub struct MemfdPool {
    slices: Slices,
}

impl MemfdPool {
    pub fn new(num_slices: usize) -> MemfdPool {
        MemfdPool { slices: Slices::new(num_slices) }
    }
}

impl Pool for MemfdPool {
    fn describe(&self) -> String {
        format!("host memory (memfd), {} slices of {} MiB", self.slices.total, SLICE_BYTES >> 20)
    }

    fn slices(&self) -> Slices {
        self.slices
    }

    fn lend(&mut self, num_slices: usize) -> Result<Loan, PoolError> {
        let mut slices = self.slices;
        slices.lend(num_slices)?;
        let bytes = (num_slices as u64 * SLICE_BYTES) as i64;
        let fail = |call: &str, e: nix::Error| PoolError::Backing(format!("{call}: {e}"));
        let memory = memfd(bytes as u64).map_err(|e| fail("memfd", e))?;
        // Committing now turns a machine short of memory into a refusal instead of a fault in the client.
        fallocate(&memory, FallocateFlags::empty(), 0, bytes).map_err(|e| fail("fallocate", e))?;
        self.slices = slices;
        Ok(Loan { memory, num_slices })
    }

    fn take_back(&mut self, loan: Loan) {
        self.slices.take_back(loan.num_slices);
    }
}

/// A fresh memfd of `bytes`, zeroed, its pages made as they are touched.
pub fn memfd(bytes: u64) -> nix::Result<OwnedFd> {
    let name = CString::new("tensorfold-lend").expect("no NUL in the name");
    let memory = memfd_create(name.as_c_str(), MFdFlags::MFD_CLOEXEC)?;
    ftruncate(&memory, i64::try_from(bytes).map_err(|_| nix::Error::EFBIG)?)?;
    Ok(memory)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use nix::unistd::{lseek, Whence};

    use super::*;

    #[test]
    fn test_a_memfd_pool_lends_whole_slices_and_takes_them_back() {
        let mut pool = MemfdPool::new(3);
        let loan = pool.lend(2).unwrap();
        assert_eq!(lseek(loan.memory.as_fd(), 0, Whence::SeekEnd).unwrap() as u64, 2 * SLICE_BYTES);
        assert_eq!((loan.bytes(), pool.num_free()), (2 * SLICE_BYTES, 1));
        assert!(matches!(pool.lend(2), Err(PoolError::NoRoom { asked: 2, free: 1 })));
        assert!(matches!(pool.lend(0), Err(PoolError::NoRoom { .. })));
        pool.take_back(loan);
        assert_eq!(pool.num_free(), 3);
    }
}

//! The reference lending daemon: lends whole slices of its pool to clients that present the key, one loan a
//! connection, and takes a loan back when its connection closes (a client that dies closes it too).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::eventfd::EventFd;
use nix::sys::socket::{accept4, bind, listen, recv, socket, AddressFamily, Backlog, MsgFlags, SockFlag, SockType};
use nix::sys::socket::{connect, UnixAddr};

use crate::client::send_record;
use crate::pool::{Loan, Pool, PoolError};
use crate::wire::{ClaimMsg, Reason, ReplyMsg, CLAIM_HEADER, MAX_KEY};
use crate::SLICE_BYTES;

/// Why the daemon could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("{path}: a daemon already listens there")]
    InUse { path: PathBuf },
    #[error("{path}: exists and is not a socket")]
    NotASocket { path: PathBuf },
    #[error("{path}: {call}: {errno}")]
    Socket { path: PathBuf, call: &'static str, errno: Errno },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// One client's connection and what it holds.
struct Client {
    sock: OwnedFd,
    loan: Option<Loan>,
}

/// A bound daemon: its socket, its key and its pool.
pub struct Daemon {
    path: PathBuf,
    listener: OwnedFd,
    key: Vec<u8>,
    pool: Box<dyn Pool>,
    clients: Vec<Client>,
    /// Slices free, for whoever watches the daemon from another thread.
    free: Arc<AtomicUsize>,
}

impl Daemon {
    /// Binds `path` (its folder made if missing; a stale socket replaced, a live one refused).
    pub fn bind(path: &Path, key: Vec<u8>, pool: Box<dyn Pool>) -> Result<Daemon, DaemonError> {
        let socket_err = |call, errno| DaemonError::Socket { path: path.to_path_buf(), call, errno };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| DaemonError::Io { path: dir.to_path_buf(), source })?;
        }
        let addr = UnixAddr::new(path).map_err(|errno| socket_err("address", errno))?;
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(DaemonError::NotASocket { path: path.to_path_buf() });
            }
            let probe = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)
                .map_err(|errno| socket_err("socket", errno))?;
            if connect(probe.as_raw_fd(), &addr).is_ok() {
                return Err(DaemonError::InUse { path: path.to_path_buf() });
            }
            std::fs::remove_file(path).map_err(|source| DaemonError::Io { path: path.to_path_buf(), source })?;
        }
        let flags = SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK;
        let listener = socket(AddressFamily::Unix, SockType::SeqPacket, flags, None)
            .map_err(|errno| socket_err("socket", errno))?;
        bind(listener.as_raw_fd(), &addr).map_err(|errno| socket_err("bind", errno))?;
        listen(&listener, Backlog::new(64).expect("a small backlog")).map_err(|errno| socket_err("listen", errno))?;
        let free = Arc::new(AtomicUsize::new(pool.num_free()));
        Ok(Daemon { path: path.to_path_buf(), listener, key, pool, clients: Vec::new(), free })
    }

    /// A count of free slices that stays current while the daemon serves.
    pub fn free_slices(&self) -> Arc<AtomicUsize> {
        self.free.clone()
    }

    pub fn describe(&self) -> String {
        format!("{} at {}", self.pool.describe(), self.path.display())
    }

    /// Serves until `stop` becomes readable (never, without one); every loan is taken back on return.
    pub fn serve(&mut self, stop: Option<BorrowedFd<'_>>) -> Result<(), DaemonError> {
        loop {
            let (stopped, accept, ready) = self.wait(stop)?;
            if stopped {
                break;
            }
            // Backwards, so removing a client leaves the indices still to visit in place.
            for i in ready.into_iter().rev() {
                if !self.serve_client(i) {
                    let client = self.clients.swap_remove(i);
                    self.close(client);
                }
            }
            if accept {
                self.accept();
            }
        }
        for client in std::mem::take(&mut self.clients) {
            self.close(client);
        }
        Ok(())
    }

    /// Waits for any socket; returns whether to stop, whether to accept, and the clients with something to read.
    fn wait(&self, stop: Option<BorrowedFd<'_>>) -> Result<(bool, bool, Vec<usize>), DaemonError> {
        let mut fds = vec![PollFd::new(self.listener.as_fd(), PollFlags::POLLIN)];
        fds.extend(stop.map(|s| PollFd::new(s, PollFlags::POLLIN)));
        let first_client = fds.len();
        fds.extend(self.clients.iter().map(|c| PollFd::new(c.sock.as_fd(), PollFlags::POLLIN)));
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(errno) => return Err(DaemonError::Socket { path: self.path.clone(), call: "poll", errno }),
        }
        let fired = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
        let stopped = stop.is_some() && fired(&fds[1]);
        let ready = (first_client..fds.len()).filter(|&i| fired(&fds[i])).map(|i| i - first_client).collect();
        Ok((stopped, fired(&fds[0]), ready))
    }

    fn accept(&mut self) {
        loop {
            match accept4(self.listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK) {
                // SAFETY: accept4 returned a new descriptor that nothing else owns.
                Ok(fd) => self.clients.push(Client { sock: unsafe { OwnedFd::from_raw_fd(fd) }, loan: None }),
                Err(Errno::EAGAIN | Errno::ECONNABORTED) => return,
                Err(errno) => {
                    tracing::warn!(%errno, "accepting a client failed");
                    return;
                }
            }
        }
    }

    /// Reads what client `i` sent and answers it; false when its connection is to close.
    fn serve_client(&mut self, i: usize) -> bool {
        let mut buf = [0u8; CLAIM_HEADER + MAX_KEY + 1];
        let n = match recv(self.clients[i].sock.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT) {
            Ok(0) | Err(Errno::ECONNRESET) => return false,
            Ok(n) => n,
            Err(Errno::EAGAIN) => return true,
            Err(errno) => {
                tracing::warn!(%errno, "reading a client failed");
                return false;
            }
        };
        if self.clients[i].loan.is_some() {
            // One loan a connection; what else a holder sends is not a claim.
            return true;
        }
        let answer = match ClaimMsg::decode(&buf[..n]) {
            Err(fault) => Err((Reason::BadClaim, 0, fault)),
            Ok(claim) if !same_key(&claim.key, &self.key) => Err((Reason::BadKey, 0, "a wrong key".into())),
            Ok(claim) if claim.ask == 0 || !claim.ask.is_multiple_of(SLICE_BYTES) => {
                Err((Reason::BadClaim, 0, format!("an ask of {} bytes, not whole slices", claim.ask)))
            }
            Ok(claim) => match self.pool.lend((claim.ask / SLICE_BYTES) as usize) {
                Ok(loan) => Ok(loan),
                Err(e @ PoolError::NoRoom { free, .. }) => {
                    Err((Reason::NoRoom, free as u64 * SLICE_BYTES, e.to_string()))
                }
                Err(e) => Err((Reason::NoRoom, 0, e.to_string())),
            },
        };
        let sock = self.clients[i].sock.as_fd();
        match answer {
            Ok(loan) => {
                let reply = ReplyMsg { ok: true, reason: Reason::Granted, size: loan.bytes() }.encode();
                let sent = send_record(sock, &reply, &[loan.memory.as_raw_fd()]);
                let bytes = loan.bytes();
                self.clients[i].loan = Some(loan);
                if let Err(errno) = sent {
                    tracing::warn!(%errno, "sending a grant failed; taking it back");
                    return false;
                }
                self.free.store(self.pool.num_free(), Ordering::SeqCst);
                tracing::info!(bytes, free_slices = self.pool.num_free(), "lent");
                true
            }
            Err((reason, size, fault)) => {
                tracing::warn!(%reason, "refused a claim: {fault}");
                let reply = ReplyMsg { ok: false, reason, size }.encode();
                let _ = send_record(sock, &reply, &[]);
                false
            }
        }
    }

    fn close(&mut self, client: Client) {
        if let Some(loan) = client.loan {
            let bytes = loan.bytes();
            self.pool.take_back(loan);
            self.free.store(self.pool.num_free(), Ordering::SeqCst);
            tracing::info!(bytes, free_slices = self.pool.num_free(), "took back");
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Compares every byte whatever the first difference, so the time taken says nothing of the key.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    given.len() == key.len() && given.iter().zip(key).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// A daemon serving on a thread of its own, stopped and joined on drop.
pub struct Running {
    stop: EventFd,
    free: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<Result<(), DaemonError>>>,
}

impl Running {
    pub fn start(mut daemon: Daemon) -> std::io::Result<Running> {
        let stop = EventFd::new().map_err(std::io::Error::from)?;
        let theirs = stop.as_fd().try_clone_to_owned()?;
        let free = daemon.free_slices();
        let thread =
            std::thread::Builder::new().name("lend".into()).spawn(move || daemon.serve(Some(theirs.as_fd())))?;
        Ok(Running { stop, free, thread: Some(thread) })
    }

    pub fn num_free(&self) -> usize {
        self.free.load(Ordering::SeqCst)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop.write(1);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

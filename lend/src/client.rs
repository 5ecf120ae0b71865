//! The client's side: claim whole slices from a lending daemon and hold them until dropped.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    connect, recvmsg, send, socket, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType, UnixAddr,
};
use nix::sys::stat::{fstat, SFlag};

use crate::key::{KeyError, KeySource};
use crate::wire::{ClaimMsg, Reason, ReplyMsg, REPLY_LEN};
use crate::{round_to_slices, ANSWER_LIMIT};

/// A claim on a lending daemon, as the settings name it.
#[derive(Clone, Debug)]
pub struct Claim {
    pub socket: PathBuf,
    pub key: KeySource,
    /// Bytes wanted; rounded up to whole slices before the claim is sent.
    pub ask_bytes: u64,
    /// How long the daemon has to answer.
    pub timeout: Duration,
}

impl Claim {
    pub fn new(socket: PathBuf, key: KeySource, ask_bytes: u64) -> Claim {
        Claim { socket, key, ask_bytes, timeout: ANSWER_LIMIT }
    }
}

/// Why no memory was lent; the server goes on with its ordinary KV room.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("the ask is zero bytes")]
    EmptyAsk,
    #[error("no lending daemon at {path}: {errno}")]
    NoDaemon { path: PathBuf, errno: Errno },
    #[error("the socket failed in {call}: {errno}")]
    Socket { call: &'static str, errno: Errno },
    #[error("the daemon did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the daemon closed the connection without answering")]
    Gone,
    #[error("the daemon refused: {reason} (it could lend {size} bytes now)")]
    Refused { reason: Reason, size: u64 },
    #[error("the daemon's reply is malformed: {0}")]
    Malformed(String),
    #[error("the daemon granted the claim but sent no descriptor")]
    MissingDescriptor,
    #[error("the daemon granted {granted} bytes of the {asked} asked for; a smaller grant is refused")]
    ShortGrant { asked: u64, granted: u64 },
    #[error("the lent descriptor holds {length} bytes, fewer than the {granted} granted")]
    ShortDescriptor { granted: u64, length: u64 },
    #[error("no display card: {0}")]
    NoCard(String),
    #[error("a display card is at {0}, but this build does not export DRM dumb buffers (see docs/carveout.md)")]
    DrmNotBuilt(PathBuf),
}

/// Lent memory: a descriptor to map and the size granted. Dropping it closes the descriptor and the connection,
/// which gives the memory back to the daemon.
pub struct Lent {
    memory: OwnedFd,
    bytes: u64,
    source: &'static str,
    _connection: Option<OwnedFd>,
}

impl Lent {
    /// Memory this process holds itself (a test's memfd), lent as a daemon would lend it.
    pub fn from_descriptor(memory: OwnedFd, bytes: u64, source: &'static str) -> Lent {
        Lent { memory, bytes, source, _connection: None }
    }

    /// Bytes granted: the reply's size, not the ask.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn memory(&self) -> BorrowedFd<'_> {
        self.memory.as_fd()
    }

    /// Where the memory came from (`daemon`, `drm`, or the caller's own word).
    pub fn source(&self) -> &'static str {
        self.source
    }
}

impl std::fmt::Debug for Lent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lent").field("bytes", &self.bytes).field("source", &self.source).finish()
    }
}

/// Claims memory from the daemon at `claim.socket`: the key is read now, the ask rounded up to whole slices, and a
/// grant is taken only if it is `ok`, at least the ask, and comes with one descriptor at least as long.
pub fn claim(claim: &Claim) -> Result<Lent, Refusal> {
    let ask = round_to_slices(claim.ask_bytes);
    if ask == 0 {
        return Err(Refusal::EmptyAsk);
    }
    let key = claim.key.read()?;
    let sock = connect_to(&claim.socket)?;
    let message = ClaimMsg { ask, key }.encode();
    match send(sock.as_raw_fd(), &message, MsgFlags::MSG_NOSIGNAL) {
        Ok(_) => {}
        Err(Errno::EPIPE | Errno::ECONNRESET) => return Err(Refusal::Gone),
        Err(errno) => return Err(Refusal::Socket { call: "send", errno }),
    }
    let (reply, fds) = receive(&sock, claim.timeout)?;
    let reply = ReplyMsg::decode(&reply).map_err(Refusal::Malformed)?;
    if !reply.ok {
        return Err(Refusal::Refused { reason: reply.reason, size: reply.size });
    }
    let mut fds = fds.into_iter();
    let memory = match (fds.next(), fds.len()) {
        (None, _) => return Err(Refusal::MissingDescriptor),
        (Some(fd), 0) => fd,
        (Some(_), more) => return Err(Refusal::Malformed(format!("{} descriptors instead of one", more + 1))),
    };
    if reply.size < ask {
        return Err(Refusal::ShortGrant { asked: ask, granted: reply.size });
    }
    // A file (a memfd) is held to its own length; device memory and dma-bufs are taken at the reply's word.
    if let Some(length) = file_length(memory.as_fd()) {
        if length < reply.size {
            return Err(Refusal::ShortDescriptor { granted: reply.size, length });
        }
    }
    Ok(Lent { memory, bytes: reply.size, source: "daemon", _connection: Some(sock) })
}

/// The length of a descriptor that is a regular file, which memfds are; `None` for anything else.
fn file_length(fd: BorrowedFd) -> Option<u64> {
    let stat = fstat(fd).ok()?;
    (SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG).then_some(stat.st_size as u64)
}

/// The `drm` source: a DRM dumb buffer exported as a dma-buf. This build refuses it, naming what it found.
pub fn claim_drm(_ask_bytes: u64) -> Result<Lent, Refusal> {
    claim_drm_in(Path::new("/dev/dri"))
}

fn claim_drm_in(dir: &Path) -> Result<Lent, Refusal> {
    let cards = std::fs::read_dir(dir).into_iter().flatten().flatten();
    let mut cards: Vec<PathBuf> = cards
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("card")))
        .collect();
    cards.sort();
    match cards.into_iter().next() {
        None => Err(Refusal::NoCard(format!("no {}/card* on this machine", dir.display()))),
        Some(card) => Err(Refusal::DrmNotBuilt(card)),
    }
}

fn connect_to(path: &Path) -> Result<OwnedFd, Refusal> {
    let sock = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|errno| Refusal::Socket { call: "socket", errno })?;
    let addr = UnixAddr::new(path).map_err(|errno| Refusal::NoDaemon { path: path.to_path_buf(), errno })?;
    connect(sock.as_raw_fd(), &addr).map_err(|errno| Refusal::NoDaemon { path: path.to_path_buf(), errno })?;
    Ok(sock)
}

/// One record and the descriptors beside it, within `limit`; every descriptor received is owned at once.
fn receive(sock: &OwnedFd, limit: Duration) -> Result<(Vec<u8>, Vec<OwnedFd>), Refusal> {
    let timeout = PollTimeout::try_from(limit).unwrap_or(PollTimeout::MAX);
    let mut fds = [PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
    match poll(&mut fds, timeout) {
        Ok(0) => return Err(Refusal::Timeout(limit)),
        Ok(_) => {}
        Err(errno) => return Err(Refusal::Socket { call: "poll", errno }),
    }
    let mut buf = [0u8; 4 * REPLY_LEN];
    let mut cmsg = nix::cmsg_space!([RawFd; 4]);
    let mut iov = [IoSliceMut::new(&mut buf)];
    let flags = MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT;
    let msg = match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut cmsg), flags) {
        Ok(msg) => msg,
        Err(Errno::ECONNRESET) => return Err(Refusal::Gone),
        Err(errno) => return Err(Refusal::Socket { call: "recvmsg", errno }),
    };
    let mut owned = Vec::new();
    for c in msg.cmsgs().map_err(|e| Refusal::Malformed(format!("control data: {e}")))? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            // SAFETY: the kernel installed these descriptors for this process just now; nothing else owns them.
            owned.extend(raw.into_iter().map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }));
        }
    }
    let (len, truncated) = (msg.bytes, msg.flags.intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC));
    if len == 0 && owned.is_empty() {
        return Err(Refusal::Gone);
    }
    if truncated {
        return Err(Refusal::Malformed("the reply or its descriptors do not fit a reply".into()));
    }
    Ok((buf[..len].to_vec(), owned))
}

/// Sends bytes and descriptors as one record; the daemon's half of the exchange, and the fake daemons' in tests.
pub fn send_record(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[RawFd]) -> nix::Result<usize> {
    use nix::sys::socket::{sendmsg, ControlMessage};
    let iov = [IoSlice::new(bytes)];
    let rights = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage] = if fds.is_empty() { &[] } else { &rights };
    sendmsg::<()>(sock.as_raw_fd(), &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_the_drm_source_refuses_clearly_with_or_without_a_card() {
        let dir = tempfile::tempdir().unwrap();
        let none = claim_drm_in(dir.path()).unwrap_err().to_string();
        assert!(none.starts_with("no display card: no ") && none.ends_with("/card* on this machine"), "{none}");
        std::fs::write(dir.path().join("card1"), b"").unwrap();
        std::fs::write(dir.path().join("renderD128"), b"").unwrap();
        let found = claim_drm_in(dir.path()).unwrap_err();
        assert!(matches!(&found, Refusal::DrmNotBuilt(p) if p.ends_with("card1")), "{found}");
    }
}

//! The client against a fake daemon on a real `SOCK_SEQPACKET` socket, one scripted answer a test.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

use nix::sys::memfd::{memfd_create, MFdFlags};
use nix::sys::socket::UnixAddr;
use nix::sys::socket::{accept, bind, listen, recv, socket, AddressFamily, Backlog, MsgFlags, SockFlag, SockType};
use nix::sys::uio::{pread, pwrite};
use nix::unistd::ftruncate;

use crate::client::{claim, send_record, Claim, Refusal};
use crate::key::KeySource;
use crate::wire::{ClaimMsg, Reason, ReplyMsg};

const MIB: u64 = 1 << 20;

/// What the fake daemon does once it has read the claim.
enum Script {
    /// Sends these bytes and descriptors as one record, then waits for the client to close.
    Reply(Vec<u8>, Vec<OwnedFd>),
    /// Never answers; waits for the client to close.
    Silent,
    /// Closes the connection without a word.
    Close,
}

struct Fake {
    _dir: tempfile::TempDir,
    path: PathBuf,
    /// The claim's bytes as they arrived.
    claims: Receiver<Vec<u8>>,
    /// A message when the client's connection has closed.
    closed: Receiver<()>,
}

fn fake(script: Script) -> Fake {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lend.sock");
    let listener = socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None).unwrap();
    bind(listener.as_raw_fd(), &UnixAddr::new(&path).unwrap()).unwrap();
    listen(&listener, Backlog::new(4).unwrap()).unwrap();
    let (claims_tx, claims) = channel();
    let (closed_tx, closed) = channel();
    std::thread::spawn(move || {
        // SAFETY: accept returned a new descriptor that nothing else owns.
        let conn = unsafe { OwnedFd::from_raw_fd(accept(listener.as_raw_fd()).unwrap()) };
        let mut buf = [0u8; 1024];
        let n = recv(conn.as_raw_fd(), &mut buf, MsgFlags::empty()).unwrap();
        claims_tx.send(buf[..n].to_vec()).unwrap();
        match script {
            Script::Reply(bytes, fds) => {
                let raw: Vec<_> = fds.iter().map(|f| f.as_raw_fd()).collect();
                send_record(conn.as_fd(), &bytes, &raw).unwrap();
            }
            Script::Silent => {}
            Script::Close => return,
        }
        while !matches!(recv(conn.as_raw_fd(), &mut buf, MsgFlags::empty()), Ok(0) | Err(_)) {}
        let _ = closed_tx.send(());
    });
    Fake { _dir: dir, path, claims, closed }
}

fn memfd(bytes: u64) -> OwnedFd {
    let fd = memfd_create(CString::new("fake-lend").unwrap().as_c_str(), MFdFlags::MFD_CLOEXEC).unwrap();
    ftruncate(&fd, bytes as i64).unwrap();
    fd
}

fn granted(size: u64) -> Vec<u8> {
    ReplyMsg { ok: true, reason: Reason::Granted, size }.encode().to_vec()
}

fn key() -> KeySource {
    KeySource::Inline { key: "sesame".into(), setting: "TF_CARVEOUT_KEY".into() }
}

fn ask(f: &Fake, bytes: u64) -> Result<crate::Lent, Refusal> {
    claim(&Claim { timeout: Duration::from_secs(5), ..Claim::new(f.path.clone(), key(), bytes) })
}

fn sent(f: &Fake) -> ClaimMsg {
    ClaimMsg::decode(&f.claims.recv_timeout(Duration::from_secs(5)).unwrap()).unwrap()
}

#[test]
fn test_a_granted_claim_takes_the_replys_size() {
    let f = fake(Script::Reply(granted(6 * MIB), vec![memfd(6 * MIB)]));
    let lent = ask(&f, 4 * MIB).unwrap();
    assert_eq!((lent.bytes(), lent.source()), (6 * MIB, "daemon"), "the reply's size is the authority");
    assert_eq!(sent(&f), ClaimMsg { ask: 4 * MIB, key: b"sesame".to_vec() });
}

#[test]
fn test_the_descriptor_arrives_by_scm_rights() {
    let memory = memfd(2 * MIB);
    pwrite(&memory, b"lent bytes", 4096).unwrap();
    let f = fake(Script::Reply(granted(2 * MIB), vec![memory]));
    let lent = ask(&f, 2 * MIB).unwrap();
    let mut back = [0u8; 10];
    pread(lent.memory(), &mut back, 4096).unwrap();
    assert_eq!(&back, b"lent bytes", "the descriptor is the daemon's memory");
}

#[test]
fn test_a_refused_claim_is_a_refusal() {
    let f = fake(Script::Reply(ReplyMsg { ok: false, reason: Reason::BadKey, size: 0 }.encode().to_vec(), vec![]));
    let err = ask(&f, 2 * MIB).unwrap_err();
    assert!(matches!(err, Refusal::Refused { reason: Reason::BadKey, size: 0 }), "{err}");
    assert_eq!(err.to_string(), "the daemon refused: the key was not accepted (it could lend 0 bytes now)");
}

#[test]
fn test_a_refusal_that_carries_a_size_and_a_descriptor_is_still_a_refusal() {
    let refusal = ReplyMsg { ok: false, reason: Reason::NoRoom, size: 8 * MIB }.encode().to_vec();
    let f = fake(Script::Reply(refusal, vec![memfd(8 * MIB)]));
    let err = ask(&f, 16 * MIB).unwrap_err();
    assert!(matches!(err, Refusal::Refused { reason: Reason::NoRoom, size } if size == 8 * MIB), "{err}");
}

#[test]
fn test_a_malformed_reply_is_refused() {
    let f = fake(Script::Reply(b"TFLD\x01\x02\x01\x00 too short".to_vec(), vec![memfd(2 * MIB)]));
    let err = ask(&f, 2 * MIB).unwrap_err();
    assert!(matches!(&err, Refusal::Malformed(m) if m.contains("16 bytes")), "{err}");
    let mut wrong_ok = granted(2 * MIB);
    wrong_ok[6] = 7;
    let f = fake(Script::Reply(wrong_ok, vec![memfd(2 * MIB)]));
    assert!(matches!(ask(&f, 2 * MIB).unwrap_err(), Refusal::Malformed(m) if m.contains("ok must be 0 or 1")));
}

#[test]
fn test_a_short_grant_is_refused_not_fitted() {
    let f = fake(Script::Reply(granted(2 * MIB), vec![memfd(2 * MIB)]));
    let err = ask(&f, 4 * MIB).unwrap_err();
    assert!(matches!(err, Refusal::ShortGrant { asked, granted } if asked == 4 * MIB && granted == 2 * MIB));
}

#[test]
fn test_an_ask_between_two_slices_is_rounded_up_before_it_is_sent() {
    let f = fake(Script::Reply(granted(4 * MIB), vec![memfd(4 * MIB)]));
    let lent = ask(&f, 3 * MIB).unwrap();
    assert_eq!(sent(&f).ask, 4 * MIB);
    assert_eq!(lent.bytes(), 4 * MIB);
    let f = fake(Script::Reply(granted(2 * MIB), vec![memfd(2 * MIB)]));
    assert_eq!(ask(&f, 1).unwrap().bytes(), 2 * MIB);
    assert_eq!(sent(&f).ask, 2 * MIB);
}

#[test]
fn test_a_grant_without_a_descriptor_is_refused() {
    let f = fake(Script::Reply(granted(2 * MIB), vec![]));
    assert!(matches!(ask(&f, 2 * MIB).unwrap_err(), Refusal::MissingDescriptor));
    let f = fake(Script::Reply(granted(2 * MIB), vec![memfd(2 * MIB), memfd(2 * MIB)]));
    assert!(matches!(ask(&f, 2 * MIB).unwrap_err(), Refusal::Malformed(m) if m.contains("2 descriptors")));
}

#[test]
fn test_a_descriptor_shorter_than_its_grant_is_refused() {
    let f = fake(Script::Reply(granted(4 * MIB), vec![memfd(2 * MIB)]));
    let err = ask(&f, 4 * MIB).unwrap_err();
    assert!(matches!(err, Refusal::ShortDescriptor { granted, length } if granted == 4 * MIB && length == 2 * MIB));
}

#[test]
fn test_a_missing_socket_is_no_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.sock");
    let err = claim(&Claim::new(path.clone(), key(), 2 * MIB)).unwrap_err();
    assert!(matches!(&err, Refusal::NoDaemon { path: p, .. } if *p == path), "{err}");
    assert!(err.to_string().starts_with("no lending daemon at "));
}

#[test]
fn test_a_daemon_that_never_answers_runs_out_the_limit() {
    let f = fake(Script::Silent);
    let start = Instant::now();
    let limit = Duration::from_millis(300);
    let err = claim(&Claim { timeout: limit, ..Claim::new(f.path.clone(), key(), 2 * MIB) }).unwrap_err();
    assert!(matches!(err, Refusal::Timeout(d) if d == limit), "{err}");
    let took = start.elapsed();
    assert!(took >= limit && took < Duration::from_secs(5), "gave up after {took:?}");
    f.closed.recv_timeout(Duration::from_secs(5)).expect("the connection closes after the limit");
}

#[test]
fn test_a_daemon_that_went_away_is_gone() {
    let f = fake(Script::Close);
    assert!(matches!(ask(&f, 2 * MIB).unwrap_err(), Refusal::Gone));
}

#[test]
fn test_the_key_files_first_line_is_what_goes_on_the_wire() {
    let f = fake(Script::Reply(granted(2 * MIB), vec![memfd(2 * MIB)]));
    let file = f.path.with_file_name("key");
    std::fs::write(&file, b"first line\nnot this one\n").unwrap();
    let source = KeySource::File { path: file, setting: "TF_CARVEOUT_KEY_FILE".into() };
    claim(&Claim::new(f.path.clone(), source, 2 * MIB)).unwrap();
    assert_eq!(sent(&f).key, b"first line");
}

#[test]
fn test_a_refused_key_file_never_reaches_the_daemon() {
    let f = fake(Script::Reply(granted(2 * MIB), vec![memfd(2 * MIB)]));
    let file = f.path.with_file_name("key");
    std::fs::write(&file, b"\n").unwrap();
    let source = KeySource::File { path: file, setting: "TF_CARVEOUT_KEY_FILE".into() };
    let err = claim(&Claim::new(f.path.clone(), source, 2 * MIB)).unwrap_err();
    assert_eq!(err.to_string(), "TF_CARVEOUT_KEY_FILE: the key is empty");
    assert!(f.claims.recv_timeout(Duration::from_millis(200)).is_err(), "a claim was sent");
}

#[test]
fn test_the_daemon_gets_the_memory_back_when_the_connection_closes() {
    let f = fake(Script::Reply(granted(2 * MIB), vec![memfd(2 * MIB)]));
    let lent = ask(&f, 2 * MIB).unwrap();
    assert!(f.closed.recv_timeout(Duration::from_millis(200)).is_err(), "closed while the memory is held");
    drop(lent);
    f.closed.recv_timeout(Duration::from_secs(5)).expect("dropping the loan closes the connection");
}

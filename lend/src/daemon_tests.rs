//! The reference daemon with the client: grants, refusals, and loans taken back when a client closes or dies.

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::{claim, Claim, Refusal};
use crate::daemon::{Daemon, DaemonError, Running};
use crate::key::KeySource;
use crate::kv::map_kv;
use crate::pool::MemfdPool;
use crate::wire::Reason;
use crate::SLICE_BYTES;

fn daemon(num_slices: usize) -> (tempfile::TempDir, PathBuf, Running) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run").join("lend.sock");
    let d = Daemon::bind(&path, b"sesame".to_vec(), Box::new(MemfdPool::new(num_slices))).unwrap();
    (dir, path, Running::start(d).unwrap())
}

fn claim_with(path: &std::path::Path, key: &str, slices: u64) -> Result<crate::Lent, Refusal> {
    let key = KeySource::Inline { key: key.into(), setting: "TF_CARVEOUT_KEY".into() };
    claim(&Claim::new(path.to_path_buf(), key, slices * SLICE_BYTES))
}

/// Waits until the daemon has `free` slices free; a loan is taken back once the daemon sees the close.
fn wait_free(d: &Running, free: usize) {
    let start = Instant::now();
    while d.num_free() != free {
        assert!(start.elapsed() < Duration::from_secs(10), "{} slices free, not {free}", d.num_free());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn test_the_daemon_lends_whole_slices_to_the_key_and_takes_them_back_on_close() {
    let (_dir, path, d) = daemon(4);
    let first = claim_with(&path, "sesame", 3).unwrap();
    assert_eq!(first.bytes(), 3 * SLICE_BYTES);
    wait_free(&d, 1);
    let err = claim_with(&path, "sesame", 2).unwrap_err();
    assert!(matches!(err, Refusal::Refused { reason: Reason::NoRoom, size } if size == SLICE_BYTES), "{err}");
    let err = claim_with(&path, "open", 1).unwrap_err();
    assert!(matches!(err, Refusal::Refused { reason: Reason::BadKey, size: 0 }), "{err}");
    drop(first);
    wait_free(&d, 4);
    let again = claim_with(&path, "sesame", 4).unwrap();
    assert_eq!(again.bytes(), 4 * SLICE_BYTES);
}

#[test]
fn test_lent_memory_from_the_daemon_holds_kv_pages() {
    let (_dir, path, d) = daemon(2);
    let lent = Arc::new(claim_with(&path, "sesame", 1).unwrap());
    let mut kv = map_kv(lent.clone(), 2, 4096).unwrap();
    assert_eq!(kv.layout.num_pages, (SLICE_BYTES / 8192) as usize);
    let last = kv.keys.len() - 1;
    kv.keys[last] = 1.5;
    kv.values[last] = -1.5;
    assert_eq!((kv.keys[last], kv.values[last]), (1.5, -1.5));
    drop(lent);
    wait_free(&d, 1);
    drop(kv);
    wait_free(&d, 2);
}

#[test]
fn test_a_second_daemon_on_a_live_socket_is_refused_and_a_stale_one_replaced() {
    let (_dir, path, d) = daemon(1);
    let second = Daemon::bind(&path, b"k".to_vec(), Box::new(MemfdPool::new(1)));
    assert!(matches!(second, Err(DaemonError::InUse { .. })));
    drop(d);
    let stale = std::os::unix::net::UnixListener::bind(&path);
    assert!(stale.is_ok(), "the stopped daemon removed its socket");
    drop(stale);
    let again = Daemon::bind(&path, b"k".to_vec(), Box::new(MemfdPool::new(1)));
    assert!(again.is_ok(), "a socket nobody listens on is replaced");
}

/// A client in another process claims one slice and holds it until killed.
const DYING_CLIENT: &str = "import socket, struct, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
key = b'sesame'
s.send(b'TFLD' + bytes([1, 1]) + struct.pack('<HQ', len(key), 2 << 20) + key)
reply, fds, _, _ = s.recvmsg(16, socket.CMSG_SPACE(4))
print('ok' if reply[6] == 1 and fds else 'refused', flush=True)
time.sleep(600)
";

#[test]
fn test_a_client_that_dies_gives_its_slices_back() {
    let python = std::env::var("TF_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let (_dir, path, d) = daemon(2);
    let child = Command::new(&python).args(["-c", DYING_CLIENT]).arg(&path).stdout(Stdio::piped()).spawn();
    let Ok(mut child) = child else {
        eprintln!("skipped: no {python} to run a client in another process");
        return;
    };
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ok");
    wait_free(&d, 1);
    child.kill().unwrap();
    child.wait().unwrap();
    wait_free(&d, 2);
}

//! The lending protocol's two messages, each one `SOCK_SEQPACKET` record, integers little-endian
//! (docs/carveout.md draws them).

/// Every message starts with these four bytes.
pub const MAGIC: [u8; 4] = *b"TFLD";
/// The protocol's version, the fifth byte of every message.
pub const VERSION: u8 = 1;
/// The sixth byte of a claim.
pub const OP_CLAIM: u8 = 1;
/// The sixth byte of a reply.
pub const OP_REPLY: u8 = 2;
/// A claim's fixed part: magic, version, op, key length, ask.
pub const CLAIM_HEADER: usize = 16;
/// A reply's length: magic, version, op, ok, reason, size.
pub const REPLY_LEN: usize = 16;
/// Longest key: its length travels in one byte of the two, and a key file's first line must be shorter than 256.
pub const MAX_KEY: usize = 255;

/// Client to daemon: lend me `ask` bytes (whole slices) for presenting `key`.
#[derive(Clone, PartialEq, Eq)]
pub struct ClaimMsg {
    pub ask: u64,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for ClaimMsg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimMsg").field("ask", &self.ask).field("key", &"(hidden)").finish()
    }
}

/// Why a daemon refused, as the reply's reason byte says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    Granted,
    BadKey,
    NoRoom,
    BadClaim,
    /// A code this client does not know; still a refusal.
    Other(u8),
}

impl Reason {
    pub fn code(self) -> u8 {
        match self {
            Reason::Granted => 0,
            Reason::BadKey => 1,
            Reason::NoRoom => 2,
            Reason::BadClaim => 3,
            Reason::Other(code) => code,
        }
    }

    pub fn from_code(code: u8) -> Reason {
        match code {
            0 => Reason::Granted,
            1 => Reason::BadKey,
            2 => Reason::NoRoom,
            3 => Reason::BadClaim,
            other => Reason::Other(other),
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reason::Granted => f.write_str("granted"),
            Reason::BadKey => f.write_str("the key was not accepted"),
            Reason::NoRoom => f.write_str("the pool has no room"),
            Reason::BadClaim => f.write_str("the claim was malformed"),
            Reason::Other(code) => write!(f, "reason {code}"),
        }
    }
}

/// Daemon to client: `ok` with the granted size (and one descriptor beside it), or a refusal that may carry the
/// size the daemon could lend now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyMsg {
    pub ok: bool,
    pub reason: Reason,
    pub size: u64,
}

impl ClaimMsg {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(CLAIM_HEADER + self.key.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[VERSION, OP_CLAIM]);
        out.extend_from_slice(&(self.key.len() as u16).to_le_bytes());
        out.extend_from_slice(&self.ask.to_le_bytes());
        out.extend_from_slice(&self.key);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<ClaimMsg, String> {
        if bytes.len() < CLAIM_HEADER {
            return Err(format!("a claim has at least {CLAIM_HEADER} bytes, this one {}", bytes.len()));
        }
        check_head(bytes, OP_CLAIM)?;
        let key_len = u16::from_le_bytes([bytes[6], bytes[7]]) as usize;
        let ask = u64::from_le_bytes(bytes[8..16].try_into().expect("eight bytes"));
        if key_len == 0 || key_len > MAX_KEY || bytes.len() != CLAIM_HEADER + key_len {
            return Err(format!("key length {key_len} does not fit a claim of {} bytes", bytes.len()));
        }
        Ok(ClaimMsg { ask, key: bytes[CLAIM_HEADER..].to_vec() })
    }
}

impl ReplyMsg {
    pub fn encode(&self) -> [u8; REPLY_LEN] {
        let mut out = [0u8; REPLY_LEN];
        out[..4].copy_from_slice(&MAGIC);
        out[4..8].copy_from_slice(&[VERSION, OP_REPLY, u8::from(self.ok), self.reason.code()]);
        out[8..].copy_from_slice(&self.size.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<ReplyMsg, String> {
        if bytes.len() != REPLY_LEN {
            return Err(format!("a reply has {REPLY_LEN} bytes, this one {}", bytes.len()));
        }
        check_head(bytes, OP_REPLY)?;
        let ok = match bytes[6] {
            0 => false,
            1 => true,
            other => return Err(format!("ok must be 0 or 1, not {other}")),
        };
        let reason = Reason::from_code(bytes[7]);
        if ok != (reason == Reason::Granted) {
            return Err(format!("ok is {} but the reason is {reason}", u8::from(ok)));
        }
        Ok(ReplyMsg { ok, reason, size: u64::from_le_bytes(bytes[8..16].try_into().expect("eight bytes")) })
    }
}

fn check_head(bytes: &[u8], op: u8) -> Result<(), String> {
    if bytes[..4] != MAGIC {
        return Err("the magic is not TFLD".into());
    }
    if bytes[4] != VERSION {
        return Err(format!("version {} is not {VERSION}", bytes[4]));
    }
    if bytes[5] != op {
        return Err(format!("op {} is not {op}", bytes[5]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_claim_and_a_reply_round_trip() {
        let claim = ClaimMsg { ask: 6 << 20, key: b"sesame".to_vec() };
        let bytes = claim.encode();
        assert_eq!(&bytes[..8], b"TFLD\x01\x01\x06\x00");
        assert_eq!(ClaimMsg::decode(&bytes).unwrap(), claim);
        let reply = ReplyMsg { ok: false, reason: Reason::NoRoom, size: 2 << 20 };
        assert_eq!(ReplyMsg::decode(&reply.encode()).unwrap(), reply);
    }

    #[test]
    fn test_malformed_messages_are_refused_with_what_is_wrong() {
        let good = ReplyMsg { ok: true, reason: Reason::Granted, size: 1 }.encode();
        assert!(ReplyMsg::decode(&good[..15]).unwrap_err().contains("16 bytes"));
        let mut bad = good;
        bad[0] = b'X';
        assert!(ReplyMsg::decode(&bad).unwrap_err().contains("magic"));
        let mut bad = good;
        bad[6] = 2;
        assert!(ReplyMsg::decode(&bad).unwrap_err().contains("ok must be 0 or 1"));
        let mut bad = good;
        bad[7] = 1;
        assert!(ReplyMsg::decode(&bad).unwrap_err().contains("ok is 1"));
        let claim = ClaimMsg { ask: 1, key: b"k".to_vec() }.encode();
        assert!(ClaimMsg::decode(&claim[..16]).unwrap_err().contains("key length 1"));
        assert!(format!("{:?}", ClaimMsg { ask: 1, key: b"secret".to_vec() }).contains("hidden"));
    }
}

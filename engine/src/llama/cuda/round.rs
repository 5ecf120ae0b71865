//! A round's tables, written to the pinned host copy of the meta buffer: each row's token, position, cache slot
//! and page table, attention's row groups, the lanes, and a draft head's own tables.

use crate::boundary::{EngineError, LaneStep, Logits};

use super::Sizing;

/// Byte offsets of the per-round tables inside the meta buffer and its pinned host copy.
#[derive(Clone, Copy)]
pub(super) struct MetaLayout {
    pub tokens: usize,
    pub pos: usize,
    pub kv_off: usize,
    pub table_off: usize,
    pub rows: usize,
    /// Attention row groups: first row and count, two u32 each.
    pub groups: usize,
    /// Per lane: its first row, start position, row count and page-table offset, four u32 each.
    pub lanes: usize,
    /// A draft head's round: each row's last key slot (its position plus one).
    pub key_pos: usize,
    /// A draft head's round, per lane whose guess keeps its state: the guess's row, position and page-table offset.
    pub guess_rows: usize,
    pub guess_pos: usize,
    pub guess_table: usize,
    pub pages: usize,
    pub end: usize,
}

impl MetaLayout {
    pub fn new(s: &Sizing) -> MetaLayout {
        let align = |n: usize| n.div_ceil(256) * 256;
        let (t, l) = (s.max_tokens, s.max_lanes);
        let tokens = 0;
        let pos = tokens + align(4 * t);
        let kv_off = pos + align(4 * t);
        let table_off = kv_off + align(8 * t);
        let rows = table_off + align(4 * t);
        let groups = rows + align(4 * t);
        let lanes = groups + align(8 * t);
        let key_pos = lanes + align(16 * l);
        let guess_rows = key_pos + align(4 * t);
        let guess_pos = guess_rows + align(4 * l);
        let guess_table = guess_pos + align(4 * l);
        let pages = guess_table + align(4 * l);
        let end = pages + align(4 * l * s.context);
        MetaLayout {
            tokens,
            pos,
            kv_off,
            table_off,
            rows,
            groups,
            lanes,
            key_pos,
            guess_rows,
            guess_pos,
            guess_table,
            pages,
            end,
        }
    }
}

/// The pool's page geometry and the round's attention grouping.
#[derive(Clone, Copy)]
pub(super) struct Geometry {
    pub page_tokens: usize,
    pub kv_dim: usize,
    pub page_stride: u64,
    /// Consecutive rows of a lane that one attention block takes.
    pub per_group: usize,
    /// Most page-table entries a round holds.
    pub max_pages: usize,
}

/// What a round's tables hold.
pub(super) struct Filled {
    pub rows: usize,
    /// Rows that want logits, in order.
    pub logit_rows: usize,
    pub groups: usize,
    /// Page-table entries: the bytes to upload end with them.
    pub pages: usize,
    /// A draft head's round: lanes whose guess keeps its state.
    pub guesses: usize,
}

impl Filled {
    /// Bytes of the host copy the round uploads.
    pub fn upload_bytes(&self, m: &MetaLayout) -> usize {
        m.pages + 4 * self.pages
    }
}

fn put(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// Writes the tables of a round over `lanes`. In a draft head's round (`head`) the row at position p keeps its keys
/// in slot p + 1, the slot of its token, and attends slots 1 to p + 1; the last row of a lane that asks for its
/// pick leaves its output as the hidden state of the position after its own.
pub(super) fn fill(
    bytes: &mut [u8],
    m: &MetaLayout,
    lanes: &[LaneStep],
    geo: Geometry,
    head: bool,
) -> Result<Filled, EngineError> {
    let sizing_err = |msg: &str| EngineError::Sizing(msg.to_string());
    let pt = geo.page_tokens;
    let mut f = Filled { rows: 0, logit_rows: 0, groups: 0, pages: 0, guesses: 0 };
    for (lane_index, lane) in lanes.iter().enumerate() {
        let (row0, n) = (f.rows, lane.tokens.len());
        for first in (row0..row0 + n).step_by(geo.per_group) {
            put(bytes, m.groups + 8 * f.groups, first as u32);
            put(bytes, m.groups + 8 * f.groups + 4, geo.per_group.min(row0 + n - first) as u32);
            f.groups += 1;
        }
        if f.pages + lane.pages.len() > geo.max_pages {
            return Err(sizing_err("the round's page tables exceed the sizing"));
        }
        for (i, v) in [row0, lane.start_pos, n, f.pages].into_iter().enumerate() {
            put(bytes, m.lanes + 16 * lane_index + 4 * i, v as u32);
        }
        for (i, &p) in lane.pages.iter().enumerate() {
            put(bytes, m.pages + 4 * (f.pages + i), p);
        }
        let page_of = |pos: usize| {
            lane.pages.get(pos / pt).copied().ok_or_else(|| sizing_err("a lane's pages do not cover its positions"))
        };
        for (i, &tok) in lane.tokens.iter().enumerate() {
            let pos = lane.start_pos + i;
            let slot = pos + usize::from(head);
            let off = page_of(slot)? as u64 * geo.page_stride + ((slot % pt) * geo.kv_dim) as u64;
            put(bytes, m.tokens + 4 * f.rows, tok);
            put(bytes, m.pos + 4 * f.rows, pos as u32);
            bytes[m.kv_off + 8 * f.rows..m.kv_off + 8 * f.rows + 8].copy_from_slice(&off.to_le_bytes());
            put(bytes, m.table_off + 4 * f.rows, f.pages as u32);
            if head {
                put(bytes, m.key_pos + 4 * f.rows, slot as u32);
            }
            if i + lane.logits.rows(n) >= n {
                put(bytes, m.rows + 4 * f.logit_rows, f.rows as u32);
                f.logit_rows += 1;
            }
            f.rows += 1;
        }
        if head && lane.logits == Logits::Argmax {
            // The guess's state stands for the position after the last row's, in the page of that row's key slot.
            put(bytes, m.guess_rows + 4 * f.guesses, (f.rows - 1) as u32);
            put(bytes, m.guess_pos + 4 * f.guesses, (lane.start_pos + n) as u32);
            put(bytes, m.guess_table + 4 * f.guesses, f.pages as u32);
            f.guesses += 1;
        }
        f.pages += lane.pages.len();
    }
    Ok(f)
}

//! On a GPU: a query row's attention has the same bits however it is batched. A 32K prompt gives the same rows whole
//! as in chunks of 7, 512 and 8,192, and as decoded one row at a time at sampled positions; a lane at 2K context
//! gives the same row alone (split blocks) as among 255 other lanes (one block per row, and one warp per row and KV
//! head) and among 63 (a few warps per row and KV head). Rows that attend from key slot 1 (a draft head's) never read
//! slot 0. Skips with a one-line reason where no GPU is found.

mod common;

use common::{bf16_bits, values};
use tensorfold_kernels::cuda::{attention_group_rows, AttentionArgs, DevPtr, Gpu, KernelOptions};

const NH: usize = 32;
const NKV: usize = 8;
const D: usize = 128;
const PAGE: usize = 16;
const KV_DIM: usize = NKV * D;
const WIDTH: usize = (NH + 2 * NKV) * D;

/// A pool of `pages` pages of one layer's keys and values, and room for the round's tables and results.
struct Bench {
    g: std::sync::Arc<Gpu>,
    k: DevPtr,
    v: DevPtr,
    ptrs: Vec<DevPtr>,
    /// The first key slot rows attend.
    first_key: usize,
}

/// One call's rows: (lane's page table, position) each; rows of one lane at consecutive positions form groups.
struct Round {
    rows: Vec<(usize, u32)>,
    /// Rows of a group: consecutive positions of one lane, at most this many.
    group_rows: usize,
}

impl Bench {
    fn new(g: std::sync::Arc<Gpu>, pages: usize) -> Bench {
        let alloc = |bytes: usize| g.malloc(bytes, false).unwrap();
        let (k, v) = (alloc(pages * PAGE * KV_DIM * 2), alloc(pages * PAGE * KV_DIM * 2));
        for (ptr, seed) in [(k, 1), (v, 2)] {
            let bits: Vec<u16> = values(seed, pages * PAGE * KV_DIM, 1.0).into_iter().map(bf16_bits).collect();
            g.upload(ptr, &bits).unwrap();
        }
        Bench { g, k, v, ptrs: vec![], first_key: 0 }
    }

    fn buffer<T>(&mut self, data: &[T]) -> DevPtr {
        let ptr = self.g.malloc(std::mem::size_of_val(data).max(4), false).unwrap();
        if !data.is_empty() {
            self.g.upload(ptr, data).unwrap();
        }
        self.ptrs.push(ptr);
        ptr
    }

    /// Each row's attention output (NH * D bf16 bits); q of a row comes from its lane and position alone.
    /// `split`: room for split states and parallel blocks; `decode`: one-row groups may take the decode kernel;
    /// `states`: room for the decode kernel's split states, that many splits a row and head at most, so a narrow
    /// round spreads each row over a few warps (a row with more splits keeps one warp).
    fn attend(
        &mut self,
        tables: &[Vec<u32>],
        round: &Round,
        split: bool,
        decode: bool,
        states: Option<usize>,
    ) -> Vec<Vec<u16>> {
        let t = round.rows.len();
        let mut qkv = Vec::with_capacity(t * WIDTH);
        let (mut pos, mut table_off, mut flat) = (vec![], vec![], vec![]);
        let mut offsets = vec![];
        for table in tables {
            offsets.push(flat.len() as u32);
            flat.extend_from_slice(table);
        }
        for &(lane, p) in &round.rows {
            qkv.extend(values(1_000_003 * lane as u64 + p as u64 + 7, WIDTH, 1.0));
            pos.push(p);
            table_off.push(offsets[lane]);
        }
        let mut groups = vec![];
        let mut r = 0;
        while r < t {
            let mut n = 1;
            while r + n < t
                && n < round.group_rows
                && round.rows[r + n] == (round.rows[r].0, round.rows[r].1 + n as u32)
            {
                n += 1;
            }
            groups.extend([r as u32, n as u32]);
            r += n;
        }
        let num_groups = groups.len() / 2;
        let longest = round.rows.iter().map(|r| r.1 as usize + 1).max().unwrap_or(1);
        let nsplit = longest.div_ceil(64).min(states.unwrap_or(usize::MAX));
        let out = self.buffer(&vec![0u16; t * NH * D]);
        let args = AttentionArgs {
            qkv: self.buffer(&qkv),
            pos: self.buffer(&pos),
            page_table: self.buffer(&flat),
            table_off: self.buffer(&table_off),
            kcache: self.k,
            vcache: self.v,
            out,
            groups: self.buffer(&groups),
            num_groups,
            num_heads: NH,
            num_kv_heads: NKV,
            head_dim: D,
            page_tokens: PAGE,
            page_stride: (PAGE * KV_DIM) as u64,
            layer_off: 0,
            scale: 1.0 / (D as f32).sqrt(),
            partial: if split { self.buffer(&vec![0f32; t * NH * nsplit * (D + 2)]) } else { 0 },
            tickets: self.buffer(&vec![0u32; t * NKV]),
            nsplit,
            splits: 32,
            one_row_groups: decode && num_groups == t,
            states: if states.is_some() { self.buffer(&vec![0f32; t * NH * nsplit * (D + 2)]) } else { 0 },
            states_bytes: t * NH * nsplit * (D + 2) * 4,
            ticket_rows: t,
            first_key: self.first_key,
        };
        if states.is_some() {
            assert!(self.g.decode_chunks(&args) > 1, "a round of {t} rows spreads its rows over several warps");
        }
        self.g.paged_attention(&args, None).unwrap();
        let mut got = vec![0u16; t * NH * D];
        // SAFETY: the buffer holds t * NH * D bf16 values and `got` lives until the sync.
        unsafe { self.g.download_async(&mut got, out).unwrap() };
        self.g.sync().unwrap();
        for p in self.ptrs.drain(..) {
            self.g.free(p, false);
        }
        got.chunks(NH * D).map(<[u16]>::to_vec).collect()
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        for p in [self.k, self.v].into_iter().chain(self.ptrs.drain(..)) {
            self.g.free(p, false);
        }
    }
}

fn open() -> Option<std::sync::Arc<Gpu>> {
    // TF_CUDA_WG_PROMPT=1 puts the prompt rounds on the wgmma kernel, whose rows must equal the others' too.
    let wg_prompt = std::env::var("TF_CUDA_WG_PROMPT").is_ok_and(|v| v == "1");
    match Gpu::open(0, None, KernelOptions { wide_decode: true, wg_prompt, ..KernelOptions::default() }) {
        Ok(g) => Some(g),
        Err(e) => {
            eprintln!("skipped: {e}");
            None
        }
    }
}

/// Page tables of `lanes` lanes of `len` positions each over a pool of `pages` pages, in a scattered order.
fn tables(lanes: usize, len: usize, pages: usize) -> Vec<Vec<u32>> {
    (0..lanes).map(|l| (0..len.div_ceil(PAGE)).map(|i| ((i * 7919 + l * 104_729) % pages) as u32).collect()).collect()
}

#[test]
fn test_a_32k_prompt_whole_equals_it_in_chunks_and_decoded() {
    let Some(g) = open() else { return };
    let n = 32_768;
    let mut bench = Bench::new(g, n / PAGE);
    let lanes = tables(1, n, n / PAGE);
    let group_rows = attention_group_rows(NH / NKV);
    let chunk = |from: usize, to: usize| Round { rows: (from..to).map(|p| (0, p as u32)).collect(), group_rows };
    let whole = bench.attend(&lanes, &chunk(0, n), false, false, None);
    for size in [7, 512, 8192] {
        let mut rows = vec![];
        for from in (0..n).step_by(size) {
            rows.extend(bench.attend(&lanes, &chunk(from, (from + size).min(n)), false, false, None));
        }
        let first = (0..n).find(|&p| rows[p] != whole[p]);
        assert_eq!(first, None, "chunks of {size}: the first row that differs from the whole prompt");
    }
    // Decoded one row at a time, alone (split blocks) and folded in one block, at split and page edges.
    for p in [0, 1, 15, 16, 63, 64, 65, 127, 1000, 4095, 4096, 20_000, 32_767] {
        for split in [true, false] {
            let row = bench.attend(&lanes, &chunk(p, p + 1), split, true, None);
            assert!(row[0] == whole[p], "position {p} decoded alone (split {split}) differs from the whole prompt");
        }
    }
}

#[test]
fn test_a_lane_at_2k_alone_equals_itself_among_255_others() {
    let Some(g) = open() else { return };
    let pages = 4096;
    let mut bench = Bench::new(g, pages);
    let lanes = tables(256, 4096, pages);
    let group_rows = attention_group_rows(NH / NKV);
    let alone = Round { rows: vec![(0, 2047)], group_rows };
    let solo = bench.attend(&lanes, &alone, true, true, None);
    // The others at contexts of 1 to 4,096 positions, the tested lane among them.
    let mut rows: Vec<(usize, u32)> = (1..256).map(|l| (l, ((l * 2654) % 4096) as u32)).collect();
    rows.insert(97, (0, 2047));
    let wide = Round { rows, group_rows };
    for decode in [true, false] {
        let got = bench.attend(&lanes, &wide, false, decode, None);
        assert!(got[97] == solo[0], "the lane among 255 others (decode kernel {decode}) differs from it alone");
        let again = bench.attend(&lanes, &Round { rows: vec![wide.rows[5]], group_rows }, true, true, None);
        assert!(got[5] == again[0], "another lane (decode kernel {decode}) differs from it alone");
    }
    // Among 63 others the decode kernel spreads each row over a few warps and folds their stored states; with room
    // for 8 splits a row, rows past 512 positions (the tested lane among them) keep one warp.
    let narrow = Round { rows: wide.rows[60..124].to_vec(), group_rows };
    let again = bench.attend(&lanes, &Round { rows: vec![narrow.rows[3]], group_rows }, true, true, None);
    for room in [usize::MAX, 8] {
        let got = bench.attend(&lanes, &narrow, false, true, Some(room));
        assert!(got[37] == solo[0], "the lane among 63 others (rows spread, room {room}) differs from it alone");
        assert!(got[3] == again[0], "another lane among 63 (rows spread, room {room}) differs from it alone");
        let short = narrow.rows.iter().position(|r| r.1 < 512).expect("a row of under 512 positions");
        let one = bench.attend(&lanes, &Round { rows: vec![narrow.rows[short]], group_rows }, true, true, None);
        assert!(got[short] == one[0], "a row of under 8 splits among 63 (room {room}) differs from it alone");
    }
}

#[test]
fn test_rows_from_key_slot_1_never_read_slot_0() {
    let Some(g) = open() else { return };
    let pages = 64;
    let mut bench = Bench::new(g.clone(), pages);
    let lanes = tables(1, 1000, pages);
    let group_rows = attention_group_rows(NH / NKV);
    let rows = |from: usize, to: usize| Round { rows: (from..to).map(|p| (0, p as u32)).collect(), group_rows };
    bench.first_key = 1;
    let before = bench.attend(&lanes, &rows(1, 200), false, false, None);
    // Slot 0's keys and values become NaN: a row that read them, even with weight 0, would turn NaN.
    let slot0 = u64::from(lanes[0][0]) * (PAGE * KV_DIM * 2) as u64;
    for ptr in [bench.k, bench.v] {
        g.upload(ptr + slot0, &vec![0x7fc0u16; KV_DIM]).unwrap();
    }
    let after = bench.attend(&lanes, &rows(1, 200), false, false, None);
    assert!(after == before, "rows from key slot 1 changed with slot 0's contents");
    for p in [1, 2, 63, 64, 65, 199] {
        for split in [true, false] {
            let row = bench.attend(&lanes, &rows(p, p + 1), split, true, None);
            assert!(row[0] == before[p - 1], "position {p} alone (split {split}) differs from it among the prompt");
        }
    }
    let nan = |row: &[u16]| row.iter().any(|&b| b & 0x7f80 == 0x7f80 && b & 0x7f != 0);
    assert!(!after.iter().any(|r| nan(r)), "a row from key slot 1 is NaN");
    bench.first_key = 0;
    let from_zero = bench.attend(&lanes, &rows(1, 2), false, false, None);
    assert!(nan(&from_zero[0]), "a row from key slot 0 did not read slot 0, so this test shows nothing");
}

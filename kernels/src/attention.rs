//! Paged KV storage and causal attention over it; a query row reads keys in absolute-position order.

use std::ops::DerefMut;

use rayon::prelude::*;

use crate::ops::dot;
use crate::simd::axpy;

/// The shape of the KV pool: a page holds `page_tokens` positions of every layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub page_tokens: usize,
    /// Bytes of one stored element: 4 for f32 on the CPU, 2 for bf16 on a GPU.
    pub elem_bytes: usize,
    /// Floats of recurrent state a page holds beside its keys and values (linear-attention layers); 0 for most models.
    pub state_elems: usize,
}

impl KvLayout {
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
    /// Bytes of one page: keys, values and recurrent state together.
    pub fn page_bytes(&self) -> usize {
        2 * self.page_elems() * self.elem_bytes + self.state_bytes(1)
    }
    /// Bytes of the recurrent state of `num_pages` pages, always f32.
    pub fn state_bytes(&self, num_pages: usize) -> usize {
        num_pages * self.state_elems * 4
    }
    /// Elements of one page of keys (or of values).
    pub fn page_elems(&self) -> usize {
        self.num_layers * self.page_tokens * self.kv_dim()
    }
    /// Bytes of the keys' (or the values') buffer of `num_pages` pages.
    pub fn buffer_bytes(&self, num_pages: usize) -> usize {
        num_pages * self.page_elems() * self.elem_bytes
    }
}

/// Memory the pool lives in: a plain vector, or an allocation made through the runtime's ledger.
pub type KvStorage = Box<dyn DerefMut<Target = [f32]> + Send + Sync>;

/// What keeps a device pool's buffers alive until the pool is dropped.
pub type KvOwner = Box<dyn Send + Sync>;

/// Where a pool's keys and values live.
enum KvMemory {
    /// Floats the CPU kernels read and write.
    Host { keys: KvStorage, values: KvStorage },
    /// Device buffers at these addresses, which only the GPU kernels touch; `states` is the recurrent state's (0
    /// until `with_device_states` gives it one).
    Device { keys: u64, values: u64, states: u64, _owner: KvOwner },
}

/// Keys and values of every page, stored `[page][layer][token][kv_dim]`, and each page's recurrent state, always in
/// host memory of its own (never lent).
pub struct KvPool {
    layout: KvLayout,
    num_pages: usize,
    memory: KvMemory,
    states: KvStorage,
}

impl KvPool {
    pub fn new(layout: KvLayout, num_pages: usize) -> KvPool {
        let n = num_pages * layout.page_elems();
        KvPool::with_storage(layout, num_pages, Box::new(vec![0.0; n]), Box::new(vec![0.0; n]))
    }

    /// A pool over given memory, each buffer at least `num_pages` pages of floats; recurrent state, where the layout
    /// has any, in a vector until `with_states` gives it other memory.
    pub fn with_storage(layout: KvLayout, num_pages: usize, keys: KvStorage, values: KvStorage) -> KvPool {
        assert_eq!(layout.elem_bytes, 4, "a host pool holds f32");
        let n = num_pages * layout.page_elems();
        assert!(keys.len() >= n && values.len() >= n, "KV storage is smaller than {num_pages} pages");
        let states = Box::new(vec![0.0; num_pages * layout.state_elems]);
        KvPool { layout, num_pages, memory: KvMemory::Host { keys, values }, states }
    }

    /// A pool in device memory, keys at `ptrs[0]` and values at `ptrs[1]`, which `owner` keeps allocated.
    pub fn on_device(layout: KvLayout, num_pages: usize, owner: KvOwner, ptrs: [u64; 2]) -> KvPool {
        let memory = KvMemory::Device { keys: ptrs[0], values: ptrs[1], states: 0, _owner: owner };
        KvPool { layout, num_pages, memory, states: Box::new(Vec::new()) }
    }

    /// The same device pool with its recurrent state at device address `ptr` (f32, `num_pages` pages of it), which
    /// `owner` keeps allocated.
    pub fn with_device_states(mut self, ptr: u64, owner: KvOwner) -> KvPool {
        if let KvMemory::Device { states, _owner: held, .. } = &mut self.memory {
            *states = ptr;
            let keys_and_values = std::mem::replace(held, Box::new(()));
            *held = Box::new((keys_and_values, owner));
        }
        self
    }

    /// The device address of the recurrent state, for a device pool that has one.
    pub fn device_states(&self) -> Option<u64> {
        match self.memory {
            KvMemory::Device { states, .. } if states != 0 => Some(states),
            _ => None,
        }
    }

    /// The same pool with its recurrent state in `states`, at least `num_pages` pages of it.
    pub fn with_states(mut self, states: KvStorage) -> KvPool {
        assert!(states.len() >= self.num_pages * self.layout.state_elems, "state storage is smaller than the pool");
        self.states = states;
        self
    }

    /// Page `page`'s recurrent state.
    pub fn state(&self, page: u32) -> &[f32] {
        let n = self.layout.state_elems;
        &self.states[page as usize * n..(page as usize + 1) * n]
    }

    /// Page `page`'s recurrent state, to write.
    pub fn state_mut(&mut self, page: u32) -> &mut [f32] {
        let n = self.layout.state_elems;
        &mut self.states[page as usize * n..(page as usize + 1) * n]
    }

    /// Device addresses of keys and values, for a pool on a GPU.
    pub fn device_ptrs(&self) -> Option<[u64; 2]> {
        match self.memory {
            KvMemory::Device { keys, values, .. } => Some([keys, values]),
            KvMemory::Host { .. } => None,
        }
    }

    fn host(&self) -> (&[f32], &[f32]) {
        match &self.memory {
            KvMemory::Host { keys, values } => (keys, values),
            KvMemory::Device { .. } => panic!("the CPU kernels read a KV pool in device memory"),
        }
    }

    pub fn layout(&self) -> KvLayout {
        self.layout
    }

    pub fn num_pages(&self) -> usize {
        self.num_pages
    }

    fn offset(&self, layer: usize, pages: &[u32], pos: usize) -> usize {
        let l = &self.layout;
        let page = pages[pos / l.page_tokens] as usize;
        assert!(page < self.num_pages, "page {page} is outside the pool");
        page * l.page_elems() + (layer * l.page_tokens + pos % l.page_tokens) * l.kv_dim()
    }

    /// Stores one position's key and value rows.
    pub fn write(&mut self, layer: usize, pages: &[u32], pos: usize, key: &[f32], value: &[f32]) {
        let (at, d) = (self.offset(layer, pages, pos), self.layout.kv_dim());
        let KvMemory::Host { keys, values } = &mut self.memory else {
            panic!("the CPU kernels write a KV pool in device memory")
        };
        keys[at..at + d].copy_from_slice(key);
        values[at..at + d].copy_from_slice(value);
    }

    fn key(&self, layer: usize, pages: &[u32], pos: usize) -> &[f32] {
        let at = self.offset(layer, pages, pos);
        &self.host().0[at..at + self.layout.kv_dim()]
    }

    fn value(&self, layer: usize, pages: &[u32], pos: usize) -> &[f32] {
        let at = self.offset(layer, pages, pos);
        &self.host().1[at..at + self.layout.kv_dim()]
    }
}

/// One query row: its heads, its absolute position, and the pages of its sequence.
pub struct Query<'a> {
    pub q: &'a [f32],
    pub pos: usize,
    pub pages: &'a [u32],
}

/// Causal grouped-query attention of each query row over positions `0..=pos`; writes `num_heads * head_dim` per row.
pub fn attend(pool: &KvPool, layer: usize, queries: &[Query], num_heads: usize, out: &mut [f32]) {
    attend_from(pool, layer, queries, num_heads, 0, out);
}

/// `attend` over positions `first..=pos` only (a draft head's keys start at its first row's).
pub fn attend_from(pool: &KvPool, layer: usize, queries: &[Query], num_heads: usize, first: usize, out: &mut [f32]) {
    let d = pool.layout.head_dim;
    let group = num_heads / pool.layout.num_kv_heads;
    let scale = 1.0 / (d as f32).sqrt();
    out.par_chunks_mut(d).enumerate().for_each(|(i, o)| {
        let (query, head) = (&queries[i / num_heads], i % num_heads);
        let q = &query.q[head * d..(head + 1) * d];
        let kv = (head / group) * d;
        let scores: Vec<f32> =
            (first..=query.pos).map(|p| dot(q, &pool.key(layer, query.pages, p)[kv..kv + d]) * scale).collect();
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s));
        let probs: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let denom = probs.iter().fold(0f32, |a, p| a + p);
        o.fill(0.0);
        for (p, w) in (first..).zip(&probs) {
            let v = &pool.value(layer, query.pages, p)[kv..kv + d];
            axpy(w / denom, v, o);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_a_page_of_bf16_takes_half_the_bytes_of_one_of_f32() {
        let f32_layout =
            KvLayout { num_layers: 3, num_kv_heads: 2, head_dim: 64, page_tokens: 16, elem_bytes: 4, state_elems: 0 };
        let bf16_layout = KvLayout { elem_bytes: 2, ..f32_layout };
        assert_eq!(f32_layout.page_elems(), 3 * 16 * 128);
        assert_eq!(f32_layout.page_bytes(), 2 * 4 * f32_layout.page_elems());
        assert_eq!(bf16_layout.page_bytes(), f32_layout.page_bytes() / 2);
        assert_eq!(bf16_layout.buffer_bytes(5), 5 * bf16_layout.page_bytes() / 2);
        let hybrid = KvLayout { state_elems: 100, ..f32_layout };
        assert_eq!(hybrid.page_bytes(), f32_layout.page_bytes() + 400);
        assert_eq!(hybrid.buffer_bytes(5), f32_layout.buffer_bytes(5));
    }

    #[test]
    fn test_each_page_has_its_own_state() {
        let layout =
            KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 4, page_tokens: 16, elem_bytes: 4, state_elems: 3 };
        let mut pool = KvPool::new(layout, 4);
        pool.state_mut(2).copy_from_slice(&[1.0, 2.0, 3.0]);
        assert_eq!(pool.state(2), [1.0, 2.0, 3.0]);
        assert!(pool.state(1).iter().chain(pool.state(3)).all(|&v| v == 0.0));
    }

    #[test]
    #[should_panic(expected = "a host pool holds f32")]
    fn test_a_host_pool_refuses_a_bf16_layout() {
        let layout =
            KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 4, page_tokens: 16, elem_bytes: 2, state_elems: 0 };
        KvPool::new(layout, 1);
    }
}

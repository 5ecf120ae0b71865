//! The prefix cache's index: full KV pages of prompts, keyed by their parent page and their own token ids.
//!
//! A page's key is (the page before it in the chain, or none for a prompt's first page; a hash of its token
//! ids), and the entry keeps the ids themselves, so a lookup compares them and a hash collision is a miss.
//! Since every parent is matched the same way, a hit means the whole prefix up to the page is the same.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

/// The parent of a prompt's first page.
const ROOT: u32 = u32::MAX;

struct Entry {
    key: (u32, u64),
    tokens: Vec<u32>,
    children: Vec<u32>,
    /// Where the page sits in the eviction order while no lease holds it.
    tick: Option<u64>,
}

/// Cached pages and their order of last use; the page book owns the page ids and their reference counts.
pub struct PrefixIndex {
    /// Most pages the cache may hold.
    budget: usize,
    by_key: HashMap<(u32, u64), u32>,
    entries: HashMap<u32, Entry>,
    /// Cached pages no lease holds, least recently used first.
    idle: BTreeMap<u64, u32>,
    clock: u64,
}

fn token_hash(tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    tokens.hash(&mut h);
    h.finish()
}

impl PrefixIndex {
    pub fn new(budget: usize) -> PrefixIndex {
        PrefixIndex { budget, by_key: HashMap::new(), entries: HashMap::new(), idle: BTreeMap::new(), clock: 0 }
    }

    /// Most pages the cache may hold.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Pages cached, held by leases or not.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Cached pages that no lease holds: room admission may take back.
    pub fn num_idle(&self) -> usize {
        self.idle.len()
    }

    /// Whether the page is cached and no lease holds it.
    pub fn is_idle(&self, page: u32) -> bool {
        self.entries.get(&page).is_some_and(|e| e.tick.is_some())
    }

    pub fn contains(&self, page: u32) -> bool {
        self.entries.contains_key(&page)
    }

    /// The longest chain of cached pages that `pages` (each `page_tokens` ids) starts with.
    pub fn lookup<'a>(&self, pages: impl Iterator<Item = &'a [u32]>) -> Vec<u32> {
        let mut chain = Vec::new();
        let mut parent = ROOT;
        for tokens in pages {
            match self.by_key.get(&(parent, token_hash(tokens))) {
                Some(&page) if self.entries[&page].tokens == tokens => {
                    chain.push(page);
                    parent = page;
                }
                _ => break,
            }
        }
        chain
    }

    /// A lease took the page: it leaves the eviction order.
    pub fn hold(&mut self, page: u32) {
        if let Some(tick) = self.entries.get_mut(&page).and_then(|e| e.tick.take()) {
            self.idle.remove(&tick);
        }
    }

    /// No lease holds the page any more: it joins the eviction order as the most recently used.
    pub fn release(&mut self, page: u32) {
        let entry = self.entries.get_mut(&page).expect("a cached page");
        self.clock += 1;
        entry.tick = Some(self.clock);
        self.idle.insert(self.clock, page);
    }

    /// Caches the chain `pages` of a prompt whose KV is computed, `tokens[i]` the ids of `pages[i]`; pages already
    /// cached stay, a page whose content another page caches stays its lease's own. `evict` runs when the budget
    /// is full; it returns false when nothing can be evicted, and caching stops there.
    pub fn insert<'a>(
        &mut self,
        pages: &[u32],
        tokens: impl Iterator<Item = &'a [u32]>,
        mut evict: impl FnMut(&mut PrefixIndex) -> bool,
    ) {
        let mut parent = ROOT;
        for (&page, ids) in pages.iter().zip(tokens) {
            let key = (parent, token_hash(ids));
            if let Some(&cached) = self.by_key.get(&key) {
                if self.entries[&cached].tokens != ids {
                    return;
                }
                parent = cached;
                continue;
            }
            if self.entries.contains_key(&page) {
                return;
            }
            while self.entries.len() >= self.budget {
                if !evict(self) {
                    return;
                }
            }
            if parent != ROOT && !self.entries.contains_key(&parent) {
                // Making room took back the chain's parent: its id may serve other positions soon.
                return;
            }
            self.by_key.insert(key, page);
            self.entries.insert(page, Entry { key, tokens: ids.to_vec(), children: Vec::new(), tick: None });
            if let Some(p) = self.entries.get_mut(&parent) {
                p.children.push(page);
            }
            parent = page;
        }
    }

    /// Drops the least recently used idle page and every page cached below it from the index; returns them with
    /// whether each was idle (free now) or still held by a lease (its own from now on).
    pub fn evict_oldest(&mut self) -> Vec<(u32, bool)> {
        let Some((_, page)) = self.idle.pop_first() else { return Vec::new() };
        let mut out = Vec::new();
        self.remove_tree(page, &mut out);
        out
    }

    /// Drops every page from the index, as `evict_oldest` reports them.
    pub fn clear(&mut self) -> Vec<(u32, bool)> {
        let out = self.entries.iter().map(|(&p, e)| (p, e.tick.is_some())).collect();
        self.by_key.clear();
        self.entries.clear();
        self.idle.clear();
        out
    }

    fn remove_tree(&mut self, page: u32, out: &mut Vec<(u32, bool)>) {
        let entry = self.entries.remove(&page).expect("a cached page");
        self.by_key.remove(&entry.key);
        if let Some(parent) = self.entries.get_mut(&entry.key.0) {
            parent.children.retain(|&c| c != page);
        }
        if let Some(t) = entry.tick {
            self.idle.remove(&t);
        }
        out.push((page, entry.tick.is_some()));
        for child in entry.children {
            self.remove_tree(child, out);
        }
    }
}

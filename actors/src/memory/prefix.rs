//! The prefix cache's index: KV pages of prompts, keyed by their parent page and their own token ids.
//!
//! A full page's key is (the page before it in the chain, or none for a prompt's first page; a hash of its token
//! ids), and the entry keeps the ids themselves, so a lookup compares them and a hash collision is a miss.
//! Since every parent is matched the same way, a hit means the whole prefix up to the page is the same.
//!
//! A prompt's last, partial page is cached too, under its parent and its first id. Many leases share full pages,
//! which none of them writes; a partial page goes to one lease at a time, which writes its own ids after the
//! cached ones. The index then keeps only the ids the lease took, and the lease's computed prompt extends them.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

/// The parent of a prompt's first page.
const ROOT: u32 = u32::MAX;

struct Entry {
    parent: u32,
    /// The page's ids whose KV is cached: a full page's all, a partial page's first ones.
    tokens: Vec<u32>,
    children: Vec<u32>,
    /// Where the page sits in the eviction order while no lease holds it.
    tick: Option<u64>,
}

/// A prompt's longest cached prefix short of its last id: full pages to share, then a page to take whole.
#[derive(Debug, Default, PartialEq)]
pub struct Resume {
    pub chain: Vec<u32>,
    /// A page no lease holds whose first ids (this many) follow the chain in the prompt.
    pub last: Option<(u32, usize)>,
}

/// Cached pages and their order of last use; the page book owns the page ids and their reference counts.
pub struct PrefixIndex {
    /// Most pages the cache may hold.
    budget: usize,
    page_tokens: usize,
    by_key: HashMap<(u32, u64), u32>,
    /// Partial pages by (parent, first id).
    partials: HashMap<(u32, u32), Vec<u32>>,
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

fn common_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixIndex {
    pub fn new(budget: usize, page_tokens: usize) -> PrefixIndex {
        PrefixIndex {
            budget,
            page_tokens,
            by_key: HashMap::new(),
            partials: HashMap::new(),
            entries: HashMap::new(),
            idle: BTreeMap::new(),
            clock: 0,
        }
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

    /// Ids of the page the index keeps, if it is cached.
    pub fn cached_ids(&self, page: u32) -> Option<&[u32]> {
        self.entries.get(&page).map(|e| &e.tokens[..])
    }

    /// The longest cached prefix of `prompt` that leaves its last id to compute, so its first token is drawn
    /// from a row of its own round.
    pub fn lookup(&self, prompt: &[u32]) -> Resume {
        let t = self.page_tokens;
        let usable = prompt.len().saturating_sub(1);
        let mut resume = Resume::default();
        let mut parent = ROOT;
        for tokens in prompt[..usable].chunks_exact(t) {
            match self.by_key.get(&(parent, token_hash(tokens))) {
                Some(&page) if self.entries[&page].tokens == tokens => {
                    resume.chain.push(page);
                    parent = page;
                }
                _ => break,
            }
        }
        let start = resume.chain.len() * t;
        let (rest, most) = (&prompt[start..], (usable - start).min(t));
        if most == 0 {
            return resume;
        }
        // A full page past the chain is one only the last id kept out; it may be taken while nothing is cached below.
        let full = (rest.len() == t).then(|| self.by_key.get(&(parent, token_hash(rest)))).flatten();
        let partials = self.partials.get(&(parent, rest[0])).into_iter().flatten();
        let takeable = |p: &&u32| self.entries[*p].tick.is_some() && self.entries[*p].children.is_empty();
        resume.last = (full.into_iter().chain(partials).filter(takeable))
            .map(|&p| (p, common_len(&self.entries[&p].tokens, rest).min(most)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(_, n)| n);
        resume
    }

    /// A lease took the page: it leaves the eviction order.
    pub fn hold(&mut self, page: u32) {
        if let Some(tick) = self.entries.get_mut(&page).and_then(|e| e.tick.take()) {
            self.idle.remove(&tick);
        }
    }

    /// A lease took `page` for its own, to write after its first `num_tokens` ids: the index keeps only those.
    pub fn take(&mut self, page: u32, num_tokens: usize) {
        let entry = self.entries.get_mut(&page).expect("a cached page");
        if num_tokens >= entry.tokens.len() {
            return;
        }
        if entry.tokens.len() == self.page_tokens {
            self.by_key.remove(&(entry.parent, token_hash(&entry.tokens)));
            self.partials.entry((entry.parent, entry.tokens[0])).or_default().push(page);
        }
        entry.tokens.truncate(num_tokens);
    }

    /// No lease holds the page any more: it joins the eviction order as the most recently used.
    pub fn release(&mut self, page: u32) {
        let entry = self.entries.get_mut(&page).expect("a cached page");
        self.clock += 1;
        entry.tick = Some(self.clock);
        self.idle.insert(self.clock, page);
    }

    /// Caches the chain `pages` of a prompt whose KV is computed, `tokens[i]` the ids of `pages[i]` (the last may
    /// be partial); pages already cached stay, a page whose content another page caches stays its lease's own,
    /// and a page the lease took from the cache keeps its ids computed now. `evict` runs when the budget is full;
    /// it returns false when nothing can be evicted, and caching stops there.
    pub fn insert<'a>(
        &mut self,
        pages: &[u32],
        tokens: impl Iterator<Item = &'a [u32]>,
        mut evict: impl FnMut(&mut PrefixIndex) -> bool,
    ) {
        let mut parent = ROOT;
        for (&page, ids) in pages.iter().zip(tokens) {
            let full = ids.len() == self.page_tokens;
            if let Some(&cached) = self.by_key.get(&(parent, token_hash(ids))).filter(|_| full) {
                if self.entries[&cached].tokens != ids {
                    return;
                }
                parent = cached;
                continue;
            }
            if let Some(entry) = self.entries.get(&page) {
                if entry.parent != parent || !ids.starts_with(&entry.tokens) {
                    return;
                }
                self.extend(page, ids);
            } else {
                if !full && self.covers(parent, ids) {
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
                self.add(page, parent, ids);
            }
            if !full {
                return;
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
        self.partials.clear();
        self.entries.clear();
        self.idle.clear();
        out
    }

    /// Whether a partial page under `parent` already keeps `ids`, or more ids that start with them.
    fn covers(&self, parent: u32, ids: &[u32]) -> bool {
        let siblings = self.partials.get(&(parent, ids[0])).into_iter().flatten();
        siblings.map(|p| &self.entries[p].tokens).any(|cached| cached.starts_with(ids))
    }

    fn add(&mut self, page: u32, parent: u32, ids: &[u32]) {
        match ids.len() == self.page_tokens {
            true => self.by_key.insert((parent, token_hash(ids)), page),
            false => {
                self.partials.entry((parent, ids[0])).or_default().push(page);
                None
            }
        };
        self.entries.insert(page, Entry { parent, tokens: ids.to_vec(), children: Vec::new(), tick: None });
        if let Some(p) = self.entries.get_mut(&parent) {
            p.children.push(page);
        }
    }

    /// The lease that took `page` computed `ids`, which start with the ids cached: the page keeps them all.
    fn extend(&mut self, page: u32, ids: &[u32]) {
        let entry = &self.entries[&page];
        let (parent, first) = (entry.parent, entry.tokens[0]);
        if entry.tokens.len() == ids.len() {
            return;
        }
        if ids.len() == self.page_tokens {
            self.unlist_partial(parent, first, page);
            self.by_key.insert((parent, token_hash(ids)), page);
        }
        self.entries.get_mut(&page).expect("a cached page").tokens = ids.to_vec();
    }

    fn unlist_partial(&mut self, parent: u32, first: u32, page: u32) {
        if let Some(siblings) = self.partials.get_mut(&(parent, first)) {
            siblings.retain(|&p| p != page);
            if siblings.is_empty() {
                self.partials.remove(&(parent, first));
            }
        }
    }

    fn remove_tree(&mut self, page: u32, out: &mut Vec<(u32, bool)>) {
        let entry = self.entries.remove(&page).expect("a cached page");
        match entry.tokens.len() == self.page_tokens {
            true => drop(self.by_key.remove(&(entry.parent, token_hash(&entry.tokens)))),
            false => self.unlist_partial(entry.parent, entry.tokens[0], page),
        }
        if let Some(parent) = self.entries.get_mut(&entry.parent) {
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

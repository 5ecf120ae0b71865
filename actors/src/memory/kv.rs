//! KV page leases: admission reserves a request's pages, the lease takes them as the lane grows, drop returns them.
//! With the prefix cache, a lease starts with the cached pages of its prompt's longest cached prefix; pages are
//! counted by the leases holding them, and a cached page no lease holds stays cached until admission needs room.
//! A cached partial page goes to one lease at a time, which writes its own positions after the cached ones.

use std::cell::RefCell;
use std::rc::Rc;

use crate::memory::prefix::PrefixIndex;

struct PageBook {
    free: Vec<u32>,
    /// Pages promised to leases but not yet taken.
    reserved: usize,
    total: usize,
    /// Leases holding each page.
    refs: Vec<u32>,
    cache: PrefixIndex,
}

impl PageBook {
    /// Whether `num_pages` more can be promised: free pages and cached ones no lease holds cover every promise,
    /// after admission held a prompt's cached pages, which may have been part of that room.
    fn can_reserve(&self, num_pages: usize) -> bool {
        self.free.len() + self.cache.num_idle() >= self.reserved + num_pages
    }

    fn hold(&mut self, page: u32) {
        self.refs[page as usize] += 1;
        if self.refs[page as usize] == 1 {
            self.cache.hold(page);
        }
    }

    fn unhold(&mut self, page: u32) {
        self.refs[page as usize] -= 1;
        if self.refs[page as usize] == 0 {
            match self.cache.contains(page) {
                true => self.cache.release(page),
                false => self.free.push(page),
            }
        }
    }

    /// A page for a lease: a free one, else the least recently used cached one no lease holds.
    fn take_free(&mut self) -> u32 {
        if self.free.is_empty() {
            evict(&mut self.cache, &mut self.free);
        }
        let page = self.free.pop().expect("reserved pages are free or cached and idle");
        self.hold(page);
        page
    }
}

/// Evicts the least recently used idle cached page and the pages cached below it; false when none is idle.
fn evict(cache: &mut PrefixIndex, free: &mut Vec<u32>) -> bool {
    let out = cache.evict_oldest();
    free_idle(&out, free);
    !out.is_empty()
}

/// Pages dropped from the cache that no lease holds are free; held ones go back when their leases drop them.
fn free_idle(dropped: &[(u32, bool)], free: &mut Vec<u32>) {
    free.extend(dropped.iter().filter(|(_, idle)| *idle).map(|(p, _)| *p));
}

/// A model's KV pages as the coordinator counts them (free, leased, cached): room, not the contents, which the
/// engine's `KvPool` holds.
pub struct KvPages {
    book: Rc<RefCell<PageBook>>,
    page_tokens: usize,
}

impl KvPages {
    /// `num_pages` pages whose prefix cache may hold up to `cache_tokens` positions (0: no cache).
    pub fn new(num_pages: usize, page_tokens: usize, cache_tokens: usize) -> KvPages {
        let book = PageBook {
            free: (0..num_pages as u32).rev().collect(),
            reserved: 0,
            total: num_pages,
            refs: vec![0; num_pages],
            cache: PrefixIndex::new((cache_tokens / page_tokens).min(num_pages), page_tokens),
        };
        KvPages { book: Rc::new(RefCell::new(book)), page_tokens }
    }

    pub fn pages_for(&self, num_tokens: usize) -> usize {
        num_tokens.div_ceil(self.page_tokens)
    }

    pub fn num_total(&self) -> usize {
        self.book.borrow().total
    }

    /// Pages held by leases right now.
    pub fn num_used(&self) -> usize {
        let b = self.book.borrow();
        b.total - b.free.len() - b.cache.num_idle()
    }

    /// Whether the pages keep a prefix cache.
    pub fn caches(&self) -> bool {
        self.book.borrow().cache.budget() > 0
    }

    /// Pages the prefix cache holds, whether leases hold them too or not.
    pub fn num_cached(&self) -> usize {
        self.book.borrow().cache.len()
    }

    /// Reserves room for `num_tokens` positions, starting from `prompt`'s longest cached prefix when one is given:
    /// its full pages shared, then a cached page no lease holds, taken for this lease's own; `None` when there is
    /// not enough room. At least one prompt position is left to compute, so the lane's first token is sampled
    /// from its own round.
    pub fn admit(&self, num_tokens: usize, prompt: Option<&[u32]>) -> Option<Lease> {
        let mut b = self.book.borrow_mut();
        let t = self.page_tokens;
        let resume = prompt.map(|p| b.cache.lookup(p)).unwrap_or_default();
        let cached = resume.chain.len() * t + resume.last.map_or(0, |(_, n)| n);
        let mut pages = resume.chain;
        pages.extend(resume.last.map(|(page, _)| page));
        for &page in &pages {
            b.hold(page);
        }
        let budget = self.pages_for(num_tokens).max(pages.len());
        if !b.can_reserve(budget - pages.len()) {
            for &page in &pages {
                b.unhold(page);
            }
            return None;
        }
        b.reserved += budget - pages.len();
        if let Some((page, num_taken)) = resume.last {
            b.cache.take(page, num_taken);
        }
        Some(Lease { book: self.book.clone(), cached, pages, budget, page_tokens: t })
    }

    /// Forgets every cached page (after a device error, whose rounds may have left pages unwritten).
    pub fn clear_cache(&self) {
        let mut b = self.book.borrow_mut();
        let out = b.cache.clear();
        free_idle(&out, &mut b.free);
    }
}

/// A lane's pages; not `Clone`, and dropping it returns every page it holds and the unused reservation.
pub struct Lease {
    book: Rc<RefCell<PageBook>>,
    pages: Vec<u32>,
    budget: usize,
    page_tokens: usize,
    cached: usize,
}

impl Lease {
    /// Takes pages until `num_tokens` positions fit; the admission reservation guarantees them.
    pub fn grow_to(&mut self, num_tokens: usize) {
        let need = num_tokens.div_ceil(self.page_tokens);
        assert!(need <= self.budget, "lease grew past its reservation: {need} > {}", self.budget);
        let mut book = self.book.borrow_mut();
        while self.pages.len() < need {
            let page = book.take_free();
            book.reserved -= 1;
            self.pages.push(page);
        }
    }

    /// Page ids in position order, for the engine's round plan.
    pub fn pages(&self) -> &[u32] {
        &self.pages
    }

    /// Positions whose KV the lease found cached at admission.
    pub fn cached(&self) -> usize {
        self.cached
    }

    /// Caches the pages of `prompt`, the last one partial or not, once their KV is computed; pages past the
    /// cache's budget are not kept.
    pub fn cache_prompt(&self, prompt: &[u32]) {
        let mut b = self.book.borrow_mut();
        let book = &mut *b;
        let num_pages = prompt.len().div_ceil(self.page_tokens).min(self.pages.len());
        let (cache, free) = (&mut book.cache, &mut book.free);
        cache.insert(&self.pages[..num_pages], prompt.chunks(self.page_tokens), |c| evict(c, free));
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut book = self.book.borrow_mut();
        book.reserved -= self.budget - self.pages.len();
        for page in self.pages.drain(..) {
            book.unhold(page);
        }
    }
}

#[cfg(test)]
#[path = "kv_tests.rs"]
mod tests;

//! KV page leases: admission reserves a request's pages, the lease takes them as the lane grows, drop returns them.

use std::cell::RefCell;
use std::rc::Rc;

struct PageBook {
    free: Vec<u32>,
    /// Pages promised to leases but not yet taken.
    reserved: usize,
    total: usize,
}

/// The coordinator's view of the KV pool: room, not page ids.
pub struct PagePool {
    book: Rc<RefCell<PageBook>>,
    page_tokens: usize,
}

impl PagePool {
    pub fn new(num_pages: usize, page_tokens: usize) -> PagePool {
        let book = PageBook { free: (0..num_pages as u32).rev().collect(), reserved: 0, total: num_pages };
        PagePool { book: Rc::new(RefCell::new(book)), page_tokens }
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
        b.total - b.free.len()
    }

    /// Whether a request of up to `num_tokens` positions can be admitted now.
    pub fn can_admit(&self, num_tokens: usize) -> bool {
        let b = self.book.borrow();
        b.free.len() - b.reserved >= self.pages_for(num_tokens)
    }

    /// Reserves room for `num_tokens` positions; `None` when there is not enough.
    pub fn admit(&self, num_tokens: usize) -> Option<Lease> {
        if !self.can_admit(num_tokens) {
            return None;
        }
        let budget = self.pages_for(num_tokens);
        self.book.borrow_mut().reserved += budget;
        Some(Lease { book: self.book.clone(), pages: Vec::new(), budget, page_tokens: self.page_tokens })
    }
}

/// A lane's pages; not `Clone`, and dropping it returns every page and the unused reservation.
pub struct Lease {
    book: Rc<RefCell<PageBook>>,
    pages: Vec<u32>,
    budget: usize,
    page_tokens: usize,
}

impl Lease {
    /// Takes pages until `num_tokens` positions fit; the admission reservation guarantees them.
    pub fn grow_to(&mut self, num_tokens: usize) {
        let need = num_tokens.div_ceil(self.page_tokens);
        assert!(need <= self.budget, "lease grew past its reservation: {need} > {}", self.budget);
        let mut book = self.book.borrow_mut();
        while self.pages.len() < need {
            let page = book.free.pop().expect("reserved pages are free");
            book.reserved -= 1;
            self.pages.push(page);
        }
    }

    /// Page ids in position order, for the engine's round plan.
    pub fn pages(&self) -> &[u32] {
        &self.pages
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut book = self.book.borrow_mut();
        book.reserved -= self.budget - self.pages.len();
        book.free.append(&mut self.pages);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_admission_reserves_and_drop_returns_everything() {
        let pool = PagePool::new(10, 16);
        let mut a = pool.admit(100).unwrap();
        assert!(!pool.can_admit(80), "7 pages are promised to the first lease");
        assert!(pool.can_admit(48));
        a.grow_to(17);
        assert_eq!((a.pages().len(), pool.num_used()), (2, 2));
        let b = pool.admit(48).unwrap();
        assert!(pool.admit(1).is_none());
        drop(a);
        assert_eq!(pool.num_used(), 0);
        assert!(pool.can_admit(112));
        drop(b);
        assert!(pool.can_admit(160));
    }

    #[test]
    fn test_pages_of_live_leases_are_distinct() {
        let pool = PagePool::new(8, 4);
        let mut leases: Vec<Lease> = (0..4).map(|_| pool.admit(8).unwrap()).collect();
        for (i, l) in leases.iter_mut().enumerate() {
            l.grow_to(1 + i * 2);
        }
        let mut all: Vec<u32> = leases.iter().flat_map(|l| l.pages().to_vec()).collect();
        let n = all.len();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), n);
    }

    #[test]
    #[should_panic(expected = "past its reservation")]
    fn test_growing_past_the_reservation_is_a_bug() {
        let pool = PagePool::new(8, 4);
        pool.admit(8).unwrap().grow_to(9);
    }
}

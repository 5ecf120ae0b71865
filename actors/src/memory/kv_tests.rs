//! Page accounting with and without the prefix cache.

use super::*;

/// Free pages plus idle cached ones: what leases do not hold.
fn unheld(pool: &KvPages) -> usize {
    let b = pool.book.borrow();
    b.free.len() + b.cache.num_idle()
}

/// A lease of `prompt` plus `more` positions, its prompt's KV computed and cached.
fn run_prompt(pool: &KvPages, prompt: &[u32], more: usize) -> Lease {
    let mut lease = pool.admit(prompt.len() + more, Some(prompt)).expect("room");
    lease.grow_to(prompt.len());
    lease.cache_prompt(prompt);
    lease
}

/// Every page is free, cached and idle, or held, exactly one of them; the reservations fit in what is not held.
fn check(pool: &KvPages) {
    let b = pool.book.borrow();
    for page in 0..b.total as u32 {
        let free = b.free.contains(&page);
        let idle = b.cache.is_idle(page);
        let held = b.refs[page as usize] > 0;
        assert_eq!(free as u8 + idle as u8 + held as u8, 1, "page {page}: free {free}, idle {idle}, held {held}");
        assert!(!free || !b.cache.contains(page), "page {page} is free and cached");
    }
    assert!(b.free.len() + b.cache.num_idle() >= b.reserved);
}

fn ids(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}

#[test]
fn test_admission_reserves_and_drop_returns_everything() {
    let pool = KvPages::new(10, 16, 0);
    let mut a = pool.admit(100, None).unwrap();
    assert!(pool.admit(80, None).is_none(), "7 pages are promised to the first lease");
    a.grow_to(17);
    assert_eq!((a.pages().len(), pool.num_used()), (2, 2));
    let b = pool.admit(48, None).unwrap();
    assert!(pool.admit(1, None).is_none());
    drop(a);
    assert_eq!(pool.num_used(), 0);
    drop(pool.admit(112, None).expect("7 pages are free again"));
    drop(b);
    drop(pool.admit(160, None).expect("every page is free again"));
}

#[test]
fn test_pages_of_live_leases_are_distinct() {
    let pool = KvPages::new(8, 4, 0);
    let mut leases: Vec<Lease> = (0..4).map(|_| pool.admit(8, None).unwrap()).collect();
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
    let pool = KvPages::new(8, 4, 0);
    pool.admit(8, None).unwrap().grow_to(9);
}

#[test]
fn test_a_prompt_resumes_from_the_cached_full_pages_of_its_longest_cached_prefix() {
    let pool = KvPages::new(16, 4, 64);
    let prompt = ids(0..10);
    let first = run_prompt(&pool, &prompt, 4);
    assert_eq!((first.cached(), pool.num_cached()), (0, 3), "two full pages and the last two ids");
    let cached = first.pages().to_vec();
    drop(first);
    assert_eq!((pool.num_used(), pool.num_cached()), (0, 3));
    // Two full pages shared, then the third taken for the first of its ids: the last is computed again.
    let again = pool.admit(14, Some(&prompt)).unwrap();
    assert_eq!((again.cached(), again.pages()), (9, &cached[..]));
    drop(again);
    let mut diverged = prompt[..8].to_vec();
    diverged.extend([77, 78]);
    assert_eq!(pool.admit(14, Some(&diverged)).unwrap().cached(), 8, "only the full pages match");
    let mut changed = prompt.clone();
    changed[5] = 99;
    assert_eq!(pool.admit(14, Some(&changed)).unwrap().cached(), 4, "the first page still matches");
    changed[0] = 99;
    assert_eq!(pool.admit(14, Some(&changed)).unwrap().cached(), 0);
    assert_eq!(pool.admit(14, None).unwrap().cached(), 0, "a request that skips the cache");
}

#[test]
fn test_a_repeated_prompt_resumes_all_but_its_last_position() {
    for len in [3, 4, 9, 10, 12] {
        let pool = KvPages::new(16, 4, 64);
        let prompt = ids(0..len);
        let first = run_prompt(&pool, &prompt, 4);
        let pages = first.pages().to_vec();
        drop(first);
        for round in 0..3 {
            let again = run_prompt(&pool, &prompt, 4);
            assert_eq!(again.cached(), len as usize - 1, "{len} ids, round {round}");
            let num_shared = (len as usize - 1).div_ceil(4);
            assert_eq!(again.pages()[..num_shared], pages[..num_shared], "{len} ids, round {round}: the same pages");
            drop(again);
            check(&pool);
        }
    }
}

#[test]
fn test_a_cached_partial_page_goes_to_one_lease_at_a_time() {
    let pool = KvPages::new(16, 4, 64);
    let prompt = ids(0..10);
    let first = run_prompt(&pool, &prompt, 4);
    let partial = first.pages()[2];
    let b = pool.admit(14, Some(&prompt)).unwrap();
    assert_eq!(b.cached(), 8, "the lease that computed the page still writes after it");
    drop(first);
    let mut c = pool.admit(14, Some(&prompt)).unwrap();
    assert_eq!((c.cached(), c.pages()[2]), (9, partial));
    let mut d = pool.admit(14, Some(&prompt)).unwrap();
    assert_eq!(d.cached(), 8, "c holds the page");
    c.grow_to(14);
    d.grow_to(14);
    assert_ne!(d.pages()[2], partial);
    check(&pool);
    drop((b, c, d));
    assert_eq!(pool.admit(14, Some(&prompt)).unwrap().cached(), 9);
    check(&pool);
}

#[test]
fn test_a_lease_that_leaves_a_cached_partial_page_early_keeps_only_the_ids_they_share() {
    let pool = KvPages::new(16, 4, 64);
    let x = ids(0..11);
    drop(run_prompt(&pool, &x, 0));
    let mut y = x[..9].to_vec();
    y.extend([99, 98]);
    // y shares the third page's first id, then writes its own two after it.
    let held = pool.admit(11, Some(&y)).unwrap();
    assert_eq!(held.cached(), 9);
    assert_eq!(pool.admit(11, Some(&x)).unwrap().cached(), 8, "y holds the page");
    drop(held);
    assert_eq!(pool.admit(11, Some(&x)).unwrap().cached(), 9, "the page keeps only the id y shared");
    drop(run_prompt(&pool, &y, 0));
    assert_eq!(pool.admit(11, Some(&y)).unwrap().cached(), 10, "y's computed ids are cached");
    assert_eq!(pool.admit(11, Some(&x)).unwrap().cached(), 9);
    check(&pool);
}

#[test]
fn test_a_partial_page_extended_past_its_end_is_cached_as_a_full_page() {
    let pool = KvPages::new(16, 4, 64);
    let long = ids(0..14);
    drop(run_prompt(&pool, &long[..6], 0));
    let lease = run_prompt(&pool, &long, 0);
    assert_eq!(lease.cached(), 6);
    drop(lease);
    assert_eq!(pool.num_cached(), 4, "three full pages and the last two ids");
    assert_eq!(pool.admit(14, Some(&long)).unwrap().cached(), 13);
    assert_eq!(pool.admit(14, Some(&long[..12])).unwrap().cached(), 8, "the full page has a page below it");
    check(&pool);
}

#[test]
fn test_cached_partial_pages_are_taken_back_and_returned_like_full_ones() {
    let pool = KvPages::new(6, 4, 24);
    let prompt = ids(0..10);
    drop(run_prompt(&pool, &prompt, 0));
    // Taken, then dropped before its prompt is computed: the page is idle and cached again.
    drop(pool.admit(10, Some(&prompt)).unwrap());
    assert_eq!((pool.num_used(), pool.num_cached(), unheld(&pool)), (0, 3, 6));
    check(&pool);
    let mut big = pool.admit(24, None).expect("idle cached pages are room");
    big.grow_to(24);
    assert_eq!((pool.num_cached(), pool.num_used()), (0, 6));
    drop(big);
    assert_eq!(pool.admit(10, Some(&prompt)).unwrap().cached(), 0);
    assert_eq!(unheld(&pool), 6);
    check(&pool);
}

#[test]
fn test_pages_shared_by_leases_are_held_once_and_return_to_the_cache() {
    let pool = KvPages::new(16, 4, 64);
    let prompt = ids(0..9);
    drop(run_prompt(&pool, &prompt, 0));
    let mut a = pool.admit(13, Some(&prompt)).unwrap();
    let mut b = pool.admit(13, Some(&prompt)).unwrap();
    a.grow_to(13);
    b.grow_to(13);
    assert_eq!(a.pages()[..2], b.pages()[..2]);
    assert_ne!(a.pages()[2..], b.pages()[2..]);
    assert_eq!(pool.num_used(), 2 + 2 + 2);
    drop(a);
    assert_eq!(pool.num_used(), 2 + 2);
    drop(b);
    assert_eq!((pool.num_used(), pool.num_cached(), unheld(&pool)), (0, 3, 16));
}

#[test]
fn test_admission_takes_back_idle_cached_pages_least_recently_used_first() {
    let pool = KvPages::new(8, 4, 32);
    let (a, b) = (ids(0..9), ids(100..109));
    drop(run_prompt(&pool, &a, 0));
    drop(run_prompt(&pool, &b, 0));
    drop(pool.admit(9, Some(&a)).unwrap());
    assert_eq!(pool.num_cached(), 6);
    // Six pages: the four free ones and the two cached pages of b, used longest ago.
    let mut big = pool.admit(24, None).expect("idle cached pages are room");
    big.grow_to(24);
    assert_eq!(pool.num_cached(), 2);
    assert_eq!(pool.admit(0, Some(&a)).unwrap().cached(), 8);
    assert_eq!(pool.admit(0, Some(&b)).unwrap().cached(), 0);
}

#[test]
fn test_pages_a_lease_holds_are_never_taken_back() {
    let pool = KvPages::new(8, 4, 32);
    let prompt = ids(0..9);
    let held = run_prompt(&pool, &prompt, 0);
    assert!(pool.admit(24, None).is_none(), "five pages are free, three are held");
    drop(pool.admit(20, None).expect("five pages"));
    drop(held);
    drop(pool.admit(32, None).expect("the cached pages are idle now"));
}

#[test]
fn test_taking_back_a_page_takes_back_the_pages_cached_below_it() {
    let pool = KvPages::new(6, 4, 24);
    let prompt = ids(0..13);
    drop(run_prompt(&pool, &prompt, 0));
    assert_eq!(pool.num_cached(), 4);
    // Touch the chain's first page alone, so it is no longer the oldest.
    drop(pool.admit(5, Some(&prompt[..5])).unwrap());
    let mut big = pool.admit(16, None).unwrap();
    big.grow_to(16);
    // The oldest idle page is the chain's second: it goes, and the third with it; the first stays.
    assert_eq!(pool.num_cached(), 1);
    assert_eq!(unheld(&pool), 2);
    drop(big);
    assert_eq!(pool.admit(13, Some(&prompt)).unwrap().cached(), 4);
}

#[test]
fn test_the_cache_holds_at_most_its_budget() {
    let pool = KvPages::new(16, 4, 8);
    for base in [0, 100, 200] {
        drop(run_prompt(&pool, &ids(base..base + 9), 0));
        assert!(pool.num_cached() <= 2);
    }
    assert_eq!(pool.admit(9, Some(&ids(200..209))).unwrap().cached(), 8, "the newest prompt stayed");
    let pool = KvPages::new(16, 4, 0);
    drop(run_prompt(&pool, &ids(0..9), 0));
    assert_eq!(pool.num_cached(), 0, "no budget, no cache");
}

#[test]
fn test_clearing_the_cache_frees_idle_pages_and_leaves_held_ones_to_their_leases() {
    let pool = KvPages::new(8, 4, 32);
    drop(run_prompt(&pool, &ids(0..9), 0));
    let held = run_prompt(&pool, &ids(100..109), 0);
    pool.clear_cache();
    assert_eq!((pool.num_cached(), pool.num_used(), unheld(&pool)), (0, 3, 5));
    drop(held);
    assert_eq!(unheld(&pool), 8);
    assert_eq!(pool.admit(9, Some(&ids(0..9))).unwrap().cached(), 0);
}

#[test]
fn test_a_storm_of_leases_sharing_prefixes_leaves_every_page_accounted() {
    let pool = KvPages::new(64, 4, 128);
    let mut seed = 7u64;
    let mut next = |n: u64| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    let mut live: Vec<Lease> = Vec::new();
    for _ in 0..2000 {
        check(&pool);
        if next(3) == 0 && !live.is_empty() {
            let i = next(live.len() as u64) as usize;
            live.swap_remove(i);
            continue;
        }
        // Prompts share one of three system prefixes, then a tail of their own.
        let mut prompt: Vec<u32> = (0..4 * next(4) as u32 + 1).map(|i| 1000 * next(3) as u32 + i).collect();
        prompt.extend((0..next(9) as u32).map(|i| 50_000 + i + 10 * next(5) as u32));
        let Some(mut lease) = pool.admit(prompt.len() + next(6) as usize, Some(&prompt)) else { continue };
        let upto = lease.cached() + next((prompt.len() - lease.cached()) as u64 + 1) as usize;
        lease.grow_to(upto);
        if upto == prompt.len() {
            lease.cache_prompt(&prompt);
        }
        live.push(lease);
        let mut held: Vec<u32> = live.iter().flat_map(|l| l.pages()[l.cached() / 4..].to_vec()).collect();
        let n = held.len();
        held.sort();
        held.dedup();
        assert_eq!(held.len(), n, "a page two leases took for their own positions");
    }
    drop(live);
    assert_eq!((pool.num_used(), unheld(&pool)), (0, 64));
    assert_eq!(pool.book.borrow().reserved, 0);
    assert!(pool.book.borrow().refs.iter().all(|&r| r == 0));
}

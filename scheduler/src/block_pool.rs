//! The KV block pool: which physical KV-cache blocks are free.
//!
//! Guarantees:
//! - Block 0 is the null block: reserved, never handed out, never freed (the runner may point
//!   padding at it).
//! - [`BlockPool::allocate`] and [`BlockPool::free`] are O(1) per block: the free list is a
//!   singly linked list threaded through one `Vec<u32>` (`next[b]` is the free block after `b`),
//!   so no allocation happens after construction.
//! - Freeing a block that is not allocated (double free, null block, out of range) is a bug in
//!   the caller and panics: silently accepting it would hand the same block to two sequences.
//!
//! Prefix caching will extend this pool, not replace it: a full block gets a content hash of its
//! tokens and a reference count; a freed block with a hash goes to the tail of the free list
//! instead of being forgotten, so a later request with the same prefix can take it back from the
//! middle of the list (that needs a `prev` link as well, which is why the list lives in index
//! vectors rather than a `Vec` used as a stack). Today every block has one owner.

/// Marks the end of the free list and an allocated block's link.
const NIL: u32 = u32::MAX;

/// A pool of `num_blocks` KV blocks, block 0 reserved.
#[derive(Debug, Clone)]
pub struct BlockPool {
    /// `next[b]`: the free block after `b` when `b` is free; `NIL` when `b` is the last free
    /// block; [`ALLOCATED`] when `b` is handed out.
    next: Vec<u32>,
    /// First free block, or `NIL`.
    head: u32,
    /// Number of free blocks.
    num_free: usize,
}

/// `next[b]` of a block that is handed out (the null block is permanently "handed out").
const ALLOCATED: u32 = u32::MAX - 1;

impl BlockPool {
    /// A pool of `num_blocks` blocks including the null block; all but block 0 start free.
    ///
    /// # Panics
    /// If `num_blocks` is 0 or does not fit the `u32` block ids the plan uses.
    pub fn new(num_blocks: usize) -> Self {
        assert!(num_blocks >= 1, "a block pool holds at least the null block");
        assert!(num_blocks < ALLOCATED as usize, "block ids are u32");
        let mut next: Vec<u32> = (1..=num_blocks as u32).collect();
        next[0] = ALLOCATED;
        if num_blocks > 1 {
            next[num_blocks - 1] = NIL;
        }
        let head = if num_blocks > 1 { 1 } else { NIL };
        Self { next, head, num_free: num_blocks - 1 }
    }

    /// Total blocks including the null block.
    pub fn num_blocks(&self) -> usize {
        self.next.len()
    }

    /// Blocks that can ever be handed out (all but the null block).
    pub fn capacity(&self) -> usize {
        self.next.len() - 1
    }

    /// Blocks free now.
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Blocks handed out now.
    pub fn num_used(&self) -> usize {
        self.capacity() - self.num_free
    }

    /// Take one free block, or `None` when the pool is empty.
    pub fn allocate(&mut self) -> Option<u32> {
        if self.head == NIL {
            return None;
        }
        let b = self.head;
        self.head = self.next[b as usize];
        self.next[b as usize] = ALLOCATED;
        self.num_free -= 1;
        Some(b)
    }

    /// Append `n` blocks to `out`, all or nothing; false (and `out` unchanged) when fewer than
    /// `n` are free.
    pub fn allocate_n(&mut self, n: usize, out: &mut Vec<u32>) -> bool {
        if n > self.num_free {
            return false;
        }
        for _ in 0..n {
            out.push(self.allocate().expect("counted free blocks"));
        }
        true
    }

    /// Return a block to the pool.
    ///
    /// # Panics
    /// On the null block, an out-of-range id, or a block that is already free.
    pub fn free(&mut self, b: u32) {
        assert!(b != 0, "the null block is never freed");
        let link = self.next.get(b as usize).copied();
        assert_eq!(link, Some(ALLOCATED), "block {b} freed but not allocated");
        self.next[b as usize] = self.head;
        self.head = b;
        self.num_free += 1;
    }

    /// Return every block of `blocks` and clear it.
    pub fn free_all(&mut self, blocks: &mut Vec<u32>) {
        for b in blocks.drain(..) {
            self.free(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::HashSet;

    #[test]
    fn null_block_is_reserved() {
        let mut pool = BlockPool::new(4);
        assert_eq!(pool.capacity(), 3);
        let got: Vec<u32> = std::iter::from_fn(|| pool.allocate()).collect();
        assert_eq!(got.len(), 3);
        assert!(!got.contains(&0));
        assert_eq!(pool.allocate(), None);
        assert_eq!(BlockPool::new(1).num_free(), 0);
    }

    #[test]
    fn allocate_n_is_all_or_nothing() {
        let mut pool = BlockPool::new(5);
        let mut out = vec![];
        assert!(!pool.allocate_n(5, &mut out));
        assert!(out.is_empty() && pool.num_free() == 4);
        assert!(pool.allocate_n(4, &mut out));
        assert_eq!(pool.num_used(), 4);
        pool.free_all(&mut out);
        assert_eq!(pool.num_free(), 4);
    }

    #[test]
    #[should_panic(expected = "not allocated")]
    fn double_free_panics() {
        let mut pool = BlockPool::new(3);
        let b = pool.allocate().unwrap();
        pool.free(b);
        pool.free(b);
    }

    #[test]
    #[should_panic(expected = "null block")]
    fn freeing_null_block_panics() {
        BlockPool::new(3).free(0);
    }

    /// Property: over many seeded rounds of random allocate/free, no block is handed out twice,
    /// the null block is never handed out, counts stay consistent, and freeing everything
    /// returns the pool to full.
    #[test]
    fn random_allocate_free_rounds() {
        for seed in 0..200u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let n = rng.random_range(1..64usize);
            let mut pool = BlockPool::new(n);
            let mut held: Vec<u32> = vec![];
            let mut live: HashSet<u32> = HashSet::new();
            for _ in 0..500 {
                if rng.random_bool(0.55) {
                    match pool.allocate() {
                        Some(b) => {
                            assert_ne!(b, 0, "seed {seed}: null block handed out");
                            assert!((b as usize) < n);
                            assert!(live.insert(b), "seed {seed}: block {b} handed out twice");
                            held.push(b);
                        }
                        None => assert_eq!(live.len(), n - 1, "seed {seed}: pool empty too early"),
                    }
                } else if !held.is_empty() {
                    let b = held.swap_remove(rng.random_range(0..held.len()));
                    live.remove(&b);
                    pool.free(b);
                }
                assert_eq!(pool.num_used(), live.len());
            }
            pool.free_all(&mut held);
            assert_eq!(pool.num_free(), n - 1, "seed {seed}: blocks lost");
            let again: HashSet<u32> = std::iter::from_fn(|| pool.allocate()).collect();
            assert_eq!(again.len(), n - 1);
        }
    }
}

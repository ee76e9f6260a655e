//! The KV block pool: which physical KV-cache blocks are free, which are shared, and which
//! still hold a prefix another request can reuse (prefix caching, in the spirit of vLLM v1).
//!
//! Guarantees:
//! - Block 0 is the null block: reserved, never handed out, never freed (the runner may point
//!   padding at it).
//! - Every handed-out block has a reference count: one per request whose block table holds it.
//!   [`BlockPool::free`] drops one reference; freeing a block nobody holds (double free, null
//!   block, out of range) is a bug in the caller and panics: silently accepting it would hand
//!   the same block to two sequences.
//! - A block nobody holds is *free*: it sits on the free list, a doubly linked list threaded
//!   through two `Vec<u32>` (O(1) to take from the front, to append, and to unlink from the
//!   middle when a request reuses it). Allocation takes the front.
//! - A full block whose KV has been computed may be *registered* under the hash of its tokens
//!   chained with its parent's ([`BlockPool::register`]). When its last holder frees it, a
//!   registered block goes to the back of the free list, keeping its contents; an unregistered
//!   one goes to the front. A request's blocks are freed last block first, so among a freed
//!   chain the leaves come before their parents: the front is evicted first, least recently
//!   used first, leaves before parents. Allocating a registered block evicts it (its hash is
//!   forgotten).
//! - [`BlockPool::lookup`] finds the longest chain of registered blocks matching a prompt. A
//!   hash only proposes a candidate: the candidate's tokens, its salt and its parent (the block
//!   and that block's generation, which changes whenever the block is evicted and reused) are
//!   compared exactly, so a hash collision can cost a miss, never a wrong hit.
//! - When asked to ([`BlockPool::record_events`]), it logs every change to the prefix cache as
//!   a [`KvEvent`] (vLLM's KV events: a router rebuilds which prefixes each replica holds from
//!   them), consecutive blocks of one chain stored or removed together folded into one event.

use std::collections::HashMap;

/// Marks the end of the free list and an unset link.
const NIL: u32 = u32::MAX;

/// A change to the prefix cache, in the terms of vLLM's KV events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Blocks registered, each a child of the one before; `parent` is the hash of the first
    /// one's parent (`None`: the first holds the prompt's start), `tokens` theirs in order.
    Stored { hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32> },
    /// Registered blocks evicted (their contents are gone).
    Removed { hashes: Vec<u64> },
    /// Every cached prefix forgotten.
    Cleared,
}

/// A pool of `num_blocks` KV blocks of `block_size` tokens, block 0 reserved.
#[derive(Debug, Clone)]
pub struct BlockPool {
    /// `next[b]` / `prev[b]`: free-list neighbours of a free block (`NIL` at the ends).
    next: Vec<u32>,
    prev: Vec<u32>,
    /// Front (evicted first) and back of the free list, or `NIL`.
    head: u32,
    tail: u32,
    /// Number of free blocks (registered or not).
    num_free: usize,
    /// Holders of each block; 0 for a free block. The null block is pinned at `u32::MAX`.
    refs: Vec<u32>,
    block_size: usize,
    /// The prefix cache: registered blocks by hash.
    cached: HashMap<u64, u32>,
    /// Per block, while registered: its hash, parent block (`NIL` for a first block) and the
    /// parent's generation then, salt, and tokens (`block_size` per block).
    hash: Vec<Option<u64>>,
    parent: Vec<u32>,
    parent_gen: Vec<u32>,
    /// Per block: bumped each time its cached contents are evicted.
    generation: Vec<u32>,
    salt: Vec<u64>,
    tokens: Vec<u32>,
    /// The prefix cache's changes since they were last taken, while recorded.
    events: Option<Vec<KvEvent>>,
}

/// One link of a prompt's prefix chain: the hash [`BlockPool::lookup`] and
/// [`BlockPool::register`] agree on.
pub fn chain_hash(parent: u64, salt: u64, tokens: &[u32]) -> u64 {
    // FxHash-style mixing: the hash only proposes candidates, which are verified exactly.
    let mut h = (parent ^ salt.rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x243f_6a88_85a3_08d3;
    for &t in tokens {
        h = (h.rotate_left(5) ^ u64::from(t)).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
    h ^ (h >> 29)
}

/// The parent hash of a prompt's first block.
pub const ROOT_HASH: u64 = 0x6a09_e667_f3bc_c908;

impl BlockPool {
    /// A pool of `num_blocks` blocks of `block_size` tokens including the null block; all but
    /// block 0 start free.
    ///
    /// # Panics
    /// If `num_blocks` is 0, does not fit the `u32` block ids the plan uses, or `block_size` is 0.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        assert!(num_blocks >= 1, "a block pool holds at least the null block");
        assert!(num_blocks < NIL as usize - 1, "block ids are u32");
        assert!(block_size >= 1, "blocks hold at least one token");
        let mut pool = Self {
            next: vec![NIL; num_blocks],
            prev: vec![NIL; num_blocks],
            head: NIL,
            tail: NIL,
            num_free: 0,
            refs: vec![1; num_blocks],
            block_size,
            cached: HashMap::new(),
            hash: vec![None; num_blocks],
            parent: vec![NIL; num_blocks],
            parent_gen: vec![0; num_blocks],
            generation: vec![0; num_blocks],
            salt: vec![0; num_blocks],
            tokens: Vec::new(),
            events: None,
        };
        pool.refs[0] = u32::MAX;
        for b in 1..num_blocks as u32 {
            pool.refs[b as usize] = 0;
            pool.push_back(b);
        }
        pool
    }

    /// Total blocks including the null block.
    pub fn num_blocks(&self) -> usize {
        self.refs.len()
    }

    /// Blocks that can ever be handed out (all but the null block).
    pub fn capacity(&self) -> usize {
        self.refs.len() - 1
    }

    /// Blocks free now (those holding a cached prefix included: they are evicted on demand).
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Blocks held by at least one request now.
    pub fn num_used(&self) -> usize {
        self.capacity() - self.num_free
    }

    /// Registered blocks (held or free) whose prefix a new request can reuse.
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// Log the prefix cache's changes from now on ([`BlockPool::take_events`]).
    pub fn record_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    /// Move the changes logged since the last call to the end of `out`.
    pub fn take_events(&mut self, out: &mut Vec<KvEvent>) {
        if let Some(ev) = &mut self.events {
            out.append(ev);
        }
    }

    /// Holders of block `b` (0: free).
    pub fn refs(&self, b: u32) -> u32 {
        self.refs[b as usize]
    }

    /// Take one free block (evicting the cached prefix it held, if any), or `None` when the pool
    /// is empty.
    pub fn allocate(&mut self) -> Option<u32> {
        let b = self.head;
        if b == NIL {
            return None;
        }
        self.unlink(b);
        self.evict(b);
        self.refs[b as usize] = 1;
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

    /// Drop one reference to `b`; the last one returns it to the free list (at the back when it
    /// holds a registered prefix, so it is evicted last; at the front otherwise).
    ///
    /// # Panics
    /// On the null block, an out-of-range id, or a block nobody holds.
    pub fn free(&mut self, b: u32) {
        assert!(b != 0, "the null block is never freed");
        let refs = self.refs.get(b as usize).copied();
        assert!(refs.is_some_and(|r| r > 0), "block {b} freed but not allocated");
        self.refs[b as usize] -= 1;
        if self.refs[b as usize] == 0 {
            if self.hash[b as usize].is_some() {
                self.push_back(b);
            } else {
                self.push_front(b);
            }
        }
    }

    /// Free every block of `blocks`, last first (a chain's leaves are evicted before its
    /// parents), and clear it.
    pub fn free_all(&mut self, blocks: &mut Vec<u32>) {
        while let Some(b) = blocks.pop() {
            self.free(b);
        }
    }

    /// The longest chain of registered blocks holding `tokens` from position 0, at most
    /// `max_blocks` long, for requests salted with `salt`. Takes no reference
    /// ([`BlockPool::acquire`] does).
    pub fn lookup(&self, tokens: &[u32], salt: u64, max_blocks: usize) -> Vec<u32> {
        let bs = self.block_size;
        let mut out = Vec::new();
        let mut h = ROOT_HASH;
        for chunk in tokens.chunks_exact(bs).take(max_blocks) {
            h = chain_hash(h, salt, chunk);
            let Some(&b) = self.cached.get(&h) else { break };
            let parent = out.last().copied().unwrap_or(NIL);
            let i = b as usize;
            let parent_ok = self.parent[i] == parent && (parent == NIL || self.parent_gen[i] == self.generation[parent as usize]);
            if !parent_ok || self.salt[i] != salt || &self.tokens[i * bs..(i + 1) * bs] != chunk {
                break; // a hash collision: never a wrong hit
            }
            out.push(b);
        }
        out
    }

    /// Take a reference to each block of `blocks` (from [`BlockPool::lookup`]), unlinking the
    /// free ones from the free list.
    pub fn acquire(&mut self, blocks: &[u32]) {
        for &b in blocks {
            assert!(b != 0 && self.hash[b as usize].is_some(), "block {b} is not a cached prefix");
            if self.refs[b as usize] == 0 {
                self.unlink(b);
            }
            self.refs[b as usize] += 1;
        }
    }

    /// Registers held block `b`, whose KV now holds `tokens` (one full block) after the chain
    /// whose last registered block is `parent` (`None`: the prompt's first block), under hash
    /// `h` ([`chain_hash`] of the parent's hash). Returns the block the cache now holds for this
    /// prefix: `b`, or another block already holding exactly the same prefix (then `b` stays
    /// unregistered; children register under that one). `None` when a different prefix holds
    /// the hash (a collision): the chain is not cached past this point.
    pub fn register(&mut self, b: u32, parent: Option<u32>, salt: u64, tokens: &[u32], h: u64) -> Option<u32> {
        let i = b as usize;
        assert!(b != 0 && self.refs[i] > 0, "only a held block can be registered");
        assert_eq!(tokens.len(), self.block_size, "only full blocks are cached");
        let bs = self.block_size;
        let parent = parent.unwrap_or(NIL);
        let parent_gen = if parent == NIL { 0 } else { self.generation[parent as usize] };
        if let Some(&x) = self.cached.get(&h) {
            let j = x as usize;
            let same = self.parent[j] == parent && self.parent_gen[j] == parent_gen && self.salt[j] == salt && self.tokens[j * bs..(j + 1) * bs] == *tokens;
            return same.then_some(x);
        }
        if self.hash[i].is_some() {
            return None; // registered already under another chain: not this one
        }
        if self.tokens.is_empty() {
            self.tokens = vec![0; self.refs.len() * bs];
        }
        self.tokens[i * bs..(i + 1) * bs].copy_from_slice(tokens);
        self.parent[i] = parent;
        self.parent_gen[i] = parent_gen;
        self.salt[i] = salt;
        self.hash[i] = Some(h);
        self.cached.insert(h, b);
        if let Some(ev) = &mut self.events {
            let parent_hash = (parent != NIL).then(|| self.hash[parent as usize]).flatten();
            match ev.last_mut() {
                Some(KvEvent::Stored { hashes, tokens: t, .. }) if parent_hash.is_some() && hashes.last() == parent_hash.as_ref() => {
                    hashes.push(h);
                    t.extend_from_slice(tokens);
                }
                _ => ev.push(KvEvent::Stored { hashes: vec![h], parent: parent_hash, tokens: tokens.to_vec() }),
            }
        }
        Some(b)
    }

    /// Forgets every cached prefix (blocks held stay held).
    pub fn reset_cache(&mut self) {
        for b in self.cached.drain().map(|(_, b)| b) {
            self.hash[b as usize] = None;
            self.generation[b as usize] = self.generation[b as usize].wrapping_add(1);
        }
        if let Some(ev) = &mut self.events {
            ev.push(KvEvent::Cleared);
        }
    }

    fn evict(&mut self, b: u32) {
        if let Some(h) = self.hash[b as usize].take() {
            if self.cached.get(&h) == Some(&b) {
                self.cached.remove(&h);
            }
            self.parent[b as usize] = NIL;
            // Children registered over this block's old contents no longer match it.
            self.generation[b as usize] = self.generation[b as usize].wrapping_add(1);
            if let Some(ev) = &mut self.events {
                match ev.last_mut() {
                    Some(KvEvent::Removed { hashes }) => hashes.push(h),
                    _ => ev.push(KvEvent::Removed { hashes: vec![h] }),
                }
            }
        }
    }

    fn unlink(&mut self, b: u32) {
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[b as usize] = NIL;
        self.next[b as usize] = NIL;
        self.num_free -= 1;
    }

    fn push_back(&mut self, b: u32) {
        self.prev[b as usize] = self.tail;
        self.next[b as usize] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail as usize] = b;
        }
        self.tail = b;
        self.num_free += 1;
    }

    fn push_front(&mut self, b: u32) {
        self.next[b as usize] = self.head;
        self.prev[b as usize] = NIL;
        if self.head == NIL {
            self.tail = b;
        } else {
            self.prev[self.head as usize] = b;
        }
        self.head = b;
        self.num_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::HashSet;

    #[test]
    fn null_block_is_reserved() {
        let mut pool = BlockPool::new(4, 16);
        assert_eq!(pool.capacity(), 3);
        let got: Vec<u32> = std::iter::from_fn(|| pool.allocate()).collect();
        assert_eq!(got.len(), 3);
        assert!(!got.contains(&0));
        assert_eq!(pool.allocate(), None);
        assert_eq!(BlockPool::new(1, 16).num_free(), 0);
    }

    #[test]
    fn allocate_n_is_all_or_nothing() {
        let mut pool = BlockPool::new(5, 16);
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
        let mut pool = BlockPool::new(3, 16);
        let b = pool.allocate().unwrap();
        pool.free(b);
        pool.free(b);
    }

    #[test]
    #[should_panic(expected = "not allocated")]
    fn a_shared_block_freed_once_too_often_panics() {
        let mut pool = BlockPool::new(3, 2);
        let b = pool.allocate().unwrap();
        assert_eq!(pool.register(b, None, 0, &[1, 2], chain_hash(ROOT_HASH, 0, &[1, 2])), Some(b));
        pool.acquire(&[b]);
        pool.free(b);
        pool.free(b);
        pool.free(b);
    }

    #[test]
    #[should_panic(expected = "null block")]
    fn freeing_null_block_panics() {
        BlockPool::new(3, 16).free(0);
    }

    /// Registers `tokens`' full blocks as one request would: a held block per block, chained.
    fn fill(pool: &mut BlockPool, tokens: &[u32], salt: u64) -> Vec<u32> {
        let bs = pool.block_size;
        let mut blocks = vec![];
        let mut h = ROOT_HASH;
        for chunk in tokens.chunks_exact(bs) {
            let b = pool.allocate().unwrap();
            h = chain_hash(h, salt, chunk);
            assert_eq!(pool.register(b, blocks.last().copied(), salt, chunk, h), Some(b));
            blocks.push(b);
        }
        blocks
    }

    #[test]
    fn a_prefix_is_found_shared_and_kept_after_its_owner_leaves() {
        let mut pool = BlockPool::new(16, 4);
        let prompt: Vec<u32> = (0..12).collect();
        let mut a = fill(&mut pool, &prompt, 0);
        assert_eq!(pool.lookup(&prompt, 0, 3), a);
        assert_eq!(pool.lookup(&prompt, 0, 2), a[..2], "at most max_blocks");
        let mut other = prompt.clone();
        other[5] = 99; // differs in the second block
        assert_eq!(pool.lookup(&other, 0, 3), a[..1]);
        assert!(pool.lookup(&prompt, 7, 3).is_empty(), "another salt shares nothing");
        assert!(pool.lookup(&prompt[..3], 0, 3).is_empty(), "partial blocks are never cached");
        // A second request shares the chain: two holders each.
        let mut b = pool.lookup(&prompt, 0, 3);
        pool.acquire(&b);
        assert!(a.iter().all(|&x| pool.refs(x) == 2));
        assert_eq!(pool.num_used(), 3);
        pool.free_all(&mut a);
        assert_eq!(pool.num_used(), 3, "still held by the second request");
        pool.free_all(&mut b);
        assert_eq!((pool.num_used(), pool.num_free(), pool.num_cached()), (0, 15, 3));
        // Free but cached: a third request still finds it.
        assert_eq!(pool.lookup(&prompt, 0, 3).len(), 3);
    }

    #[test]
    fn eviction_takes_plain_blocks_first_then_leaves_before_parents() {
        let mut pool = BlockPool::new(6, 2); // 5 usable
        let mut chain = fill(&mut pool, &[1, 2, 3, 4, 5, 6], 0); // 3 blocks
        let leaf = *chain.last().unwrap();
        pool.free_all(&mut chain);
        // Two plain blocks are free at the front: taken first, the cache untouched.
        let x = pool.allocate().unwrap();
        let y = pool.allocate().unwrap();
        assert_eq!(pool.num_cached(), 3);
        // The next allocation evicts the leaf, not the root.
        assert_eq!(pool.allocate(), Some(leaf));
        assert_eq!(pool.num_cached(), 2);
        assert_eq!(pool.lookup(&[1, 2, 3, 4, 5, 6], 0, 3).len(), 2);
        pool.free(x);
        pool.free(y);
    }

    #[test]
    fn a_hash_collision_never_gives_a_wrong_hit() {
        let mut pool = BlockPool::new(8, 2);
        let b = pool.allocate().unwrap();
        // Register [1, 2] under the hash [3, 4] would have: a forged collision.
        let forged = chain_hash(ROOT_HASH, 0, &[3, 4]);
        assert_eq!(pool.register(b, None, 0, &[1, 2], forged), Some(b));
        assert!(pool.lookup(&[3, 4], 0, 1).is_empty(), "the tokens are compared, not only the hash");
        // A child whose parent was evicted and refilled is not reached through the new parent,
        // even when the new parent's chain proposes the child's hash.
        let owner = fill(&mut pool, &[5, 6, 7, 8], 0);
        let (root, child) = (owner[0], owner[1]);
        pool.free(root); // the root goes back first, so it is evicted before the child
        let mut plain = vec![];
        while let Some(x) = pool.allocate() {
            plain.push(x);
        }
        assert!(plain.contains(&root), "the root was evicted and reused");
        assert_eq!(pool.refs(child), 1);
        // Refill the reused block under the hash the old root had (as a new request with the same
        // first block would). The child was computed over the old contents: it is not trusted,
        // whatever the new contents are.
        let old_root_hash = chain_hash(ROOT_HASH, 0, &[5, 6]);
        assert_eq!(pool.register(root, None, 0, &[5, 6], old_root_hash), Some(root));
        assert_eq!(pool.lookup(&[5, 6, 7, 8], 0, 2), vec![root], "no hit past a parent of another generation");
        pool.free(child);
        pool.free_all(&mut plain);
    }

    /// Property: a subscriber that applies the logged events holds exactly the pool's cached
    /// hashes after every round, and can recompute each stored hash from its parent's and the
    /// tokens the event carries (as a router that keeps its own keys does).
    #[test]
    fn events_rebuild_the_cached_set() {
        for seed in 0..100u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let mut pool = BlockPool::new(rng.random_range(2..24usize), 2);
            pool.record_events();
            let (mut owners, mut seen, mut events): (Vec<Vec<u32>>, HashSet<u64>, Vec<KvEvent>) = (vec![], HashSet::new(), vec![]);
            for round in 0..300 {
                if rng.random_range(0..3) == 0 && !owners.is_empty() {
                    let mut o = owners.swap_remove(rng.random_range(0..owners.len()));
                    pool.free_all(&mut o);
                } else if round % 97 == 96 {
                    pool.reset_cache();
                } else {
                    let p = rng.random_range(0..5u32);
                    let prompt: Vec<u32> = (0..8).map(|i| p * 10 + i).collect();
                    let mut blocks = pool.lookup(&prompt, 0, 4);
                    pool.acquire(&blocks);
                    let (mut h, mut parent) = (ROOT_HASH, blocks.last().copied());
                    for (i, chunk) in prompt.chunks_exact(2).enumerate() {
                        h = chain_hash(h, 0, chunk);
                        if i < blocks.len() {
                            continue;
                        }
                        let Some(b) = pool.allocate() else { break };
                        blocks.push(b);
                        match pool.register(b, parent, 0, chunk, h) {
                            Some(x) => parent = Some(x),
                            None => break,
                        }
                    }
                    owners.push(blocks);
                }
                pool.take_events(&mut events);
                for e in events.drain(..) {
                    match e {
                        KvEvent::Stored { hashes, parent, tokens } => {
                            assert_eq!(tokens.len(), 2 * hashes.len(), "seed {seed}");
                            let mut h = parent.unwrap_or(ROOT_HASH);
                            assert!(parent.is_none_or(|p| seen.contains(&p)), "seed {seed}: a stored block's parent is held");
                            for (x, chunk) in hashes.iter().zip(tokens.chunks_exact(2)) {
                                h = chain_hash(h, 0, chunk);
                                assert_eq!(h, *x, "seed {seed}: the key follows from the tokens");
                                assert!(seen.insert(*x), "seed {seed}: stored twice");
                            }
                        }
                        KvEvent::Removed { hashes } => {
                            for x in hashes {
                                assert!(seen.remove(&x), "seed {seed}: removed but not stored");
                            }
                        }
                        KvEvent::Cleared => seen.clear(),
                    }
                }
                let cached: HashSet<u64> = pool.cached.keys().copied().collect();
                assert_eq!(seen, cached, "seed {seed} round {round}");
            }
        }
    }

    /// Property: over many seeded rounds of random allocate / share / free, no block is ever
    /// held by two owners unless shared through the cache, counts stay consistent, and freeing
    /// everything returns the pool to full with no block lost.
    #[test]
    fn random_rounds_keep_references_and_counts_consistent() {
        for seed in 0..200u64 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let n = rng.random_range(2..48usize);
            let mut pool = BlockPool::new(n, 2);
            let mut owners: Vec<Vec<u32>> = vec![];
            for _ in 0..400 {
                match rng.random_range(0..3) {
                    0 => {
                        // A request over one of a few prompts: reuse what is cached, fill the rest.
                        let p = rng.random_range(0..4u32);
                        let prompt: Vec<u32> = (0..6).map(|i| p * 10 + i).collect();
                        let mut blocks = pool.lookup(&prompt, 0, 3);
                        pool.acquire(&blocks);
                        let mut h = ROOT_HASH;
                        for (i, chunk) in prompt.chunks_exact(2).enumerate() {
                            h = chain_hash(h, 0, chunk);
                            if i < blocks.len() {
                                continue;
                            }
                            let Some(b) = pool.allocate() else { break };
                            let parent = blocks.last().copied();
                            blocks.push(b);
                            // Identical content held elsewhere (freed and not yet found): fine.
                            if pool.register(b, parent, 0, chunk, h).is_none() {
                                break;
                            }
                        }
                        owners.push(blocks);
                    }
                    1 if !owners.is_empty() => {
                        let mut o = owners.swap_remove(rng.random_range(0..owners.len()));
                        pool.free_all(&mut o);
                    }
                    _ => {
                        if let Some(b) = pool.allocate() {
                            owners.push(vec![b]);
                        }
                    }
                }
                let mut count = std::collections::HashMap::new();
                for o in &owners {
                    for &b in o {
                        assert_ne!(b, 0, "seed {seed}: null block handed out");
                        *count.entry(b).or_insert(0u32) += 1;
                    }
                }
                for (&b, &c) in &count {
                    assert_eq!(pool.refs(b), c, "seed {seed}: block {b} references");
                }
                assert_eq!(pool.num_used(), count.len(), "seed {seed}");
            }
            for mut o in owners.drain(..) {
                pool.free_all(&mut o);
            }
            assert_eq!(pool.num_free(), n - 1, "seed {seed}: blocks lost");
            let again: HashSet<u32> = std::iter::from_fn(|| pool.allocate()).collect();
            assert_eq!(again.len(), n - 1);
            assert_eq!(pool.num_cached(), 0, "allocating every block evicts every prefix");
        }
    }
}

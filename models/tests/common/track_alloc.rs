//! A global allocator that records the largest allocation a thread makes while [`tracked`]
//! runs there, for the fuzz tests' allocation bound (`models/tests/fuzz.rs`, and
//! `server/tests/fuzz.rs` through `#[path]`). Include it with `mod track_alloc;` and it installs
//! itself as the test binary's allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Records the largest allocation made on a thread while [`tracked`] runs there (model loading
/// and other tests' threads are not counted).
pub struct Tracking;

thread_local! {
    static TRACKING: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    let _ = TRACKING.try_with(|on| {
        if on.get() {
            let _ = LARGEST.try_with(|m| m.set(m.get().max(size)));
        }
    });
}

// SAFETY: forwards to the system allocator; only records sizes in const-initialized
// thread-locals (which never allocate).
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note(l.size());
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        note(new);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

/// Runs `f` with this thread's allocations tracked; returns its result and the largest one.
pub fn tracked<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|m| m.set(0));
    TRACKING.with(|on| on.set(true));
    let out = f();
    TRACKING.with(|on| on.set(false));
    (out, LARGEST.with(|m| m.get()))
}

//! What the CUDA backend reports, defined where the CPU build has it too: whether a stream can
//! order every host thread's work, and a captured graph's nodes by kind ([`crate::device`]
//! re-exports both; the backend, `cuda.rs`, fills them in).

/// Why a raw CUDA stream handle cannot carry every host thread's work in issue order, if it
/// cannot: the legacy default stream (0) synchronises with everything, and the per-thread default
/// stream (2) is a different stream on each thread, so nothing orders their work.
pub fn shared_stream_problem(raw: usize) -> Option<&'static str> {
    match raw {
        0 => Some("the CUDA device runs on the legacy default stream"),
        2 => Some("the CUDA device runs on per-thread default streams (one per host thread, unordered)"),
        _ => None,
    }
}

/// Nodes of a captured CUDA graph by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphCounts {
    pub kernels: usize,
    pub copies: usize,
    pub memsets: usize,
    pub allocs: usize,
    pub frees: usize,
    pub other: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_explicit_stream_is_shared_in_order_by_every_thread() {
        assert!(shared_stream_problem(0).is_some_and(|w| w.contains("legacy")));
        assert!(shared_stream_problem(2).is_some_and(|w| w.contains("per-thread")));
        assert_eq!(shared_stream_problem(0x5555_0000_1230), None);
    }
}

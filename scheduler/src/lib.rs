//! pace-scheduler: what runs in each step, and how well users were served.
//!
//! Pure Rust: no tokio, no candle, no HTTP and no clock reads. Time is a value passed in, so the
//! same code runs in the server (real clock), in the simulator (virtual clock) and in tests.
//!
//! Layout:
//! - [`plan`]: the step plan and step output exchanged with the model runner.

pub mod plan;

pub use plan::{BatchPlan, RequestId, SampledToken, SeqSlice, StepOutput};

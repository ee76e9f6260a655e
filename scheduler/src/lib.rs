//! pace-scheduler: what runs in each step, and how well users were served.
//!
//! Pure Rust: no tokio, no candle, no HTTP and no clock reads. Time is a value passed in, so the
//! same code runs in the server (real clock), in the simulator (virtual clock) and in tests.
//!
//! Layout:
//! - [`plan`]: the step plan and step output exchanged with the model runner.
//! - [`request`]: what enters (a [`NewRequest`]) and leaves ([`Event`], [`Rejection`]).
//! - [`scheduler`]: the shared mechanism, [`Scheduler`]: request states, budgets, block
//!   allocation, preemption, bookkeeping. The engine calls `add`, `schedule`, `update`, `abort`.
//! - [`block_pool`]: the KV block pool, block 0 reserved, O(1) allocate and free.
//! - [`policy`]: the [`Policy`] seam and the three policies `fcfs`, `drop-late`, `smooth`
//!   (whose four rules can each be switched off for an ablation: `smooth:door=0`, ...).
//! - [`cost`]: [`StepCostModel`], a step's duration from its [`StepShape`], refit online.
//! - [`lengths`]: [`LengthModel`], output lengths learned from finished requests (censored
//!   Kaplan-Meier per `max_tokens` bucket), so no policy takes `max_tokens` for the length.
//! - [`patience`]: [`PatienceModel`], how long clients wait before they leave (censored
//!   Kaplan-Meier over the idle latencies at which they left or were served).
//! - [`slo`]: metrics.md, once: TTFT/ITL/TPOT/E2E, binary SLOs, idle latency, benefit, windows.
//! - [`slo_args`]: the SLO flags (one clap group for `pace serve`, `pace bench` and `pace sim`).
//! - [`sim`]: the discrete-event simulator behind `pace sim`.

pub mod block_pool;
pub mod cost;
pub mod lengths;
pub mod patience;
pub mod plan;
pub mod policy;
pub mod request;
pub mod scheduler;
pub mod sim;
pub mod slo;
pub mod slo_args;

pub use cost::{CostCoeffs, StepCostModel, StepShape};
pub use lengths::{LengthModel, LengthPrior};
pub use patience::PatienceModel;
pub use plan::{BatchPlan, RequestId, SampledToken, SeqSlice, StepOutput};
pub use policy::{Policy, ALL_POLICY_NAMES};
pub use request::{Event, FinishReason, NewRequest, RejectReason, Rejection};
pub use scheduler::{Scheduler, SchedulerConfig, SchedulerStats};
pub use slo::{BinarySlo, MaxTokensRule, Patience, Penalty, RequestRecord, SloClass, SloParams, WindowStats};

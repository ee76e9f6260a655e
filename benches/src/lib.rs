//! pace-bench: load generation against OpenAI-compatible servers, offered-load sweeps, A/B
//! reports, and the front end of the discrete-event simulator.
//!
//! Every metric is computed by `pace_scheduler::slo` (docs/metrics.md) from client-side
//! timestamps; this crate only measures, schedules and reports.
//!
//! Layout:
//! - [`cli`]: `pace bench serve | sweep | ab` commands ([`BenchCommand`], [`run`]); [`args`]:
//!   their flags.
//! - [`dataset`]: prompts (random and exact in tokens, ShareGPT, JSONL) and the tokenizer.
//! - [`arrivals`]: seeded Poisson / gamma send schedules.
//! - [`client`]: one streaming request and its timestamps; [`sse`]: frames and token times.
//! - [`load`]: a bounded open-loop (or concurrency-capped) run of a workload.
//! - [`report`]: a run's metrics, vLLM-style table and result JSON.
//! - [`sweep`]: several loads and targets, the report directory; [`plots`]: SVG charts.
//! - [`repeats`]: an A/B repeated over seeds, summarised by medians, intervals and paired differences.
//! - [`score`]: `pace bench score`, the pace metrics from other tools' per-request exports.
//! - [`third_party`]: `pace bench ab --client aiperf|guidellm|vllm`, the load driven by other tools.
//! - [`soak`]: `pace bench soak`, a long hostile run judged by pass/fail checks.
//! - [`hostile`]: `pace bench hostile`, polite users' latency with and without attackers.
//! - [`launch`]: starting and stopping `pace serve` per scheduler policy.
//! - [`provenance`]: command, commit, machine and date at the top of every report.
//! - [`sim_cmd`]: `pace sim`.

pub mod args;
pub mod arrivals;
pub mod cli;
pub mod client;
pub mod dataset;
pub mod hostile;
pub mod launch;
pub mod load;
pub mod plots;
pub mod provenance;
pub mod repeats;
pub mod report;
pub mod score;
pub mod sim_cmd;
pub mod soak;
pub mod sse;
pub mod sweep;
pub mod third_party;

pub use cli::{run, BenchCommand};

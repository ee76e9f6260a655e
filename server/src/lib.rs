//! pace's server crate: the `pace` binary's subcommands as a library, so the HTTP API can be
//! driven in-process by tests ([`serve::in_process`] and [`serve::api::app`]).

pub mod cli;
pub mod engine;
pub mod engine_bench;
pub mod engine_setup;
pub mod generate;
pub mod gpu_check;
pub mod serve;

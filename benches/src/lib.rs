//! pace-bench: load generation against OpenAI-compatible servers, sweeps, A/B reports, and the
//! front end of the discrete-event simulator.

pub mod sim_cmd;

//! pace-models: the Llama-family model, its weights, tokenizer, chat template, sampler and runner.

pub mod chat;
pub mod config;
pub mod constraint;
pub mod error;
pub mod fetch;
pub mod gguf;
pub mod hf_cache;
pub mod kv_cache;
pub mod linear;
pub mod llama;
pub mod loader;
pub mod runner;
pub mod sampler;
pub mod tokenizer;
pub mod weights;

pub use error::{Error, Result};

//! pace-models: the Llama-family model, its weights, tokenizer, chat template, sampler and runner.

pub mod chat;
pub mod config;
pub mod error;
pub mod gguf;
pub mod tokenizer;

pub use error::{Error, Result};

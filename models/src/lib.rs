//! pace-models: the Llama-family model, its weights, tokenizer, chat template, sampler and runner.

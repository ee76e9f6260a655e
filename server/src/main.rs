//! `pace`: an OpenAI-compatible LLM inference server that schedules for what users experience.

mod cli;
mod engine;
mod generate;

use clap::{Parser, Subcommand};

/// pace: serve a Llama-family model, generate from the command line, or simulate schedulers.
#[derive(Debug, Parser)]
#[command(name = "pace", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate text for one or more prompts (continuous batching, no HTTP).
    Generate(generate::GenerateArgs),
    /// Simulate the scheduling policies on a cost-model preset (discrete-event, virtual clock).
    Sim(pace_bench::sim_cmd::SimArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Generate(a) => generate::run(a),
        Command::Sim(a) => pace_bench::sim_cmd::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

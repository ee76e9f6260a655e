//! `pace`: an OpenAI-compatible LLM inference server that schedules for what users experience.

use clap::{Parser, Subcommand};
use pace_server::{engine_bench, generate, gpu_check, serve};

/// pace: serve a Llama-family model, generate from the command line, or simulate schedulers.
#[derive(Debug, Parser)]
#[command(name = "pace", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(serve::ServeArgs),
    /// Generate text for one or more prompts (continuous batching, no HTTP).
    Generate(generate::GenerateArgs),
    /// Measure engine throughput (prefill, decode, aggregate decode) without HTTP.
    EngineBench(engine_bench::EngineBenchArgs),
    /// Simulate the scheduling policies on a cost-model preset (discrete-event, virtual clock).
    Sim(pace_bench::sim_cmd::SimArgs),
    /// Benchmark OpenAI-compatible servers: one load, offered-load sweeps, A/B reports.
    Bench {
        #[command(subcommand)]
        cmd: pace_bench::BenchCommand,
    },
    /// Check this binary on a GPU: CUDA kernels and model logits against the CPU, speed against
    /// the GPU's measured ceilings (deploy/gpu-check.sh runs it part by part).
    GpuCheck(gpu_check::GpuCheckArgs),
}

fn main() {
    // candle's own CPU thread pool spins while it waits; pace's kernels run on rayon's pool,
    // whose workers sleep. Keep candle's elementwise ops on the calling thread.
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: no other thread exists yet.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
    let cli = Cli::parse();
    let (level, quiet, format) = match &cli.command {
        Command::Serve(a) => (a.log_level, a.disable_log_requests, a.log_format),
        _ => (serve::LogLevel::Info, false, serve::LogFormat::Text),
    };
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = serve::log_filter(rust_log.as_deref(), level, quiet);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")))
        .with_writer(std::io::stderr);
    match format {
        serve::LogFormat::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        serve::LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).with_span_list(false).init(),
    }
    let result = match &cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Generate(a) => generate::run(a),
        Command::EngineBench(a) => engine_bench::run(a),
        Command::Sim(a) => pace_bench::sim_cmd::run(a),
        Command::Bench { cmd } => pace_bench::run(cmd),
        Command::GpuCheck(a) => gpu_check::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

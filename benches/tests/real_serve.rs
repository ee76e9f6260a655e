//! One real, short sweep against `pace serve` on the default model: `pace bench ab --scheduler
//! smooth` starts the server on a free 127.0.0.1 port, waits for /health, runs a small bounded
//! workload at two loads, and stops it with SIGTERM. (Several policies in one run are covered
//! against a stand-in server in `commands.rs`; one real server keeps this test short.)
//!
//! The `pace` binary is `$PACE_BIN`, or `target/<profile>/pace` next to this test's directory
//! (built by `cargo build -p pace-server` or by the workspace's tests).

use clap::Parser;
use pace_bench::BenchCommand;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: BenchCommand,
}

#[path = "support/pace_bin.rs"]
mod support;
use support::pace_bin;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_real_sweep_against_pace_serve() {
    let bin = pace_bin();
    if !bin.is_file() {
        // `cargo test --workspace` builds it once pace-server has integration tests; until then a
        // clean checkout may not have it.
        eprintln!("SKIPPED: {} missing (build it with `cargo build -p pace-server` or set PACE_BIN)", bin.display());
        return;
    }
    let dir = std::env::temp_dir().join(format!("pace-bench-real-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    let args = [
        "bench",
        "ab",
        "--scheduler",
        "smooth",
        "--pace-bin",
        bin.to_str().unwrap(),
        "--serve-arg=--kv-cache-memory=256MiB",
        "--request-rates",
        "2,8",
        "--num-prompts",
        "6",
        "--random-input-len",
        "64",
        "--random-output-len",
        "12",
        "--seed",
        "1",
        "--goodput",
        "ttft:5000",
        "tpot:100",
        "--time-limit",
        "120",
        "--max-requests",
        "6",
        "--disable-tqdm",
        "--result-dir",
        dir.to_str().unwrap(),
        "--server-start-timeout",
        "300",
    ];
    let BenchCommand::Ab(a) = Cli::try_parse_from(args).unwrap().cmd else { unreachable!() };
    pace_bench::cli::ab(&a).await.unwrap();
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("pace bench ab: smooth"), "{md}");
    for policy in ["smooth"] {
        for load in ["2", "8"] {
            let file = dir.join(format!("points/{policy}-{load}.json.gz"));
            let v = serde_json::to_value(pace_bench::sweep::read_point(&file).unwrap()).unwrap();
            let n = |k: &str| v[k].as_u64().unwrap();
            assert!(n("counted") >= 1, "{}", file.display());
            assert_eq!(n("completed") + n("rejected"), n("counted"), "{}: every counted request completed or was rejected", file.display());
            assert!(n("completed") > 0 && n("failed") == 0 && n("aborted") == 0, "{}", file.display());
            assert_eq!(v["timelines"][0]["prompt_len"], 64);
            // `pace bench score` reads pace's own result: every request sent, as the result saw it.
            let params = pace_scheduler::slo::SloParams::default();
            let s = pace_bench::score::score_paths(std::slice::from_ref(&file), None, params, false, None).unwrap().remove(0);
            let sent = v["timelines"].as_array().unwrap().len();
            let done = v["timelines"].as_array().unwrap().iter().filter(|t| t["record"]["outcome"] == "completed").count();
            assert_eq!((s.sent, s.served), (sent, done), "{}", file.display());
        }
    }
    assert!(dir.join("overview.svg").is_file());
    std::fs::remove_dir_all(&dir).ok();
}

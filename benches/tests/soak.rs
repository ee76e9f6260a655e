//! The CI-sized soak: `pace bench soak` against `pace serve` on the default model for one
//! minute of load (20 s measure saturation first), 1.5x saturation, a fifth of the clients
//! leaving at random moments, 50 slow connections. Every check of the ten-minute soak runs
//! except memory growth, which needs a longer run (docs/reliability-soak.md has that one).
//!
//! The `pace` binary is `$PACE_BIN`, or `target/<profile>/pace` next to this test's directory.

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
async fn a_one_minute_soak_passes_every_check() {
    let bin = pace_bin();
    if !bin.is_file() {
        eprintln!("SKIPPED: {} missing (build it with `cargo build -p pace-server` or set PACE_BIN)", bin.display());
        return;
    }
    let dir = std::env::temp_dir().join(format!("pace-soak-ci-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    let args = [
        "bench",
        "soak",
        "--pace-bin",
        bin.to_str().unwrap(),
        "--serve-arg=--kv-cache-memory=256MiB",
        "--duration",
        "60",
        "--calibrate-s",
        "20",
        "--calibrate-concurrency",
        "16",
        "--slow-connections",
        "50",
        "--seed",
        "3",
        "--request-timeout",
        "300",
        "--drain-timeout",
        "300",
        "--server-start-timeout",
        "300",
        "--result-dir",
        dir.to_str().unwrap(),
    ];
    let BenchCommand::Soak(a) = Cli::try_parse_from(args).unwrap().cmd else { unreachable!() };
    let r = pace_bench::soak::soak(&a).await.unwrap_or_else(|e| panic!("{e:#}\n{}", std::fs::read_to_string(dir.join("report.md")).unwrap_or_default()));
    assert!(r.passed);
    // The run did what it says: overload, clients that left at several moments, slow sockets cut.
    assert!(r.sent >= 30, "{} requests", r.sent);
    assert!(r.by_kind.get("completed").copied().unwrap_or(0) > 0);
    assert!(r.left_by_moment.len() >= 3, "{:?}", r.left_by_moment);
    assert!(r.slow.cut >= 50, "{:?}", r.slow.cut);
    let names: Vec<&str> = r.checks.iter().map(|c| c.name).collect();
    assert_eq!(names, ["no 5xx", "served", "accounted", "idle after", "memory", "health", "slow connections cut"]);
    assert!(r.checks.iter().all(|c| c.verdict == "pass" || (c.name == "memory" && c.verdict == "not judged")), "{:?}", r.checks);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("soak.json")).unwrap()).unwrap();
    assert_eq!(json["requests"].as_array().unwrap().len(), r.sent);
    std::fs::remove_dir_all(&dir).ok();
}

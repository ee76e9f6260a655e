//! The CI-sized hostile run: `pace bench hostile` against `pace serve` on dummy weights, 8 s a
//! phase, with every kind of attacker at once (400 idle sockets, 40 slow-header ones, a costly
//! body and a client that hangs up every half second). Asserted: what must hold on any machine
//! (no polite request fails, every probe answers, every costly body gets a 4xx, the attackers
//! really ran). The latency ratios are the benchmark's targets, judged in its report
//! (docs/bench/hostile-cpu-smollm2), not here.

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
async fn polite_users_are_served_while_every_attacker_runs() {
    let bin = pace_bin();
    if !bin.is_file() {
        eprintln!("SKIPPED: {} missing (build it with `cargo build -p pace-server` or set PACE_BIN)", bin.display());
        return;
    }
    let dir = std::env::temp_dir().join(format!("pace-hostile-ci-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    #[rustfmt::skip]
    let args = [
        "bench", "hostile", "--pace-bin", bin.to_str().unwrap(),
        "--serve-model", "dummy:smollm2-135m:q4", "--serve-arg=--kv-cache-memory=128MiB", "--serve-arg=--max-connections=256",
        "--duration", "8", "--users", "2", "--prompt-words", "30", "--max-tokens", "16",
        "--idle-connections", "400", "--slow-connections", "40", "--heavy-per-s", "2", "--leavers-per-s", "2",
        "--request-timeout", "60", "--server-start-timeout", "300", "--result-dir", dir.to_str().unwrap(),
    ];
    let BenchCommand::Hostile(a) = Cli::try_parse_from(args).unwrap().cmd else { unreachable!() };
    let r = pace_bench::hostile::hostile(&a).await.unwrap_or_else(|e| panic!("{e:#}"));
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert_eq!(r.phases.len(), 3, "{report}");
    for p in &r.phases {
        assert!(p.completed >= 2 && p.failed == 0, "{}: {} done, {} failed: {:?}\n{report}", p.name, p.completed, p.failed, p.failures);
        assert!(p.health_s.len() >= 16 && p.health_failed == 0, "{}: {} probes, {} failed\n{report}", p.name, p.health_s.len(), p.health_failed);
    }
    let at = &r.attack;
    // 400 idle sockets against 256 slots: the server closed some to make room, and they reopened.
    assert!(at.idle_opened > 400 && at.idle_closed > 0, "{report}");
    assert!(at.slow.opened >= 40, "{report}");
    assert!(at.heavy.len() >= 8, "{report}");
    for (kind, status, _) in &at.heavy {
        assert!((400..500).contains(status), "{kind}: {status}\n{report}");
    }
    assert!(at.leavers.get("left").copied().unwrap_or(0) >= 8, "{report}");
    assert_eq!(r.checks.iter().filter(|c| c.name.starts_with("every costly") || c.name.starts_with("no polite")).filter(|c| c.passed).count(), 2, "{report}");
    std::fs::remove_dir_all(&dir).ok();
}

//! `pace bench serve | sweep | ab` end to end against scripted servers on 127.0.0.1, and against
//! a stand-in for `pace serve` that `ab --scheduler` starts and stops itself.

mod common;

use std::path::{Path, PathBuf};

use clap::Parser;
use pace_bench::BenchCommand;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: BenchCommand,
}

fn parse(args: &[&str]) -> BenchCommand {
    let mut v = vec!["bench"];
    v.extend_from_slice(args);
    Cli::try_parse_from(v).unwrap_or_else(|e| panic!("{e}")).cmd
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pace-bench-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&d).ok();
    d
}

/// Small, bounded workload flags shared by the tests.
const SMALL: [&str; 12] =
    ["--random-input-len", "24", "--random-output-len", "3", "--seed", "5", "--disable-tqdm", "--time-limit", "20", "--max-requests", "50", "--goodput"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_saves_a_vllm_style_result_with_timelines() {
    let base = common::start(common::Cfg::new(40, 15)).await;
    let dir = tempdir("serve");
    let mut args = vec!["serve", "--base-url", &base, "--num-prompts", "8", "--request-rate", "40"];
    args.extend(SMALL);
    let d = dir.to_str().unwrap();
    args.extend(["ttft:500", "tpot:100", "--save-result", "--result-dir", d, "--result-filename", "r.json"]);
    let BenchCommand::Serve(a) = parse(&args) else { unreachable!() };
    let r = pace_bench::cli::serve(&a).await.unwrap();
    assert_eq!(r.model_id, "scripted-model", "found on /v1/models");
    // The default window counts the requests scheduled in 10%..80% of the arrival span.
    let sched: Vec<f64> = r.timelines.iter().map(|t| t.scheduled).collect();
    let span = sched[sched.len() - 1];
    let inside = sched.iter().filter(|&&t| t >= 0.1 * span && t <= 0.8 * span).count();
    assert!((1..8).contains(&inside));
    assert_eq!((r.counted, r.completed, r.failed, r.rejected), (inside, inside, 0, 0));
    assert!((r.duration - 0.7 * span).abs() < 1e-9, "every rate is over the window");
    assert!(r.input_lens.iter().all(|&n| n == 24), "random prompts are exact in tokens");
    assert_eq!(r.info.seed, 5);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
    for key in [
        "date",
        "backend",
        "model_id",
        "tokenizer_id",
        "num_prompts",
        "request_rate",
        "burstiness",
        "max_concurrency",
        "duration",
        "completed",
        "failed",
        "total_input_tokens",
        "total_output_tokens",
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
        "input_lens",
        "output_lens",
        "ttfts",
        "itls",
        "errors",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
        "p99_e2el_ms",
        "rejected",
        "dropped",
        "token_goodput",
        "smooth_goodput",
        "attainment",
        "p99_idle_ms",
        "timelines",
        "window_s",
        "counted",
        "smooth_goodput_ci95",
        "benefit_per_request",
        "ceiling",
        "ceiling_fraction",
        "rejected_frac",
        "dropped_frac",
        "abandoned_frac",
        "wasted_tokens_frac",
        "idle_p99_served",
        "idle_p99_all",
        "ttft_p99_all",
        "tpot_p50_served",
    ] {
        assert!(v.get(key).is_some(), "result file lacks {key}");
    }
    assert_eq!(v["backend"], "openai");
    assert_eq!(v["request_rate"], 40.0);
    let tl = v["timelines"].as_array().unwrap();
    assert_eq!(tl.len(), 8);
    assert_eq!(tl[0]["record"]["token_times"].as_array().unwrap().len(), 3);
    assert_eq!(tl[0]["usage_completion_tokens"], 3);
    // Same seed, same prompts and schedule: a second run offers the identical workload.
    let again = pace_bench::cli::serve(&a).await.unwrap();
    assert_eq!(again.input_lens, r.input_lens);
    let sched = |x: &pace_bench::report::BenchResult| x.timelines.iter().map(|t| t.scheduled).collect::<Vec<_>>();
    assert_eq!(sched(&again), sched(&r));
    std::fs::remove_dir_all(&dir).ok();
}

fn assert_report(dir: &Path, labels: &[&str]) -> String {
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for l in labels {
        assert!(md.contains(l), "report lacks {l}");
    }
    for f in ["sweep.json", "overview.svg", "smooth_goodput.svg", "ttft_p99.svg", "tpot_p50.svg", "idle_p99.svg", "attainment.svg"] {
        let bytes = std::fs::read(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(bytes.len() > 1000, "{f} is too small");
        if f.ends_with(".svg") {
            assert!(bytes.starts_with(b"<svg"), "{f} is an SVG");
        }
    }
    assert!(!dir.join("overview.png").exists(), "SVG only");
    assert!(md.contains("![overview](overview.svg)"), "{md}");
    let svg = std::fs::read_to_string(dir.join("ttft_p99.svg")).unwrap();
    assert!(svg.contains("SLO: TTFT") && svg.contains("offered load"), "threshold line and axis label");
    md
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_writes_markdown_json_and_plots() {
    let base = common::start(common::Cfg::new(30, 10)).await;
    let dir = tempdir("sweep");
    let d = dir.to_str().unwrap();
    let mut args = vec!["sweep", "--base-url", &base, "--label", "scripted", "--request-rates", "20,60", "--num-prompts", "6", "--result-dir", d];
    args.extend(SMALL);
    args.extend(["ttft:500", "tpot:100"]);
    let BenchCommand::Sweep(a) = parse(&args) else { unreachable!() };
    pace_bench::cli::sweep(&a).await.unwrap();
    let md = assert_report(&dir, &["scripted", "capacity at 90% attainment", "### 20 req/s", "### 60 req/s"]);
    assert!(md.contains("| scripted | 60 req/s |"), "every request passes, so capacity is the top load:\n{md}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("sweep.json")).unwrap()).unwrap();
    let points = v["series"][0]["points"].as_array().unwrap();
    assert_eq!(points.len(), 2);
    // Each point's full result, gzip-compressed, read back whole.
    let point = pace_bench::sweep::read_point(&dir.join("points/scripted-20.json.gz")).unwrap();
    assert_eq!(point.info.label, "scripted");
    assert!(!point.timelines.is_empty());
    // The ceiling: Theta is the largest output throughput of any point; each point's ceiling is
    // min(offered, Theta), and its fraction is smooth goodput over it.
    let theta = v["theta"].as_f64().unwrap();
    let best = |i: usize| points[i]["delivered_tps"].as_f64().unwrap().max(points[i]["smooth_goodput"].as_f64().unwrap());
    assert!(theta > 0.0 && theta == best(0).max(best(1)));
    for p in points {
        let (c, f) = (p["ceiling"].as_f64().unwrap(), p["ceiling_fraction"].as_f64().unwrap());
        assert!((c - p["offered_output_tps"].as_f64().unwrap().min(theta)).abs() < 1e-9);
        assert!((f - p["smooth_goodput"].as_f64().unwrap() / c).abs() < 1e-9);
    }
    assert!(md.contains("Ceiling: `min(offered output tok/s, Theta)`") && md.contains("of ceiling") && md.contains("- Commit:"));
    assert!(std::fs::read_to_string(dir.join("smooth_goodput.svg")).unwrap().contains("ceiling"));
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_sweep_scores_benefit_per_request_sent() {
    let base = common::start(common::Cfg::new(30, 10)).await;
    let dir = tempdir("sweep-closed");
    let d = dir.to_str().unwrap();
    let mut args = vec!["sweep", "--base-url", &base, "--max-concurrencies", "1,4", "--num-prompts", "10", "--result-dir", d];
    args.extend(SMALL);
    args.extend(["ttft:500", "--patience", "exp:20", "--max-tokens-rule", "cap:3"]);
    let BenchCommand::Sweep(a) = parse(&args) else { unreachable!() };
    pace_bench::cli::sweep(&a).await.unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("sweep.json")).unwrap()).unwrap();
    for p in v["series"][0]["points"].as_array().unwrap() {
        assert_eq!(p["counted"], 7, "10% to 80% of 10 requests");
        let (c, f) = (p["ceiling"].as_f64().unwrap(), p["ceiling_fraction"].as_f64().unwrap());
        assert!(c > 0.0 && (f - p["benefit_per_request"].as_f64().unwrap() / c).abs() < 1e-9, "{p}");
    }
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("benefit per request sent") && md.contains("### 4 in flight"), "{md}");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ab_over_urls_overlays_targets_and_finds_capacity() {
    let fast = common::start(common::Cfg::new(30, 10)).await;
    let slow = common::start(common::Cfg::new(300, 60)).await;
    let dir = tempdir("ab-urls");
    let urls = format!("{fast},{slow}");
    let d = dir.to_str().unwrap();
    let mut args = vec!["ab", "--base-urls", &urls, "--labels", "fast,slow", "--request-rates", "10,30", "--num-prompts", "5", "--result-dir", d];
    args.extend(SMALL);
    args.extend(["ttft:200"]);
    let BenchCommand::Ab(a) = parse(&args) else { unreachable!() };
    pace_bench::cli::ab(&a).await.unwrap();
    let md = assert_report(&dir, &["fast vs slow", "| fast |", "| slow |"]);
    assert!(md.contains("| fast | 30 req/s |") && md.contains("| slow | none reached |"), "{md}");
    let svg = std::fs::read_to_string(dir.join("smooth_goodput.svg")).unwrap();
    assert!(svg.contains("fast") && svg.contains("slow"), "both targets in the legend");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ab_repeats_with_new_seeds_and_reports_the_spread_and_the_paired_difference() {
    let fast = common::start(common::Cfg::new(30, 10)).await;
    let slow = common::start(common::Cfg::new(300, 60)).await;
    let dir = tempdir("ab-repeats");
    let urls = format!("{fast},{slow}");
    let d = dir.to_str().unwrap();
    let mut args = vec!["ab", "--base-urls", &urls, "--labels", "fast,slow", "--request-rates", "10,30", "--num-prompts", "5", "--result-dir", d];
    args.extend(["--repeats", "2"]);
    args.extend(SMALL);
    args.extend(["ttft:200"]);
    let BenchCommand::Ab(a) = parse(&args) else { unreachable!() };
    pace_bench::cli::ab(&a).await.unwrap();
    // Each repeat is a whole A/B report of its own, with its own seed (the flag's, then the next).
    let mut per_seed = Vec::new();
    for seed in [5, 6] {
        let sub = dir.join(format!("seed-{seed}"));
        assert_report(&sub, &["fast vs slow", &format!("seed {seed}")]);
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(sub.join("sweep.json")).unwrap()).unwrap();
        assert_eq!(v["seed"], seed);
        per_seed.push(v);
    }
    let sched = |seed: u64| {
        let r = pace_bench::sweep::read_point(&dir.join(format!("seed-{seed}/points/fast-10.json.gz"))).unwrap();
        r.timelines.iter().map(|t| t.scheduled).collect::<Vec<f64>>()
    };
    assert_ne!(sched(5), sched(6), "a new seed brings new arrivals");
    // The top report summarises exactly the repeats' numbers.
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("(2 repeats)") && md.contains("[5](seed-5/report.md)") && md.contains("[6](seed-6/report.md)"), "{md}");
    assert!(dir.join("ceiling_fraction.svg").exists() && dir.join("smooth_goodput.svg").exists());
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("repeats.json")).unwrap()).unwrap();
    assert_eq!(r["seeds"], serde_json::json!([5, 6]));
    let frac = |v: &serde_json::Value, series: usize, point: usize| v["series"][series]["points"][point]["ceiling_fraction"].as_f64().unwrap();
    let targets = r["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 4, "two targets at two loads");
    for (k, t) in targets.iter().enumerate() {
        let (series, point) = (k / 2, k % 2);
        let values: Vec<f64> = t["ceiling_fraction"]["values"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(values, vec![frac(&per_seed[0], series, point), frac(&per_seed[1], series, point)], "{t}");
        let mean = (values[0] + values[1]) / 2.0;
        assert!((t["ceiling_fraction"]["mean"].as_f64().unwrap() - mean).abs() < 1e-12);
        assert!((t["ceiling_fraction"]["median"].as_f64().unwrap() - mean).abs() < 1e-12, "the median of two is their mean");
    }
    // fast minus slow, per repeat: the slow server's first token is 270 ms later for every client,
    // so fast is ahead in both repeats at both loads.
    let paired = r["paired"].as_array().unwrap();
    assert_eq!(paired.len(), 2);
    for (point, p) in paired.iter().enumerate() {
        assert_eq!((p["first"].as_str(), p["other"].as_str()), (Some("fast"), Some("slow")));
        let diffs: Vec<f64> = p["difference"]["values"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        for (i, d) in diffs.iter().enumerate() {
            assert!((d - (frac(&per_seed[i], 0, point) - frac(&per_seed[i], 1, point))).abs() < 1e-12);
        }
        assert_eq!(p["ahead"], 2, "{p}");
    }
    assert!(md.contains("| fast | slow |") && md.contains("2 of 2"), "{md}");
    // The run order rotates: the second repeat starts with the second target (its points are
    // written first), and its report still lists the targets in the order given.
    assert_eq!(r["run_orders"], serde_json::json!([["fast", "slow"], ["slow", "fast"]]));
    assert!(md.contains("5: fast, slow; 6: slow, fast"), "{md}");
    let written = |seed: u64, label: &str| std::fs::metadata(dir.join(format!("seed-{seed}/points/{label}-30.json.gz"))).unwrap().modified().unwrap();
    assert!(written(5, "fast") < written(5, "slow"), "seed 5 ran fast first");
    assert!(written(6, "slow") < written(6, "fast"), "seed 6 ran slow first");
    assert_eq!(per_seed[1]["series"][0]["label"], "fast");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priority_mix_sends_vllm_priorities_and_scores_each_priority_against_the_weighted_ceiling() {
    // A server that serves only requests with a negative priority and refuses the rest.
    let mut cfg = common::Cfg::new(20, 10);
    cfg.refuse_unprioritized = true;
    let seen = cfg.priorities.clone();
    let base = common::start(cfg).await;
    let dir = tempdir("ab-priority");
    let d = dir.to_str().unwrap();
    let mut args = vec!["ab", "--base-urls", &base, "--labels", "prio", "--request-rates", "20", "--num-prompts", "20", "--result-dir", d];
    args.extend(["--priority-mix", "0.5:-2"]);
    args.extend(SMALL);
    args.extend(["ttft:200"]);
    let BenchCommand::Ab(a) = parse(&args) else { unreachable!() };
    pace_bench::cli::ab(&a).await.unwrap();
    // Every request sent carries the simulator's draw for the same seed as vLLM's `priority`
    // field, 0 included.
    let drawn = "0.5:-2".parse::<pace_scheduler::sim::PriorityMix>().unwrap().draw(20, 5);
    let point = pace_bench::sweep::read_point(&dir.join("points/prio-20.json.gz")).unwrap();
    let mut want: Vec<i64> = point.timelines.iter().map(|t| drawn[t.index]).collect();
    let mut got = seen.lock().unwrap().clone();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    assert!(want.contains(&-2) && want.contains(&0), "{want:?}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("sweep.json")).unwrap()).unwrap();
    let p = &v["series"][0]["points"][0];
    let rows = p["by_priority"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{p}");
    let (heavy, light) = (&rows[0], &rows[1]);
    assert_eq!((heavy["priority"].as_i64(), heavy["weight"].as_f64()), (Some(-2), Some(4.0)));
    assert_eq!((light["priority"].as_i64(), light["weight"].as_f64()), (Some(0), Some(1.0)));
    assert_eq!(heavy["rejected_frac"], 0.0);
    assert_eq!(light["rejected_frac"], 1.0);
    assert_eq!(light["benefit_per_request"], 0.0, "a refusal scores 0");
    assert!(heavy["benefit_per_request"].as_f64().unwrap() > 4.0, "three tokens weigh 12, less a little lateness: {heavy}");
    assert_eq!(heavy["counted"].as_u64().unwrap() + light["counted"].as_u64().unwrap(), p["counted"].as_u64().unwrap());
    // Theta's tokens go to the heaviest first: the ceiling is the weighted one.
    let offered = |r: &serde_json::Value| r["offered_output_tps"].as_f64().unwrap();
    let theta = v["theta"].as_f64().unwrap();
    let ceiling = pace_scheduler::slo::weighted_ceiling(&[(4.0, offered(heavy)), (1.0, offered(light))], theta);
    assert!((p["ceiling"].as_f64().unwrap() - ceiling).abs() < 1e-9, "{p}");
    assert!((p["ceiling_fraction"].as_f64().unwrap() - p["smooth_goodput"].as_f64().unwrap() / ceiling).abs() < 1e-9);
    assert!(p["ceiling_fraction"].as_f64().unwrap() <= 1.0 + 1e-9, "no target beats the ceiling: {p}");
    let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(md.contains("## By priority") && md.contains("| -2 (4) |") && md.contains("priority mix 0.5:-2"), "{md}");
    // Closed loops are refused: their per-request ceiling has no weights.
    let mut closed = vec!["ab", "--base-urls", &base, "--max-concurrencies", "2", "--num-prompts", "4", "--result-dir", d, "--priority-mix", "0.5:-2"];
    closed.extend(SMALL);
    closed.extend(["ttft:200"]);
    let BenchCommand::Ab(a) = parse(&closed) else { unreachable!() };
    let err = pace_bench::cli::ab(&a).await.unwrap_err();
    assert!(err.to_string().contains("open loops"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Writes a `pace` stand-in: a shell script that runs this test binary's `fake_pace_serve`.
fn fake_pace(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let script = dir.join("fake-pace");
    std::fs::write(&script, format!("#!/bin/sh\nPACE_BENCH_FAKE_SERVE=\"$*\" exec '{}' fake_pace_serve --exact --ignored --nocapture\n", exe.display()))
        .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ab_starts_and_stops_one_server_per_scheduler() {
    let dir = tempdir("ab-sched");
    let bin = fake_pace(&dir.join("bin"));
    let d = dir.join("report");
    let d = d.to_str().unwrap();
    let mut args = vec![
        "ab",
        "--scheduler",
        "smooth,fcfs",
        "--pace-bin",
        bin.to_str().unwrap(),
        "--serve-arg=--max-num-seqs=4",
        "--request-rates",
        "10,30",
        "--num-prompts",
        "4",
        "--result-dir",
        d,
        "--server-start-timeout",
        "30",
        "--server-stop-timeout",
        "10",
    ];
    args.extend(SMALL);
    args.extend(["ttft:150"]);
    let BenchCommand::Ab(a) = parse(&args) else { unreachable!() };
    pace_bench::cli::ab(&a).await.unwrap();
    let report = dir.join("report");
    let md = assert_report(&report, &["smooth vs fcfs"]);
    assert!(md.contains("| smooth | 30 req/s |") && md.contains("| fcfs | none reached |"), "{md}");
    for policy in ["smooth", "fcfs"] {
        let log = std::fs::read_to_string(report.join(format!("logs/serve-{policy}.log"))).unwrap();
        assert!(log.contains(&format!("--scheduler {policy} --max-num-seqs=4")), "{log}");
        assert!(log.contains("stopped by SIGTERM"), "the server was stopped gracefully: {log}");
    }
    // --resume: a cut-short run goes on where it stopped. With fcfs's last point gone, smooth's
    // server is not started again, fcfs's first point is read back as it was, and only the
    // missing point runs.
    let sweep_before = std::fs::read_to_string(report.join("sweep.json")).unwrap();
    let fcfs10 = std::fs::read(report.join("points/fcfs-10.json.gz")).unwrap();
    std::fs::remove_file(report.join("points/fcfs-30.json.gz")).unwrap();
    std::fs::remove_dir_all(report.join("logs")).unwrap();
    let mut resumed = args.clone();
    resumed.push("--resume");
    let BenchCommand::Ab(a) = parse(&resumed) else { unreachable!() };
    pace_bench::cli::ab(&a).await.unwrap();
    assert!(!report.join("logs/serve-smooth.log").exists(), "smooth's points were all there");
    assert!(report.join("logs/serve-fcfs.log").exists() && report.join("points/fcfs-30.json.gz").exists());
    assert_eq!(std::fs::read(report.join("points/fcfs-10.json.gz")).unwrap(), fcfs10, "reused, not run again");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report.join("sweep.json")).unwrap()).unwrap();
    let old: serde_json::Value = serde_json::from_str(&sweep_before).unwrap();
    // (Theta, and so every ceiling, moves with the rerun point; what was measured does not.)
    let same = |a: &serde_json::Value, b: &serde_json::Value| {
        for k in ["smooth_goodput", "counted", "delivered_tps", "offered_output_tps", "ttft_p99", "result_file"] {
            assert_eq!(a[k], b[k], "{k}");
        }
    };
    for (series, point) in [(0, 0), (0, 1), (1, 0)] {
        same(&v["series"][series]["points"][point], &old["series"][series]["points"][point]);
    }
    // A point recorded for another workload is an error, not silently reused.
    let other_seed: Vec<&str> = resumed.iter().map(|w| if *w == "5" { "6" } else { *w }).collect();
    assert!(other_seed.contains(&"6"));
    let BenchCommand::Ab(a) = parse(&other_seed) else { unreachable!() };
    let err = pace_bench::cli::ab(&a).await.unwrap_err();
    assert!(err.to_string().contains("was recorded for another run"), "{err}");
    // A server that dies at start is an error naming its log, not a hang.
    let cfg = pace_bench::launch::ServeConfig { bin: "/bin/false".into(), args: vec![], start_timeout: 30.0, stop_timeout: 1.0, log_dir: dir.join("logs") };
    let mut p = pace_bench::launch::ServeProcess::spawn(&cfg, "smooth").unwrap();
    let err = p.wait_ready(&pace_bench::client::http_client(1).unwrap(), 30.0).await.unwrap_err();
    assert!(err.to_string().contains("exited before it was ready"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ab_side_by_side_runs_the_policies_at_once_each_server_on_its_cpus() {
    let dir = tempdir("ab-side");
    let bin = fake_pace(&dir.join("bin"));
    let d = dir.join("report");
    let d = d.to_str().unwrap();
    // Two CPUs where the machine has them (the sets swap between repeats), else both on CPU 0.
    let two = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    let cpus = if two { "0/1" } else { "0/0" };
    let mut args = vec![
        "ab",
        "--scheduler",
        "smooth,fcfs",
        "--pace-bin",
        bin.to_str().unwrap(),
        "--side-by-side",
        "--serve-cpus",
        cpus,
        "--repeats",
        "2",
        "--request-rates",
        "20",
        "--num-prompts",
        "8",
        "--result-dir",
        d,
        "--server-start-timeout",
        "30",
        "--server-stop-timeout",
        "10",
    ];
    args.extend(SMALL);
    args.extend(["ttft:150"]);
    let BenchCommand::Ab(a) = parse(&args) else { unreachable!() };
    pace_bench::cli::ab(&a).await.unwrap();
    let report = dir.join("report");
    let md = std::fs::read_to_string(report.join("report.md")).unwrap();
    assert!(md.contains("Side by side"), "{md}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(report.join("repeats.json")).unwrap()).unwrap();
    assert_eq!(r["side_by_side"], true);
    let expect = if two {
        serde_json::json!([["smooth on CPUs 0", "fcfs on CPUs 1"], ["smooth on CPUs 1", "fcfs on CPUs 0"]])
    } else {
        serde_json::json!([["smooth on CPUs 0", "fcfs on CPUs 0"], ["smooth on CPUs 0", "fcfs on CPUs 0"]])
    };
    assert_eq!(r["run_orders"], expect);
    for (k, seed) in [5, 6].into_iter().enumerate() {
        let sub = report.join(format!("seed-{seed}"));
        let sub_md = std::fs::read_to_string(sub.join("report.md")).unwrap();
        assert!(sub_md.contains("the targets ran side by side"), "{sub_md}");
        // Each server ran on the CPUs named for it, and the two took requests at the same time:
        // each one's first request came before the other's last.
        let mut spans = Vec::new();
        for (i, policy) in ["smooth", "fcfs"].into_iter().enumerate() {
            let log = std::fs::read_to_string(sub.join(format!("logs/serve-{policy}.log"))).unwrap();
            let cpu = if two { (i + k) % 2 } else { 0 };
            assert!(log.contains(&format!("Cpus_allowed_list: {cpu}\n")), "{policy} in repeat {seed}: {log}");
            let at: Vec<u128> = log.lines().filter_map(|l| l.strip_prefix("request at ")).map(|t| t.parse().unwrap()).collect();
            // (The run stops once the counted requests have ended, so the last prompts may not go out.)
            assert!(at.len() >= 4, "{policy}'s requests: {log}");
            spans.push((at[0], at[at.len() - 1]));
        }
        assert!(spans[0].0 < spans[1].1 && spans[1].0 < spans[0].1, "the runs overlap in time: {spans:?}");
        assert!(sub.join("points/smooth-20.json.gz").exists() && sub.join("points/fcfs-20.json.gz").exists());
    }
    // Side by side cannot resume one target alone, and the CPU sets must match the policies.
    let mut resumed = args.clone();
    resumed.push("--resume");
    let BenchCommand::Ab(a) = parse(&resumed) else { unreachable!() };
    assert!(pace_bench::cli::ab(&a).await.unwrap_err().to_string().contains("--resume"));
    let wrong: Vec<&str> = args.iter().map(|w| if *w == cpus { "0" } else { *w }).collect();
    let BenchCommand::Ab(a) = parse(&wrong) else { unreachable!() };
    assert!(pace_bench::cli::ab(&a).await.unwrap_err().to_string().contains("one CPU set per --scheduler entry"));
    std::fs::remove_dir_all(&dir).ok();
}

/// The stand-in for `pace serve` started by `ab_starts_and_stops_one_server_per_scheduler`
/// (through the script from [`fake_pace`]): a scripted server on `--port`, fast for `smooth` and
/// slow for `fcfs`, that exits on SIGTERM. Does nothing when run any other way.
#[test]
#[ignore = "helper process for the ab test, not a test"]
fn fake_pace_serve() {
    let Ok(args) = std::env::var("PACE_BENCH_FAKE_SERVE") else { return };
    println!("fake pace {args}");
    let words: Vec<&str> = args.split_whitespace().collect();
    let after = |flag: &str| words.iter().position(|w| *w == flag).and_then(|i| words.get(i + 1)).copied();
    let port: u16 = after("--port").unwrap().parse().unwrap();
    let cfg = if after("--scheduler") == Some("fcfs") { common::Cfg::new(250, 40) } else { common::Cfg::new(30, 10) };
    // The CPUs it may run on (what `ab --serve-cpus` set), and when each request came (what
    // `ab --side-by-side` overlaps).
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    if let Some(line) = status.lines().find(|l| l.starts_with("Cpus_allowed_list:")) {
        println!("{}", line.split_whitespace().collect::<Vec<_>>().join(" "));
    }
    let stamp = axum::middleware::from_fn(|req: axum::extract::Request, next: axum::middleware::Next| async move {
        if req.uri().path().starts_with("/v1/") && req.method() == axum::http::Method::POST {
            let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
            println!("request at {ms}");
        }
        next.run(req).await
    });
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).unwrap();
        axum::serve(listener, common::app(cfg).layer(stamp))
            .with_graceful_shutdown(async move {
                term.recv().await;
            })
            .await
            .unwrap();
    });
    println!("stopped by SIGTERM");
}

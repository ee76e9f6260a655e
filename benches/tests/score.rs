//! `pace bench score` on small committed exports of every format (`data/score/`), each number
//! checked against a value computed by hand from docs/metrics.md (reading rate 5 tok/s, alpha
//! 2.5, linear penalty: token i is due i/5 s after the request was sent); and on real exports
//! that AIPerf and GuideLLM wrote against a real `pace serve` on 127.0.0.1.

use std::path::{Path, PathBuf};

use pace_bench::score::formats::{detect, Format, Level, Timing};
use pace_bench::score::{score_paths, Fluidity, Score};
use pace_scheduler::slo::SloParams;

#[path = "support/pace_bin.rs"]
mod support;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/score").join(name)
}

fn params(slo: &str) -> SloParams {
    SloParams { binary: slo.parse().unwrap(), ..SloParams::default() }
}

fn one(name: &str) -> Score {
    let mut s = score_paths(&[data(name)], None, params(""), false, None).unwrap();
    assert_eq!(s.len(), 1, "{name}: one run");
    s.remove(0)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn formats_are_detected_from_content() {
    let cases = [
        ("aiperf/c2/profile_export.jsonl", Some(Format::Aiperf)),
        ("vllm-result.json", Some(Format::Vllm)),
        ("guidellm-benchmarks.json", Some(Format::Guidellm)),
        ("guidellm-benchmarks.yaml", Some(Format::Guidellm)),
        ("per_request_lifecycle_metrics.json", Some(Format::InferencePerf)),
        ("pace-result.json", Some(Format::Pace)),
        ("not-an-export.json", None),
        ("aiperf/c2/profile_export_aiperf.json", None),
    ];
    for (name, want) in cases {
        assert_eq!(detect(&data(name)).unwrap(), want, "{name}");
    }
    // Named, a file of no format is an error that says what was expected.
    let err = score_paths(&[data("not-an-export.json")], None, params(""), false, None).unwrap_err().to_string();
    assert!(err.contains("not a per-request export") && err.contains("AIPerf") && err.contains("GuideLLM"), "{err}");
    // A directory skips the tools' other files and scores every export in it.
    let all = score_paths(&[data("")], None, params(""), false, None).unwrap();
    assert_eq!(all.len(), 6, "{:?}", all.iter().map(|s| &s.source).collect::<Vec<_>>());
}

/// AIPerf: a warm-up record (skipped), a request on time, one late with two tokens per chunk,
/// a 429 and a 500.
#[test]
fn aiperf_by_hand() {
    let f = Fluidity { ttft: 0.5, tbt: 0.25 };
    let s = score_paths(&[data("aiperf/c2/profile_export.jsonl")], None, params("ttft:500"), true, Some(f)).unwrap().remove(0);
    assert_eq!((s.sent, s.served, s.refused, s.failed, s.cancelled), (4, 2, 1, 1, 0));
    assert_eq!(s.level, Some(Level::Concurrency(2.0)), "from profile_export_aiperf.json beside it");
    assert_eq!(s.timing, Timing::PerChunk);
    // On time: 4 tokens at 0.2, 0.4, 0.6, 0.8 s (the server's usage count, not AIPerf's 3),
    // benefit 4. Late: sent at 0.1, chunks at 1.1 and 1.2 s holding two tokens each; due at
    // 0.3..0.9, the first 0.8 s late: 4 - 2.5 * 0.8 = 2. Refused and failed: 0.
    assert!(close(s.benefit_per_request_sent, 6.0 / 4.0), "{}", s.benefit_per_request_sent);
    assert!(close(s.duration_s, 1.2), "first sent 0.0 to last ended 1.2: {}", s.duration_s);
    assert!(close(s.smooth_goodput, 6.0 / 1.2));
    assert!(close(s.binary_goodput.unwrap(), 1.0 / 1.2), "only the first meets TTFT 500 ms");
    assert!(close(s.attainment.unwrap(), 0.25));
    assert!(close(s.idle_served.max, 0.8) && s.idle_served.count == 2);
    // Every request: the refusal waited 0.01 s, the failure 0.2 s.
    assert_eq!(s.idle_all.count, 4);
    assert!(close(s.idle_all.max, 0.8));
    // Fluidity: the first stream 4 of 4 on time; the second misses its first token, then its
    // chain restarts at 1.1 s and the next three are on time: 7 of 8.
    assert!(close(s.fluidity_index.unwrap(), 7.0 / 8.0));
}

#[test]
fn vllm_by_hand() {
    let s = one("vllm-result.json");
    assert_eq!((s.sent, s.served, s.refused, s.failed), (3, 2, 1, 0));
    assert_eq!(s.level, Some(Level::Concurrency(4.0)), "max_concurrency 4 at rate inf is a closed loop");
    // 3 tokens on time (3); 3 tokens over chunks at 0.5 and 0.6 s: 0.5, 0.5, 0.6 against
    // deadlines 0.2, 0.4, 0.6: idle 0.3, 3 - 0.75 = 2.25; the 'Too Many Requests' 0.
    assert!(close(s.benefit_per_request_sent, 5.25 / 3.0));
    assert!(close(s.duration_s, 2.0), "vLLM's own duration");
    assert!(close(s.smooth_goodput, 5.25 / 2.0));
    assert!(s.binary_goodput.is_none(), "no --slo, no binary goodput");
}

#[test]
fn guidellm_json_and_yaml_by_hand() {
    for name in ["guidellm-benchmarks.json", "guidellm-benchmarks.yaml"] {
        let s = one(name);
        assert_eq!((s.sent, s.served, s.refused, s.failed, s.cancelled), (3, 1, 1, 0, 1), "{name}");
        assert_eq!(s.level, Some(Level::Concurrency(2.0)));
        assert_eq!(s.timing, Timing::Estimated, "GuideLLM keeps first and last token times only");
        // Served: 4 tokens from 0.5 to 1.1 s at a uniform pace, each 0.3 s late: 4 - 0.75.
        // Cancelled with 2 tokens on time and its next not yet due when it ended: 2.
        assert!(close(s.benefit_per_request_sent, 5.25 / 3.0), "{name}: {}", s.benefit_per_request_sent);
        assert!(close(s.smooth_goodput, 5.25 / 4.0), "{name}: over the benchmark's 4 s");
    }
}

#[test]
fn inference_perf_by_hand() {
    let s = one("per_request_lifecycle_metrics.json");
    assert_eq!((s.sent, s.served, s.refused, s.failed), (3, 2, 1, 0));
    assert_eq!(s.timing, Timing::PerToken);
    // On time: 3. An older record (fields in `info`): tokens at 0.7 and 1.0 s, due 0.2 and
    // 0.4: idle 0.6, 2 - 1.5 = 0.5. 'HTTP Error 429': 0.
    assert!(close(s.benefit_per_request_sent, 3.5 / 3.0));
    assert!(close(s.smooth_goodput, 3.5 / 1.2));
}

#[test]
fn pace_by_hand() {
    let s = one("pace-result.json");
    assert_eq!((s.sent, s.served, s.refused), (2, 1, 1));
    assert_eq!(s.level, Some(Level::Rate(2.0)));
    assert!(close(s.benefit_per_request_sent, (3.0 - 2.5 * 0.3) / 2.0));
}

#[test]
fn plots_need_levels_and_write_svgs() {
    let dir = std::env::temp_dir().join(format!("pace-score-plot-{}", std::process::id()));
    let scores = score_paths(&[data("aiperf"), data("vllm-result.json")], None, params(""), false, None).unwrap();
    let files = pace_bench::score::plot(&dir, &scores, false).unwrap();
    assert!(files.iter().all(|f| std::fs::read_to_string(f).unwrap().contains("<svg")));
    let mixed = score_paths(&[data("aiperf"), data("pace-result.json")], None, params(""), false, None).unwrap();
    assert!(pace_bench::score::plot(&dir, &mixed, false).is_err(), "clients and rates on one axis");
    std::fs::remove_dir_all(&dir).ok();
}

/// The bin directory of a venv with AIPerf and GuideLLM: `$PACE_CLIENTS_VENV` if set, else a venv under
/// target/ that this installs them into from the package index.
fn clients_bin_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("PACE_CLIENTS_VENV") {
        return PathBuf::from(p).join("bin");
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/clients-venv");
    let bin = venv.join("bin");
    let has = |exe: &str| bin.join(exe).is_file();
    if !(has("aiperf") && has("guidellm")) {
        let ok = std::process::Command::new("python3").args(["-m", "venv"]).arg(&venv).status().is_ok_and(|s| s.success())
            && std::process::Command::new(bin.join("python"))
                .args(["-m", "pip", "install", "-q", "--disable-pip-version-check", "aiperf>=0.13,<0.14", "guidellm>=0.8,<0.9"])
                .status()
                .is_ok_and(|s| s.success());
        assert!(ok, "could not install aiperf and guidellm into {}", venv.display());
    }
    bin
}

/// AIPerf and GuideLLM drive a real `pace serve` (started by `pace bench ab --client`) at two
/// concurrencies; their own exports are then scored, and the counts must match what the tools
/// themselves recorded.
#[test]
fn real_aiperf_and_guidellm_against_pace_serve() {
    let pace = support::pace_bin();
    if !pace.is_file() {
        eprintln!("SKIPPED: {} missing (build it with `cargo build -p pace-server` or set PACE_BIN)", pace.display());
        return;
    }
    let bin = clients_bin_dir();
    for client in ["aiperf", "guidellm"] {
        let dir = std::env::temp_dir().join(format!("pace-score-{client}-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let out = std::process::Command::new(&pace)
            .args(["bench", "ab", "--client", client, "--client-bin"])
            .arg(bin.join(client))
            .args(["--scheduler", "fcfs", "--pace-bin"])
            .arg(&pace)
            .args(["--serve-arg=--kv-cache-memory=256MiB", "--max-concurrencies", "1,2", "--num-prompts", "4"])
            .args(["--random-input-len", "48", "--random-output-len", "12", "--seed", "3", "--time-limit", "300", "--result-dir"])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{client}: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let md = std::fs::read_to_string(dir.join("report.md")).unwrap();
        assert!(md.contains(&format!("--client {client}")) && md.contains("| fcfs |"), "{md}");
        // Score the tools' files again, as a user would, and check them against the tools' own.
        let scores = score_paths(&[dir.join("fcfs")], None, params("ttft:60000"), true, None).unwrap();
        assert_eq!(scores.len(), 2, "{client}: one run per concurrency");
        for s in &scores {
            assert_eq!((s.sent, s.served, s.refused, s.failed), (4, 4, 0, 0), "{client} {}", s.source);
            assert!(matches!(s.level, Some(Level::Concurrency(c)) if c == 1.0 || c == 2.0), "{client}: {:?}", s.level);
            assert!(close(s.binary_goodput.unwrap() * s.duration_s, 4.0), "{client}: all four within TTFT 60 s");
            // Every answer is 12 tokens (ignore_eos) by the server's count: the benefit of a
            // request is at most its 12 tokens.
            assert!(s.benefit_per_request_sent <= 12.0 + 1e-9 && s.output_throughput > 0.0, "{client}: {s:?}");
            assert!(s.ttft_served.count == 4 && s.ttft_served.p50 > 0.0);
        }
        if client == "aiperf" {
            // AIPerf's own request count and duration, side by side with the score's.
            for s in &scores {
                let level = dir.join("fcfs").join(&s.source).parent().unwrap().join("profile_export_aiperf.json");
                let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&level).unwrap()).unwrap();
                assert_eq!(v["request_count"]["avg"].as_f64(), Some(4.0), "{}", level.display());
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}

//! The simulator reproduces the smooth-goodput paper's two counterexamples and checks the point
//! of the design, on fixed seeds with the `h200-llama3-8b` preset.

use pace_scheduler::policy::by_name;
use pace_scheduler::sim::{preset, saturation_rate, simulate, sweep, SimConfig, SweepPoint};
use pace_scheduler::slo::{RequestRecord, WindowStats};

fn h200() -> (SimConfig, pace_scheduler::sim::Preset) {
    let p = preset("h200-llama3-8b").expect("preset");
    (SimConfig::from_preset(&p), p)
}

fn point<'a>(points: &'a [SweepPoint], policy: &str, load: f64) -> &'a WindowStats {
    &points.iter().find(|x| x.policy == policy && (x.load_factor - load).abs() < 1e-9).expect("point").stats
}

/// (a) Under overload, drop-late has higher binary goodput than fcfs and lower smooth goodput:
/// binary goodput rewards abandoning late requests, smooth goodput does not.
#[test]
fn counterexample_a_drop_late_wins_binary_goodput_and_loses_smooth_goodput() {
    let (cfg, p) = h200();
    let sat = saturation_rate(&cfg, &p.workload, 0, 1);
    let rate = 1.5 * sat;
    let reqs = p.workload.generate(rate, 2000, 7);
    let run = |name: &str| simulate(&cfg, by_name(name).unwrap(), &reqs).unwrap().window(&cfg.sched);
    let (fcfs, drop) = (run("fcfs"), run("drop-late"));
    assert!(drop.dropped > 0);
    assert!(drop.request_goodput > fcfs.request_goodput, "request goodput {} vs {}", drop.request_goodput, fcfs.request_goodput);
    assert!(drop.token_goodput > fcfs.token_goodput);
    assert!(drop.smooth_goodput < fcfs.smooth_goodput, "smooth goodput {} vs {}", drop.smooth_goodput, fcfs.smooth_goodput);
}

/// The output-delay trick: deliver token i no earlier than `theta` after token i-1, holding ready
/// tokens in a buffer (a server-side pacer in front of the client).
fn hold_back(ready: &[f64], theta: f64) -> Vec<f64> {
    let mut out: Vec<f64> = Vec::with_capacity(ready.len());
    for &t in ready {
        let t = match out.last() {
            Some(&prev) => t.max(prev + theta),
            None => t,
        };
        out.push(t);
    }
    out
}

/// Share of inter-token gaps above `threshold`: a TBT-style SLO metric.
fn tbt_violations(records: &[RequestRecord], threshold: f64) -> f64 {
    let (mut over, mut all) = (0usize, 0usize);
    for r in records {
        for g in r.itls() {
            all += 1;
            over += usize::from(g > threshold);
        }
    }
    over as f64 / all.max(1) as f64
}

/// (b) Holding ready tokens back until a TBT-style threshold improves the TBT metric, and never
/// improves idle latency or smooth goodput (deadlines count from arrival, not the last token).
#[test]
fn counterexample_b_holding_tokens_back_helps_tbt_and_never_idle_or_smooth_goodput() {
    let (cfg, p) = h200();
    let sat = saturation_rate(&cfg, &p.workload, 0, 1);
    let reqs = p.workload.generate(sat, 1500, 11);
    let res = simulate(&cfg, by_name("fcfs").unwrap(), &reqs).unwrap();
    let threshold = 0.1;
    let theta = 0.09;
    let held: Vec<RequestRecord> = res
        .records
        .iter()
        .map(|r| {
            let token_times = hold_back(&r.token_times, theta);
            let end = token_times.last().copied().unwrap_or(r.end).max(r.end);
            RequestRecord { token_times, end, ..r.clone() }
        })
        .collect();
    let (before, after) = (tbt_violations(&res.records, threshold), tbt_violations(&held, threshold));
    assert!(before > 0.01, "the workload must have TBT violations to hide ({before})");
    assert!(after < before / 2.0, "TBT violations {before} -> {after}");
    for (r, h) in res.records.iter().zip(&held) {
        assert!(h.idle_latency() >= r.idle_latency() - 1e-12);
    }
    let end = held.iter().map(|r| r.end).fold(res.end, f64::max);
    let w0 = WindowStats::compute(&res.records, res.start, end, &cfg.sched.slo);
    let w1 = WindowStats::compute(&held, res.start, end, &cfg.sched.slo);
    assert!(w1.smooth_goodput <= w0.smooth_goodput);
    assert!(w1.idle.mean >= w0.idle.mean && w1.idle.p99 >= w0.idle.p99);
}

/// The point of the design: at 0.5x, 1x, 1.5x and 2x the preset's saturation rate, smooth has
/// the highest smooth goodput at and above saturation, at least twice fcfs's at 1.5x, is not
/// worse than fcfs below saturation, and keeps at least 95% of fcfs's token throughput.
///
/// 10,000 requests: with a shorter run fcfs's queue has no time to grow and its smooth goodput
/// reflects less of the overload (the gap widens with the length of the overload).
#[test]
fn smooth_wins_smooth_goodput_at_and_above_saturation() {
    let (cfg, p) = h200();
    let sat = saturation_rate(&cfg, &p.workload, 0, 1);
    assert!(sat > 10.0 && sat < 100.0, "saturation {sat} req/s");
    let loads = [0.5, 1.0, 1.5, 2.0];
    let rates: Vec<f64> = loads.iter().map(|l| l * sat).collect();
    let points = sweep(&cfg, &p.workload, &["smooth", "fcfs", "drop-late"], &rates, 10_000, 42, sat).unwrap();
    for &load in &loads {
        let (s, f, d) = (point(&points, "smooth", load), point(&points, "fcfs", load), point(&points, "drop-late", load));
        let msg = format!(
            "load {load}: smooth goodput smooth {:.0} fcfs {:.0} drop-late {:.0}; tok/s smooth {:.0} fcfs {:.0}",
            s.smooth_goodput, f.smooth_goodput, d.smooth_goodput, s.output_throughput, f.output_throughput
        );
        assert!(s.output_throughput >= 0.95 * f.output_throughput, "{msg}");
        if load < 1.0 {
            assert!(s.smooth_goodput >= 0.995 * f.smooth_goodput, "{msg}");
        } else {
            assert!(s.smooth_goodput > f.smooth_goodput && s.smooth_goodput > d.smooth_goodput, "{msg}");
        }
        if load == 1.5 {
            assert!(s.smooth_goodput >= 2.0 * f.smooth_goodput, "{msg}");
        }
        eprintln!("{msg}");
    }
}

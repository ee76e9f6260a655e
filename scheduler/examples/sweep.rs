//! Prints a quick sweep of a preset: `cargo run -p pace-scheduler --example sweep -- PRESET N`.
use pace_scheduler::sim::{preset, saturation_rate, sweep, SimConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let name = args.get(1).map_or("h200-llama3-8b", |s| s.as_str());
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2000);
    let p = preset(name).expect("preset");
    let cfg = SimConfig::from_preset(&p);
    let t0 = std::time::Instant::now();
    let sat = saturation_rate(&cfg, &p.workload, 2000, 1);
    println!("saturation {sat:.2} req/s ({:.2}s)", t0.elapsed().as_secs_f64());
    let rates: Vec<f64> = [0.5, 1.0, 1.5, 2.0].iter().map(|f| f * sat).collect();
    let pts = sweep(&cfg, &p.workload, &["smooth", "fcfs", "drop-late"], &rates, n, 42, sat).expect("sim");
    println!("{:>9} {:>5} {:>8} {:>9} {:>8} {:>8} {:>9} {:>7} {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} {:>6}",
        "policy", "load", "req/s", "tok/s", "goodput", "tokgood", "smooth", "attain", "ttft50", "ttft99", "tpot99", "idle99", "rej", "drop", "pre");
    for x in &pts {
        let s = &x.stats;
        println!("{:>9} {:>5.2} {:>8.2} {:>9.0} {:>8.2} {:>8.0} {:>9.0} {:>7.3} {:>7.3} {:>7.3} {:>7.3} {:>6.1} {:>6} {:>6} {:>6}",
            x.policy, x.load_factor, s.request_throughput, s.output_throughput, s.request_goodput, s.token_goodput,
            s.smooth_goodput, s.attainment, s.ttft.p50, s.ttft.p99, s.tpot.p99, s.idle.p99, s.rejected, s.dropped, x.preempted);
    }
    println!("elapsed {:.2}s", t0.elapsed().as_secs_f64());
}

//! `pace sim`: the discrete-event simulator's command line, tables, JSON and SVG plots.
//!
//! Every policy runs on the same seeded workload at every offered load; the preset's saturation
//! rate is estimated first (see [`pace_scheduler::sim::saturation_rate`]) so loads can be given
//! as multiples of it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValue, PossibleValuesParser};
use pace_scheduler::policy::POLICY_NAMES;
use pace_scheduler::sim::workload::sharegpt_pairs;
use pace_scheduler::sim::{preset, presets, saturation_rate, sweep, Arrivals, LengthSource, Lengths, SimConfig, SweepPoint};
use pace_scheduler::slo::{BinarySlo, Penalty, SloClass};
use plotters::prelude::*;
use serde::Serialize;

/// Options of `pace sim`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Cost-model preset (machine and model).
    #[arg(long, default_value = "h200-llama3-8b", value_parser = preset_parser())]
    pub preset: String,
    /// Policies to compare, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "smooth,fcfs,drop-late", value_parser = PossibleValuesParser::new(POLICY_NAMES))]
    pub policies: Vec<String>,
    /// Offered loads as multiples of the preset's estimated saturation rate.
    #[arg(long, value_delimiter = ',', default_value = "0.5,1,1.5,2", conflicts_with = "rates")]
    pub load_factors: Vec<f64>,
    /// Offered loads in requests per second (instead of --load-factors).
    #[arg(long, value_delimiter = ',')]
    pub rates: Option<Vec<f64>>,
    /// Requests per run.
    #[arg(long, default_value_t = 10_000)]
    pub num_requests: usize,
    /// Seed of the workload (lengths and arrivals) and of step-time noise.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Write sweep.json, summary.jsonl, report.md and one SVG per metric here.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print one JSON object per (policy, rate) line instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Reading rate q, tokens per second (smooth goodput).
    #[arg(long, default_value_t = 5.0)]
    pub reading_rate: f64,
    /// First-token grace g, milliseconds (smooth goodput).
    #[arg(long, default_value_t = 0.0)]
    pub ttft_grace: f64,
    /// Weight of waiting against output, alpha (smooth goodput).
    #[arg(long, default_value_t = 2.5)]
    pub alpha: f64,
    /// Penalty of idle seconds: linear, quadratic or capped:SECONDS.
    #[arg(long, default_value = "linear")]
    pub penalty: String,
    /// Binary SLO for goodput and drop-late, e.g. "ttft:500 tpot:50" (ms); default: the preset's.
    #[arg(long)]
    pub goodput: Option<String>,
    /// Prompt tokens: N or LO:HI (uniform); default: the preset's.
    #[arg(long)]
    pub input_len: Option<String>,
    /// Output tokens: N or LO:HI (uniform); default: the preset's.
    #[arg(long)]
    pub output_len: Option<String>,
    /// Draw (prompt, output) lengths from a ShareGPT-format JSON file (about 4 characters a token).
    #[arg(long, conflicts_with_all = ["input_len", "output_len"])]
    pub sharegpt: Option<PathBuf>,
    /// Arrival process: poisson or gamma:CV.
    #[arg(long, default_value = "poisson")]
    pub arrivals: String,
    /// Relative standard deviation of simulated step times (log-normal).
    #[arg(long, default_value_t = 0.0)]
    pub noise: f64,
}

fn preset_parser() -> PossibleValuesParser {
    PossibleValuesParser::new(presets().into_iter().map(|p| PossibleValue::new(p.name).help(p.description)))
}

fn parse_lengths(s: &str) -> Result<Lengths> {
    let n = |v: &str| v.trim().parse::<usize>().with_context(|| format!("length `{s}`: expected N or LO:HI"));
    Ok(match s.split_once(':') {
        Some((lo, hi)) => {
            let (lo, hi) = (n(lo)?, n(hi)?);
            if lo == 0 || hi < lo {
                bail!("length `{s}`: need 1 <= LO <= HI");
            }
            Lengths::Uniform(lo, hi)
        }
        None => match n(s)? {
            0 => bail!("length `{s}` must be at least 1"),
            v => Lengths::Fixed(v),
        },
    })
}

fn parse_arrivals(s: &str) -> Result<Arrivals> {
    if s == "poisson" {
        return Ok(Arrivals::Poisson);
    }
    let cv = s
        .strip_prefix("gamma:")
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0)
        .with_context(|| format!("arrivals `{s}`: expected poisson or gamma:CV with CV > 0"))?;
    Ok(Arrivals::Gamma { cv })
}

/// One line of `--json` output.
#[derive(Debug, Clone, Serialize)]
pub struct SummaryLine {
    /// Preset name.
    pub preset: String,
    /// Policy name.
    pub policy: String,
    /// Offered request rate, per second.
    pub rate: f64,
    /// Offered rate over saturation rate.
    pub load_factor: f64,
    /// Estimated saturation request rate of the preset on this workload.
    pub saturation_rate: f64,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Output tokens per second.
    pub output_throughput: f64,
    /// Binary-SLO-passing requests per second.
    pub request_goodput: f64,
    /// Output tokens of passing requests per second.
    pub token_goodput: f64,
    /// Smooth goodput, benefit per second.
    pub smooth_goodput: f64,
    /// Passed over completed.
    pub attainment: f64,
    /// Passed over offered.
    pub attainment_offered: f64,
    /// Seconds.
    pub ttft_p50: f64,
    /// Seconds.
    pub ttft_p99: f64,
    /// Seconds.
    pub tpot_p50: f64,
    /// Seconds.
    pub tpot_p99: f64,
    /// Seconds.
    pub idle_p50: f64,
    /// Seconds.
    pub idle_p99: f64,
    /// Seconds.
    pub idle_mean: f64,
    /// Completed requests.
    pub completed: usize,
    /// Rejected at admission.
    pub rejected: usize,
    /// Dropped after admission.
    pub dropped: usize,
    /// Preemptions.
    pub preempted: u64,
    /// Requests per run.
    pub num_requests: usize,
    /// Workload seed.
    pub seed: u64,
}

fn summary(p: &SweepPoint, preset: &str, args: &SimArgs) -> SummaryLine {
    let s = &p.stats;
    SummaryLine {
        preset: preset.to_string(),
        policy: p.policy.clone(),
        rate: p.rate,
        load_factor: p.load_factor,
        saturation_rate: p.saturation_rate,
        request_throughput: s.request_throughput,
        output_throughput: s.output_throughput,
        request_goodput: s.request_goodput,
        token_goodput: s.token_goodput,
        smooth_goodput: s.smooth_goodput,
        attainment: s.attainment,
        attainment_offered: s.attainment_offered,
        ttft_p50: s.ttft.p50,
        ttft_p99: s.ttft.p99,
        tpot_p50: s.tpot.p50,
        tpot_p99: s.tpot.p99,
        idle_p50: s.idle.p50,
        idle_p99: s.idle.p99,
        idle_mean: s.idle.mean,
        completed: s.completed,
        rejected: s.rejected,
        dropped: s.dropped,
        preempted: p.preempted,
        num_requests: args.num_requests,
        seed: args.seed,
    }
}

/// Run `pace sim`.
pub fn run(args: &SimArgs) -> Result<()> {
    let p = preset(&args.preset).with_context(|| format!("unknown preset `{}`", args.preset))?;
    if !(args.reading_rate > 0.0 && args.reading_rate.is_finite()) || args.ttft_grace < 0.0 || args.alpha < 0.0 {
        bail!("--reading-rate must be > 0, --ttft-grace and --alpha >= 0");
    }
    if args.num_requests == 0 {
        bail!("--num-requests must be at least 1");
    }
    let mut cfg = SimConfig::from_preset(&p);
    cfg.noise = args.noise.max(0.0);
    cfg.seed = args.seed;
    let slo = &mut cfg.sched.slo;
    slo.alpha = args.alpha;
    slo.penalty = args.penalty.parse::<Penalty>()?;
    slo.default_class = SloClass { reading_rate: args.reading_rate, grace: args.ttft_grace / 1000.0 };
    slo.binary = args.goodput.as_deref().unwrap_or(p.goodput).parse::<BinarySlo>()?;
    let mut workload = p.workload.clone();
    workload.arrivals = parse_arrivals(&args.arrivals)?;
    if let Some(path) = &args.sharegpt {
        workload.lengths = LengthSource::Pairs(sharegpt_pairs(path)?);
    } else if args.input_len.is_some() || args.output_len.is_some() {
        let LengthSource::Synthetic { input, output } = &mut workload.lengths else { unreachable!("presets are synthetic") };
        if let Some(s) = &args.input_len {
            *input = parse_lengths(s)?;
        }
        if let Some(s) = &args.output_len {
            *output = parse_lengths(s)?;
        }
    }
    let sat = saturation_rate(&cfg, &workload, 0, args.seed);
    let rates: Vec<f64> = match &args.rates {
        Some(r) => r.clone(),
        None => args.load_factors.iter().map(|f| f * sat).collect(),
    };
    if rates.iter().any(|r| !(*r > 0.0 && r.is_finite())) {
        bail!("offered rates must be positive");
    }
    let policies: Vec<&str> = args.policies.iter().map(|s| s.as_str()).collect();
    let points = sweep(&cfg, &workload, &policies, &rates, args.num_requests, args.seed, sat)?;
    let lines: Vec<SummaryLine> = points.iter().map(|x| summary(x, p.name, args)).collect();
    if args.json {
        for l in &lines {
            println!("{}", serde_json::to_string(l)?);
        }
    } else {
        let (mean_in, mean_out) = workload.mean_lengths();
        println!(
            "preset {} | saturation ~{sat:.2} req/s | {} requests, mean prompt {mean_in:.0}, mean output {mean_out:.0} tokens | q={} tok/s g={} ms alpha={} f={} | goodput SLO \"{}\"",
            p.name, args.num_requests, args.reading_rate, args.ttft_grace, args.alpha, slo_penalty(&cfg), cfg.sched.slo.binary
        );
        print!("{}", tables(&lines, false));
    }
    if let Some(dir) = &args.out {
        write_outputs(dir, p.name, &lines, &points, &cfg, sat)?;
        if !args.json {
            println!("wrote {}", dir.display());
        }
    }
    Ok(())
}

fn slo_penalty(cfg: &SimConfig) -> String {
    cfg.sched.slo.penalty.to_string()
}

/// Tables, one per offered rate (plain text, or Markdown).
pub fn tables(lines: &[SummaryLine], markdown: bool) -> String {
    let head = [
        "policy", "req/s", "tok/s", "goodput req/s", "goodput tok/s", "smooth goodput", "attain", "TTFT p50", "TTFT p99",
        "TPOT p50", "TPOT p99", "idle p50", "idle p99", "rejected", "dropped", "preempted",
    ];
    let mut out = String::new();
    let mut rates: Vec<f64> = lines.iter().map(|l| l.rate).collect();
    rates.dedup();
    for rate in rates {
        let rows: Vec<&SummaryLine> = lines.iter().filter(|l| l.rate == rate).collect();
        let lf = rows.first().map_or(0.0, |l| l.load_factor);
        let _ = writeln!(out, "{}offered {rate:.2} req/s ({lf:.2}x saturation)", if markdown { "\n#### " } else { "\n" });
        let cells: Vec<Vec<String>> = rows
            .iter()
            .map(|l| {
                vec![
                    l.policy.clone(),
                    format!("{:.2}", l.request_throughput),
                    format!("{:.0}", l.output_throughput),
                    format!("{:.2}", l.request_goodput),
                    format!("{:.0}", l.token_goodput),
                    format!("{:.0}", l.smooth_goodput),
                    format!("{:.3}", l.attainment),
                    format!("{:.3}s", l.ttft_p50),
                    format!("{:.3}s", l.ttft_p99),
                    format!("{:.1}ms", l.tpot_p50 * 1e3),
                    format!("{:.1}ms", l.tpot_p99 * 1e3),
                    format!("{:.2}s", l.idle_p50),
                    format!("{:.2}s", l.idle_p99),
                    l.rejected.to_string(),
                    l.dropped.to_string(),
                    l.preempted.to_string(),
                ]
            })
            .collect();
        if markdown {
            let _ = writeln!(out, "\n| {} |", head.join(" | "));
            let _ = writeln!(out, "|{}", "---|".repeat(head.len()));
            for c in &cells {
                let _ = writeln!(out, "| {} |", c.join(" | "));
            }
        } else {
            let widths: Vec<usize> =
                (0..head.len()).map(|i| cells.iter().map(|c| c[i].len()).chain([head[i].len()]).max().unwrap_or(0)).collect();
            let row = |c: &[String]| c.iter().zip(&widths).map(|(v, w)| format!("{v:>w$}")).collect::<Vec<_>>().join("  ");
            let _ = writeln!(out, "{}", row(&head.map(String::from)));
            for c in &cells {
                let _ = writeln!(out, "{}", row(c));
            }
        }
    }
    out
}

/// A metric to plot: file stem, title, axis label, value.
type Metric = (&'static str, &'static str, &'static str, fn(&SummaryLine) -> f64);

const METRICS: [Metric; 14] = [
    ("smooth_goodput", "Smooth goodput", "benefit / s", |l| l.smooth_goodput),
    ("token_goodput", "Token goodput (binary SLO)", "tokens / s", |l| l.token_goodput),
    ("request_goodput", "Request goodput (binary SLO)", "requests / s", |l| l.request_goodput),
    ("output_throughput", "Output token throughput", "tokens / s", |l| l.output_throughput),
    ("request_throughput", "Request throughput", "requests / s", |l| l.request_throughput),
    ("attainment", "SLO attainment (of completed)", "fraction", |l| l.attainment),
    ("ttft_p50", "TTFT p50", "seconds", |l| l.ttft_p50),
    ("ttft_p99", "TTFT p99", "seconds", |l| l.ttft_p99),
    ("tpot_p50", "TPOT p50", "seconds", |l| l.tpot_p50),
    ("tpot_p99", "TPOT p99", "seconds", |l| l.tpot_p99),
    ("idle_p99", "User idle latency p99", "seconds", |l| l.idle_p99),
    ("rejected", "Rejected at admission", "requests", |l| l.rejected as f64),
    ("dropped", "Dropped after admission", "requests", |l| l.dropped as f64),
    ("preempted", "Preemptions", "count", |l| l.preempted as f64),
];

const COLORS: [RGBColor; 4] = [RGBColor(0, 114, 178), RGBColor(213, 94, 0), RGBColor(0, 158, 115), RGBColor(204, 121, 167)];

fn draw_metric<DB: DrawingBackend>(area: &DrawingArea<DB, plotters::coord::Shift>, m: &Metric, lines: &[SummaryLine], by_load: bool) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let (_, title, unit, value) = m;
    let x_of = |l: &SummaryLine| if by_load { l.load_factor } else { l.rate };
    let xs: Vec<f64> = lines.iter().map(x_of).collect();
    let ys: Vec<f64> = lines.iter().map(value).collect();
    let (x0, x1) = (xs.iter().copied().fold(f64::INFINITY, f64::min), xs.iter().copied().fold(f64::NEG_INFINITY, f64::max));
    let (mut y0, mut y1) = (ys.iter().copied().fold(0.0, f64::min), ys.iter().copied().fold(0.0, f64::max));
    if y1 - y0 < 1e-12 {
        y1 = y0 + 1.0;
    }
    let pad = (y1 - y0) * 0.05;
    y0 -= if y0 < 0.0 { pad } else { 0.0 };
    y1 += pad;
    let xpad = ((x1 - x0) * 0.05).max(0.05);
    let mut chart = ChartBuilder::on(area)
        .caption(*title, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((x0 - xpad)..(x1 + xpad), y0..y1)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .x_desc(if by_load { "offered load (x saturation rate)" } else { "offered load (requests / s)" })
        .y_desc(*unit)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut policies: Vec<&str> = lines.iter().map(|l| l.policy.as_str()).collect();
    policies.sort_unstable();
    policies.dedup();
    for (i, pol) in policies.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = lines.iter().filter(|l| l.policy == *pol).map(|l| (x_of(l), value(l))).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(*pol)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

fn write_outputs(dir: &Path, preset: &str, lines: &[SummaryLine], points: &[SweepPoint], cfg: &SimConfig, sat: f64) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    crate::plots::register_fonts();
    let jsonl: String = lines.iter().map(|l| serde_json::to_string(l).map(|s| s + "\n")).collect::<Result<_, _>>()?;
    std::fs::write(dir.join("summary.jsonl"), jsonl)?;
    let full = serde_json::json!({ "preset": preset, "saturation_rate": sat, "config": cfg.sched, "points": points });
    std::fs::write(dir.join("sweep.json"), serde_json::to_string_pretty(&full)?)?;
    let by_load = sat > 0.0;
    for m in &METRICS {
        let path = dir.join(format!("{}.svg", m.0));
        let root = SVGBackend::new(&path, (640, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
        draw_metric(&root, m, lines, by_load)?;
        root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let path = dir.join("overview.svg");
    let root = SVGBackend::new(&path, (1600, 1600)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let overview = ["smooth_goodput", "token_goodput", "request_goodput", "output_throughput", "ttft_p99", "tpot_p99", "idle_p99", "rejected", "dropped"];
    for (area, name) in root.split_evenly((3, 3)).iter().zip(overview) {
        let m = METRICS.iter().find(|m| m.0 == name).expect("metric exists");
        draw_metric(area, m, lines, by_load)?;
    }
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut md = format!(
        "# `pace sim` report: {preset}\n\nSaturation rate (estimated, fcfs under a backlog): {sat:.2} req/s. \
         Smooth goodput: q = {} tok/s, g = {} s, alpha = {}, f = {}. Binary SLO: `{}`.\n\n![overview](overview.svg)\n",
        cfg.sched.slo.default_class.reading_rate,
        cfg.sched.slo.default_class.grace,
        cfg.sched.slo.alpha,
        cfg.sched.slo.penalty,
        cfg.sched.slo.binary,
    );
    md.push_str(&tables(lines, true));
    std::fs::write(dir.join("report.md"), md)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    #[test]
    fn parses_flags_and_writes_json_svg_and_report() {
        let dir = std::env::temp_dir().join(format!("pace-sim-test-{}", std::process::id()));
        let cli = Cli::try_parse_from([
            "sim", "--preset", "cpu-smollm2", "--policies", "smooth,fcfs", "--load-factors", "0.5,1.5",
            "--num-requests", "150", "--penalty", "capped:5", "--goodput", "ttft:2000", "--input-len", "16:64",
            "--output-len", "32", "--out", dir.to_str().unwrap(), "--json",
        ])
        .unwrap();
        run(&cli.sim).unwrap();
        let lines = std::fs::read_to_string(dir.join("summary.jsonl")).unwrap();
        assert_eq!(lines.lines().count(), 4);
        let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
        for key in ["policy", "rate", "request_throughput", "output_throughput", "request_goodput", "token_goodput",
            "smooth_goodput", "attainment", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "idle_p99", "rejected",
            "dropped", "preempted", "saturation_rate"] {
            assert!(first.get(key).is_some(), "missing {key}");
        }
        let svg = std::fs::read_to_string(dir.join("smooth_goodput.svg")).unwrap();
        assert!(svg.contains("<svg") && svg.contains("smooth") && svg.contains("fcfs"));
        assert!(std::fs::read_to_string(dir.join("report.md")).unwrap().contains("| policy |"));
        std::fs::remove_dir_all(&dir).ok();
        assert!(Cli::try_parse_from(["sim", "--preset", "tpu"]).is_err());
        assert!(Cli::try_parse_from(["sim", "--rates", "1", "--load-factors", "1"]).is_err());
        assert!(parse_lengths("0").is_err() && parse_lengths("9:3").is_err());
        assert_eq!(parse_arrivals("gamma:2").unwrap(), Arrivals::Gamma { cv: 2.0 });
    }
}

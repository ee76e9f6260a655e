//! `pace bench ab --repeats N`: the same A/B run N times with seeds S, S+1, ..., and one report
//! over the repeats.
//!
//! One run's `±` (from the spread of its requests' benefits) says how well that run measured its
//! own requests. It does not say how much the point moves from run to run: a new seed brings other
//! prompts, arrival times and clients, the few answers that run to `max_tokens` land elsewhere, and
//! the machine's speed drifts. Repeats measure that spread directly. Per load and target the
//! report gives the fraction of the ceiling in every repeat, their median, their mean with a 95%
//! interval (Student's t over the repeats) and the pooled fraction (all repeats' benefit over all
//! their ceilings' tokens, as if one long run). Within a repeat every target gets the same
//! workload, so the first target's *paired* difference from each other one (per repeat, then
//! mean and interval) removes the workload's share of the spread: it is the comparison to read.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};
use pace_scheduler::slo::mean_ci95;
use serde::Serialize;

use crate::plots::{write_chart, Chart, Line};
use crate::provenance::Provenance;
use crate::sweep::{PointSummary, SweepSpec};

/// One repeat of an A/B: its seed, its report directory (relative to the top one), its spec and
/// its series with the ceilings set.
pub struct Repeat {
    /// Seed of prompts, arrivals and clients.
    pub seed: u64,
    /// The repeat's own report directory, relative to the top report.
    pub dir: String,
    /// What the repeat ran.
    pub spec: SweepSpec,
    /// Every target's points, ceilings set (`sweep::write_report` sets them).
    pub series: Vec<(String, Vec<PointSummary>)>,
    /// The targets' labels in the order they ran (rotated from one repeat to the next); side by
    /// side, every target with the CPUs its server had.
    pub order: Vec<String>,
    /// Whether the targets ran at the same time (`pace bench ab --side-by-side`).
    pub side_by_side: bool,
}

/// Summary of a few numbers: every value, median, mean and the 95% half-width over them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    /// One value per repeat, in repeat order.
    pub values: Vec<f64>,
    /// Median of the values.
    pub median: f64,
    /// Mean of the values.
    pub mean: f64,
    /// Half-width of the mean's 95% interval (Student's t, n - 1 degrees of freedom).
    pub ci95: f64,
}

impl Spread {
    /// The spread of `values`.
    pub fn of(values: Vec<f64>) -> Self {
        let (mean, ci95) = mean_ci95(&values);
        Self { median: median(&values), mean, ci95, values }
    }
}

/// Median (the mean of the middle two for an even count; 0 for none).
pub fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A target at a load over the repeats.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetAtLoad {
    /// Target label.
    pub label: String,
    /// Offered load.
    pub load: f64,
    /// Fraction of the ceiling.
    pub ceiling_fraction: Spread,
    /// All repeats' counted benefit over all their ceilings' tokens (open loop: smooth goodput
    /// times window over ceiling times window; closed loop: benefit per request over the
    /// ceiling per request, weighted by the requests counted).
    pub pooled_ceiling_fraction: f64,
    /// Smooth goodput (benefit / s, or per request for a closed loop's ceiling).
    pub smooth_goodput: Spread,
    /// Share of counted requests refused.
    pub rejected: Spread,
    /// Share of counted requests whose client left.
    pub abandoned: Spread,
    /// TPOT p50 of served requests, seconds.
    pub tpot_p50_served: Spread,
    /// Counted requests in each repeat.
    pub counted: Vec<usize>,
}

/// The first target's paired difference from another one at a load.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Paired {
    /// The first target.
    pub first: String,
    /// The other target.
    pub other: String,
    /// Offered load.
    pub load: f64,
    /// First minus other, fraction of the ceiling, per repeat.
    pub difference: Spread,
    /// Repeats in which the first was ahead.
    pub ahead: usize,
}

/// Every target at every load, and the paired differences, over `runs`.
pub fn summarize(runs: &[Repeat]) -> (Vec<TargetAtLoad>, Vec<Paired>) {
    let Some(first) = runs.first() else { return (vec![], vec![]) };
    let mut out = Vec::new();
    let mut paired = Vec::new();
    let find =
        |run: &Repeat, label: &str, i: usize| -> Option<PointSummary> { run.series.iter().find(|(l, _)| l == label).and_then(|(_, p)| p.get(i)).cloned() };
    let first_label = first.series.first().map(|(l, _)| l.clone());
    for (label, pts) in &first.series {
        for (i, p0) in pts.iter().enumerate() {
            let pts: Vec<PointSummary> = runs.iter().filter_map(|r| find(r, label, i)).collect();
            let take = |f: fn(&PointSummary) -> f64| Spread::of(pts.iter().map(f).collect());
            let (num, den) = pts.iter().fold((0.0, 0.0), |(n, d), p| {
                let weight = if p.closed_loop { p.counted as f64 } else { p.window_s };
                let value = if p.closed_loop { p.benefit_per_request } else { p.smooth_goodput };
                (n + value * weight, d + p.ceiling * weight)
            });
            out.push(TargetAtLoad {
                label: label.clone(),
                load: p0.load,
                ceiling_fraction: take(|p| p.ceiling_fraction),
                pooled_ceiling_fraction: if den > 0.0 { num / den } else { 0.0 },
                smooth_goodput: take(|p| if p.closed_loop { p.benefit_per_request } else { p.smooth_goodput }),
                rejected: take(|p| p.rejected_frac),
                abandoned: take(|p| p.abandoned_frac),
                tpot_p50_served: take(|p| p.tpot_p50_served),
                counted: pts.iter().map(|p| p.counted).collect(),
            });
            if let Some(f) = first_label.as_deref().filter(|f| *f != label) {
                let d: Vec<f64> = runs.iter().filter_map(|r| Some(find(r, f, i)?.ceiling_fraction - find(r, label, i)?.ceiling_fraction)).collect();
                paired.push(Paired {
                    first: f.to_string(),
                    other: label.clone(),
                    load: p0.load,
                    ahead: d.iter().filter(|&&x| x > 0.0).count(),
                    difference: Spread::of(d),
                });
            }
        }
    }
    (out, paired)
}

/// The loads of `rows`, in order, once each.
fn loads(rows: &[TargetAtLoad]) -> Vec<f64> {
    let mut loads: Vec<f64> = rows.iter().map(|r| r.load).collect();
    loads.sort_by(f64::total_cmp);
    loads.dedup();
    loads
}

fn pct(v: f64) -> String {
    format!("{:.1}%", v * 100.0)
}

/// Writes `report.md`, `repeats.json` and two charts (fraction of the ceiling, smooth goodput:
/// mean and 95% interval over the repeats) into `dir`, above the repeats' own reports.
pub fn write_report(dir: &Path, title: &str, runs: &[Repeat], prov: &Provenance) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let Some(first) = runs.first() else { anyhow::bail!("no repeats to report") };
    let (rows, paired) = summarize(runs);
    let axis = first.spec.axis;
    let json = serde_json::json!({
        "title": title,
        "provenance": prov,
        "axis": axis,
        "seeds": runs.iter().map(|r| r.seed).collect::<Vec<_>>(),
        "repeat_dirs": runs.iter().map(|r| &r.dir).collect::<Vec<_>>(),
        "run_orders": runs.iter().map(|r| &r.order).collect::<Vec<_>>(),
        "side_by_side": first.side_by_side,
        "workload": runs.iter().map(|r| &r.spec.workload_desc).collect::<Vec<_>>(),
        "params": first.spec.info.params,
        "targets": rows,
        "paired": paired,
    });
    std::fs::write(dir.join("repeats.json"), serde_json::to_string_pretty(&json)?)?;
    let labels: Vec<&String> = first.series.iter().map(|(l, _)| l).collect();
    let chart = |name: &str, title: &str, unit: &str, f: fn(&TargetAtLoad) -> &Spread, ceiling: bool| Chart {
        name: name.into(),
        title: title.into(),
        x_desc: axis.describe().into(),
        y_desc: unit.into(),
        lines: labels
            .iter()
            .map(|l| {
                let mine: Vec<&TargetAtLoad> = rows.iter().filter(|r| &r.label == *l).collect();
                Line { label: (*l).clone(), points: mine.iter().map(|r| (r.load, f(r).mean)).collect(), errors: mine.iter().map(|r| f(r).ci95).collect() }
            })
            .collect(),
        threshold: None,
        ceiling: ceiling.then(|| Line::new("ceiling", loads(&rows).into_iter().map(|l| (l, 1.0)).collect())),
    };
    write_chart(
        dir,
        &chart(
            "ceiling_fraction",
            "Smooth goodput / ceiling (mean and 95% interval over the repeats)",
            "fraction of the ceiling",
            |r| &r.ceiling_fraction,
            true,
        ),
    )?;
    write_chart(
        dir,
        &chart(
            "smooth_goodput",
            "Smooth goodput (mean and 95% interval over the repeats)",
            "benefit / s (closed loop: per request)",
            |r| &r.smooth_goodput,
            false,
        ),
    )?;
    std::fs::write(dir.join("report.md"), markdown(title, runs, &rows, &paired, prov))?;
    Ok(())
}

fn markdown(title: &str, runs: &[Repeat], rows: &[TargetAtLoad], paired: &[Paired], prov: &Provenance) -> String {
    let first = &runs[0];
    let unit = first.spec.axis.unit();
    let mut md = format!("# {title}\n\n{}", prov.markdown());
    let seeds: Vec<String> = runs.iter().map(|r| format!("[{}]({}/report.md)", r.seed, r.dir)).collect();
    let _ = writeln!(md, "- Repeats: {} with seeds {} (each a full A/B report: its points, logs and plots)", runs.len(), seeds.join(", "));
    let _ = writeln!(md, "- Workload of the first repeat: {}", first.spec.workload_desc);
    let orders: Vec<String> = runs.iter().map(|r| format!("{}: {}", r.seed, r.order.join(", "))).collect();
    if first.side_by_side {
        let _ = writeln!(
            md,
            "- Side by side: in each repeat every target ran at the same time on the same machine (`--side-by-side`), so a \
             drift of the machine's speed slows them together; the started servers' CPUs rotate from one repeat to the \
             next: {}",
            orders.join("; ")
        );
    } else {
        let _ = writeln!(
            md,
            "- Run order, rotated so that each repeat starts with the next target and a drift of the machine's speed over a \
             repeat does not always favour the same one: {}",
            orders.join("; ")
        );
    }
    let _ = writeln!(md, "{}", crate::sweep::smooth_goodput_line(&first.spec.info.params));
    let _ = writeln!(
        md,
        "- Each repeat is measured and its ceiling set as a single A/B report says (its own Theta). Here, per load and target: \
         the fraction of the ceiling in every repeat, their median, their mean `±` the half-width of its 95% interval over the \
         repeats (Student's t), and the pooled fraction (all repeats' benefit over all their ceilings). Within a repeat every \
         target gets the same prompts, arrivals and clients, so the paired difference below is the comparison to read.\n"
    );
    md.push_str("![fraction of the ceiling](ceiling_fraction.svg)\n\n## Fraction of the ceiling\n");
    for load in &loads(rows) {
        let _ = writeln!(
            md,
            "\n### {load} {unit}\n\n| target | per repeat | median | mean ± 95% | pooled | rejected (median) | left (median) | TPOT p50 served (median) | counted |\n|---|---|---|---|---|---|---|---|---|"
        );
        for r in rows.iter().filter(|r| r.load == *load) {
            let per: Vec<String> = r.ceiling_fraction.values.iter().map(|v| pct(*v)).collect();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} ± {:.1} pt | {} | {} | {} | {:.0} ms | {} |",
                r.label,
                per.join(", "),
                pct(r.ceiling_fraction.median),
                pct(r.ceiling_fraction.mean),
                r.ceiling_fraction.ci95 * 100.0,
                pct(r.pooled_ceiling_fraction),
                pct(r.rejected.median),
                pct(r.abandoned.median),
                r.tpot_p50_served.median * 1e3,
                r.counted.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", "),
            );
        }
    }
    if !paired.is_empty() {
        md.push_str("\n## Paired differences (same seed, same workload)\n\n| load | first | minus | per repeat (points) | mean ± 95% (points) | first ahead in |\n|---|---|---|---|---|---|\n");
        for d in paired {
            let per: Vec<String> = d.difference.values.iter().map(|v| format!("{:+.1}", v * 100.0)).collect();
            let _ = writeln!(
                md,
                "| {} {unit} | {} | {} | {} | {:+.1} ± {:.1} | {} of {} |",
                d.load,
                d.first,
                d.other,
                per.join(", "),
                d.difference.mean * 100.0,
                d.difference.ci95 * 100.0,
                d.ahead,
                d.difference.values.len()
            );
        }
    }
    md.push_str("\nEvery number: `repeats.json`; each repeat's points (`points/*.json.gz`), server logs and plots: its `seed-S/` directory.\n");
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_takes_the_middle_of_the_sorted_values() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
        let s = Spread::of(vec![0.9, 0.8, 1.0]);
        assert!((s.mean - 0.9).abs() < 1e-12 && s.median == 0.9);
        // s = 0.1, t(2) = 4.303: 4.303 * 0.1 / sqrt(3) = 0.2484.
        assert!((s.ci95 - 0.2484).abs() < 1e-3, "{}", s.ci95);
    }
}

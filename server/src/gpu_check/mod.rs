//! `pace gpu-check`: one command that says whether this binary works on this GPU and how fast.
//!
//! Parts, each runnable alone (deploy/gpu-check.sh runs them one by one, each under its own
//! timeout, so one failing part cannot eat the others' time):
//! - `kernels`: the CUDA paged-attention and KV-cache-write ops against the CPU ops on random
//!   inputs (docs/reliability.md's cases and tolerances), every kernel path;
//! - `model`: logits of `dummy:smollm2-135m` (fixed seed) on the GPU against the CPU, over a
//!   mixed batch of prefill chunks and decodes, in f32 and in bf16;
//! - `bench`: `dummy:llama-3-8b` in bf16: decode step time at 1k contexts against the memory
//!   bandwidth floor, prefill against the measured bf16 matmul rate, paged-attention bandwidth at
//!   4k context; ceilings (device-to-device copy, an 8192^3 matmul) measured first;
//! - `summary`: one table from the parts' JSON files (and a `pace bench ab` report, if any).
//!
//! Every part writes `DIR/<part>.json` (rows of check, value, target, status) and prints
//! `PASS`/`FAIL`/`SKIP` lines. Without a usable GPU (the CPU build, no driver, no device) the GPU
//! parts say so and record SKIP. The code is device-agnostic: it only asks candle for a device.

mod bench;
mod kernels;
mod model;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use candle_core::Device;
use serde::{Deserialize, Serialize};

/// Arguments of `pace gpu-check`.
#[derive(Debug, clap::Args)]
pub struct GpuCheckArgs {
    /// Parts to run, in order: kernels, model, bench, summary (default: all four).
    #[arg(value_parser = ["kernels", "model", "bench", "summary"])]
    pub parts: Vec<String>,
    /// Directory for the parts' JSON results (and the summary).
    #[arg(long, default_value = "gpu-check-out")]
    pub out: PathBuf,
    /// The GPU: cuda or cuda:N.
    #[arg(long, default_value = "cuda")]
    pub device: String,
    /// Smaller and fewer cases and repetitions (a smoke test).
    #[arg(long)]
    pub quick: bool,
    /// Directory of a `pace bench ab` report to fold into the summary.
    #[arg(long)]
    pub ab_dir: Option<PathBuf>,
}

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Status {
    #[serde(rename = "PASS")]
    Pass,
    #[serde(rename = "FAIL")]
    Fail,
    #[serde(rename = "SKIP")]
    Skip,
    /// A measurement with no pass/fail target.
    #[serde(rename = "INFO")]
    Info,
}

impl Status {
    fn of(ok: bool) -> Self {
        if ok {
            Self::Pass
        } else {
            Self::Fail
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Skip => "SKIP",
            Self::Info => "INFO",
        }
    }
}

/// One line of a part's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub check: String,
    pub value: String,
    pub target: String,
    pub status: Status,
}

/// A part's results, as written to `DIR/<part>.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PartReport {
    pub part: String,
    pub status: Status,
    pub note: String,
    pub rows: Vec<Row>,
}

impl PartReport {
    fn new(part: &str) -> Self {
        Self { part: part.to_string(), status: Status::Pass, note: String::new(), rows: Vec::new() }
    }

    /// Records and prints one row; a failing row fails the part.
    fn row(&mut self, check: impl Into<String>, value: impl Into<String>, target: impl Into<String>, status: Status) {
        let row = Row { check: check.into(), value: value.into(), target: target.into(), status };
        println!("{} {}: {} {} (target {})", row.status.label(), self.part, row.check, row.value, row.target);
        if status == Status::Fail {
            self.status = Status::Fail;
        }
        self.rows.push(row);
    }

    fn skip(part: &str, why: &str) -> Self {
        println!("SKIP {part}: {why}");
        Self { part: part.to_string(), status: Status::Skip, note: why.to_string(), rows: Vec::new() }
    }

    fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("{}.json", self.part));
        std::fs::write(&path, serde_json::to_string_pretty(self)?).with_context(|| format!("writing {}", path.display()))
    }
}

/// The GPU, or why there is none.
fn gpu(spec: &str) -> std::result::Result<Device, String> {
    if !spec.starts_with("cuda") {
        return Err(format!("--device {spec}: gpu-check needs cuda or cuda:N"));
    }
    match pace_models::loader::parse_device(spec) {
        Ok(d) if !d.is_cpu() => Ok(d),
        Ok(_) => Err("no CUDA device".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Runs `pace gpu-check`. Fails (exit status 1) when a part fails; skipped parts do not fail.
pub fn run(args: &GpuCheckArgs) -> Result<()> {
    let all = ["kernels", "model", "bench", "summary"];
    let parts: Vec<&str> = if args.parts.is_empty() { all.to_vec() } else { args.parts.iter().map(String::as_str).collect() };
    let mut failed = Vec::new();
    for part in parts {
        if part == "summary" {
            let table = summary(&args.out, args.ab_dir.as_deref())?;
            println!("\n{table}");
            std::fs::create_dir_all(&args.out)?;
            std::fs::write(args.out.join("summary.md"), &table)?;
            continue;
        }
        let report = match gpu(&args.device) {
            Err(why) => PartReport::skip(part, &format!("no usable GPU: {why}")),
            Ok(dev) => {
                let result = match part {
                    "kernels" => kernels::run(&dev, args.quick),
                    "model" => model::run(&dev, args.quick),
                    _ => bench::run(&dev, args.quick),
                };
                result.unwrap_or_else(|e| {
                    println!("FAIL {part}: {e:#}");
                    PartReport { part: part.to_string(), status: Status::Fail, note: format!("{e:#}"), rows: Vec::new() }
                })
            }
        };
        report.write(&args.out)?;
        if report.status == Status::Fail {
            failed.push(part);
        }
    }
    if !failed.is_empty() {
        anyhow::bail!("gpu-check failed: {}", failed.join(", "));
    }
    Ok(())
}

/// One markdown table of every part's rows found in `dir`, plus a `pace bench ab` headline.
pub fn summary(dir: &Path, ab_dir: Option<&Path>) -> Result<String> {
    let mut t = String::from("| part | check | value | target | status |\n|---|---|---|---|---|\n");
    for part in ["kernels", "model", "bench"] {
        let path = dir.join(format!("{part}.json"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            t.push_str(&format!("| {part} | (did not run or did not finish) | | | FAIL |\n"));
            continue;
        };
        let r: PartReport = serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        if r.rows.is_empty() || !r.note.is_empty() {
            t.push_str(&format!("| {part} | {} | | | {} |\n", cell(&r.note), r.status.label()));
        }
        for row in &r.rows {
            t.push_str(&format!("| {part} | {} | {} | {} | {} |\n", cell(&row.check), cell(&row.value), cell(&row.target), row.status.label()));
        }
    }
    if let Some(ab) = ab_dir {
        t.push_str(&ab_rows(ab));
    }
    Ok(t)
}

fn cell(s: &str) -> String {
    s.replace('|', "/").replace('\n', " ")
}

/// Rows for a `pace bench ab` report: each policy's peak smooth goodput and token goodput.
fn ab_rows(dir: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(dir.join("sweep.json")) else {
        return "| ab | smooth vs fcfs (no sweep.json: did not run or did not finish) | | | FAIL |\n".into();
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return "| ab | smooth vs fcfs (unreadable sweep.json) | | | FAIL |\n".into();
    };
    let mut out = String::new();
    for h in v.get("headlines").and_then(|h| h.as_array()).into_iter().flatten() {
        let label = h.get("label").and_then(|l| l.as_str()).unwrap_or("?");
        let peak = h.get("smooth_peak").and_then(|p| p.get(1)).and_then(|p| p.as_f64());
        let tok = h.get("max_token_goodput").and_then(|p| p.as_f64());
        out.push_str(&format!(
            "| ab | {label}: peak smooth goodput / max token goodput | {} / {} | (A/B, no target) | INFO |\n",
            peak.map_or("-".into(), |p| format!("{p:.1}")),
            tok.map_or("-".into(), |p| format!("{p:.1} tok/s"))
        ));
    }
    if out.is_empty() {
        out.push_str("| ab | smooth vs fcfs (no headlines in sweep.json) | | | FAIL |\n");
    }
    out
}

/// Largest relative (to `max(1, |b|)`) and absolute differences between two equal-length slices,
/// NaN counting as infinitely far.
pub(crate) fn max_errors(a: &[f32], b: &[f32]) -> (f64, f64) {
    let mut rel = 0f64;
    let mut abs = 0f64;
    for (&x, &y) in a.iter().zip(b) {
        let d = (x as f64 - y as f64).abs();
        let d = if d.is_nan() { f64::INFINITY } else { d };
        abs = abs.max(d);
        rel = rel.max(d / (y as f64).abs().max(1.0));
    }
    (rel, abs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_every_gpu_part_is_skipped_and_the_summary_says_so() {
        let dir = std::env::temp_dir().join(format!("pace-gpu-check-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let args = GpuCheckArgs { parts: vec![], out: dir.clone(), device: "cuda".into(), quick: true, ab_dir: None };
        if gpu("cuda").is_ok() {
            return; // a GPU is here: nothing to say about the no-GPU path
        }
        run(&args).expect("skipped parts do not fail");
        let table = std::fs::read_to_string(dir.join("summary.md")).unwrap();
        for part in ["kernels", "model", "bench"] {
            assert!(table.contains(&format!("| {part} | no usable GPU")), "{table}");
        }
        assert!(table.contains("SKIP"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The parts' harnesses, pointed at the CPU: the CPU against itself must pass.
    #[test]
    fn kernel_and_model_checks_pass_with_the_cpu_standing_in_for_the_gpu() {
        let r = kernels::run(&Device::Cpu, true).unwrap();
        assert_eq!(r.status, Status::Pass, "{:#?}", r.rows);
        assert!(r.rows.len() >= 7 * 4);
        let argmax: Vec<&Row> = r.rows.iter().filter(|row| row.check.starts_with("argmax_rows")).collect();
        assert_eq!(argmax.len(), 3, "{:#?}", r.rows);
        assert!(argmax.iter().all(|row| row.value.starts_with("16 of 16") && row.status == Status::Pass));
        let r = model::run(&Device::Cpu, true).unwrap();
        assert_eq!(r.status, Status::Pass, "{:#?}", r.rows);
        let steps = r.rows.iter().find(|row| row.check.contains("execute()")).expect("the execute() row");
        assert_eq!(steps.value, "52/52 agree", "4 sequences x (1 prefill + 12 decode steps)");
    }

    #[test]
    fn errors_treat_nan_as_infinitely_far() {
        assert_eq!(max_errors(&[1.0, 2.0], &[1.0, 2.5]), (0.2, 0.5));
        assert_eq!(max_errors(&[f32::NAN], &[0.0]).0, f64::INFINITY);
    }
}

//! Where a report came from (evaluation.md, point 11): the command, the commit, the machine and
//! the date, written at the top of every report so a reader can rerun it.

use serde::{Deserialize, Serialize};

/// A report's origin.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// The command line, shell-quoted.
    pub command: String,
    /// `git rev-parse HEAD` of the working directory (`-dirty` with uncommitted changes to
    /// tracked files), or `unknown` outside a checkout.
    pub commit: String,
    /// CPU model, logical cores and memory of this machine.
    pub machine: String,
    /// UTC date and time, `YYYYMMDD-HHMMSS`.
    pub date: String,
}

fn quote(arg: &str) -> String {
    if !arg.is_empty() && arg.chars().all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c)) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

fn git(args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("git").args(args).stderr(std::process::Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn meminfo_gib() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: f64 = text.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / (1024.0 * 1024.0))
}

fn cpu_model() -> Option<String> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

/// This process's provenance: its own command line with the binary named `pace`.
pub fn collect() -> Provenance {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut() {
        *first = "pace".into();
    }
    collect_for(&args.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" "))
}

/// Provenance of `command`.
pub fn collect_for(command: &str) -> Provenance {
    let commit = match git(&["rev-parse", "HEAD"]) {
        Some(c) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{c}-dirty")
            } else {
                c
            }
        }
        None => "unknown".into(),
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let machine = format!(
        "{}, {cores} logical cores, {}",
        cpu_model().unwrap_or_else(|| std::env::consts::ARCH.to_string()),
        meminfo_gib().map_or("memory unknown".to_string(), |g| format!("{g:.0} GiB"))
    );
    let date = crate::report::utc_stamp(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()));
    Provenance { command: command.to_string(), commit, machine, date }
}

impl Provenance {
    /// Markdown lines for the top of a report.
    pub fn markdown(&self) -> String {
        format!("- Command: `{}`\n- Commit: `{}`\n- Machine: {}\n- Date (UTC): {}\n", self.command, self.commit, self.machine, self.date)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_what_a_shell_would_split() {
        assert_eq!(quote("--goodput"), "--goodput");
        assert_eq!(quote("ttft:500 tpot:50"), "'ttft:500 tpot:50'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        let p = collect_for("pace sim");
        assert!(p.markdown().contains("`pace sim`") && p.machine.contains("logical cores"));
        assert_eq!(p.date.len(), 15);
    }
}

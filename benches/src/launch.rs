//! Starting and stopping `pace serve` for `pace bench ab --scheduler ...`.
//!
//! Each policy gets a fresh server on a free 127.0.0.1 port, its output in a log file next to
//! the report. It is ready when `GET /health` answers 200; it is stopped with SIGTERM (pace
//! drains and exits) and killed if it has not exited after a timeout. A server still running
//! when its handle is dropped (an error on the way) is killed.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

/// How to start the server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// The `pace` binary.
    pub bin: PathBuf,
    /// Extra arguments after `serve --host --port --scheduler` (model, KV cache, ...).
    pub args: Vec<String>,
    /// Seconds to wait for `/health`.
    pub start_timeout: f64,
    /// Seconds between SIGTERM and SIGKILL.
    pub stop_timeout: f64,
    /// Directory for the server logs.
    pub log_dir: PathBuf,
}

/// A running `pace serve`.
#[derive(Debug)]
pub struct ServeProcess {
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
    stop_timeout: f64,
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

impl ServeProcess {
    /// Starts `bin serve --host 127.0.0.1 --port P --scheduler POLICY ARGS...`.
    pub fn spawn(cfg: &ServeConfig, policy: &str) -> Result<Self> {
        Self::spawn_on(cfg, policy, &[])
    }

    /// [`Self::spawn`], the server and every thread it starts confined to `cpus` (Linux CPU
    /// numbers; empty: wherever the system puts them). Side-by-side A/Bs give each server its
    /// own CPUs, so that they share the machine's speed but not its cores.
    pub fn spawn_on(cfg: &ServeConfig, policy: &str, cpus: &[usize]) -> Result<Self> {
        let port = free_port()?;
        std::fs::create_dir_all(&cfg.log_dir).with_context(|| format!("creating {}", cfg.log_dir.display()))?;
        // Policies with constants set (`smooth:KEY=VALUE`) name their log file by a slug.
        let log = cfg.log_dir.join(format!("serve-{}.log", crate::sweep::slug(policy)));
        let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(&cfg.bin);
        cmd.args(["serve", "--host", "127.0.0.1", "--port", &port.to_string(), "--scheduler", policy])
            .args(&cfg.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if !cpus.is_empty() {
            pin(&mut cmd, cpus)?;
        }
        let child = cmd.spawn().with_context(|| format!("starting {} serve", cfg.bin.display()))?;
        Ok(Self { child: Some(child), base_url: format!("http://127.0.0.1:{port}"), log, stop_timeout: cfg.stop_timeout })
    }

    /// Waits until `/health` answers 200, the process exits (an error with its log's tail), or
    /// `timeout` seconds pass.
    pub async fn wait_ready(&mut self, client: &reqwest::Client, timeout: f64) -> Result<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(timeout);
        let url = format!("{}/health", self.base_url);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    bail!("pace serve exited before it was ready ({status}); log {}:\n{}", self.log.display(), log_tail(&self.log));
                }
            }
            let probe = client.get(&url).timeout(Duration::from_secs(2)).send().await;
            if probe.is_ok_and(|r| r.status().is_success()) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("pace serve not ready after {timeout} s; log {}:\n{}", self.log.display(), log_tail(&self.log));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGTERM, then SIGKILL after the stop timeout. Returns the exit status.
    pub async fn stop(mut self) -> Result<ExitStatus> {
        let Some(mut child) = self.child.take() else { bail!("pace serve already exited") };
        // SAFETY: kill(2) on the pid of a child we own and have not reaped.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(self.stop_timeout);
        loop {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            if tokio::time::Instant::now() >= deadline {
                child.kill().ok();
                return Ok(child.wait()?);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().ok();
            child.wait().ok();
        }
    }
}

/// Parses a CPU list as `taskset -c` takes it: `0`, `0,2`, `0-7`, `0-3,8-11`.
pub fn parse_cpus(s: &str) -> std::result::Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let bad = || format!("'{s}' is not a CPU list like 0, 0,2 or 0-7");
        let (lo, hi): (usize, usize) = (lo.parse().map_err(|_| bad())?, hi.parse().map_err(|_| bad())?);
        if lo > hi || hi >= libc::CPU_SETSIZE as usize {
            return Err(bad());
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Confines the command's process to `cpus` from before it runs (its threads inherit the set).
#[cfg(target_os = "linux")]
fn pin(cmd: &mut Command, cpus: &[usize]) -> Result<()> {
    use std::os::unix::process::CommandExt;
    // SAFETY: an all-zero cpu_set_t is the empty set; CPU_SET writes inside it for numbers below
    // CPU_SETSIZE, which the loop checks before each call.
    let set = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c >= libc::CPU_SETSIZE as usize {
                bail!("CPU {c} is past the largest this system can name");
            }
            libc::CPU_SET(c, &mut set);
        }
        set
    };
    // SAFETY: the closure runs in the forked child before exec and only makes one system call,
    // which is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn pin(_cmd: &mut Command, _cpus: &[usize]) -> Result<()> {
    bail!("pinning a server to CPUs needs Linux")
}

/// The last lines of a log, for error messages.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_taskset_takes_them() {
        assert_eq!(parse_cpus("0"), Ok(vec![0]));
        assert_eq!(parse_cpus("3,1"), Ok(vec![1, 3]));
        assert_eq!(parse_cpus("0-3,8-9,2"), Ok(vec![0, 1, 2, 3, 8, 9]));
        for bad in ["", "a", "3-1", "1-", "-1", "0,,1", "99999"] {
            assert!(parse_cpus(bad).is_err(), "{bad}");
        }
    }
}

/// The server a single-server bench (`soak`, `hostile`) drives: a running one, or `pace serve`
/// started on a free port.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// A running pace server; without it, `pace serve` is started on a free port.
    #[arg(long)]
    pub base_url: Option<String>,
    /// Policy of the started server.
    #[arg(long, default_value = "smooth", value_parser = pace_scheduler::policy::parse_name)]
    pub scheduler: String,
    /// `pace` binary for the started server (default: this one).
    #[arg(long)]
    pub pace_bin: Option<PathBuf>,
    /// `--model` of the started server (default: pace's default model).
    #[arg(long)]
    pub serve_model: Option<String>,
    /// Extra argument for the started server (repeatable), e.g. --serve-arg=--kv-cache-memory=1GiB.
    #[arg(long, allow_hyphen_values = true)]
    pub serve_arg: Vec<String>,
    /// Seconds to wait for the started server's /health.
    #[arg(long, default_value_t = 600.0)]
    pub server_start_timeout: f64,
}

impl ServerArgs {
    /// The base URL, a description for the report, and the started server (None for
    /// `--base-url`), its log under `log_dir`.
    pub async fn start(&self, client: &reqwest::Client, log_dir: &Path) -> Result<(String, String, Option<ServeProcess>)> {
        if let Some(u) = &self.base_url {
            return Ok((u.trim_end_matches('/').to_string(), u.clone(), None));
        }
        let bin = match &self.pace_bin {
            Some(b) => b.clone(),
            None => std::env::current_exe().context("locating the pace binary; pass --pace-bin")?,
        };
        let mut args = Vec::new();
        if let Some(m) = &self.serve_model {
            args.extend(["--model".to_string(), m.clone()]);
        }
        args.extend(self.serve_arg.iter().cloned());
        let desc = format!("pace serve --scheduler {} {}", self.scheduler, args.join(" ")).trim().to_string();
        let cfg = ServeConfig { bin, args, start_timeout: self.server_start_timeout, stop_timeout: 60.0, log_dir: log_dir.to_path_buf() };
        eprintln!("starting {desc}");
        let mut s = ServeProcess::spawn(&cfg, &self.scheduler)?;
        s.wait_ready(client, cfg.start_timeout).await?;
        Ok((s.base_url.clone(), desc, Some(s)))
    }
}

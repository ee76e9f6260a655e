//! `pace bench ab --client aiperf|guidellm|vllm`: the A/B's load driven by a benchmark tool pace
//! did not write, and scored by `pace bench score` (one implementation of the metrics).
//!
//! Each target runs every load in turn (a fresh `pace serve` per policy); each load gets its own
//! prompts (seed `SEED + 1000 * repeat + load index`), since one seed would repeat the prompts
//! and the prefix cache would then make later loads' prefill nearly free. The tools draw their
//! synthetic prompts with the model's tokenizer through `transformers`; pace writes it as a
//! Hugging Face `tokenizer.json` from the model's GGUF ([`export_tokenizer`]), so no hub is
//! needed. Random prompts of `--random-input-len` tokens ask for exactly `--random-output-len`
//! tokens with `ignore_eos`, as `pace bench` does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::args::{AbArgs, Client, WorkloadArgs};
use crate::launch::ServeProcess;
use crate::score::formats::Level;
use crate::score::{score_paths, Score};

/// One run of a tool at one load.
#[derive(Debug, Clone)]
pub struct Job {
    /// Which tool.
    pub client: Client,
    /// Its executable.
    pub exe: String,
    /// Server base URL.
    pub base_url: String,
    /// Model name to send.
    pub model: String,
    /// A directory with `tokenizer.json` and `tokenizer_config.json`.
    pub tokenizer_dir: PathBuf,
    /// `/v1/completions` or `/v1/chat/completions`.
    pub endpoint: String,
    /// Prompt tokens.
    pub input_len: usize,
    /// Output tokens (ignore_eos).
    pub output_len: usize,
    /// Requests to send.
    pub num_prompts: usize,
    /// Prompt (and arrival) seed.
    pub seed: u64,
    /// Clients or request rate.
    pub level: Level,
    /// Where the tool writes its export.
    pub out: PathBuf,
}

fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{}", x as i64)
    } else {
        format!("{x}")
    }
}

impl Job {
    /// The tool's command line (program first).
    pub fn command(&self) -> Vec<String> {
        let s = |x: &str| x.to_string();
        let out = self.out.display().to_string();
        let tok = self.tokenizer_dir.display().to_string();
        let chat = self.endpoint == "/v1/chat/completions";
        match self.client {
            Client::Aiperf => {
                let mut c = vec![s(&self.exe), s("profile"), s("--model"), self.model.clone(), s("--url"), self.base_url.clone()];
                c.extend([s("--endpoint-type"), s(if chat { "chat" } else { "completions" }), s("--streaming")]);
                c.extend([s("--tokenizer"), tok]);
                c.extend([s("--synthetic-input-tokens-mean"), self.input_len.to_string(), s("--synthetic-input-tokens-stddev"), s("0")]);
                c.extend([s("--output-tokens-mean"), self.output_len.to_string(), s("--output-tokens-stddev"), s("0")]);
                c.extend([s("--extra-inputs"), s("ignore_eos:true")]);
                c.extend([s("--request-count"), self.num_prompts.to_string(), s("--random-seed"), self.seed.to_string()]);
                match self.level {
                    Level::Concurrency(n) => c.extend([s("--concurrency"), num(n)]),
                    Level::Rate(r) => c.extend([s("--request-rate"), num(r), s("--arrival-pattern"), s("poisson")]),
                }
                c.extend([s("--artifact-dir"), out, s("--ui-type"), s("none")]);
                c
            }
            Client::Guidellm => {
                let profile = match self.level {
                    Level::Concurrency(n) => format!("kind=concurrent,streams={}", num(n)),
                    Level::Rate(r) => format!("kind=poisson,rate={}", num(r)),
                };
                vec![
                    s(&self.exe),
                    s("run"),
                    s("--backend"),
                    format!(
                        "{{\"kind\":\"openai_http\",\"target\":\"{}\",\"model\":\"{}\",\"request_format\":\"{}\",\"extras\":{{\"body\":{{\"ignore_eos\":true}}}}}}",
                        self.base_url, self.model, self.endpoint
                    ),
                    s("--profile"),
                    profile,
                    s("--constraint"),
                    format!("kind=max_requests,count={}", self.num_prompts),
                    s("--data"),
                    format!("kind=synthetic_text,prompt_tokens={},output_tokens={}", self.input_len, self.output_len),
                    s("--tokenizer"),
                    format!("kind=huggingface_auto,model={tok}"),
                    s("--seed"),
                    format!("kind=static,value={}", self.seed),
                    s("--output"),
                    format!("kind=json,path={out}/benchmarks.json"),
                    s("--disable-console-interactive"),
                ]
            }
            Client::Vllm => {
                let mut c = vec![s(&self.exe), s("bench"), s("serve"), s("--backend"), s(if chat { "openai-chat" } else { "openai" })];
                c.extend([s("--base-url"), self.base_url.clone(), s("--endpoint"), self.endpoint.clone(), s("--model"), self.model.clone()]);
                c.extend([s("--tokenizer"), tok, s("--dataset-name"), s("random")]);
                c.extend([s("--random-input-len"), self.input_len.to_string(), s("--random-output-len"), self.output_len.to_string()]);
                c.extend([s("--ignore-eos"), s("--num-prompts"), self.num_prompts.to_string(), s("--seed"), self.seed.to_string()]);
                match self.level {
                    Level::Concurrency(n) => c.extend([s("--max-concurrency"), num(n), s("--request-rate"), s("inf")]),
                    Level::Rate(r) => c.extend([s("--request-rate"), num(r)]),
                }
                c.extend([s("--save-result"), s("--save-detailed"), s("--result-dir"), out, s("--result-filename"), s("result.json")]);
                c
            }
        }
    }

    /// Runs the tool (its output in `out/client.log`), killing it after `time_limit` seconds.
    pub async fn run(&self, time_limit: f64) -> Result<()> {
        std::fs::create_dir_all(&self.out).with_context(|| format!("creating {}", self.out.display()))?;
        let cmd = self.command();
        let log = std::fs::File::create(self.out.join("client.log"))?;
        let mut child = tokio::process::Command::new(&cmd[0])
            .args(&cmd[1..])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {} (install it with pip, or name it with --client-bin)", cmd[0]))?;
        let status = match tokio::time::timeout(Duration::from_secs_f64(time_limit), child.wait()).await {
            Ok(s) => s?,
            Err(_) => {
                let _ = child.kill().await;
                bail!("{} ran past --time-limit ({time_limit} s); see {}", cmd[0], self.out.join("client.log").display());
            }
        };
        if !status.success() {
            bail!("{} exited with {status}; see {}", cmd[0], self.out.join("client.log").display());
        }
        Ok(())
    }
}

/// Writes the tokenizer of `tokenizer` (a GGUF, a Hugging Face directory or `tokenizer.json`,
/// `dummy:NAME`, or pace's default model) into `dir` as `tokenizer.json` and
/// `tokenizer_config.json`, the files `transformers.AutoTokenizer` loads; returns `dir`.
pub fn export_tokenizer(tokenizer: Option<&Path>, dir: &Path) -> Result<PathBuf> {
    let t = crate::dataset::load_tokenizer(tokenizer)?;
    let json = t.hf_encoder_json().context("this tokenizer (SentencePiece) has no Hugging Face form to hand to the benchmark tools")?;
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("tokenizer.json"), json)?;
    let piece = |id: Option<u32>| id.and_then(|i| t.token_str(i)).map(String::from);
    let config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": piece(t.bos_token_id()),
        "eos_token": piece(t.eos_token_id()),
        "model_max_length": 8192,
    });
    std::fs::write(dir.join("tokenizer_config.json"), serde_json::to_string_pretty(&config)?)?;
    Ok(dir.to_path_buf())
}

/// The directory name of a load.
pub fn level_dir(l: Level) -> String {
    match l {
        Level::Concurrency(c) => format!("c{}", num(c)),
        Level::Rate(r) => format!("r{}", num(r)),
    }
}

/// One scored run of the A/B.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AbRow {
    /// Repeat index (0-based) and its base seed.
    pub repeat: usize,
    /// Target label.
    pub target: String,
    /// The load.
    pub level: Level,
    /// The tool's command for it.
    pub command: Vec<String>,
    /// Its score.
    pub score: Score,
}

/// `pace bench ab --client`.
pub async fn ab(a: &AbArgs, client: Client) -> Result<()> {
    let prov = crate::provenance::collect();
    let w: &WorkloadArgs = &a.workload;
    if w.dataset_name != "random" {
        bail!("--client drives the tool's own synthetic prompts: only --dataset-name random (--random-input-len, --random-output-len)");
    }
    if a.side_by_side || a.loads.resume || !a.serve_cpus.is_empty() {
        bail!("--client runs the targets one after another: --side-by-side, --resume and --serve-cpus are not supported with it");
    }
    if !a.labels.is_empty() && a.labels.len() != a.base_urls.len() {
        bail!("--labels needs one label per --base-urls entry");
    }
    if w.num_prompts > w.max_requests {
        bail!("--num-prompts {} exceeds the hard cap --max-requests {}", w.num_prompts, w.max_requests);
    }
    let levels: Vec<Level> = if a.loads.max_concurrencies.is_empty() {
        a.loads.request_rates.iter().map(|&r| Level::Rate(r)).collect()
    } else {
        a.loads.max_concurrencies.iter().map(|&c| Level::Concurrency(c as f64)).collect()
    };
    if levels.is_empty() || levels.iter().any(|l| matches!(l, Level::Rate(r) | Level::Concurrency(r) if !(r.is_finite() && *r > 0.0))) {
        bail!("give positive --request-rates or --max-concurrencies");
    }
    let binary = w.slo.binary()?;
    let params = w.slo.params(binary.unwrap_or_default());
    let dir = a.loads.result_dir.clone().unwrap_or_else(|| PathBuf::from(format!("pace-bench-ab-{}", client.exe())));
    std::fs::create_dir_all(&dir)?;
    let tokenizer_dir = export_tokenizer(w.tokenizer.as_deref(), &dir.join("tokenizer"))?;
    let exe = a.client_bin.clone().unwrap_or_else(|| client.exe().to_string());
    let http = crate::client::http_client(4)?;
    let cfg = crate::args::serve_config(a, &dir)?;
    let base_seed = w.seed.unwrap_or(0);
    let n_targets = a.base_urls.len() + a.scheduler.len();
    let mut rows = Vec::new();
    for r in 0..a.repeats as usize {
        for k in 0..n_targets {
            // The order rotates from one repeat to the next, as `ab --repeats` does.
            let j = (k + r) % n_targets;
            let (label, server, base_url) = if j < a.base_urls.len() {
                let url = a.base_urls[j].clone();
                (a.labels.get(j).cloned().unwrap_or_else(|| url.clone()), None, url)
            } else {
                let policy = &a.scheduler[j - a.base_urls.len()];
                let cfg = cfg.as_ref().context("a policy target without a server configuration")?;
                eprintln!("starting pace serve --scheduler {policy}");
                let mut server = ServeProcess::spawn(cfg, policy)?;
                server.wait_ready(&http, cfg.start_timeout).await?;
                let url = server.base_url.clone();
                (policy.clone(), Some(server), url)
            };
            let model = match &w.model {
                Some(m) => m.clone(),
                None => crate::client::first_model(&http, &base_url, w.api_key.as_deref()).await?.0,
            };
            for (i, &level) in levels.iter().enumerate() {
                let sub = if a.repeats > 1 { dir.join(format!("repeat-{}", r + 1)) } else { dir.clone() };
                let job = Job {
                    client,
                    exe: exe.clone(),
                    base_url: base_url.clone(),
                    model: model.clone(),
                    tokenizer_dir: tokenizer_dir.canonicalize()?,
                    endpoint: w.endpoint.clone(),
                    input_len: w.random_input_len,
                    output_len: w.random_output_len,
                    num_prompts: w.num_prompts,
                    seed: base_seed.wrapping_add(1000 * r as u64 + i as u64),
                    level,
                    out: std::path::absolute(sub.join(&label).join(level_dir(level)))?,
                };
                eprintln!("[{label}] {} at {}", client.exe(), level_dir(level));
                job.run(w.time_limit).await?;
                let mut scores = score_paths(std::slice::from_ref(&job.out), None, params, binary.is_some(), None)
                    .with_context(|| format!("scoring {}", job.out.display()))?;
                for mut s in scores.drain(..) {
                    s.series = label.clone();
                    s.level = Some(level);
                    rows.push(AbRow { repeat: r, target: label.clone(), level, command: job.command(), score: s });
                }
            }
            if let Some(server) = server {
                let status = server.stop().await?;
                if !status.success() {
                    eprintln!("warning: pace serve --scheduler {label} exited with {status}");
                }
            }
        }
    }
    let report = report(&prov, client, a, &rows, binary.is_some());
    std::fs::write(dir.join("report.md"), report)?;
    std::fs::write(dir.join("scores.json"), serde_json::to_string_pretty(&rows)?)?;
    // One line per target at the median over repeats.
    let medians: Vec<Score> = median_rows(&rows).into_iter().map(|(_, _, s)| s).collect();
    crate::score::plot(&dir, &medians, binary.is_some())?;
    println!("wrote {}", dir.join("report.md").display());
    Ok(())
}

/// Per (target, level): the repeat whose benefit per request sent is the median (the lower
/// middle one for an even count), in target then load order.
fn median_rows(rows: &[AbRow]) -> Vec<(String, Level, Score)> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in rows {
        let k = (r.target.clone(), level_dir(r.level));
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(t, l)| {
            let mut of: Vec<&AbRow> = rows.iter().filter(|r| r.target == t && level_dir(r.level) == l).collect();
            of.sort_by(|a, b| a.score.benefit_per_request_sent.total_cmp(&b.score.benefit_per_request_sent));
            let m = of[(of.len() - 1) / 2];
            (t, m.level, m.score.clone())
        })
        .collect()
}

fn report(prov: &crate::provenance::Provenance, client: Client, a: &AbArgs, rows: &[AbRow], has_slo: bool) -> String {
    let w = &a.workload;
    let mut out = format!("# pace bench ab --client {}\n\n{}\n", client.exe(), prov.markdown());
    out.push_str(&format!(
        "\nLoad driven by **{}** (a client pace did not write), {} requests per load, {} prompt tokens, {} output tokens \
         (ignore_eos), endpoint {}; each load its own prompts (seed {} + 1000 x repeat + load index), each policy a fresh \
         server; scored by `pace bench score` with reading rate {} tok/s, alpha {}, penalty {}. Rerun with the command above; \
         score any run again with `pace bench score DIR` (the tools' exports are under `<target>/<load>/`).\n\n",
        client.exe(),
        w.num_prompts,
        w.random_input_len,
        w.random_output_len,
        w.endpoint,
        w.seed.unwrap_or(0),
        w.slo.reading_rate,
        w.slo.alpha,
        w.slo.penalty,
    ));
    if let Some(first) = rows.first() {
        out.push_str(&format!("The tool's command for the first run:\n\n```\n{}\n```\n\n", first.command.join(" ")));
    }
    if a.repeats > 1 {
        out.push_str(&format!("## Medians over {} repeats (the run with the median benefit per request sent)\n\n", a.repeats));
    } else {
        out.push_str("## Results\n\n");
    }
    let medians: Vec<Score> = median_rows(rows)
        .into_iter()
        .map(|(t, _, mut s)| {
            s.source = t;
            s
        })
        .collect();
    out.push_str(&crate::score::table(&medians, has_slo));
    if a.repeats > 1 {
        out.push_str("\n## Every repeat\n\n");
        let all: Vec<Score> = rows
            .iter()
            .map(|r| {
                let mut s = r.score.clone();
                s.source = format!("{} (repeat {})", r.target, r.repeat + 1);
                s
            })
            .collect();
        out.push_str(&crate::score::table(&all, has_slo));
    }
    out.push_str("\n![benefit per request sent](benefit-per-request-sent.svg)\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(client: Client, level: Level) -> Job {
        Job {
            client,
            exe: client.exe().into(),
            base_url: "http://127.0.0.1:9".into(),
            model: "m".into(),
            tokenizer_dir: "/t".into(),
            endpoint: "/v1/completions".into(),
            input_len: 256,
            output_len: 128,
            num_prompts: 40,
            seed: 7,
            level,
            out: "/o".into(),
        }
    }

    /// `vllm bench serve` is not installed here to run for real (AIPerf and GuideLLM are, in
    /// tests/score.rs): its command must at least ask for the per-request export `score` reads,
    /// with the load in vLLM's terms.
    #[test]
    fn vllm_command_asks_for_the_detailed_export() {
        let c = job(Client::Vllm, Level::Concurrency(8.0)).command().join(" ");
        for want in
            ["vllm bench serve", "--save-result --save-detailed", "--result-dir /o", "--max-concurrency 8 --request-rate inf", "--ignore-eos", "--seed 7"]
        {
            assert!(c.contains(want), "{want}: {c}");
        }
        let c = job(Client::Vllm, Level::Rate(0.5)).command().join(" ");
        assert!(c.contains("--request-rate 0.5") && !c.contains("--max-concurrency"), "{c}");
        let c = job(Client::Aiperf, Level::Rate(0.5)).command().join(" ");
        assert!(c.contains("--request-rate 0.5 --arrival-pattern poisson") && c.contains("--artifact-dir /o"), "{c}");
        assert_eq!(level_dir(Level::Rate(0.5)), "r0.5");
        assert_eq!(level_dir(Level::Concurrency(8.0)), "c8");
    }
}

//! Default sampling parameters, as vLLM's `--generation-config` and
//! `--override-generation-config` set them: a request that leaves a parameter out gets the
//! model's own recommendation (its `generation_config.json`) rather than the API's neutral
//! default, and the operator can override either.
//!
//! Read from the file: `temperature`, `top_p`, `top_k`, `min_p`, `repetition_penalty` and
//! `max_new_tokens` (the default `max_tokens`); other keys are ignored, as vLLM ignores them.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use pace_models::loader::ModelSource;
use serde_json::Value;

/// Sampling parameters a request gets when it sends none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingDefaults {
    /// `temperature`.
    pub temperature: f64,
    /// `top_p`.
    pub top_p: f64,
    /// `top_k`; 0 is off.
    pub top_k: u32,
    /// `min_p`.
    pub min_p: f64,
    /// `repetition_penalty`.
    pub repetition_penalty: f64,
    /// Default `max_tokens` (still within the request's share of `--max-request-output-tokens`
    /// and the context); `None`: that share.
    pub max_tokens: Option<usize>,
}

impl Default for SamplingDefaults {
    /// The OpenAI API's neutral defaults.
    fn default() -> Self {
        Self { temperature: 1.0, top_p: 1.0, top_k: 0, min_p: 0.0, repetition_penalty: 1.0, max_tokens: None }
    }
}

impl SamplingDefaults {
    /// Sets the parameters `v` (a JSON object) names; `from` names it in errors.
    pub fn apply(&mut self, v: &Value, from: &str) -> Result<()> {
        let Some(obj) = v.as_object() else { bail!("{from}: not a JSON object") };
        let num = |k: &str, lo: f64, hi: f64| -> Result<Option<f64>> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => match x.as_f64() {
                    Some(f) if f >= lo && f <= hi => Ok(Some(f)),
                    _ => bail!("{from}: {k} must be a number in [{lo}, {hi}], got {x}"),
                },
            }
        };
        if let Some(t) = num("temperature", 0.0, 2.0)? {
            self.temperature = t;
        }
        if let Some(p) = num("top_p", 0.0, 1.0)? {
            if p == 0.0 {
                bail!("{from}: top_p must be above 0");
            }
            self.top_p = p;
        }
        if let Some(k) = num("top_k", -1.0, u32::MAX as f64)? {
            if k.fract() != 0.0 {
                bail!("{from}: top_k must be an integer");
            }
            self.top_k = if k <= 0.0 { 0 } else { k as u32 };
        }
        if let Some(m) = num("min_p", 0.0, 1.0)? {
            self.min_p = m;
        }
        if let Some(r) = num("repetition_penalty", 0.0, 10.0)? {
            if r == 0.0 {
                bail!("{from}: repetition_penalty must be above 0");
            }
            self.repetition_penalty = r;
        }
        if let Some(n) = num("max_new_tokens", 1.0, (1u64 << 40) as f64)? {
            if n.fract() != 0.0 {
                bail!("{from}: max_new_tokens must be an integer");
            }
            self.max_tokens = Some(n as usize);
        }
        Ok(())
    }

    /// The parameters that differ from the API's defaults, for the start-up log.
    pub fn describe(&self) -> String {
        let d = Self::default();
        let mut parts = Vec::new();
        if self.temperature != d.temperature {
            parts.push(format!("temperature={}", self.temperature));
        }
        if self.top_p != d.top_p {
            parts.push(format!("top_p={}", self.top_p));
        }
        if self.top_k != d.top_k {
            parts.push(format!("top_k={}", self.top_k));
        }
        if self.min_p != d.min_p {
            parts.push(format!("min_p={}", self.min_p));
        }
        if self.repetition_penalty != d.repetition_penalty {
            parts.push(format!("repetition_penalty={}", self.repetition_penalty));
        }
        if let Some(n) = self.max_tokens {
            parts.push(format!("max_tokens={n}"));
        }
        parts.join(" ")
    }
}

/// Where `--generation-config auto` looks: next to the model's files.
fn model_config_file(source: &ModelSource) -> Option<PathBuf> {
    let p = match source {
        ModelSource::Hub { inner, .. } => return model_config_file(inner),
        ModelSource::HfDir(dir) => dir.join("generation_config.json"),
        ModelSource::Gguf(file) => file.parent()?.join("generation_config.json"),
        ModelSource::Default | ModelSource::Dummy { .. } => return None,
    };
    p.is_file().then_some(p)
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))
}

/// Resolves `--generation-config` (`auto`: the model's `generation_config.json` when it has one;
/// `vllm`: the API's neutral defaults, vLLM's name for them; or a directory holding a
/// `generation_config.json`, or that file) and then `--override-generation-config` (a JSON
/// object). Returns the defaults and where they came from (`None`: nowhere, the neutral ones).
pub fn resolve(source: &ModelSource, flag: &str, overrides: Option<&str>) -> Result<(SamplingDefaults, Option<String>)> {
    let mut d = SamplingDefaults::default();
    let file = match flag {
        "auto" => model_config_file(source),
        "vllm" => None,
        path => {
            let p = PathBuf::from(path);
            let file = if p.is_dir() { p.join("generation_config.json") } else { p };
            if !file.is_file() {
                bail!("--generation-config {path}: no generation_config.json there (use auto, vllm, or a directory or file that has one)");
            }
            Some(file)
        }
    };
    let mut from = Vec::new();
    if let Some(f) = &file {
        d.apply(&read_json(f)?, &f.display().to_string())?;
        from.push(f.display().to_string());
    }
    if let Some(o) = overrides {
        let v: Value = serde_json::from_str(o).context("--override-generation-config: not JSON")?;
        d.apply(&v, "--override-generation-config")?;
        from.push("--override-generation-config".to_string());
    }
    Ok((d, (!from.is_empty()).then(|| from.join(" and "))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_what_vllm_reads_and_checks_it() {
        let mut d = SamplingDefaults::default();
        d.apply(&json!({"temperature": 0.6, "top_p": 0.9, "top_k": 50, "do_sample": true, "max_new_tokens": 256, "eos_token_id": [1, 2]}), "t").unwrap();
        assert_eq!(d, SamplingDefaults { temperature: 0.6, top_p: 0.9, top_k: 50, max_tokens: Some(256), ..SamplingDefaults::default() });
        assert_eq!(d.describe(), "temperature=0.6 top_p=0.9 top_k=50 max_tokens=256");
        for bad in [json!({"temperature": 3}), json!({"top_p": 0}), json!({"top_k": 1.5}), json!({"max_new_tokens": 0}), json!({"min_p": "x"}), json!([1])] {
            assert!(SamplingDefaults::default().apply(&bad, "t").is_err(), "{bad}");
        }
        // top_k -1 is off, as in vLLM.
        let mut d = SamplingDefaults { top_k: 5, ..SamplingDefaults::default() };
        d.apply(&json!({"top_k": -1}), "t").unwrap();
        assert_eq!(d.top_k, 0);
    }

    #[test]
    fn auto_finds_the_file_beside_the_model_and_overrides_win() {
        let dir = std::env::temp_dir().join(format!("pace-genconfig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("generation_config.json"), r#"{"temperature": 0.2, "top_p": 0.9}"#).unwrap();
        let gguf = ModelSource::Gguf(dir.join("model.gguf"));
        let (d, from) = resolve(&gguf, "auto", None).unwrap();
        assert_eq!((d.temperature, d.top_p), (0.2, 0.9));
        assert!(from.unwrap().ends_with("generation_config.json"));
        let (d, _) = resolve(&ModelSource::HfDir(dir.clone()), "auto", Some(r#"{"temperature": 0}"#)).unwrap();
        assert_eq!((d.temperature, d.top_p), (0.0, 0.9));
        assert_eq!(resolve(&gguf, "vllm", None).unwrap(), (SamplingDefaults::default(), None));
        assert_eq!(resolve(&ModelSource::Default, "auto", None).unwrap().0, SamplingDefaults::default());
        assert_eq!(resolve(&ModelSource::Default, dir.to_str().unwrap(), None).unwrap().0.temperature, 0.2);
        assert!(resolve(&ModelSource::Default, "/nonexistent", None).is_err());
        assert!(resolve(&ModelSource::Default, "auto", Some("{")).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}

//! Models by Hugging Face id, from the local Hugging Face cache, offline.
//!
//! `--model org/name` finds the repository where `huggingface_hub` (and so vLLM, TGI and
//! `hf download`) put it: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`. A repository lives in
//! `models--org--name/`; `refs/main` holds the commit whose `snapshots/<commit>/` is the model
//! (its files are symlinks into `blobs/`). A snapshot with `config.json` and safetensors is a
//! Hugging Face model directory; one with `.gguf` files is a GGUF repository, whose file is
//! chosen with `org/name:FILE.gguf` (not needed when it holds one). Nothing is downloaded.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// What an id resolved to.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    /// A snapshot directory holding `config.json` and safetensors.
    HfDir(PathBuf),
    /// One GGUF file of a snapshot.
    Gguf(PathBuf),
}

/// Whether `spec` reads as a Hugging Face id, `org/name` or `org/name:FILE.gguf` (and not as a
/// path: no leading `.` or `/`, one slash, no `..`).
pub fn looks_like_id(spec: &str) -> bool {
    let (repo, file) = split(spec);
    let ok_part = |s: &str| !s.is_empty() && s != "." && s != ".." && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    let Some((org, name)) = repo.split_once('/') else { return false };
    ok_part(org) && ok_part(name) && !org.starts_with('.') && file.is_none_or(|f| f.ends_with(".gguf") && !f.contains(".."))
}

fn split(spec: &str) -> (&str, Option<&str>) {
    match spec.split_once(':') {
        Some((repo, file)) => (repo, Some(file)),
        None => (spec, None),
    }
}

/// The hub cache directories to look in, in order, from the environment.
pub fn hub_dirs() -> Vec<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    let mut dirs = Vec::new();
    if let Some(d) = var("HF_HUB_CACHE").or_else(|| var("HUGGINGFACE_HUB_CACHE")) {
        dirs.push(d);
    }
    if let Some(h) = var("HF_HOME") {
        dirs.push(h.join("hub"));
    }
    if let Some(x) = var("XDG_CACHE_HOME") {
        dirs.push(x.join("huggingface").join("hub"));
    }
    if let Some(home) = var("HOME") {
        dirs.push(home.join(".cache").join("huggingface").join("hub"));
    }
    dirs.dedup();
    dirs
}

/// Resolves `spec` (`org/name[:FILE.gguf]`) in the first of `dirs` that holds the repository.
pub fn resolve(spec: &str, dirs: &[PathBuf]) -> Result<Resolved> {
    let (repo, file) = split(spec);
    let folder = format!("models--{}", repo.replace('/', "--"));
    let Some(root) = dirs.iter().map(|d| d.join(&folder)).find(|p| p.is_dir()) else {
        let looked = dirs.iter().map(|d| d.join(&folder).display().to_string()).collect::<Vec<_>>().join(", ");
        let get = match file {
            Some(f) => format!("hf download {repo} {f}"),
            None => format!("hf download {repo}"),
        };
        return Err(Error::Invalid(format!(
            "--model {spec}: not in the Hugging Face cache (looked in {}); pace does not download models by id: \
             fetch it with `{get}` (pip install huggingface_hub), or set HF_HUB_CACHE / HF_HOME to where it is",
            if looked.is_empty() { "nowhere: set HF_HUB_CACHE, HF_HOME or HOME".to_string() } else { looked }
        )));
    };
    let snapshot = snapshot(&root, spec)?;
    if let Some(f) = file {
        let path = snapshot.join(f);
        if !path.is_file() {
            return Err(Error::Invalid(format!("--model {spec}: {f} is not in {} (GGUF files there: {})", snapshot.display(), list(&ggufs(&snapshot)))));
        }
        return Ok(Resolved::Gguf(path));
    }
    let has_safetensors =
        std::fs::read_dir(&snapshot).map(|rd| rd.flatten().any(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))).unwrap_or(false);
    if snapshot.join("config.json").is_file() && has_safetensors {
        return Ok(Resolved::HfDir(snapshot));
    }
    let found = ggufs(&snapshot);
    match found.as_slice() {
        [one] => Ok(Resolved::Gguf(snapshot.join(one))),
        [] => Err(Error::Invalid(format!(
            "--model {spec}: the snapshot {} holds neither config.json with safetensors nor a .gguf file \
             (an incomplete download? `hf download {repo}` completes it)",
            snapshot.display()
        ))),
        many => Err(Error::Invalid(format!(
            "--model {spec}: the repository holds {} GGUF files; choose one with --model {repo}:FILE.gguf ({})",
            many.len(),
            list(many)
        ))),
    }
}

/// The snapshot `refs/main` names, or the only snapshot when there is no ref.
fn snapshot(root: &Path, spec: &str) -> Result<PathBuf> {
    let snapshots = root.join("snapshots");
    if let Ok(commit) = std::fs::read_to_string(root.join("refs").join("main")) {
        let dir = snapshots.join(commit.trim());
        if dir.is_dir() {
            return Ok(dir);
        }
        return Err(Error::Invalid(format!("--model {spec}: refs/main names {} but {} is missing (an interrupted download?)", commit.trim(), dir.display())));
    }
    let mut all: Vec<PathBuf> = std::fs::read_dir(&snapshots).map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect()).unwrap_or_default();
    all.sort();
    match all.len() {
        1 => Ok(all.remove(0)),
        0 => Err(Error::Invalid(format!("--model {spec}: {} has no snapshot", root.display()))),
        n => Err(Error::Invalid(format!("--model {spec}: {n} snapshots under {} and no refs/main to choose one", snapshots.display()))),
    }
}

/// `.gguf` file names in `dir` (and one level of subfolders, as some repositories keep
/// quantizations apart), sorted, relative to `dir`.
fn ggufs(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut visit = |d: &Path, prefix: &str, deeper: bool| -> Vec<PathBuf> {
        let mut subdirs = Vec::new();
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if path.is_dir() && deeper {
                subdirs.push(path);
            } else if name.ends_with(".gguf") && path.is_file() {
                out.push(format!("{prefix}{name}"));
            }
        }
        subdirs
    };
    for sub in visit(dir, "", true) {
        let prefix = format!("{}/", sub.file_name().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default());
        visit(&sub, &prefix, false);
    }
    out.sort();
    out
}

fn list(names: &[String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}

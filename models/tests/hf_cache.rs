//! `--model org/name[:FILE.gguf]` from a Hugging Face cache laid out as `huggingface_hub` lays
//! it out: `models--org--name/{refs/main, snapshots/<commit>/, blobs/}`, every snapshot file a
//! relative symlink into `blobs/`.

use std::path::{Path, PathBuf};

use candle_core::Device;
use pace_models::hf_cache::{looks_like_id, resolve, Resolved};
use pace_models::loader::{load, LoadOptions, ModelSource};

/// A repository `org/name` in `hub` with commit `commit` holding `files` (name, contents), each
/// a symlink into blobs/ as the real cache has them; `refs/main` names the commit when `main`.
fn repo(hub: &Path, id: &str, commit: &str, files: &[(&str, &[u8])], main: bool) -> PathBuf {
    let root = hub.join(format!("models--{}", id.replace('/', "--")));
    let snap = root.join("snapshots").join(commit);
    std::fs::create_dir_all(root.join("blobs")).unwrap();
    for (i, (name, data)) in files.iter().enumerate() {
        let blob = format!("{commit}{i:04}");
        std::fs::write(root.join("blobs").join(&blob), data).unwrap();
        let link = snap.join(name);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        let up = "../".repeat(name.matches('/').count() + 2);
        std::os::unix::fs::symlink(format!("{up}blobs/{blob}"), &link).unwrap();
        assert!(link.is_file(), "the symlink {} resolves", link.display());
    }
    if main {
        std::fs::create_dir_all(root.join("refs")).unwrap();
        std::fs::write(root.join("refs").join("main"), commit).unwrap();
    }
    snap
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pace-hf-cache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn ids_are_told_from_paths() {
    for id in ["HuggingFaceTB/SmolLM2-135M-Instruct", "bartowski/Llama-3.2-1B-Instruct-GGUF:Llama-3.2-1B-Instruct-Q4_K_M.gguf", "a/b"] {
        assert!(looks_like_id(id), "{id}");
    }
    for spec in ["model.gguf", "./org/name", "/abs/org/name", "org/name/extra", "../x", "org/..", "org/name:notes.txt", "org/name:../x.gguf", "dummy"] {
        assert!(!looks_like_id(spec), "{spec}");
    }
}

#[test]
fn safetensors_and_gguf_repositories_resolve_through_the_symlinks() {
    let hub = tmp("kinds");
    let st = repo(&hub, "acme/tiny", "c0ffee", &[("config.json", b"{}"), ("model.safetensors", b"x"), ("tokenizer.json", b"{}")], true);
    assert_eq!(resolve("acme/tiny", std::slice::from_ref(&hub)).unwrap(), Resolved::HfDir(st));
    let one = repo(&hub, "acme/tiny-GGUF", "beef01", &[("tiny.Q4_1.gguf", b"GGUF"), ("README.md", b"#")], true);
    assert_eq!(resolve("acme/tiny-GGUF", std::slice::from_ref(&hub)).unwrap(), Resolved::Gguf(one.join("tiny.Q4_1.gguf")));

    // Several GGUF files: the error lists them; naming one picks it (in a subfolder too).
    let many = repo(&hub, "acme/many-GGUF", "abc", &[("m.Q4_1.gguf", b"G"), ("m.Q8_0.gguf", b"G"), ("f16/m.F16.gguf", b"G")], true);
    let err = resolve("acme/many-GGUF", std::slice::from_ref(&hub)).unwrap_err().to_string();
    assert!(err.contains("3 GGUF files") && err.contains("m.Q4_1.gguf, m.Q8_0.gguf") && err.contains("f16/m.F16.gguf"), "{err}");
    assert!(err.contains("--model acme/many-GGUF:FILE.gguf"), "{err}");
    assert_eq!(resolve("acme/many-GGUF:m.Q8_0.gguf", std::slice::from_ref(&hub)).unwrap(), Resolved::Gguf(many.join("m.Q8_0.gguf")));
    assert_eq!(resolve("acme/many-GGUF:f16/m.F16.gguf", std::slice::from_ref(&hub)).unwrap(), Resolved::Gguf(many.join("f16/m.F16.gguf")));
    let err = resolve("acme/many-GGUF:m.Q2_K.gguf", std::slice::from_ref(&hub)).unwrap_err().to_string();
    assert!(err.contains("m.Q2_K.gguf is not in") && err.contains("m.Q4_1.gguf"), "{err}");
    let _ = std::fs::remove_dir_all(&hub);
}

#[test]
fn refs_main_chooses_the_snapshot_and_the_first_cache_holding_the_repo_wins() {
    let (a, b) = (tmp("first"), tmp("second"));
    repo(&b, "acme/two", "old111", &[("old.gguf", b"G")], false);
    let new = repo(&b, "acme/two", "new222", &[("new.gguf", b"G")], true);
    assert_eq!(resolve("acme/two", &[a.clone(), b.clone()]).unwrap(), Resolved::Gguf(new.join("new.gguf")));
    // Without refs/main, two snapshots are ambiguous; one is not.
    std::fs::remove_dir_all(b.join("models--acme--two").join("refs")).unwrap();
    assert!(resolve("acme/two", std::slice::from_ref(&b)).unwrap_err().to_string().contains("2 snapshots"));
    let only = repo(&a, "acme/two", "solo", &[("solo.gguf", b"G")], false);
    assert_eq!(resolve("acme/two", &[a.clone(), b.clone()]).unwrap(), Resolved::Gguf(only.join("solo.gguf")));
    let _ = std::fs::remove_dir_all(&a);
    let _ = std::fs::remove_dir_all(&b);
}

#[test]
fn a_model_not_in_the_cache_says_where_it_looked_and_how_to_get_it() {
    let hub = tmp("missing");
    let err = resolve("acme/absent", std::slice::from_ref(&hub)).unwrap_err().to_string();
    assert!(err.contains(&hub.join("models--acme--absent").display().to_string()), "{err}");
    assert!(err.contains("hf download acme/absent"), "{err}");
    let err = resolve("acme/absent:x.Q4_1.gguf", std::slice::from_ref(&hub)).unwrap_err().to_string();
    assert!(err.contains("hf download acme/absent x.Q4_1.gguf"), "{err}");
    // An incomplete snapshot (no weights) is its own error.
    repo(&hub, "acme/partial", "p1", &[("config.json", b"{}")], true);
    assert!(resolve("acme/partial", std::slice::from_ref(&hub)).unwrap_err().to_string().contains("incomplete download"));
    let _ = std::fs::remove_dir_all(&hub);
}

/// The real default model, put into a fixture cache as a GGUF repository, loads by id and is
/// served under the id, as vLLM serves a model by id.
#[test]
fn a_gguf_repository_loads_by_id() {
    let model = pace_models::fetch::default_model_path().unwrap();
    let hub = tmp("load");
    let root = hub.join("models--acme--smol-GGUF");
    let snap = root.join("snapshots").join("f00d");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(root.join("refs")).unwrap();
    std::fs::write(root.join("refs").join("main"), "f00d\n").unwrap();
    std::os::unix::fs::symlink(&model, snap.join("smol.Q4_1.gguf")).unwrap();
    let source = ModelSource::from_hub("acme/smol-GGUF", std::slice::from_ref(&hub)).unwrap();
    assert_eq!(source.default_name(), "acme/smol-GGUF");
    let lm = load(&source, &LoadOptions { max_model_len: Some(256), ..LoadOptions::on(Device::Cpu) }).unwrap();
    assert_eq!(lm.name, "acme/smol-GGUF");
    assert_eq!(lm.tokenizer.decode(&lm.tokenizer.encode("Hello there", false).unwrap(), false).unwrap(), "Hello there");
    let _ = std::fs::remove_dir_all(&hub);
}

//! The repository's Markdown: every relative link in a tracked `*.md` file (README figures link
//! to their committed reports) names a file or folder git tracks, so a report that moves or gets
//! compressed cannot leave a dead link behind.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("the workspace root")
}

/// `a/b/../c` → `a/c` (no file system access; links may name files that are missing).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// The targets of the inline links `[text](target)` outside fenced code blocks.
fn link_targets(md: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let end = rest.find(|c: char| c == ')' || c.is_whitespace()).unwrap_or(rest.len());
            targets.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    targets
}

#[test]
fn link_targets_are_read_from_inline_links_outside_code() {
    let md = "see [a](docs/a.md#x) and [b](https://x.y) \n```\n[c](nope.md)\n```\n[d](../e.json.gz \"title\")";
    assert_eq!(link_targets(md), ["docs/a.md#x", "https://x.y", "../e.json.gz"]);
    assert_eq!(normalize(Path::new("docs/bench/../sim/./x.md")), Path::new("docs/sim/x.md"));
}

#[test]
fn every_relative_link_in_the_markdown_names_a_tracked_file() {
    let root = root();
    let Ok(out) = Command::new("git").args(["ls-files", "-z"]).current_dir(&root).output() else {
        eprintln!("SKIPPED: no git");
        return;
    };
    if !out.status.success() {
        eprintln!("SKIPPED: not a git checkout");
        return;
    }
    let files: Vec<PathBuf> = out.stdout.split(|&b| b == 0).filter(|p| !p.is_empty()).map(|p| PathBuf::from(String::from_utf8_lossy(p).into_owned())).collect();
    let mut known: BTreeSet<PathBuf> = BTreeSet::new();
    for f in &files {
        known.extend(f.ancestors().filter(|a| !a.as_os_str().is_empty()).map(Path::to_path_buf));
    }
    let mut dead = Vec::new();
    let mut checked = 0;
    for md in files.iter().filter(|f| f.extension().is_some_and(|e| e == "md")) {
        let text = std::fs::read_to_string(root.join(md)).unwrap();
        for target in link_targets(&text) {
            let path = target.split('#').next().unwrap_or("");
            if path.is_empty() || path.contains("://") || path.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let resolved = normalize(&md.parent().unwrap_or(Path::new("")).join(path));
            if !known.contains(&resolved) {
                dead.push(format!("{}: {target}", md.display()));
            }
        }
    }
    assert!(checked > 100, "only {checked} relative links found: the scan is broken");
    assert!(dead.is_empty(), "links to files git does not track:\n{}", dead.join("\n"));
}

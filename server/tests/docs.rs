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

/// The configuration reference cannot drift from the flags: every long flag `pace serve --help`
/// lists (clap's own definitions) has a row in docs/configuration.md, and every row names a
/// flag that exists.
#[test]
fn every_serve_flag_is_in_the_configuration_reference() {
    let out = Command::new(env!("CARGO_BIN_EXE_pace")).args(["serve", "--help"]).output().expect("pace serve --help");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    let flags: BTreeSet<String> = help
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("--") || l.starts_with("-h, --"))
        .filter_map(|l| l.trim_start_matches("-h, ").split([' ', '=', ',']).next().map(str::to_string))
        .filter(|f| f != "--help")
        .collect();
    assert!(flags.len() > 40, "{flags:?}");
    let doc = std::fs::read_to_string(root().join("docs/configuration.md")).unwrap();
    let rows: Vec<&str> = doc.lines().filter(|l| l.starts_with("| `--")).collect();
    let missing: Vec<&String> = flags.iter().filter(|f| !rows.iter().any(|r| r.contains(&format!("`{f}`")))).collect();
    assert!(missing.is_empty(), "flags of `pace serve --help` without a row in docs/configuration.md: {missing:?}");
    let named: BTreeSet<String> = rows
        .iter()
        .flat_map(|r| r.split('|').nth(1).unwrap_or("").split('`').skip(1).step_by(2).map(|f| f.split(' ').next().unwrap_or("").to_string()))
        .filter(|f| f.starts_with("--"))
        .collect();
    let unknown: Vec<&String> = named.iter().filter(|f| !flags.contains(*f) && !help.contains(&format!("[alias: {f}]"))).collect();
    assert!(unknown.is_empty(), "rows of docs/configuration.md naming no flag of `pace serve --help`: {unknown:?}");
}

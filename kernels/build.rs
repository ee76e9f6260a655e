//! With the `cuda` feature, compiles kernels/cuda/*.cu with nvcc into fat binaries (machine code
//! for sm_80 and sm_90, plus compute_90 PTX that newer GPUs compile at load), which
//! `src/cuda.rs` embeds. Without the feature it does nothing, so the CPU build needs no CUDA.
//!
//! nvcc is `$NVCC`, else `$CUDA_HOME/bin/nvcc`, else `nvcc` on the PATH. `PACE_CUDA_ARCHS`
//! (comma-separated compute capabilities, default `80,90`) changes the machine-code targets.
//!
//! ptxas reports every kernel's registers, spills and shared memory (`-Xptxas -v`); build.rs
//! keeps that record as `ptxas.tsv` (embedded, shown by `pace gpu-check kernels`) and warns
//! about any kernel that spills.

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCES: [&str; 4] = ["cache", "attention", "attention_mma", "sample"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=cuda");
    for var in ["NVCC", "CUDA_HOME", "PACE_CUDA_ARCHS", "CARGO_FEATURE_CUDA"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let src = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR")).join("cuda");
    let nvcc = nvcc();
    let archs = std::env::var("PACE_CUDA_ARCHS").unwrap_or_else(|_| "80,90".into());
    let mut gencode: Vec<String> = Vec::new();
    let mut newest = 0u32;
    for a in archs.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let n: u32 = a.parse().unwrap_or_else(|_| panic!("PACE_CUDA_ARCHS: '{a}' is not a compute capability like 90"));
        gencode.push(format!("-gencode=arch=compute_{n},code=sm_{n}"));
        newest = newest.max(n);
    }
    gencode.push(format!("-gencode=arch=compute_{newest},code=compute_{newest}"));
    // The files compile in parallel; each is a few seconds to half a minute of ptxas.
    let jobs: Vec<_> = SOURCES
        .iter()
        .map(|name| {
            let mut cmd = Command::new(&nvcc);
            cmd.arg("-std=c++17")
                .arg("-O3")
                .arg("-fatbin")
                // Compressed fat binaries: a quarter of the size; the driver expands them at load.
                .arg("-Xfatbin=-compress-all")
                .arg("-Xptxas=-v")
                .args(&gencode)
                .arg("-o")
                .arg(out.join(format!("{name}.fatbin")))
                .arg(src.join(format!("{name}.cu")));
            cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
            let child = cmd.spawn().unwrap_or_else(|e| panic!("running {}: {e} (set NVCC or CUDA_HOME)", nvcc.display()));
            (name, child)
        })
        .collect();
    let mut report = String::from("kernel\tarch\tregisters\tspill_stores\tspill_loads\tsmem_bytes\n");
    for (name, child) in jobs {
        let out = child.wait_with_output().expect("waiting for nvcc");
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "nvcc failed on kernels/cuda/{name}.cu:\n{text}");
        for k in ptxas_records(&text) {
            if k.spill_stores + k.spill_loads > 0 {
                println!(
                    "cargo:warning=kernels/cuda/{name}.cu: {} spills on {} ({} bytes stored, {} loaded, {} registers)",
                    k.kernel, k.arch, k.spill_stores, k.spill_loads, k.registers
                );
            }
            report.push_str(&format!("{}\t{}\t{}\t{}\t{}\t{}\n", k.kernel, k.arch, k.registers, k.spill_stores, k.spill_loads, k.smem));
        }
    }
    std::fs::write(out.join("ptxas.tsv"), report).expect("writing ptxas.tsv");
}

/// One kernel's line of ptxas's `-v` report.
struct PtxasRecord {
    kernel: String,
    arch: String,
    registers: u32,
    spill_stores: u32,
    spill_loads: u32,
    smem: u32,
}

/// Parses ptxas's verbose output: a "Compiling entry function 'K' for 'sm_N'" line, then a line
/// with the stack frame and spill bytes, then "Used R registers, ..., S bytes smem, ...".
fn ptxas_records(text: &str) -> Vec<PtxasRecord> {
    let number_before = |line: &str, what: &str| -> Option<u32> {
        let at = line.find(what)?;
        line[..at].split(|c: char| !c.is_ascii_digit()).rfind(|w| !w.is_empty())?.parse().ok()
    };
    let mut out: Vec<PtxasRecord> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let mut parts = rest.split('\'');
            let kernel = parts.next().unwrap_or("").to_string();
            let arch = parts.nth(1).unwrap_or("").to_string();
            out.push(PtxasRecord { kernel, arch, registers: 0, spill_stores: 0, spill_loads: 0, smem: 0 });
        } else if let Some(k) = out.last_mut() {
            if line.contains("bytes spill stores") {
                k.spill_stores = number_before(line, " bytes spill stores").unwrap_or(0);
                k.spill_loads = number_before(line, " bytes spill loads").unwrap_or(0);
            } else if line.contains("Used ") && line.contains(" registers") {
                k.registers = number_before(line, " registers").unwrap_or(0);
                k.smem = number_before(line, " bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

fn nvcc() -> PathBuf {
    if let Some(p) = std::env::var_os("NVCC") {
        return PathBuf::from(p);
    }
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        let p = Path::new(&home).join("bin").join("nvcc");
        if p.exists() {
            return p;
        }
    }
    PathBuf::from("nvcc")
}

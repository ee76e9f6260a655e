//! With the `cuda` feature, compiles kernels/cuda/*.cu with nvcc into fat binaries (machine code
//! for sm_80 and sm_90, plus compute_90 PTX that newer GPUs compile at load), which
//! `src/cuda.rs` embeds. Without the feature it does nothing, so the CPU build needs no CUDA.
//!
//! nvcc is `$NVCC`, else `$CUDA_HOME/bin/nvcc`, else `nvcc` on the PATH. `PACE_CUDA_ARCHS`
//! (comma-separated compute capabilities, default `80,90`) changes the machine-code targets.

use std::path::{Path, PathBuf};
use std::process::Command;

const SOURCES: [&str; 3] = ["cache", "attention", "attention_mma"];

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
    // The three files compile in parallel; each is a few seconds to half a minute of ptxas.
    let jobs: Vec<_> = SOURCES
        .iter()
        .map(|name| {
            let mut cmd = Command::new(&nvcc);
            cmd.arg("-std=c++17")
                .arg("-O3")
                .arg("-fatbin")
                // Compressed fat binaries: a quarter of the size; the driver expands them at load.
                .arg("-Xfatbin=-compress-all")
                .args(&gencode)
                .arg("-o")
                .arg(out.join(format!("{name}.fatbin")))
                .arg(src.join(format!("{name}.cu")));
            let child = cmd.spawn().unwrap_or_else(|e| panic!("running {}: {e} (set NVCC or CUDA_HOME)", nvcc.display()));
            (name, child)
        })
        .collect();
    for (name, child) in jobs {
        let status = child.wait_with_output().expect("waiting for nvcc").status;
        assert!(status.success(), "nvcc failed on kernels/cuda/{name}.cu");
    }
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

//! The CUDA build, on a machine without a GPU (CI): every kernels/cuda/*.cu compiles to machine
//! code for sm_80 and sm_90, and `cargo build --profile cuda-release --features cuda` builds the
//! `pace` binary (target/cuda/cuda-release/pace, stripped, fat LTO), which must stay under 60 MiB
//! (it travels to GPU machines for deploy/gpu-check.sh).
//!
//! tools/cuda-toolchain.sh sets up nvcc 13.0 and the CUDA 13 headers and libraries from the
//! Python package index (about 10 s and 1.2 GB, kept in target/cuda-toolchain) with a link-time
//! stub of the driver library. The build goes to target/cuda, kept between runs: the first one
//! takes 10 to 20 minutes on 2 cores (candle's own CUDA kernels), later ones only rebuild what
//! changed. `PACE_SKIP_CUDA_BUILD=1` skips this test (for quick local runs; CI never sets it).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("the workspace root")
}

/// Runs tools/cuda-toolchain.sh and returns the environment it prints (`export K=V` lines).
fn toolchain(cargo: &str, target: &Path) -> Vec<(String, String)> {
    // The script reads the cudarc sources (driver entry points for the stub) from the registry.
    let fetched = Command::new(cargo).args(["fetch", "--locked"]).current_dir(root()).status().expect("cargo fetch");
    assert!(fetched.success(), "cargo fetch --locked failed");
    let out = Command::new("bash")
        .arg(root().join("tools/cuda-toolchain.sh"))
        .arg(target.join("cuda-toolchain"))
        .output()
        .expect("running tools/cuda-toolchain.sh");
    assert!(out.status.success(), "tools/cuda-toolchain.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let path = std::env::var("PATH").unwrap_or_default();
    let library = std::env::var("LIBRARY_PATH").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| {
            // Expand the two references the script leaves to the caller's environment.
            let v = v.replace("$PATH", &path).replace("${LIBRARY_PATH:+:$LIBRARY_PATH}", &if library.is_empty() { String::new() } else { format!(":{library}") });
            let v = if k == "CUDA_COMPUTE_CAP" { "90".to_string() } else { v };
            (k.to_string(), v)
        })
        .collect()
}

#[test]
fn cuda_kernels_and_the_cuda_binary_build_without_a_gpu() {
    if std::env::var_os("PACE_SKIP_CUDA_BUILD").is_some_and(|v| v == "1") {
        eprintln!("SKIPPED: PACE_SKIP_CUDA_BUILD=1");
        return;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = root().join("target");
    let env = toolchain(&cargo, &target);
    let nvcc = env.iter().find(|(k, _)| k == "CUDA_HOME").map(|(_, v)| Path::new(v).join("bin/nvcc")).expect("CUDA_HOME");

    // Every kernel file, for both architectures, through ptxas.
    let scratch = target.join("cuda-cubins");
    std::fs::create_dir_all(&scratch).unwrap();
    let mut sources: Vec<PathBuf> = std::fs::read_dir(root().join("kernels/cuda"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    sources.sort();
    assert!(sources.len() >= 3, "kernels/cuda has {} .cu files", sources.len());
    for src in &sources {
        for arch in ["sm_80", "sm_90"] {
            let t0 = Instant::now();
            let out = scratch.join(format!("{}.{arch}.cubin", src.file_stem().unwrap().to_string_lossy()));
            let o = Command::new(&nvcc)
                .args(["-std=c++17", "-O3", "-cubin", &format!("-arch={arch}"), "-o"])
                .arg(&out)
                .arg(src)
                .output()
                .expect("running nvcc");
            assert!(o.status.success(), "nvcc -arch={arch} {} failed:\n{}", src.display(), String::from_utf8_lossy(&o.stderr));
            println!("nvcc {arch} {}: {:.1} s", src.display(), t0.elapsed().as_secs_f64());
        }
    }

    // The CUDA build of the binary, into its own target directory.
    let t0 = Instant::now();
    let status = Command::new(&cargo)
        .args(["build", "--profile", "cuda-release", "--locked", "--features", "cuda", "-p", "pace-server", "--bin", "pace"])
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("CARGO_TARGET_DIR", target.join("cuda"))
        // candle's kernel build runs this many nvcc jobs (2 cores here; more starve the machine).
        .env("CUDAFORGE_THREADS", "2")
        .current_dir(root())
        .status()
        .expect("running cargo build --features cuda");
    assert!(status.success(), "cargo build --profile cuda-release --features cuda failed ({status})");
    println!("cargo build --profile cuda-release --features cuda: {:.0} s", t0.elapsed().as_secs_f64());

    let bin = target.join("cuda/cuda-release/pace");
    let size = std::fs::metadata(&bin).expect("the CUDA binary").len();
    println!("CUDA binary {}: {:.1} MiB", bin.display(), size as f64 / (1 << 20) as f64);
    assert!(size < 60 << 20, "the CUDA binary is {size} bytes, over 60 MiB");
}

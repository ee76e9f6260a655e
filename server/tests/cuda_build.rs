//! The CUDA build, on a machine without a GPU (CI): every kernels/cuda/*.cu compiles to machine
//! code for sm_80 and sm_90 (kernels/build.rs, in the build below), and `cargo build --profile cuda-release --features cuda` builds the
//! `pace` binary (target/cuda/cuda-release/pace, stripped, fat LTO), and xz-compresses it
//! (target/cuda/pace.xz: what travels to GPU machines for deploy/gpu-check.sh). The device tool
//! takes the whole working tree plus what it carries, 64 MiB at most, so the repository's tracked
//! files and the compressed binary must fit in that together. The build's ptxas record (kernels/build.rs: registers and spills of every kernel
//! for sm_80 and sm_90) must list every kernel with no spills.
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
    let out =
        Command::new("bash").arg(root().join("tools/cuda-toolchain.sh")).arg(target.join("cuda-toolchain")).output().expect("running tools/cuda-toolchain.sh");
    assert!(out.status.success(), "tools/cuda-toolchain.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let path = std::env::var("PATH").unwrap_or_default();
    let library = std::env::var("LIBRARY_PATH").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| {
            // Expand the two references the script leaves to the caller's environment.
            let v =
                v.replace("$PATH", &path).replace("${LIBRARY_PATH:+:$LIBRARY_PATH}", &if library.is_empty() { String::new() } else { format!(":{library}") });
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
    assert!(nvcc.exists(), "no nvcc at {}", nvcc.display());

    // Every kernel file is one kernels/build.rs compiles (for sm_80 and sm_90, through ptxas:
    // its record is checked below), so none is left out of the binary unbuilt.
    let mut sources: Vec<String> = std::fs::read_dir(root().join("kernels/cuda"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    sources.sort();
    assert!(sources.len() >= 3, "kernels/cuda has {} .cu files", sources.len());
    let build_rs = std::fs::read_to_string(root().join("kernels/build.rs")).unwrap();
    let listed = build_rs.lines().find(|l| l.starts_with("const SOURCES")).expect("kernels/build.rs lists its SOURCES");
    for src in &sources {
        assert!(listed.contains(&format!("\"{src}\"")), "kernels/cuda/{src}.cu is not in kernels/build.rs's SOURCES: {listed}");
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
    assert!(size < 80 << 20, "the CUDA binary is {size} bytes, over 80 MiB");

    // The ptxas record the binary embeds: every kernel of kernels/cuda for both architectures,
    // none spilling registers to local memory.
    let build = target.join("cuda/cuda-release/build");
    let record = std::fs::read_dir(&build)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path().join("out/ptxas.tsv")))
        .filter(|p| p.exists())
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .expect("kernels/build.rs wrote ptxas.tsv");
    let tsv = std::fs::read_to_string(&record).unwrap();
    let rows: Vec<Vec<&str>> = tsv.lines().skip(1).map(|l| l.split('\t').collect()).collect();
    for (kernel, arch) in
        [("pa_simt_bf16_bf16_128_g4", "sm_90"), ("pa_mma_bf16_bf16_128", "sm_80"), ("argmax_bf16", "sm_90"), ("reshape_and_cache_b16", "sm_80")]
    {
        assert!(rows.iter().any(|r| r[0] == kernel && r[1] == arch), "{kernel} on {arch} is missing from {}:\n{tsv}", record.display());
    }
    assert!(rows.len() >= 2 * 36, "{} kernel builds in the record:\n{tsv}", rows.len());
    let spilling: Vec<String> = rows.iter().filter(|r| r.len() >= 5 && (r[3] != "0" || r[4] != "0")).map(|r| r.join(" ")).collect();
    assert!(spilling.is_empty(), "kernels that spill registers: {spilling:#?}");

    // What travels to a GPU host: the binary, xz-compressed (deploy/gpu-check.sh unpacks it).
    let t0 = Instant::now();
    let packed = target.join("cuda/pace.xz");
    let o = Command::new("python3")
        .args(["-c", "import lzma, shutil, sys; shutil.copyfileobj(open(sys.argv[1], 'rb'), lzma.open(sys.argv[2], 'wb', preset=6))"])
        .arg(&bin)
        .arg(&packed)
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let packed_size = std::fs::metadata(&packed).unwrap().len();
    println!("{}: {:.1} MiB in {:.0} s", packed.display(), packed_size as f64 / (1 << 20) as f64, t0.elapsed().as_secs_f64());
    assert!(packed_size < 16 << 20, "the compressed CUDA binary is {packed_size} bytes, over 16 MiB");
    // Together with the repository's tracked files, it must travel in one device call.
    if let Some(tree) = tracked_bytes() {
        println!("tracked files: {:.1} MiB; with the binary: {:.1} MiB", tree as f64 / (1 << 20) as f64, (tree + packed_size) as f64 / (1 << 20) as f64);
        assert!(tree + packed_size < 60 << 20, "tracked files ({tree} bytes) and pace.xz ({packed_size}) are over 60 MiB: a GPU run could not send them");
    }
}

/// The quick form of the size check above, run even where the CUDA build is skipped: the
/// compressed binary has been 10.2 MiB (under the 16 MiB the build test allows it), so the tracked
/// files get 48 MiB of the 60. Committed reports keep raw files over 100 KB gzip-compressed.
#[test]
fn tracked_files_leave_room_for_the_cuda_binary() {
    let files = tracked_files();
    if files.is_empty() {
        eprintln!("SKIPPED: not a git checkout");
        return;
    }
    let tree: u64 = files.iter().map(|(n, _)| n).sum();
    let mut big: Vec<(u64, String)> = files.into_iter().filter(|(n, _)| *n > 300_000).collect();
    big.sort_unstable_by(|a, b| b.cmp(a));
    assert!(
        tree < 48 << 20,
        "tracked files are {:.1} MiB, over the 48 MiB that leaves room for pace.xz in one device call; the largest:\n{big:#?}",
        tree as f64 / (1 << 20) as f64
    );
}

/// Bytes of every file git tracks in the repository (None without git).
fn tracked_bytes() -> Option<u64> {
    let files = tracked_files();
    (!files.is_empty()).then(|| files.iter().map(|(n, _)| n).sum())
}

/// Size and path of every file git tracks (empty without git).
fn tracked_files() -> Vec<(u64, String)> {
    let root = root();
    let Ok(out) = Command::new("git").args(["ls-files", "-z"]).current_dir(&root).output() else {
        return Vec::new();
    };
    if !out.status.success() {
        return Vec::new();
    }
    out.stdout
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .filter_map(|p| Some((std::fs::metadata(root.join(&p)).ok()?.len(), p)))
        .collect()
}

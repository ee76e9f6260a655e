//! `--device` on the CPU build (what CI runs): `cuda` is a clear error at start that names the
//! CUDA build, never a loader failure or a panic; `auto` runs on the CPU and says so. And
//! deploy/gpu-check.sh on a machine without a GPU driver: it unpacks the binary it is given, says
//! what it needs and stops before any part with one clear line.

use std::process::Command;

fn pace(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pace")).args(args).env("RUST_LOG", "info").output().expect("running pace")
}

#[test]
fn cuda_on_the_cpu_build_is_a_clear_error_and_auto_uses_the_cpu() {
    for spec in ["cuda", "cuda:1", "gpu"] {
        let out = pace(&["generate", "--device", spec, "--model", "dummy:smollm2-135m", "--prompt", "hi", "--max-tokens", "1"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "--device {spec}: {err}");
        assert!(err.contains("CPU build") && err.contains("--features cuda"), "--device {spec}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let out = pace(&["generate", "--device", "nonsense", "--model", "dummy:smollm2-135m", "--prompt", "hi"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nonsense"));

    let out = pace(&["generate", "--device", "auto", "--model", "dummy:smollm2-135m", "--prompt", "hi", "--max-tokens", "2"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("using the CPU"), "the log says where it runs: {stderr}");
    assert!(stdout.contains("2 generated tokens"), "{stdout}");
}

/// The GPU check's setup on a machine with no NVIDIA driver (CI): given an xz-compressed binary it
/// unpacks it, prints the environment (what the binary NEEDs, the driver's CUDA version, torch's)
/// and stops early with exit status 2 and one `FAIL setup` line naming the missing driver, without
/// running any part. Skipped where a driver is installed.
#[test]
fn the_gpu_check_stops_early_with_one_line_when_the_driver_is_missing() {
    let has_driver = ["/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/usr/lib64/libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1"]
        .iter()
        .any(|p| std::path::Path::new(p).exists());
    if has_driver {
        eprintln!("SKIPPED: this machine has an NVIDIA driver");
        return;
    }
    let dir = std::env::temp_dir().join(format!("pace-gpu-check-script-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Any dynamically linked ELF binary stands in for pace (a small one: compressing it is quick):
    // the setup reads its NEEDED list and stops before it could run.
    let stand_in = ["/bin/true", "/usr/bin/true"].into_iter().find(|p| std::path::Path::new(p).exists()).unwrap_or(env!("CARGO_BIN_EXE_pace"));
    let packed = dir.join("pace.xz");
    let status = Command::new("python3")
        .args(["-c", "import lzma, shutil, sys; shutil.copyfileobj(open(sys.argv[1], 'rb'), lzma.open(sys.argv[2], 'wb'))"])
        .arg(stand_in)
        .arg(&packed)
        .status()
        .expect("python3");
    assert!(status.success());
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gpu-check.sh");
    let out =
        Command::new("bash").arg(&script).arg(&packed).env("OUT", dir.join("out")).env_remove("LD_LIBRARY_PATH").output().expect("running deploy/gpu-check.sh");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(text.contains("unpacking") && text.contains("NEEDED: ") && text.contains("libc.so.6"), "{text}");
    assert!(text.contains("driver supports CUDA: unknown") && text.contains("torch.version.cuda: "), "{text}");
    let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
    assert!(last.starts_with("FAIL setup: no NVIDIA driver") && last.contains("libcuda.so.1"), "{text}");
    assert!(!text.contains("=== kernels"), "no part runs: {text}");
    let log = std::fs::read_to_string(dir.join("out/gpu-check.log")).unwrap();
    assert!(log.contains("FAIL setup: no NVIDIA driver"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

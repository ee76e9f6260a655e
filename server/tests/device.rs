//! `--device` on the CPU build (what CI runs): `cuda` is a clear error at start that names the
//! CUDA build, never a loader failure or a panic; `auto` runs on the CPU and says so.

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

//! The deployment files (deploy/): promtool checks and alert unit tests, dashboard checks,
//! Kubernetes and compose schema validation, Dockerfile lint, and the end-to-end run of a real
//! Prometheus scraping real `pace serve` instances (this build's binary) under a bounded load,
//! evaluating every dashboard and rule expression. The script installs its own tools.

#[test]
fn deploy_files_check_out_against_a_real_prometheus_and_real_servers() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = std::process::Command::new("bash")
        .arg(root.join("deploy/test/run.sh"))
        .env("PACE_CMD", env!("CARGO_BIN_EXE_pace"))
        .env("PACE_E2E_STRICT", "1")
        .current_dir(&root)
        .status()
        .expect("running deploy/test/run.sh");
    assert!(status.success(), "deploy/test/run.sh failed ({status}); see its output above");
}

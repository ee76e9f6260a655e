//! `pace engine-bench --roofline` on the CPU: the machine's limits are measured, the model's
//! matmul footprint is what its quantized weights hold, and decode and prefill come out as
//! fractions of their limits (below 1 up to the noise of a shared machine).

use std::process::Command;

#[test]
fn roofline_reports_limits_footprint_and_fractions() {
    let out = Command::new(env!("CARGO_BIN_EXE_pace"))
        .args(["engine-bench", "--model", "dummy:smollm2-135m:q4", "--threads", "1", "--prompt-len", "64", "--gen", "16"])
        .args(["--concurrency", "2", "--context", "32", "--agg-gen", "8", "--reps", "1", "--roofline", "--json"])
        .output()
        .expect("running pace");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().to_string();
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let r = &v["roofline"];
    let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
    // SmolLM2-135M's projections and head: 134.5 M weights, 4.5 bits each in the Q4 layout.
    let (params, bytes) = (f("matmul_params"), f("matmul_bytes"));
    assert!((1.3e8..1.4e8).contains(&params), "{params}");
    assert!(bytes > 0.5 * params && bytes < 0.7 * params, "{bytes} bytes for {params} weights");
    assert!(f("bandwidth_1_thread_bytes_s") > 1e8 && f("bandwidth_bytes_s") > 1e8, "{r}");
    assert!((f("decode_limit_tok_s") - f("bandwidth_bytes_s") / bytes).abs() < 1e-6 * f("decode_limit_tok_s"));
    let decode = f("decode_fraction");
    assert!(decode > 0.0 && decode < 2.0, "{decode}");
    if !r["int8_mac_s"].is_null() {
        let prefill = f("prefill_fraction");
        assert!(prefill > 0.0 && prefill < 2.0 && f("fma_flop_s") > 1e9, "{r}");
        assert!((f("prefill_limit_tok_s") - f("int8_mac_s") / params).abs() < 1e-6 * f("prefill_limit_tok_s"));
    }
}

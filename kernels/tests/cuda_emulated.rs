//! pace's CUDA kernels (kernels/cuda/*.cu), run on the host by a small emulation of the CUDA
//! they use (kernels/cuda/emu.h: a thread block as cooperative fibers, warp shuffles and the
//! mma.m16n8k16 fragment layout as the PTX ISA defines them), against a naive f64 reference:
//! every cache and query dtype, head sizes 64 and 128, block sizes 16 and 32, GQA groups 1 to
//! 12, decode and prefill chunks in one batch, split-K partitions, NaN in every unused slot.
//! This checks the kernels' indexing, masking and numerics where there is no GPU (CI); timing,
//! memory ordering and the real instructions are checked by `pace gpu-check` on a GPU.
//!
//! Needs a C++17 compiler (`$CXX`, else `c++`); without one the test says so and passes.

use std::path::Path;
use std::process::Command;

#[test]
fn cuda_kernels_match_the_reference_under_emulation() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda").join("emu_test.cpp");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pace_cuda_emu_test");
    let built = Command::new(&cxx).args(["-std=c++17", "-O2", "-DPACE_EMU", "-o"]).arg(&exe).arg(&src).status();
    match built {
        Err(e) => {
            eprintln!("SKIPPED: no C++ compiler to build the CUDA kernel emulation ({cxx}: {e})");
            return;
        }
        Ok(s) => assert!(s.success(), "{cxx} failed to build {}", src.display()),
    }
    let out = Command::new(&exe).output().expect("running the emulated kernels");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    assert!(out.status.success(), "emulated CUDA kernels disagree with the reference:\n{text}");
}

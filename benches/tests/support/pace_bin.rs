//! The `pace` binary the real-server tests drive: `PACE_BIN`, else the one cargo built beside
//! the test executable (`target/<profile>/deps/<test>-HASH` -> `target/<profile>/pace`).

use std::path::PathBuf;

pub fn pace_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PACE_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable");
    exe.parent().and_then(|d| d.parent()).expect("target dir").join("pace")
}

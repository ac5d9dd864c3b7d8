//! The source tree, for the tests that check it (`structure.rs`, `guide.rs`): where the workspace
//! is, whether its sources are beside the test binary (not in the GPU bundle), and its files.

use std::path::{Path, PathBuf};

/// The workspace root (the folder above `host/`).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host lives in the workspace").to_path_buf()
}

/// Whether the sources (`gpu/src`, `host/src`, `guide/src`) are here; says so where they are not
/// (the GPU bundle carries binaries only: CI checks the tree).
pub fn sources_here(test: &str) -> bool {
    let ws = workspace();
    let here = ["gpu/src/lib.rs", "host/src/lib.rs", "guide/src/SUMMARY.md"].iter().all(|f| ws.join(f).exists());
    if !here {
        eprintln!("{test}: the sources are not beside this binary (GPU bundle); checked in the source tree by CI");
    }
    here
}

/// Every file under `dir` whose name ends with `.ext`, sorted.
pub fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("reading {d:?}: {e}")) {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == ext) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

//! The build script's toolchain check (`host/build.rs` includes this file; `tests/library.rs` tests
//! it). kiln builds its kernels' PTX with `-Zbuild-std=core`, which only a nightly cargo accepts: on
//! another channel the build stops before that step, with a message saying which toolchain kiln
//! needs and how a crate that depends on kiln gets it, instead of cargo's bare "-Z flag" error.

use std::ffi::OsStr;
use std::path::Path;
use std::process::Command;

/// The channel that `rust-toolchain.toml` in `workspace` pins (`nightly-2026-05-20`), if it names one.
pub fn pinned_channel(workspace: &Path) -> Option<String> {
    let text = std::fs::read_to_string(workspace.join("rust-toolchain.toml")).ok()?;
    text.lines().find_map(|line| {
        let value = line.trim().strip_prefix("channel")?.trim_start().strip_prefix('=')?;
        Some(value.trim().trim_matches('"').to_string())
    })
}

/// What `cargo -vV` prints for the cargo at `cargo`, or `None` where it does not run.
pub fn cargo_version(cargo: &OsStr) -> Option<String> {
    let out = Command::new(cargo).arg("-vV").output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok()
}

/// Whether the cargo whose `cargo -vV` output is `version` accepts `-Z` flags: a nightly or a dev
/// build does, and so does any cargo when `bootstrap` (`RUSTC_BOOTSTRAP=1`) is set.
pub fn accepts_z_flags(version: &str, bootstrap: bool) -> bool {
    if bootstrap {
        return true;
    }
    let release = version.lines().find_map(|l| l.strip_prefix("release:")).unwrap_or(version).trim();
    release.contains("-nightly") || release.contains("-dev")
}

/// The message for a build whose cargo (`cargo -vV` output: `version`) does not accept `-Z` flags:
/// which toolchain kiln needs (`pinned`, from `toolchain_file`), and the steps that give it to kiln's
/// repository and to a crate that depends on kiln.
pub fn not_nightly_message(version: &str, pinned: &str, toolchain_file: &Path) -> String {
    let first = version.lines().next().unwrap_or(version).trim();
    format!(
        "kiln compiles its GPU kernels to PTX with `-Zbuild-std=core`, which needs a nightly cargo, and \
         this build runs {first}.\n\
         Build with the nightly that kiln pins in {file} ({pinned}, with the rust-src component):\n\
         - in a crate that depends on kiln: copy that rust-toolchain.toml into the crate's root \
         (beside its Cargo.toml), or run in the crate's directory\n      \
         rustup toolchain install {pinned} --component rust-src\n      \
         rustup override set {pinned}\n\
         - in kiln's repository: rustup reads rust-toolchain.toml there (`rustup toolchain install` \
         once if it is missing).\n\
         See \"Using kiln as a library\" in kiln's README.",
        file = toolchain_file.display()
    )
}

//! Builds the PTX modules the host embeds, so that a fresh clone needs no manual step before
//! `cargo test`. The same builder drives `cargo xtask build-ptx`; both share `target/ptx`.

use std::path::PathBuf;

#[path = "build/toolchain.rs"]
mod toolchain;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest.parent().expect("host/ lives in the workspace").to_path_buf();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let builder = kiln_ptx_builder::Builder::new(&workspace);
    for p in builder.source_paths() {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    println!("cargo:rerun-if-env-changed=KILN_SKIP_PTX");

    // A cargo that refuses -Z flags stops here, with what to do (cargo's own error names no remedy).
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let version = toolchain::cargo_version(&cargo);
    let pinned = toolchain::pinned_channel(&workspace).unwrap_or_else(|| "the pinned nightly".into());
    if let Some(v) = &version
        && !toolchain::accepts_z_flags(v, std::env::var_os("RUSTC_BOOTSTRAP").is_some_and(|b| b == "1"))
    {
        eprintln!("kiln: {}", toolchain::not_nightly_message(v, &pinned, &workspace.join("rust-toolchain.toml")));
        std::process::exit(1);
    }

    let mut table = String::from("/// The PTX modules built from kiln-gpu, by architecture name.\n");
    table.push_str("pub static MODULES: &[(&str, &str)] = &[\n");
    for (arch, _) in kiln_ptx_builder::ARCHS {
        let module = match builder.build(arch) {
            Ok(m) => m,
            Err(e) => {
                // A build script's panic is how cargo reports a failed build; the message says what to do.
                let running = version.as_deref().and_then(|v| v.lines().next()).unwrap_or("an unknown cargo");
                panic!("kiln: {e} (kiln pins {pinned}; this build runs {running})");
            }
        };
        let dest = out.join(format!("kiln_{arch}.ptx"));
        std::fs::write(&dest, &module.text).unwrap_or_else(|e| panic!("kiln: writing {}: {e}", dest.display()));
        table.push_str(&format!("    ({arch:?}, include_str!({:?})),\n", dest.display().to_string()));
    }
    table.push_str("];\n");
    std::fs::write(out.join("ptx_modules.rs"), table).expect("writing ptx_modules.rs");
}

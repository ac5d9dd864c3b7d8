//! Builds the PTX modules the host embeds, so that a fresh clone needs no manual step before
//! `cargo test`. The same builder drives `cargo xtask build-ptx`; both share `target/ptx`.

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let workspace = manifest.parent().expect("host/ lives in the workspace").to_path_buf();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let builder = kiln_ptx_builder::Builder::new(&workspace);
    for p in builder.source_paths() {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    println!("cargo:rerun-if-env-changed=KILN_SKIP_PTX");

    let mut table = String::from("/// The PTX modules built from kiln-gpu, by architecture name.\n");
    table.push_str("pub static MODULES: &[(&str, &str)] = &[\n");
    for (arch, _) in kiln_ptx_builder::ARCHS {
        let module = match builder.build(arch) {
            Ok(m) => m,
            Err(e) => {
                // A build script's panic is how cargo reports a failed build; the message says what to do.
                panic!("kiln: {e}");
            }
        };
        let dest = out.join(format!("kiln_{arch}.ptx"));
        std::fs::write(&dest, &module.text).unwrap_or_else(|e| panic!("kiln: writing {}: {e}", dest.display()));
        table.push_str(&format!("    ({arch:?}, include_str!({:?})),\n", dest.display().to_string()));
    }
    table.push_str("];\n");
    std::fs::write(out.join("ptx_modules.rs"), table).expect("writing ptx_modules.rs");
}

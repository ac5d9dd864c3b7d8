//! The house rules of the source tree, checked on the sources (from the workspace; skipped, with a
//! message, where the sources are not beside the test binary, as in the GPU bundle):
//!
//! - inline PTX (`asm!`, `global_asm!`) lives only in the device library's intrinsics modules
//!   (`gpu/src/*.rs`); kernels and the host call their wrappers;
//! - the host's modules import downward only: CLI -> train -> megakernel / tools -> nn, optim,
//!   checkpoint, data -> tensor -> cuda -> ptx -> error -> dtype, testing, deterministic.

#[path = "source_tree.rs"]
mod source_tree;
use source_tree::{files, sources_here, workspace};

/// The lines of `text` outside `//` comments (enough for these rules: no rule's token appears in
/// a string literal of the sources).
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.split("//").next().unwrap_or("")))
        .filter(|(_, l)| !l.trim().is_empty())
}

#[test]
fn inline_ptx_only_in_the_device_library() {
    if !sources_here("inline_ptx_only_in_the_device_library") {
        return;
    }
    let ws = workspace();
    let intrinsics = ws.join("gpu/src");
    let mut bad = Vec::new();
    let mut seen = 0;
    for dir in ["gpu", "host", "xtask", "tests", "benches"] {
        for f in files(&ws.join(dir), "rs") {
            if f.ends_with("tests/structure.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).expect("a source file");
            for (n, line) in code_lines(&text) {
                if line.contains("asm!") {
                    // the intrinsics modules are the files directly in gpu/src
                    if f.parent() == Some(intrinsics.as_path()) {
                        seen += 1;
                    } else {
                        bad.push(format!("{}:{n}: {}", f.strip_prefix(&ws).unwrap_or(&f).display(), line.trim()));
                    }
                }
            }
        }
    }
    assert!(seen > 0, "no asm! found in gpu/src/*.rs: the rule would be vacuous (did the modules move?)");
    assert!(
        bad.is_empty(),
        "inline PTX outside the device library's intrinsics modules (gpu/src/*.rs); wrap it once there, \
         with a # Safety section, and call the wrapper:\n{}",
        bad.join("\n")
    );
}

/// The host's top-level modules, lowest layer first: a module may import its own layer and those
/// below it.
const LAYERS: &[&[&str]] = &[
    &["dtype", "testing", "deterministic", "attention"],
    &["error"],
    &["ptx"],
    &["cuda"],
    &["tensor"],
    &["nn", "optim", "checkpoint", "data", "corpus", "dist"],
    &["megakernel", "tools"],
    &["train"],
    &["cli"],
];

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The top-level modules `line` names through `crate::` (`crate::a::...` and `crate::{a, b::c}`).
fn crate_imports(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    for (i, _) in line.match_indices("crate::") {
        let rest = &line[i + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            let list = &list[..list.find('}').unwrap_or(list.len())];
            out.extend(list.split(',').map(|p| ident(p.trim())).filter(|p| !p.is_empty()));
        } else {
            out.push(ident(rest));
        }
    }
    out
}

#[test]
fn host_modules_import_downward_only() {
    if !sources_here("host_modules_import_downward_only") {
        return;
    }
    let src = workspace().join("host/src");
    let mut bad = Vec::new();
    let mut edges = 0;
    for f in files(&src, "rs") {
        let rel = f.strip_prefix(&src).expect("under host/src");
        let top =
            rel.components().next().expect("a path").as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let own =
            layer(&top).unwrap_or_else(|| panic!("host/src/{top}: a module missing from LAYERS; give it a layer"));
        let text = std::fs::read_to_string(&f).expect("a source file");
        for (n, line) in code_lines(&text) {
            for m in crate_imports(line) {
                let Some(l) = layer(&m) else { continue }; // re-exported items at the crate root
                edges += 1;
                if l > own {
                    bad.push(format!(
                        "host/src/{}:{n}: {top} (layer {own}) imports {m} (layer {l}): {}",
                        rel.display(),
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(edges > 20, "only {edges} crate:: imports found: the check would be vacuous");
    assert!(
        bad.is_empty(),
        "imports that reach up a layer (move the shared item down, or invert the call):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_import_parser_reads_both_forms() {
    assert_eq!(crate_imports("use crate::error::{Error, Result};"), ["error"]);
    assert_eq!(crate_imports("use crate::{cuda::Device, tensor};"), ["cuda", "tensor"]);
    assert_eq!(crate_imports("x: crate::nn::Activation, y: crate::dtype::DType"), ["nn", "dtype"]);
    assert!(crate_imports("use super::gemm;").is_empty());
}

//! The guide (`guide/src`, an mdBook) kept true, checked without mdbook (from the workspace;
//! skipped, with a message, where the sources are not beside the test binary, as in the GPU bundle):
//!
//! - `SUMMARY.md` lists every chapter that exists, and every `.md` under `guide/src` is listed;
//! - every relative link and image (`[t](path)`, `![a](path)`, `<img src="path">`) outside code
//!   resolves to a file, and its `#anchor`, if any, to a heading of the target (mdBook's ids: the
//!   heading's text lowercased, whitespace to `-`, characters other than letters, digits, `_` and
//!   `-` dropped; a repeated heading gets `-1`, `-2`, ...);
//! - every *kernel-looking name* the guide quotes exists (the rule is at [`kernel_like`]);
//! - every `kiln` command the guide quotes names a subcommand and flags the built binary's
//!   `--help` lists, and its `--kernel NAME` is one `kiln gemm` lists;
//! - every `cargo xtask TASK --flag` the guide quotes names a task of `xtask/src/main.rs`'s `enum
//!   Task` (variants, kebab-cased) and a `#[arg(long)]` field of it;
//! - every file path the guide names, in prose or code (`benches/results/gemm.md`, `sgemm.rs`,
//!   `../x`), is a file of the repository (the rule is at [`named_paths`]).
//!
//! "Quotes" means inside a code span (`` `...` ``) or a fenced code block. Prose outside code is
//! not checked for names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[path = "source_tree.rs"]
mod source_tree;
use source_tree::{files, sources_here, workspace};

/// Known stale references the checks tolerate, as (check, file under guide/src, the quoted item
/// as the failure message shows it). Empty: every reference in the guide resolves. An entry that
/// matches no failure of its check fails that check ("no longer needed"), so none outlives its fix.
const ALLOWED: &[(&str, &str, &str)] = &[];

/// The checks [`ALLOWED`] may name.
const CHECKS: &[&str] = &[
    "relative_links_and_images_resolve",
    "quoted_kernel_names_exist",
    "quoted_kiln_commands_exist",
    "quoted_xtask_commands_exist",
    "named_file_paths_exist",
];

fn guide_src() -> PathBuf {
    workspace().join("guide/src")
}

/// One line of a chapter: its text, and whether it is inside a fenced code block.
struct Line {
    n: usize,
    text: String,
    in_block: bool,
}

struct Chapter {
    /// Path under guide/src, with `/`.
    rel: String,
    lines: Vec<Line>,
}

fn chapters() -> Vec<Chapter> {
    let src = guide_src();
    files(&src, "md")
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(&src).expect("under guide/src").to_string_lossy().replace('\\', "/");
            let text = std::fs::read_to_string(&p).expect("a chapter");
            let mut fence: Option<String> = None;
            let mut lines = Vec::new();
            for (i, l) in text.lines().enumerate() {
                let t = l.trim_start();
                let marker: String = t.chars().take_while(|c| *c == '`' || *c == '~').collect();
                if marker.len() >= 3 && marker.chars().all(|c| c == marker.chars().next().unwrap()) {
                    match &fence {
                        None => {
                            fence = Some(marker);
                            continue;
                        }
                        Some(f) if marker.starts_with(f.as_str()) && t[marker.len()..].trim().is_empty() => {
                            fence = None;
                            continue;
                        }
                        _ => {}
                    }
                }
                lines.push(Line { n: i + 1, text: l.to_string(), in_block: fence.is_some() });
            }
            Chapter { rel, lines }
        })
        .collect()
}

/// The code spans of a prose line (single-backtick or multi-backtick, on one line), and the line
/// with them removed.
fn code_spans(line: &str) -> (Vec<String>, String) {
    let b = line.as_bytes();
    let (mut spans, mut rest) = (Vec::new(), String::new());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'`' {
            let run = b[i..].iter().take_while(|c| **c == b'`').count();
            let open = &line[i..i + run];
            if let Some(end) = line[i + run..].find(open) {
                let close = i + run + end;
                // the closing run must be exactly as long
                if line[close + run..].starts_with('`') {
                    rest.push_str(open);
                    i += run;
                    continue;
                }
                spans.push(line[i + run..close].trim().to_string());
                i = close + run;
                continue;
            }
            rest.push_str(open);
            i += run;
            continue;
        }
        let ch = line[i..].chars().next().expect("a char");
        rest.push(ch);
        i += ch.len_utf8();
    }
    (spans, rest)
}

/// Every piece of quoted code in the guide: (chapter, line number, text) for each code span of a
/// prose line and each line of a code block.
fn quoted(chapters: &[Chapter]) -> Vec<(String, usize, String)> {
    let mut out = Vec::new();
    for c in chapters {
        for l in &c.lines {
            if l.in_block {
                out.push((c.rel.clone(), l.n, l.text.clone()));
            } else {
                for s in code_spans(&l.text).0 {
                    out.push((c.rel.clone(), l.n, s));
                }
            }
        }
    }
    out
}

/// Checks the failures against [`ALLOWED`] and panics with those left, and with the allow-list
/// entries of `check` that matched no failure.
fn report(check: &str, failures: Vec<(String, String, String)>, seen: usize) {
    assert!(CHECKS.contains(&check), "{check}: add it to CHECKS");
    assert!(seen > 0, "{check}: nothing was checked; the rule would be vacuous (did the guide move?)");
    let allowed = |file: &str, item: &str| ALLOWED.iter().any(|(c, f, i)| *c == check && *f == file && *i == item);
    let left: Vec<&str> = failures.iter().filter(|(f, i, _)| !allowed(f, i)).map(|(_, _, msg)| msg.as_str()).collect();
    let unneeded: Vec<String> = ALLOWED
        .iter()
        .filter(|(c, f, i)| *c == check && !failures.iter().any(|(ff, ii, _)| ff == f && ii == i))
        .map(|(_, f, i)| format!("({check:?}, {f:?}, {i:?})"))
        .collect();
    let mut problems = String::new();
    if !left.is_empty() {
        problems += &format!("{} stale reference(s) in the guide:\n{}\n", left.len(), left.join("\n"));
    }
    if !unneeded.is_empty() {
        problems +=
            &format!("ALLOWED entries that match no failure any more (fixed: remove them):\n{}\n", unneeded.join("\n"));
    }
    assert!(problems.is_empty(), "{check}: {problems}");
    eprintln!("{check}: {seen} checked, {} allowed by ALLOWED", failures.len());
}

#[test]
fn allow_list_names_checks_and_chapters() {
    if !sources_here("allow_list_names_checks_and_chapters") {
        return;
    }
    for (c, f, _) in ALLOWED {
        assert!(CHECKS.contains(c), "ALLOWED names the check {c}, which does not exist");
        assert!(guide_src().join(f).exists(), "ALLOWED names guide/src/{f}, which does not exist");
    }
}

// ---------------------------------------------------------------------------------------------
// SUMMARY.md

#[test]
fn summary_lists_every_chapter() {
    if !sources_here("summary_lists_every_chapter") {
        return;
    }
    let src = guide_src();
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).expect("SUMMARY.md");
    let mut listed = BTreeSet::new();
    let mut bad = Vec::new();
    for (i, l) in summary.lines().enumerate() {
        for target in link_targets(l) {
            if target.is_empty() || is_external(&target) {
                continue;
            }
            let path = target.split('#').next().unwrap_or("").to_string();
            if !src.join(&path).is_file() {
                bad.push(format!("SUMMARY.md:{}: lists {path}, which does not exist", i + 1));
            }
            listed.insert(path);
        }
    }
    for c in chapters() {
        if c.rel != "SUMMARY.md" && !listed.contains(&c.rel) {
            bad.push(format!("guide/src/{}: not listed in SUMMARY.md (mdBook would not build it)", c.rel));
        }
    }
    assert!(listed.len() > 10, "SUMMARY.md lists {} chapters; the parser is broken", listed.len());
    assert!(bad.is_empty(), "SUMMARY.md and guide/src disagree:\n{}", bad.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// links and images

fn is_external(t: &str) -> bool {
    t.contains("://") || t.starts_with("mailto:")
}

/// The targets of the inline links and images (`[t](target "title")`, `![a](target)`), of
/// reference definitions (`[x]: target`) and of `<img src="target">` in a line (code removed first
/// by the caller).
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        // the target ends at the matching ')' (one level of nested parentheses allowed)
        let mut depth = 0;
        let mut end = after.len();
        for (j, ch) in after.char_indices() {
            match ch {
                '(' => depth += 1,
                ')' if depth == 0 => {
                    end = j;
                    break;
                }
                ')' => depth -= 1,
                _ => {}
            }
        }
        let t = after[..end].trim();
        let t = t.strip_prefix('<').and_then(|t| t.strip_suffix('>')).unwrap_or(t);
        out.push(t.split_whitespace().next().unwrap_or("").to_string());
        rest = &after[end.min(after.len())..];
    }
    let t = line.trim_start();
    if t.starts_with('[')
        && let Some(i) = t.find("]: ")
        && !t[1..i].contains('[')
    {
        out.push(t[i + 3..].split_whitespace().next().unwrap_or("").to_string());
    }
    let mut rest = line;
    while let Some(i) = rest.find("src=\"") {
        let after = &rest[i + 5..];
        let end = after.find('"').unwrap_or(after.len());
        out.push(after[..end].to_string());
        rest = &after[end..];
    }
    out
}

/// mdBook's id of a heading: its text (Markdown removed) lowercased, whitespace to `-`, and every
/// character other than a letter, digit, `_` or `-` dropped.
fn heading_id(heading: &str) -> String {
    // [text](url) -> text
    let mut text = String::new();
    let mut rest = heading;
    while let Some(i) = rest.find("](") {
        let open = rest[..i].rfind('[').unwrap_or(i);
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..i]);
        let after = &rest[i + 2..];
        rest = &after[after.find(')').map_or(after.len(), |j| j + 1)..];
    }
    text.push_str(rest);
    let text = text.replace(['`', '*'], "");
    text.trim()
        .chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().next().unwrap_or(c))
            } else if c.is_whitespace() {
                Some('-')
            } else {
                None
            }
        })
        .collect()
}

/// The ids of a chapter's headings (ATX headings outside code blocks), repeated ones numbered as
/// mdBook numbers them.
fn anchors(c: &Chapter) -> BTreeSet<String> {
    let mut count: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for l in c.lines.iter().filter(|l| !l.in_block) {
        let t = l.text.trim_start();
        let hashes = t.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && t[hashes..].starts_with(' ') {
            let id = heading_id(t[hashes..].trim().trim_end_matches('#').trim());
            let k = count.entry(id.clone()).or_insert(0);
            out.insert(if *k == 0 { id.clone() } else { format!("{id}-{k}") });
            *k += 1;
        }
    }
    out
}

/// `a/b/../c` -> `a/c` (lexically; `..` above the start is kept).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir if out.file_name().is_some() => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

#[test]
fn relative_links_and_images_resolve() {
    if !sources_here("relative_links_and_images_resolve") {
        return;
    }
    let src = guide_src();
    let chapters = chapters();
    let ids: BTreeMap<String, BTreeSet<String>> = chapters.iter().map(|c| (c.rel.clone(), anchors(c))).collect();
    let mut failures = Vec::new();
    let mut seen = 0;
    for c in &chapters {
        let dir = Path::new(&c.rel).parent().unwrap_or(Path::new("")).to_path_buf();
        for l in c.lines.iter().filter(|l| !l.in_block) {
            for target in link_targets(&code_spans(&l.text).1) {
                if target.is_empty() || is_external(&target) {
                    continue;
                }
                seen += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let rel = if path.is_empty() { PathBuf::from(&c.rel) } else { normalize(&dir.join(path)) };
                let rel_s = rel.to_string_lossy().replace('\\', "/");
                let msg = |why: String| {
                    (c.rel.clone(), target.clone(), format!("guide/src/{}:{}: {target}: {why}", c.rel, l.n))
                };
                if !src.join(&rel).exists() {
                    failures.push(msg(format!("no file guide/src/{rel_s}")));
                } else if rel_s.starts_with("..") {
                    failures.push(msg("outside guide/src: mdBook does not copy it into the book".into()));
                } else if let Some(a) = anchor {
                    match ids.get(&rel_s) {
                        Some(set) if !set.contains(a) => {
                            failures.push(msg(format!("no heading with id `{a}` in {rel_s}")))
                        }
                        None if rel_s.ends_with(".md") => failures.push(msg(format!("{rel_s} is not a chapter"))),
                        _ => {}
                    }
                }
            }
        }
    }
    report("relative_links_and_images_resolve", failures, seen);
}

// ---------------------------------------------------------------------------------------------
// kernel names

/// The identifiers of `text` (maximal runs of ASCII letters, digits and `_`), after expanding
/// one-level brace alternatives as the guide writes them (`sgemm_vec_128x128x{8,16}_8x8`).
fn identifiers(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for t in &expand_braces(text) {
        out.extend(ident_runs(t).into_iter().map(|(_, w)| w.to_string()));
    }
    out
}

/// `text` with its brace alternatives expanded (`x{8,16}_y` -> `x8_y`, `x16_y`): groups that hold
/// only identifier characters and commas, up to four of them.
fn expand_braces(text: &str) -> Vec<String> {
    let mut texts = vec![text.to_string()];
    for _ in 0..4 {
        let mut next = Vec::new();
        for t in &texts {
            let group = t.match_indices('{').find_map(|(i, _)| {
                let j = i + t[i..].find('}')?;
                let inner = &t[i + 1..j];
                let alternatives =
                    inner.contains(',') && inner.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ',');
                alternatives.then_some((i, j))
            });
            match group {
                Some((i, j)) => {
                    for alt in t[i + 1..j].split(',') {
                        next.push(format!("{}{alt}{}", &t[..i], &t[j + 1..]));
                    }
                }
                _ => next.push(t.clone()),
            }
        }
        texts = next;
    }
    texts
}

/// The maximal runs of ASCII letters, digits and `_` in `text`, with their byte offsets.
fn ident_runs(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices().chain(std::iter::once((text.len(), ' '))) {
        let ident = c.is_ascii_alphanumeric() || c == '_';
        match (ident, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, &text[s..i]));
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// The identifiers of quoted code that may name a kernel: [`identifiers`] less the segments of
/// Rust paths (`kiln::cuda::gemm_tuned`: a kernel is never named with `::`).
fn kernel_candidates(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for t in expand_braces(text) {
        for (i, w) in ident_runs(&t) {
            if !t[..i].ends_with("::") && !t[i + w.len()..].starts_with("::") {
                out.push(w.to_string());
            }
        }
    }
    out
}

/// The rule for a *kernel-looking name*: an identifier, in quoted code, that is lower snake case
/// with at least one `_` (`[a-z][a-z0-9]*(_[a-z0-9]+)+`) and whose first segment (before the
/// first `_`) is the first segment of some kernel's name: `sgemm`, `hgemm`, `gemm`, `megakernel`,
/// `mma`, `tma`, `tmem`, `mbarrier`, `softmax`, ... (taken from the embedded PTX's `.entry`
/// names, so a new family of kernels is covered without editing this test).
///
/// Such a name passes when it is
/// - an `.entry` of some architecture's embedded PTX module (`kiln::ptx::embedded`), or
/// - any other identifier of that PTX (a parameter, as in a listing of the PTX), or
/// - not a kernel but something else that exists: an identifier in the code (not the comments) of
///   the workspace's Rust sources (gpu, host, tests, xtask, benches), string literals included
///   (the GPU tests' names, the `kiln gemm --kernel` names of host-side GEMMs and launch
///   variants), or a name a format string there builds (`"gemm_bf16_from_f32_{name}"`, the
///   benchmark's rows). A function declared `#[kernel]` is a kernel: it passes only as a PTX
///   `.entry`.
///
/// Segments of Rust paths (`kiln::cuda::gemm_tuned`) are not kernel names and are not checked.
///
/// So a renamed or deleted kernel, test or function that the guide still quotes fails, and so does
/// a `#[kernel]` function that no architecture's module builds.
fn kernel_like(word: &str, families: &BTreeSet<String>) -> bool {
    let mut parts = word.split('_');
    let first = parts.next().unwrap_or("");
    let snake = word.split('_').count() >= 2
        && word.split('_').all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()))
        && first.starts_with(|c: char| c.is_ascii_lowercase());
    snake && families.contains(first)
}

/// (`.entry` names, all identifiers) of the embedded PTX modules.
fn ptx_names() -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut entries, mut words) = (BTreeSet::new(), BTreeSet::new());
    for arch in kiln::gpu::Arch::ALL {
        let text = kiln::ptx::embedded(arch);
        for l in text.lines() {
            if let Some(i) = l.find(".entry ") {
                let name: String =
                    l[i + 7..].trim_start().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                entries.insert(name);
            }
        }
        words.extend(identifiers(text));
    }
    (entries, words)
}

/// The names the sources know: identifiers of the workspace's Rust code outside `//` comments,
/// the templates of names its format strings build (`"gemm_bf16_from_f32_{name}"`: the prefix
/// and suffix around a `{...}` placeholder), and the names of `#[kernel]` functions.
struct SourceNames {
    words: BTreeSet<String>,
    templates: BTreeSet<(String, String)>,
    kernels: BTreeSet<String>,
}

impl SourceNames {
    /// Whether `w` is a word of the code or a name one of its format strings builds.
    fn knows(&self, w: &str) -> bool {
        self.words.contains(w)
            || self.templates.iter().any(|(pre, suf)| {
                w.len() > pre.len() + suf.len()
                    && w.starts_with(pre.as_str())
                    && w.ends_with(suf.as_str())
                    && w[pre.len()..w.len() - suf.len()].chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            })
    }
}

/// Templates of names in a line of code: an identifier ending in `_` right before a `{...}`
/// placeholder, with the identifier characters right after it.
fn templates(code: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, _) in code.match_indices('{') {
        let pre: String = code[..i].chars().rev().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let pre: String = pre.chars().rev().collect();
        let Some(j) = code[i..].find('}') else { continue };
        let inner = &code[i + 1..i + j];
        if pre.len() >= 3
            && pre.ends_with('_')
            && inner.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            let suf: String =
                code[i + j + 1..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            out.push((pre, suf));
        }
    }
    out
}

fn source_names() -> SourceNames {
    let ws = workspace();
    let (mut words, mut kernels, mut temps) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    for dir in ["gpu", "host", "tests", "xtask", "benches"] {
        for f in files(&ws.join(dir), "rs") {
            if f.ends_with("tests/guide.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&f).expect("a source file");
            let lines: Vec<&str> = text.lines().collect();
            for (i, l) in lines.iter().enumerate() {
                let code = l.split("//").next().unwrap_or("");
                words.extend(identifiers(code));
                temps.extend(templates(code));
                if l.trim_start().starts_with("#[kernel") {
                    // the function the attribute marks: the next line with `fn NAME`
                    for next in lines.iter().skip(i + 1).take(4) {
                        if let Some(j) = next.find("fn ") {
                            let name: String =
                                next[j + 3..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                            kernels.insert(name);
                            break;
                        }
                    }
                }
            }
        }
    }
    SourceNames { words, templates: temps, kernels }
}

#[test]
fn quoted_kernel_names_exist() {
    if !sources_here("quoted_kernel_names_exist") {
        return;
    }
    let (entries, ptx_words) = ptx_names();
    assert!(entries.len() > 20, "{} .entry names in the embedded PTX; the parser is broken", entries.len());
    let families: BTreeSet<String> = entries.iter().map(|e| e.split('_').next().unwrap_or("").to_string()).collect();
    let names = source_names();
    let kernel_fns = &names.kernels;
    assert!(kernel_fns.len() > 20, "{} #[kernel] functions found; the parser is broken", kernel_fns.len());
    let mut failures = Vec::new();
    let mut seen = 0;
    for (file, n, text) in quoted(&chapters()) {
        for w in kernel_candidates(&text) {
            if !kernel_like(&w, &families) {
                continue;
            }
            seen += 1;
            let ok = if kernel_fns.contains(&w) {
                entries.contains(&w)
            } else {
                entries.contains(&w) || ptx_words.contains(&w) || names.knows(&w)
            };
            if !ok {
                let why = if kernel_fns.contains(&w) {
                    "a #[kernel] function that no embedded PTX module has as an .entry"
                } else {
                    "no kernel (.entry of the embedded PTX), and nothing else of that name in the sources"
                };
                failures.push((file.clone(), w.clone(), format!("guide/src/{file}:{n}: `{w}`: {why}")));
            }
        }
    }
    report("quoted_kernel_names_exist", failures, seen);
}

// ---------------------------------------------------------------------------------------------
// kiln and cargo xtask commands

/// The commands of a piece of quoted code: it is cut at `&&`, `||`, `|` and `;`, and each part
/// ends at a `#` comment or a redirection. Returns each part's words.
fn commands(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for part in text.split("&&").flat_map(|p| p.split("||")).flat_map(|p| p.split(['|', ';'])) {
        let mut words = Vec::new();
        for w in part.split_whitespace() {
            if w.starts_with('#') || w.starts_with('>') || w.starts_with("2>") || w.starts_with('<') {
                break;
            }
            // a backtick inside a code block's line closes a quoted command (`kiln gemm`'s)
            let w = w.trim_start_matches(['`', '(']);
            if let Some((w, _)) = w.split_once('`') {
                words.push(w.to_string());
                break;
            }
            words.push(w.trim_end_matches([')', ',', '.']).to_string());
        }
        if words.first().is_some_and(|w| w == "$") {
            words.remove(0);
        }
        // environment assignments before the command
        while words.first().is_some_and(|w| w.contains('=') && !w.starts_with('-')) {
            words.remove(0);
        }
        if !words.is_empty() {
            out.push(words);
        }
    }
    out
}

/// The arguments given to the kiln binary by a command, when it runs kiln: `kiln ARGS` (kiln its
/// first word), or `cargo run [OPTIONS] -- ARGS` where OPTIONS pick the kiln package or none.
fn kiln_args(words: &[String]) -> Option<Vec<String>> {
    if words[0] == "kiln" {
        return Some(words[1..].to_vec());
    }
    if words.len() >= 2 && words[0] == "cargo" && words[1] == "run" {
        let dash = words.iter().position(|w| w == "--");
        let opts = &words[2..dash.unwrap_or(words.len())];
        for (i, o) in opts.iter().enumerate() {
            let value = opts.get(i + 1).map(String::as_str);
            let picks_other = match o.as_str() {
                "-p" | "--package" | "--bin" => value != Some("kiln"),
                "--example" | "--bench" | "--test" => true,
                _ => false,
            };
            if picks_other {
                return None;
            }
        }
        return Some(dash.map_or(Vec::new(), |d| words[d + 1..].to_vec()));
    }
    None
}

/// The long flags of `args` (`--flag`, `--flag=value`), with the value that follows each.
fn long_flags(args: &[String]) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for (i, a) in args.iter().enumerate() {
        if a == "--" {
            break;
        }
        if let Some(f) = a.strip_prefix("--").filter(|f| !f.is_empty()) {
            match f.split_once('=') {
                Some((f, v)) => out.push((format!("--{f}"), Some(v.to_string()))),
                None => out.push((format!("--{f}"), args.get(i + 1).filter(|v| !v.starts_with('-')).cloned())),
            }
        }
    }
    out
}

/// Whether `help` lists `flag` (as a whole word: `--flag` not followed by a letter, digit or `-`).
fn help_lists(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(i, _)| {
        let before = help[..i].chars().next_back();
        let after = help[i + flag.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '-')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_')
    })
}

fn run_kiln(bin: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(bin).args(args).output().expect("running kiln");
    assert!(out.status.success(), "kiln {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

#[test]
fn quoted_kiln_commands_exist() {
    if !sources_here("quoted_kiln_commands_exist") {
        return;
    }
    let Some(bin) = kiln::testing::kiln_binary("guide", env!("CARGO_BIN_EXE_kiln")) else {
        return;
    };
    let top = run_kiln(&bin, &["--help"]);
    // "Commands:" lists `  NAME  description` until a blank line
    let subcommands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect();
    assert!(subcommands.iter().any(|s| s == "gemm"), "kiln --help lists no gemm subcommand:\n{top}");
    let mut help: BTreeMap<String, String> = BTreeMap::new();
    help.insert(String::new(), top.clone());
    for s in &subcommands {
        // `kiln help` takes subcommand names, not flags: its help is the top-level one
        let text = if s == "help" { top.clone() } else { run_kiln(&bin, &[s, "--help"]) };
        help.insert(s.clone(), text);
    }
    // `kiln gemm` without --kernel lists the kernel names, indented, one a line
    let gemm_kernels: BTreeSet<String> =
        run_kiln(&bin, &["gemm"]).lines().filter(|l| l.starts_with("  ")).map(|l| l.trim().to_string()).collect();
    assert!(gemm_kernels.contains("sgemm_naive"), "kiln gemm lists no sgemm_naive: {gemm_kernels:?}");

    let mut failures = Vec::new();
    let mut seen = 0;
    for (file, n, text) in quoted(&chapters()) {
        for words in commands(&text) {
            let Some(args) = kiln_args(&words) else { continue };
            seen += 1;
            let shown = words.join(" ");
            let mut fail = |item: String, why: String| {
                failures.push((file.clone(), item, format!("guide/src/{file}:{n}: `{shown}`: {why}")));
            };
            // the subcommand: the first argument that is not a flag; none: train's flags
            let sub = match args.first() {
                Some(a) if !a.starts_with('-') => {
                    if !help.contains_key(a) {
                        fail(
                            a.clone(),
                            format!("kiln has no subcommand `{a}` (kiln --help: {})", subcommands.join(", ")),
                        );
                        continue;
                    }
                    a.clone()
                }
                _ => String::new(),
            };
            for (flag, value) in long_flags(&args) {
                if !help_lists(&help[&sub], &flag) {
                    let which = if sub.is_empty() { "kiln --help".to_string() } else { format!("kiln {sub} --help") };
                    fail(flag.clone(), format!("{which} lists no `{flag}`"));
                } else if sub == "gemm"
                    && flag == "--kernel"
                    && let Some(k) = value.filter(|k| k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
                    && !gemm_kernels.contains(&k)
                {
                    fail(k.clone(), format!("`kiln gemm` lists no kernel `{k}`"));
                }
            }
        }
    }
    report("quoted_kiln_commands_exist", failures, seen);
}

/// `enum Task`'s variants in xtask/src/main.rs, kebab-cased, each with its `#[arg(long)]` fields
/// as `--flag-name`.
fn xtask_tasks() -> BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(workspace().join("xtask/src/main.rs")).expect("xtask/src/main.rs");
    let body: Vec<&str> =
        text.lines().skip_while(|l| !l.starts_with("enum Task")).skip(1).take_while(|l| *l != "}").collect();
    let mut tasks: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut current = None;
    let mut long_next = false;
    for l in body {
        let indent = l.len() - l.trim_start().len();
        let t = l.trim();
        if indent == 4 && t.starts_with(|c: char| c.is_ascii_uppercase()) {
            let name: String = t.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
            let mut kebab = String::new();
            for (i, c) in name.chars().enumerate() {
                if c.is_ascii_uppercase() && i > 0 {
                    kebab.push('-');
                }
                kebab.push(c.to_ascii_lowercase());
            }
            tasks.insert(kebab.clone(), BTreeSet::new());
            current = Some(kebab);
        } else if t.starts_with("#[arg(") {
            long_next = t.contains("long");
        } else if let (Some(task), Some((field, _))) = (&current, t.split_once(':')) {
            if long_next && !field.contains(' ') {
                tasks.get_mut(task).expect("the task").insert(format!("--{}", field.replace('_', "-")));
            }
            long_next = false;
        }
    }
    tasks
}

#[test]
fn quoted_xtask_commands_exist() {
    if !sources_here("quoted_xtask_commands_exist") {
        return;
    }
    let tasks = xtask_tasks();
    assert!(
        tasks.contains_key("build-ptx") && tasks["build-ptx"].contains("--require-ptxas"),
        "the parser of xtask's enum Task is broken: {tasks:?}"
    );
    let mut failures = Vec::new();
    let mut seen = 0;
    for (file, n, text) in quoted(&chapters()) {
        for words in commands(&text) {
            if words.len() < 2 || words[0] != "cargo" || words[1] != "xtask" {
                continue;
            }
            seen += 1;
            let shown = words.join(" ");
            let Some(task) = words.get(2) else { continue };
            match tasks.get(task) {
                None => failures.push((
                    file.clone(),
                    task.clone(),
                    format!(
                        "guide/src/{file}:{n}: `{shown}`: xtask has no task `{task}` ({})",
                        tasks.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                )),
                Some(flags) => {
                    for (flag, _) in long_flags(&words[3..]) {
                        if !flags.contains(&flag) && flag != "--help" {
                            failures.push((
                                file.clone(),
                                flag.clone(),
                                format!("guide/src/{file}:{n}: `{shown}`: xtask {task} has no `{flag}`"),
                            ));
                        }
                    }
                }
            }
        }
    }
    report("quoted_xtask_commands_exist", failures, seen);
}

// ---------------------------------------------------------------------------------------------
// file paths

/// Extensions of the repository files the guide names.
const FILE_EXTENSIONS: &[&str] = &["md", "rs", "json", "svg", "png", "sh", "toml", "py", "ptx", "csv", "log", "txt"];

/// Folders of build outputs: paths under them are made by a command, not kept in the repository.
const GENERATED: &[&str] = &["target/", ".bundle/"];

/// Every file of the workspace (paths relative to it, with `/`), build outputs and `.git` left out.
fn repository_files() -> Vec<String> {
    let ws = workspace();
    let mut out = Vec::new();
    let mut stack = vec![ws.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("reading {d:?}: {e}")) {
            let p = e.expect("a directory entry").path();
            let rel = p.strip_prefix(&ws).expect("under the workspace").to_string_lossy().replace('\\', "/");
            if p.is_dir() {
                if !matches!(rel.as_str(), "target" | ".git" | ".bundle") {
                    stack.push(p);
                }
            } else {
                out.push(rel);
            }
        }
    }
    out
}

/// The file paths a line names (prose or code): runs of `[A-Za-z0-9_./-]` that end in `.EXT` for
/// an extension of [`FILE_EXTENSIONS`], or that start with `../`; not parts of URLs (`://`), not
/// absolute, and not starting with `-` (a flag, or a suffix as in "`a.json` and `-b.json`").
fn named_paths(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let is_path = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-');
    let mut start = None;
    for (i, c) in line.char_indices().chain(std::iter::once((line.len(), ' '))) {
        match (is_path(c), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                start = None;
                let w = line[s..i].trim_end_matches('.');
                // not a URL's path, an absolute path, a flag or a suffix (`-b.json`), or dots alone
                if line[..s].ends_with(':')
                    || w.starts_with(['/', '-'])
                    || !w.contains(|c: char| c.is_ascii_alphanumeric())
                {
                    continue;
                }
                let ext = w.rsplit_once('.');
                let has_ext = ext
                    .is_some_and(|(stem, e)| !stem.is_empty() && !stem.ends_with('/') && FILE_EXTENSIONS.contains(&e));
                if has_ext || w.starts_with("../") {
                    out.push(w.to_string());
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn named_file_paths_exist() {
    if !sources_here("named_file_paths_exist") {
        return;
    }
    let ws = workspace();
    let files = repository_files();
    assert!(files.iter().any(|f| f == "guide/src/SUMMARY.md"), "the file walk is broken");
    let mut failures = Vec::new();
    let mut seen = 0;
    for c in chapters() {
        let dir = ws.join("guide/src").join(&c.rel).parent().expect("a folder").to_path_buf();
        for l in &c.lines {
            for p in named_paths(&l.text) {
                let bare = p.trim_start_matches("./");
                if GENERATED.iter().any(|g| bare.starts_with(g)) {
                    continue;
                }
                seen += 1;
                // relative to the chapter or the workspace, or a file whose path ends with it
                // (a `../` path only relative to the chapter, and only inside the workspace)
                let found = if p.starts_with("../") {
                    let rel = normalize(&Path::new("guide/src").join(&c.rel).parent().expect("a folder").join(&p));
                    !rel.starts_with("..") && ws.join(rel).exists()
                } else {
                    dir.join(&p).exists()
                        || ws.join(bare).exists()
                        || files.iter().any(|f| f.ends_with(&format!("/{bare}")))
                };
                if !found {
                    failures.push((
                        c.rel.clone(),
                        p.clone(),
                        format!(
                            "guide/src/{}:{}: `{p}`: no such file in the repository (relative to the chapter or the workspace, or as the end of a path)",
                            c.rel, l.n
                        ),
                    ));
                }
            }
        }
    }
    report("named_file_paths_exist", failures, seen);
}

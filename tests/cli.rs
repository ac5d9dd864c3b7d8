//! The `kiln` command line, run as a user runs it: inputs are checked before any work starts, and
//! a mistake is a message naming the flag (or the file) and what to change, never an abort.
//!
//! Every case is fast: it fails before training, or trains one epoch of a tiny model on the CPU.
//! In the GPU bundle, which carries test binaries but not the `kiln` binary, each case says so and
//! returns (`cargo test` always builds the binary beside the tests).

use std::path::{Path, PathBuf};
use std::process::Command;

/// What one run of the binary left: its exit code (None: killed by a signal), stdout, stderr.
struct Run {
    code: Option<i32>,
    out: String,
    err: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit {:?}\n--- stdout\n{}\n--- stderr\n{}", self.code, self.out, self.err)
    }
}

/// Whether a `kiln` binary is here to run (`$KILN_BIN` in the GPU bundle, else the one cargo
/// built); says so where none is.
fn binary_here(test: &str) -> bool {
    kiln::testing::kiln_binary(test, env!("CARGO_BIN_EXE_kiln")).is_some()
}

/// Runs `kiln ARGS` in `dir` (so that a default checkpoint lands there, not in the source tree).
fn kiln_in(dir: &Path, args: &[&str]) -> Run {
    kiln_with_env(dir, args, &[])
}

/// [`kiln_in`] with environment variables set for the child.
fn kiln_with_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let exe = kiln::testing::kiln_binary("cli", env!("CARGO_BIN_EXE_kiln")).expect("binary_here checked");
    let o = Command::new(exe)
        .args(args)
        .current_dir(dir)
        // no progress bar, and no GPU test knobs from the caller's environment
        .env_remove("KILN_SYNC_LAUNCHES")
        .envs(env.iter().copied())
        .output()
        .expect("the kiln binary runs");
    Run {
        code: o.status.code(),
        out: String::from_utf8_lossy(&o.stdout).into_owned(),
        err: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// A fresh, empty directory for one test.
fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("a temporary directory");
    d
}

/// A refused run: exit status 2 (the parser refused a flag) or 1 (a check after parsing refused
/// it) -- not a panic's 101, not an abort's signal --, no training, and a message on stderr that
/// contains every one of `needles`.
fn assert_refused(r: &Run, needles: &[&str]) {
    assert!(matches!(r.code, Some(1 | 2)), "{r:?}");
    assert!(!r.out.contains("epoch"), "trained before refusing: {r:?}");
    for n in needles {
        assert!(r.err.contains(n), "stderr lacks {n:?}: {r:?}");
    }
}

/// Tiny, one-epoch training flags: a refused case that the parser lets through still ends fast.
const TINY: &[(&str, &str)] = &[("--epochs", "1"), ("--width", "4"), ("--depth", "2"), ("--device", "cpu")];

/// `kiln train EXTRA`, with the [`TINY`] flags that `extra` does not set.
fn train(dir: &Path, extra: &[&str]) -> Run {
    let mut args = vec!["train"];
    for (flag, value) in TINY {
        if !extra.iter().any(|a| a.split('=').next() == Some(*flag)) {
            args.extend_from_slice(&[flag, value]);
        }
    }
    args.extend_from_slice(extra);
    kiln_in(dir, &args)
}

#[test]
fn a_negative_learning_rate_is_refused_in_both_spellings_with_one_message() {
    if !binary_here("a_negative_learning_rate_is_refused_in_both_spellings_with_one_message") {
        return;
    }
    let dir = tmpdir("lr");
    let eq = train(&dir, &["--lr=-1"]);
    assert_refused(&eq, &["--lr", "greater than 0"]);
    let space = train(&dir, &["--lr", "-1"]);
    assert_refused(&space, &["--lr", "greater than 0"]);
    assert_eq!(eq.err, space.err, "`--lr=-1` and `--lr -1` read differently");
    assert!(!dir.join("kiln-mlp.safetensors").exists(), "a refused run saved a checkpoint");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_numeric_training_flag_names_itself_and_its_range() {
    if !binary_here("every_numeric_training_flag_names_itself_and_its_range") {
        return;
    }
    let dir = tmpdir("ranges");
    let cases: &[(&[&str], &[&str])] = &[
        (&["--lr", "0"], &["--lr", "greater than 0"]),
        (&["--lr", "nan"], &["--lr", "finite"]),
        (&["--lr", "inf"], &["--lr", "finite"]),
        (&["--weight-decay=-5"], &["--weight-decay", "0 or more"]),
        (&["--weight-decay", "-5"], &["--weight-decay", "0 or more"]),
        (&["--clip-grad-norm", "0"], &["--clip-grad-norm", "greater than 0"]),
        (&["--clip-grad-norm=-1"], &["--clip-grad-norm", "greater than 0"]),
        (&["--clip-grad-norm", "inf"], &["--clip-grad-norm", "finite"]),
        (&["--width", "0"], &["--width", "1 or more"]),
        (&["--width", "-3"], &["--width", "1 or more"]),
        (&["--depth", "0"], &["--depth", "1 or more"]),
        (&["--batch", "0"], &["--batch", "1 or more"]),
        (&["--epochs", "0"], &["--epochs", "1 or more"]),
        (&["--warmup", "-1"], &["--warmup", "0 or more"]),
        (&["--seed", "-1"], &["--seed", "0 or more"]),
        (&["--target-accuracy", "95"], &["--target-accuracy", "between 0 and 1"]),
        (&["--target-accuracy", "-0.5"], &["--target-accuracy", "between 0 and 1"]),
    ];
    for (args, needles) in cases {
        let r = train(&dir, args);
        assert_refused(&r, needles);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--width 0` used to be reported by an internal function (`Linear::new: 2 inputs and 0 outputs`).
#[test]
fn width_zero_is_reported_by_its_flag_not_an_internal_function() {
    if !binary_here("width_zero_is_reported_by_its_flag_not_an_internal_function") {
        return;
    }
    let dir = tmpdir("width0");
    let r = train(&dir, &["--width", "0"]);
    assert_refused(&r, &["--width"]);
    assert!(!r.err.contains("Linear::new"), "{r:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--width 100000000` used to abort the process (`memory allocation of 80000000000000000 bytes
/// failed`, exit 134): the model's size is checked against the memory there is before allocating.
#[test]
fn a_model_too_large_for_memory_is_an_error_not_an_abort() {
    if !binary_here("a_model_too_large_for_memory_is_an_error_not_an_abort") {
        return;
    }
    let dir = tmpdir("huge");
    for (width, depth) in [("100000000", "3"), ("18446744073709551615", "3"), ("4", "1000000000000")] {
        for mode in [&[][..], &["--megakernel"]] {
            let mut args = vec!["--width", width, "--depth", depth];
            args.extend_from_slice(mode);
            let r = train(&dir, &args);
            assert_refused(&r, &["memory", "--width, --depth"]);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The safetensors header of `path` as JSON, and the tensor bytes after it.
fn read_header(path: &Path) -> (serde_json::Value, Vec<u8>) {
    let bytes = std::fs::read(path).expect("the checkpoint");
    let n = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header = serde_json::from_slice(&bytes[8..8 + n]).expect("a JSON header");
    (header, bytes[8 + n..].to_vec())
}

fn write_header(path: &Path, header: &serde_json::Value, data: &[u8]) {
    let mut h = serde_json::to_vec(header).expect("JSON");
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    std::fs::write(path, out).expect("writing the checkpoint");
}

/// `eval` of a checkpoint whose metadata says `width` 1e8 used to build that model before looking
/// at the tensors (and abort): the metadata is checked against the file's tensors first.
#[test]
fn eval_checks_checkpoint_metadata_against_its_tensors_before_building() {
    if !binary_here("eval_checks_checkpoint_metadata_against_its_tensors_before_building") {
        return;
    }
    let dir = tmpdir("meta");
    let r = train(&dir, &["--depth", "3", "--target-accuracy", "0", "--checkpoint", "c.safetensors"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let ok = kiln_in(&dir, &["eval", "--checkpoint", "c.safetensors"]);
    assert_eq!(ok.code, Some(0), "the untouched checkpoint evaluates: {ok:?}");
    let (header, data) = read_header(&dir.join("c.safetensors"));
    let cases: &[(&str, &str, &[&str])] = &[
        ("width", "100000000", &["width", "100000000", "0.weight"]),
        ("width", "18446744073709551615", &["width", "0.weight"]),
        ("depth", "1000", &["depth", "1000"]),
        ("depth", "0", &["depth"]),
        ("features", "3", &["features", "0.weight"]),
        ("classes", "7", &["classes", "4.weight"]),
        ("width", "many", &["width", "many"]),
    ];
    for (key, value, needles) in cases {
        let mut h = header.clone();
        h["__metadata__"][*key] = serde_json::Value::String(value.to_string());
        write_header(&dir.join("bad.safetensors"), &h, &data);
        let r = kiln_in(&dir, &["eval", "--checkpoint", "bad.safetensors"]);
        assert_eq!(r.code, Some(1), "{key} = {value}: {r:?}");
        for n in *needles {
            assert!(r.err.contains(n), "{key} = {value}: stderr lacks {n:?}: {r:?}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An IDX file of unsigned bytes with the given dimensions and data.
fn idx(path: &Path, dims: &[u32], data: &[u8]) {
    let mut b = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        b.extend_from_slice(&d.to_be_bytes());
    }
    b.extend_from_slice(data);
    std::fs::write(path, b).expect("writing an IDX file");
}

/// A tiny MNIST-shaped directory: `n` train and `n / 2` test images of 4 x 4 pixels.
fn tiny_mnist(dir: &Path, n: u32) {
    for (prefix, rows) in [("train", n), ("t10k", n / 2)] {
        let pixels: Vec<u8> = (0..rows * 16).map(|i| (i * 37 % 256) as u8).collect();
        let labels: Vec<u8> = (0..rows).map(|i| (i % 10) as u8).collect();
        idx(&dir.join(format!("{prefix}-images-idx3-ubyte")), &[rows, 4, 4], &pixels);
        idx(&dir.join(format!("{prefix}-labels-idx1-ubyte")), &[rows], &labels);
    }
}

/// An IDX header with dimensions 0xFFFFFFFF used to overflow the byte count (a panic in a debug
/// build, a wrong count in release): the sizes a file states are multiplied with checks.
#[test]
fn an_idx_header_whose_dimensions_overflow_is_a_file_error() {
    if !binary_here("an_idx_header_whose_dimensions_overflow_is_a_file_error") {
        return;
    }
    let dir = tmpdir("idx");
    tiny_mnist(&dir, 20);
    idx(&dir.join("train-images-idx3-ubyte"), &[u32::MAX, u32::MAX, u32::MAX], &[0; 16]);
    let r = train(&dir, &["--dataset", "mnist", "--data-dir", "."]);
    assert_refused(&r, &["train-images-idx3-ubyte", "4294967295"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--dataset mnist` used to default to a target accuracy of 0%: any run passed.
#[test]
fn mnist_has_a_sensible_default_target_accuracy() {
    if !binary_here("mnist_has_a_sensible_default_target_accuracy") {
        return;
    }
    let dir = tmpdir("mnist-target");
    tiny_mnist(&dir, 40);
    let r = train(&dir, &["--dataset", "mnist", "--data-dir", ".", "--batch", "8"]);
    // one epoch on 40 images of noise cannot reach 90% on the held-out 20
    assert!(r.out.contains("target 90%"), "{r:?}");
    assert_eq!(r.code, Some(1), "{r:?}");
    let help = kiln_in(&dir, &["train", "--help"]);
    assert!(help.out.contains("90% on mnist"), "{help:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--megakernel` used to ignore `--optimizer`, `--activation`, `--dtype` (and `--weight-decay`)
/// silently; they are refused by name.
#[test]
fn the_megakernel_refuses_the_flags_it_cannot_honour() {
    if !binary_here("the_megakernel_refuses_the_flags_it_cannot_honour") {
        return;
    }
    let dir = tmpdir("mk-refuse");
    let cases: &[(&[&str], &str)] = &[
        (&["--optimizer", "adam"], "--optimizer"),
        (&["--optimizer", "adamw"], "--optimizer"),
        (&["--optimizer", "nesterov"], "--optimizer"),
        (&["--activation", "gelu"], "--activation"),
        (&["--dtype", "f64"], "--dtype"),
        (&["--weight-decay", "0.1"], "--weight-decay"),
        (&["--clip-grad-norm", "1"], "--clip-grad-norm"),
        (&["--matmul-precision", "bf16"], "--matmul-precision"),
    ];
    for (args, flag) in cases {
        let mut a = vec!["--megakernel"];
        a.extend_from_slice(args);
        let r = train(&dir, &a);
        assert_refused(&r, &[flag, "--megakernel"]);
    }
    // and the layer-by-layer path refuses the megakernel's own flag, and --data-dir without MNIST
    assert_refused(&train(&dir, &["--mega-path", "bf16"]), &["--mega-path", "--megakernel"]);
    assert_refused(&train(&dir, &["--data-dir", "."]), &["--data-dir", "mnist"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Accuracy, in percent, from the last line of stdout that contains `key`, read after it.
fn percent_after(text: &str, key: &str) -> f64 {
    let line = text.lines().rev().find(|l| l.contains(key)).unwrap_or_else(|| panic!("no {key:?} in {text}"));
    let rest = &line[line.find(key).expect("the key") + key.len()..];
    let num: String = rest.trim_start().chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
    num.parse().unwrap_or_else(|_| panic!("no number after {key:?} in {line}"))
}

/// `--megakernel` used to ignore `--checkpoint`: it saves the trained weights as an ordinary
/// checkpoint (the constant input feature's weights become the first layer's bias), which `kiln
/// eval` loads and scores as the run did.
#[test]
fn the_megakernel_saves_a_checkpoint_that_eval_loads() {
    if !binary_here("the_megakernel_saves_a_checkpoint_that_eval_loads") {
        return;
    }
    let dir = tmpdir("mk-save");
    let r = train(
        &dir,
        &["--megakernel", "--width", "16", "--lr", "0.1", "--target-accuracy", "0", "--checkpoint", "mk.safetensors"],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.out.contains("saved checkpoint mk.safetensors"), "{r:?}");
    let trained = percent_after(&r.out, "reached");
    let e = kiln_in(&dir, &["eval", "--checkpoint", "mk.safetensors"]);
    assert_eq!(e.code, Some(0), "{e:?}");
    let evaluated = percent_after(&e.out, "mk.safetensors:");
    // the same model on the same 600 held-out rows; a bias added after the product instead of a
    // weight times 1 inside it may round one borderline row the other way
    assert!((trained - evaluated).abs() <= 100.0 / 600.0 + 1e-9, "trained {trained}%, eval {evaluated}%");
    assert!(trained > 40.0, "one epoch at lr 0.1 learns something of 3 classes: {trained}%");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_help_lists_the_values_of_every_choice() {
    if !binary_here("the_help_lists_the_values_of_every_choice") {
        return;
    }
    let dir = tmpdir("help");
    let help = kiln_in(&dir, &["train", "--help"]);
    assert_eq!(help.code, Some(0), "{help:?}");
    assert!(help.out.contains("[possible values: cuda-cores, tf32, tf32x3, bf16]"), "{help:?}");
    assert!(help.out.contains("[possible values: f32, bf16]"), "{help:?}");
    let bad = train(&dir, &["--megakernel", "--mega-path", "fp8"]);
    assert_eq!(bad.code, Some(2), "{bad:?}");
    assert!(bad.err.contains("--mega-path") && bad.err.contains("tf32x3"), "{bad:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kiln gemm --kernel nonexistent` used to report the device's error (on a machine without a GPU)
/// before the unknown name: the name and the numbers are checked before the device is opened.
#[test]
fn gemm_checks_its_arguments_before_the_device() {
    if !binary_here("gemm_checks_its_arguments_before_the_device") {
        return;
    }
    let dir = tmpdir("gemm");
    let r = kiln_in(&dir, &["gemm", "--kernel", "nonexistent"]);
    assert_refused(&r, &["nonexistent", "sgemm_smem", "gemm_wgmma_bf16_persistent"]);
    assert!(!r.err.contains("CUDA"), "the device was opened first: {r:?}");
    let cases: &[(&[&str], &[&str])] = &[
        (&["--reps", "0"], &["--reps", "1 or more"]),
        (&["--split-k", "0"], &["--split-k", "1 or more"]),
        (&["--shape", "0x64x64"], &["--shape", "1 or more"]),
        (&["--shape", "64x64"], &["--shape", "MxNxK"]),
    ];
    for (args, needles) in cases {
        let mut a = vec!["gemm", "--kernel", "sgemm_smem"];
        a.extend_from_slice(args);
        let r = kiln_in(&dir, &a);
        assert_eq!(r.code, Some(2), "{r:?}");
        for n in *needles {
            assert!(r.err.contains(n), "stderr lacks {n:?}: {r:?}");
        }
    }
    // a product whose operands cannot fit in memory is refused by its size, before the device
    let r = kiln_in(&dir, &["gemm", "--kernel", "sgemm_smem", "--shape", "4000000000x4000000000x4000000000"]);
    assert_refused(&r, &["memory", "--shape"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kiln gemm --ladder` on a machine without a usable GPU (hidden from the child with
/// `CUDA_VISIBLE_DEVICES=`, so the case runs alike with or without one): a non-zero exit and a
/// message that says so, not a panic and not a table. Its flags are checked before the device.
#[test]
fn gemm_ladder_without_a_gpu_says_so() {
    if !binary_here("gemm_ladder_without_a_gpu_says_so") {
        return;
    }
    let dir = tmpdir("gemm-ladder");
    let no_gpu = [("CUDA_VISIBLE_DEVICES", "")];
    let r = kiln_with_env(&dir, &["gemm", "--ladder", "--shape", "64x64x64"], &no_gpu);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.err.contains("no usable GPU") && r.err.contains("compute capability 8.0"), "{r:?}");
    assert!(!r.out.contains("| rung"), "a table without a GPU: {r:?}");
    // one kernel or the whole ladder, not both; the k split belongs to one kernel
    for extra in [&["--kernel", "sgemm_smem"][..], &["--split-k", "2"][..]] {
        let mut a = vec!["gemm", "--ladder"];
        a.extend_from_slice(extra);
        let r = kiln_with_env(&dir, &a, &no_gpu);
        assert_eq!(r.code, Some(2), "{r:?}");
        assert!(r.err.contains("--ladder") && r.err.contains(extra[0]), "{r:?}");
    }
    let r = kiln_with_env(&dir, &["gemm", "--ladder", "--shape", "0x64x64"], &no_gpu);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.err.contains("--shape"), "{r:?}");
    // the JSON is the ladder's: --json without --ladder is a usage error
    let r = kiln_with_env(&dir, &["gemm", "--kernel", "sgemm_smem", "--json", "x.json"], &no_gpu);
    assert_eq!(r.code, Some(2), "{r:?}");
    assert!(r.err.contains("--json") && r.err.contains("--ladder"), "{r:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kiln attention`: without --kernel it lists the kernels (no device needed); the name, the
/// numbers, the head dim and the memory are checked before the device; without a usable GPU it
/// says so.
#[test]
fn attention_lists_its_kernels_and_checks_its_arguments_before_the_device() {
    if !binary_here("attention_lists_its_kernels_and_checks_its_arguments_before_the_device") {
        return;
    }
    let dir = tmpdir("attention");
    let no_gpu = [("CUDA_VISIBLE_DEVICES", "")];
    let r = kiln_with_env(&dir, &["attention"], &no_gpu);
    assert_eq!(r.code, Some(0), "{r:?}");
    for name in
        ["naive", "naive_bf16", "flash_fwd_simt_f32", "flash_fwd_simt_bf16", "flash_fwd_mma_bf16", "flash_fwd_mma_f16"]
    {
        assert!(r.out.contains(name), "the list lacks {name}: {r:?}");
    }
    let r = kiln_with_env(&dir, &["attention", "--kernel", "naive", "--backward"], &no_gpu);
    assert_refused(&r, &["--backward", "autograd"]);
    let r = kiln_with_env(&dir, &["attention", "--kernel", "nonexistent"], &no_gpu);
    assert_refused(&r, &["nonexistent", "flash_fwd_mma_bf16"]);
    assert!(!r.err.contains("CUDA"), "the device was opened first: {r:?}");
    let r = kiln_with_env(&dir, &["attention", "--kernel", "flash_fwd_mma_bf16", "--shape", "1x2x64x96"], &no_gpu);
    assert_refused(&r, &["head dim 96", "64, 128"]);
    let cases: &[(&[&str], &[&str])] = &[
        (&["--reps", "0"], &["--reps", "1 or more"]),
        (&["--kv-len", "0"], &["--kv-len", "1 or more"]),
        (&["--shape", "1x2x0x64"], &["--shape", "1 or more"]),
        (&["--shape", "2x64x64"], &["--shape", "BxHxSxD"]),
        (&["--blocks", "0"], &["--blocks", "1 or more"]),
    ];
    for (args, needles) in cases {
        let mut a = vec!["attention", "--kernel", "flash_fwd_simt_f32"];
        a.extend_from_slice(args);
        let r = kiln_with_env(&dir, &a, &no_gpu);
        assert_eq!(r.code, Some(2), "{r:?}");
        for n in *needles {
            assert!(r.err.contains(n), "stderr lacks {n:?}: {r:?}");
        }
    }
    // every rung runs its backward: the mma.sync one passes the checks and reaches the device
    let r = kiln_with_env(&dir, &["attention", "--kernel", "flash_fwd_mma_f16", "--backward"], &no_gpu);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.err.contains("no usable GPU"), "{r:?}");
    // a backward kernel by name: an unknown one, or one that does not take the forward's dtype, is
    // refused before the device opens
    let r =
        kiln_with_env(&dir, &["attention", "--kernel", "flash_fwd_mma_f16", "--backward-kernel", "wgmma3"], &no_gpu);
    assert_refused(&r, &["wgmma3", "simt, mma, wgmma, wgmma2"]);
    assert!(!r.err.contains("no usable GPU"), "the device was opened first: {r:?}");
    let r =
        kiln_with_env(&dir, &["attention", "--kernel", "flash_fwd_simt_f32", "--backward-kernel", "wgmma2"], &no_gpu);
    assert_refused(&r, &["Wgmma2 backward", "F32"]);
    assert!(!r.err.contains("no usable GPU"), "the device was opened first: {r:?}");
    let r = kiln_with_env(&dir, &["attention", "--kernel", "flash_fwd_mma_f16", "--backward-kernel", "mma"], &no_gpu);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.err.contains("no usable GPU"), "{r:?}");
    // a block count: only the Hopper forwards take one, checked before the device opens
    let r = kiln_with_env(&dir, &["attention", "--kernel", "flash_fwd_mma_bf16", "--blocks", "4"], &no_gpu);
    assert_refused(&r, &["block count", "MmaSync", "Wgmma2"]);
    assert!(!r.err.contains("no usable GPU"), "the device was opened first: {r:?}");
    let r = kiln_with_env(&dir, &["attention", "--kernel", "flash_fwd_wgmma2_bf16", "--blocks", "4"], &no_gpu);
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.err.contains("no usable GPU"), "{r:?}");
    let big = ["attention", "--kernel", "flash_fwd_simt_f32", "--shape", "64x64x4000000x128"];
    assert_refused(&kiln_with_env(&dir, &big, &no_gpu), &["memory", "--shape"]);
    let r = kiln_with_env(
        &dir,
        &["attention", "--kernel", "flash_fwd_mma_bf16", "--shape", "1x2x65x64", "--causal"],
        &no_gpu,
    );
    assert_eq!(r.code, Some(1), "{r:?}");
    assert!(r.err.contains("no usable GPU") && r.err.contains("compute capability 8.0"), "{r:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A few sentences of text for the GPT cases (about 2,400 bytes).
fn gpt_text(dir: &Path) -> PathBuf {
    let p = dir.join("text.txt");
    let s: String =
        (0..100).map(|i| format!("the {} sees the {}. ", ["cat", "dog"][i % 2], ["fox", "bird"][i % 3 % 2])).collect();
    std::fs::write(&p, s).expect("the text file");
    p
}

/// `kiln train --model gpt` on a temporary file: trains a few steps, writes the checkpoint, the
/// loss curve and the loss log, resumes to more steps, and `kiln sample` continues a prompt.
#[test]
fn gpt_trains_resumes_and_samples() {
    if !binary_here("gpt_trains_resumes_and_samples") {
        return;
    }
    let dir = tmpdir("gpt");
    let text = gpt_text(&dir);
    let t = text.to_str().unwrap();
    let base = ["train", "--model", "gpt", "--data", t, "--tokens", "chars", "--device", "cpu", "--batch", "4"];
    let mut args = base.to_vec();
    args.extend_from_slice(&[
        "--steps",
        "4",
        "--eval-every",
        "2",
        "--checkpoint",
        "a.safetensors",
        "--loss-log",
        "a.log",
    ]);
    let r = kiln_in(&dir, &args);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.out.contains("validation loss"), "{r:?}");
    assert!(dir.join("a.safetensors").exists() && dir.join("a.svg").exists());
    let log = std::fs::read_to_string(dir.join("a.log")).unwrap();
    assert_eq!(log.lines().count(), 4, "{log}");
    let mut args = base.to_vec();
    args.extend_from_slice(&["--steps", "6", "--resume", "a.safetensors", "--checkpoint", "b.safetensors"]);
    let r = kiln_in(&dir, &args);
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.out.contains("step 6/6"), "{r:?}");
    let r = kiln_in(
        &dir,
        &["sample", "--checkpoint", "b.safetensors", "--prompt", "the ", "--tokens", "30", "--device", "cpu"],
    );
    assert_eq!(r.code, Some(0), "{r:?}");
    assert!(r.out.starts_with("the ") && r.out.trim_end().chars().count() >= 30, "{r:?}");
    // a resume with another model, a prompt outside the vocabulary, a GPT checkpoint to eval
    let mut args = base.to_vec();
    args.extend_from_slice(&["--steps", "8", "--resume", "b.safetensors", "--width", "64"]);
    assert_refused(&kiln_in(&dir, &args), &["b.safetensors", "same --preset"]);
    let r = kiln_in(&dir, &["sample", "--checkpoint", "b.safetensors", "--prompt", "THE", "--device", "cpu"]);
    assert_refused(&r, &["--prompt", "'T'"]);
    assert_refused(&kiln_in(&dir, &["eval", "--checkpoint", "b.safetensors"]), &["GPT checkpoint", "kiln sample"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bad data for a GPT is refused before any step, naming the file and what to change.
#[test]
fn gpt_refuses_bad_data_and_checkpoints() {
    if !binary_here("gpt_refuses_bad_data_and_checkpoints") {
        return;
    }
    let dir = tmpdir("gpt-bad");
    std::fs::write(dir.join("empty.txt"), "").unwrap();
    std::fs::write(dir.join("short.txt"), "hello").unwrap();
    std::fs::write(dir.join("binary.bin"), [0xffu8, 0xfe, 0x00, 0x80].repeat(100)).unwrap();
    let gpt = |extra: &[&str]| {
        let mut a = vec!["train", "--model", "gpt", "--device", "cpu", "--steps", "1"];
        a.extend_from_slice(extra);
        kiln_in(&dir, &a)
    };
    assert_refused(&gpt(&[]), &["--data"]);
    assert_refused(&gpt(&["--data", "empty.txt"]), &["empty.txt", "empty"]);
    assert_refused(&gpt(&["--data", "short.txt"]), &["short.txt", "--block"]);
    assert_refused(&gpt(&["--data", "binary.bin", "--tokens", "chars"]), &["binary.bin", "UTF-8", "--tokens bytes"]);
    assert_refused(&gpt(&["--data", "missing.txt"]), &["missing.txt"]);
    assert_refused(&gpt(&["--data", "short.txt", "--preset", "huge"]), &["--preset", "char-mini"]);
    assert_refused(&gpt(&["--data", "short.txt", "--width", "30"]), &["--width", "multiple"]);
    assert_refused(&kiln_in(&dir, &["sample", "--checkpoint", "missing.safetensors"]), &["missing.safetensors"]);
    assert_refused(&train(&dir, &["--data", "short.txt"]), &["--data", "--model gpt"]);
    assert!(!dir.join("kiln-gpt.safetensors").exists(), "a refused run saved a checkpoint");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpus_flag_mistakes_are_refused_before_any_work() {
    if !binary_here("gpus_flag_mistakes_are_refused_before_any_work") {
        return;
    }
    let d = tmpdir("gpus");
    assert_refused(&kiln_in(&d, &["train", "--gpus", "0"]), &["--gpus", "1 or more"]);
    assert_refused(&kiln_in(&d, &["train", "--gpus", "2", "--dtype", "bf16"]), &["--gpus", "bf16"]);
    // the GPT trains on several GPUs, but not with ZeRO-1 (refused before the data is read)
    assert_refused(
        &kiln_in(&d, &["train", "--gpus", "2", "--model", "gpt", "--zero1", "--data", "absent.txt"]),
        &["--zero1", "--model gpt"],
    );
    // more GPUs than present: the count in the message, or no driver at all on a machine without one
    let r = kiln_in(&d, &["train", "--gpus", "64", "--epochs", "1"]);
    assert_refused(&r, &[]);
    assert!(r.err.contains("--gpus 64") || r.err.contains("no CUDA driver"), "{r:?}");
    assert_refused(&kiln_in(&d, &["allreduce", "--bytes", "3"]), &["--bytes", "multiple of 4"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// The data-parallel and multi-process flags: each mistake is refused before any GPU or network
/// work, with the flag to change.
#[test]
fn data_parallel_and_multi_process_flag_mistakes_are_refused() {
    if !binary_here("data_parallel_and_multi_process_flag_mistakes_are_refused") {
        return;
    }
    let d = tmpdir("dist-flags");
    // data-parallel settings on one GPU
    for flag in ["--zero1", "--no-overlap"] {
        assert_refused(&kiln_in(&d, &["train", flag]), &[flag, "--gpus 2"]);
    }
    assert_refused(&kiln_in(&d, &["train", "--bucket-mb", "4"]), &["--bucket-mb", "--gpus 2"]);
    assert_refused(&kiln_in(&d, &["train", "--bucket-mb", "0"]), &["--bucket-mb"]);
    // multi-process flags without a world size
    for (flag, v) in
        [("--rank", "1"), ("--local-rank", "0"), ("--master-addr", "127.0.0.1"), ("--master-port", "29500")]
    {
        assert_refused(&kiln_in(&d, &["train", flag, v]), &[flag, "--world-size"]);
    }
    // a rank outside the world, a missing rank, several GPUs per process, a bad environment
    assert_refused(&kiln_in(&d, &["train", "--world-size", "2", "--rank", "2"]), &["--rank", "0 to 1"]);
    assert_refused(&kiln_in(&d, &["train", "--world-size", "2"]), &["--rank", "RANK"]);
    assert_refused(&kiln_in(&d, &["train", "--world-size", "0"]), &["--world-size", "1 or more"]);
    assert_refused(
        &kiln_in(&d, &["train", "--gpus", "2", "--world-size", "2", "--rank", "0"]),
        &["--gpus", "--world-size"],
    );
    assert_refused(&kiln_with_env(&d, &["train"], &[("WORLD_SIZE", "2"), ("RANK", "5")]), &["--rank", "0 to 1"]);
    assert_refused(&kiln_with_env(&d, &["train"], &[("WORLD_SIZE", "two")]), &["WORLD_SIZE", "whole number"]);
    // ZeRO-1 cannot clip by the global norm
    assert_refused(&kiln_in(&d, &["train", "--gpus", "2", "--zero1", "--clip-grad-norm", "1"]), &["--clip-grad-norm"]);
    let _ = std::fs::remove_dir_all(&d);
}

/// `--no-graph` is accepted and documented; on the CPU (which never captures) a run with it and
/// one without train alike, and the library reports no step replayed as a graph.
#[test]
fn no_graph_is_accepted_and_the_cpu_never_captures() {
    use kiln::train::{DataSource, DeviceChoice, OptimizerKind, TrainConfig};
    let run = |graph: bool| {
        let cfg = TrainConfig {
            data: DataSource::Spirals { per_class: 40, classes: 3, noise: 0.2 },
            width: 8,
            depth: 2,
            batch: 17,
            epochs: 2,
            optimizer: OptimizerKind::Sgd { momentum: 0.9, nesterov: false },
            device: DeviceChoice::Cpu,
            checkpoint: None,
            progress: false,
            graph,
            ..TrainConfig::default()
        };
        let mut lines = Vec::new();
        let r = kiln::train::train(&cfg, |l| lines.push(l.to_string())).unwrap();
        (r, lines)
    };
    let ((a, la), (b, lb)) = (run(true), run(false));
    assert_eq!(a.graph_steps, 0);
    assert_eq!(b.graph_steps, 0);
    assert!(!la.iter().chain(&lb).any(|l| l.contains("graph")), "{la:?} {lb:?}");
    for (x, y) in a.epochs.iter().zip(&b.epochs) {
        assert_eq!(x.loss.to_bits(), y.loss.to_bits());
    }
    if !binary_here("no_graph_is_accepted_and_the_cpu_never_captures") {
        return;
    }
    let dir = tmpdir("no-graph");
    let r = train(&dir, &["--no-graph", "--target-accuracy", "0"]);
    assert_eq!(r.code, Some(0), "{r:?}");
    let h = kiln_in(&dir, &["train", "--help"]);
    assert!(h.out.contains("--no-graph") && h.out.contains("f16"), "{h:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

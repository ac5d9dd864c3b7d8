//! Checkpoints a user can trust: atomic saves, checksums, the destination checked before training.

use kiln::checkpoint::{TrainingState, load_training, save_training};
use kiln::nn::{Activation, Module, Sequential, mlp};
use kiln::optim::{Adam, Optimizer, Sgd};
use kiln::tensor::{DType, Tensor};
use kiln::train::{DataSource, DeviceChoice, TrainConfig, train};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-ckpt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The names of the entries of `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// The `kiln` binary (`$KILN_BIN` in the GPU bundle, else the one cargo built for these tests).
fn kiln_exe(test: &str) -> Option<PathBuf> {
    kiln::testing::kiln_binary(test, env!("CARGO_BIN_EXE_kiln"))
}

/// `(start, end)` of tensor `name`'s bytes in a safetensors file.
fn data_range(bytes: &[u8], name: &str) -> (usize, usize) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let off = &header[name]["data_offsets"];
    (8 + n + off[0].as_u64().unwrap() as usize, 8 + n + off[1].as_u64().unwrap() as usize)
}

/// `bytes` (a safetensors file) with its header's metadata edited by `edit`.
fn rewrite_metadata(bytes: &[u8], edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) -> Vec<u8> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(header["__metadata__"].as_object_mut().unwrap());
    let mut h = serde_json::to_vec(&header).unwrap();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(&bytes[8 + n..]);
    out
}

/// A kiln process whose file writes stop at a size limit (the shell ignores SIGXFSZ, so the write
/// fails with EFBIG instead of killing the process) must not damage the previous checkpoint: the
/// save fails, the old file keeps every byte, and no temporary file is left beside it.
#[cfg(unix)]
#[test]
fn a_save_cut_short_by_a_file_size_limit_leaves_the_previous_checkpoint() {
    let dir = tmpdir("fsize");
    let path = dir.join("c.safetensors");
    let args = |seed: &str| {
        ["train", "--epochs", "1", "--device", "cpu", "--target-accuracy", "0", "--seed", seed, "--checkpoint"]
            .map(String::from)
            .into_iter()
            .chain([path.to_string_lossy().into_owned()])
            .collect::<Vec<_>>()
    };
    let Some(exe) = kiln_exe("a_save_cut_short_by_a_file_size_limit_leaves_the_previous_checkpoint") else { return };
    let first = Command::new(&exe).args(args("1")).output().unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let good = std::fs::read(&path).unwrap();
    assert!(good.len() > 40 * 1024, "the checkpoint ({} bytes) must be larger than the limit", good.len());

    // 40 blocks of 512 bytes (dash and bash count -f in 512-byte blocks): 20 KiB
    let cut = Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 40 && exec \"$0\" \"$@\"")
        .arg(&exe)
        .args(args("2"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&cut.stderr);
    assert!(!cut.status.success(), "a save cut short must fail the run");
    assert!(
        stderr.contains("c.safetensors") && stderr.contains("unchanged"),
        "the error names the checkpoint: {stderr}"
    );
    assert!(std::fs::read(&path).unwrap() == good, "the previous checkpoint changed");
    assert_eq!(entries(&dir), ["c.safetensors"], "a temporary file was left behind");
    kiln::checkpoint::load(&path).expect("the previous checkpoint still loads");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A byte flipped in a tensor's data is caught on load, with the tensor named.
#[test]
fn flipped_bytes_in_tensor_data_are_an_error_naming_the_tensor() {
    let dir = tmpdir("flip");
    let path = dir.join("c.safetensors");
    let a = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0], [2, 2], DType::F32).unwrap();
    let b = Tensor::from_f64(&[5.0, 6.0, 7.0], [3], DType::F32).unwrap();
    kiln::checkpoint::save(&path, &[("a".into(), a), ("layer.b".into(), b)], HashMap::new()).unwrap();
    kiln::checkpoint::load(&path).expect("an intact file loads");
    let mut bytes = std::fs::read(&path).unwrap();
    let (start, end) = data_range(&bytes, "layer.b");
    assert_eq!(end - start, 12);
    bytes[start + 5] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    match kiln::checkpoint::load(&path) {
        Err(kiln::Error::CorruptCheckpoint { tensor, expected, actual, .. }) => {
            assert_eq!(tensor, "layer.b");
            assert_ne!(expected, actual);
        }
        Err(e) => panic!("expected CorruptCheckpoint, got {e}"),
        Ok(_) => panic!("a corrupted tensor must not load"),
    }
    let e = kiln::checkpoint::load(&path).err().expect("still corrupted").to_string();
    assert!(e.contains("`layer.b`") && e.contains("c.safetensors") && !e.contains("`a`"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Training to a checkpoint in a folder that does not exist stops before any work, naming the path.
#[test]
fn an_unwritable_checkpoint_destination_stops_training_before_any_work() {
    let path = PathBuf::from("/nonexistent-kiln-dir/x.safetensors");
    let cfg = TrainConfig {
        data: DataSource::Spirals { per_class: 100, classes: 3, noise: 0.2 },
        epochs: 1,
        device: DeviceChoice::Cpu,
        checkpoint: Some(path),
        progress: false,
        ..TrainConfig::default()
    };
    let mut lines = Vec::new();
    let e = train(&cfg, |l| lines.push(l.to_string())).err().expect("refused");
    assert!(lines.is_empty(), "work started before the check: {lines:?}");
    assert!(e.to_string().contains("/nonexistent-kiln-dir/x.safetensors"), "{e}");
}

/// The same through the binary, as a user meets it.
#[test]
fn the_cli_checks_the_checkpoint_destination_before_training() {
    let Some(exe) = kiln_exe("the_cli_checks_the_checkpoint_destination_before_training") else { return };
    let out = Command::new(&exe)
        .args(["train", "--checkpoint", "/nonexistent-dir/x.safetensors", "--epochs", "1", "--device", "cpu"])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success());
    assert!(stdout.is_empty(), "training output before the check: {stdout}");
    assert!(stderr.contains("/nonexistent-dir/x.safetensors") && stderr.contains("does not exist"), "{stderr}");
}

/// `kiln eval` of a checkpoint with a flipped byte fails, naming the tensor, instead of evaluating
/// a damaged model.
#[test]
fn eval_of_a_corrupted_checkpoint_fails_naming_the_tensor() {
    let Some(exe) = kiln_exe("eval_of_a_corrupted_checkpoint_fails_naming_the_tensor") else { return };
    let dir = tmpdir("eval");
    let path = dir.join("c.safetensors");
    let out = Command::new(&exe)
        .args(["train", "--epochs", "1", "--device", "cpu", "--target-accuracy", "0", "--checkpoint"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut bytes = std::fs::read(&path).unwrap();
    let (start, _) = data_range(&bytes, "2.weight");
    bytes[start + 17] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let out = Command::new(&exe).args(["eval", "--checkpoint"]).arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "eval of a corrupted checkpoint must fail: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(stderr.contains("`2.weight`"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A checkpoint without checksums (as kiln wrote before them, or another tool writes) loads, its
/// values intact; one whose header lost a single tensor's checksum is refused as damaged.
#[test]
fn checkpoints_without_checksums_still_load() {
    let dir = tmpdir("old");
    let path = dir.join("c.safetensors");
    let a = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0], [2, 2], DType::F32).unwrap();
    let b = Tensor::from_f64(&[5.0, 6.0, 7.0], [3], DType::F64).unwrap();
    let meta = HashMap::from([("width".to_string(), "2".to_string())]);
    kiln::checkpoint::save(&path, &[("a".into(), a), ("b".into(), b)], meta.clone()).unwrap();
    let new = std::fs::read(&path).unwrap();

    let old = rewrite_metadata(&new, |m| m.retain(|k, _| !k.starts_with(kiln::checkpoint::CHECKSUM_PREFIX)));
    assert!(!String::from_utf8_lossy(&old).contains("crc32"));
    std::fs::write(&path, &old).unwrap();
    let (t, m) = kiln::checkpoint::load(&path).expect("a file without checksums loads");
    assert_eq!(m, meta);
    assert_eq!(t["a"].to_vec_f64(), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(t["b"].to_vec_f64(), [5.0, 6.0, 7.0]);

    let half = rewrite_metadata(&new, |m| {
        m.remove("kiln.crc32.b").expect("b's checksum");
    });
    std::fs::write(&path, &half).unwrap();
    let e = kiln::checkpoint::load(&path).err().expect("a damaged header").to_string();
    assert!(e.contains("`b`") && e.contains("no checksum"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

type MakeOptimizer = fn(Vec<(String, Tensor)>) -> Box<dyn Optimizer>;

/// One step of training on batch `i` (fixed inputs and labels for each `i`).
fn train_step(model: &Sequential, opt: &mut dyn Optimizer, i: u64) {
    let x = Tensor::randn([32, 2], DType::F32, &mut Tensor::rng(100 + i));
    let y: Vec<usize> = (0..32).map(|r| (r * 7 + i as usize) % 3).collect();
    let loss = model.forward(&x).unwrap().cross_entropy(&y).unwrap();
    loss.backward().unwrap();
    opt.step().unwrap();
    opt.zero_grad();
}

fn bits(ts: &[(String, Tensor)]) -> Vec<(String, Vec<u64>)> {
    ts.iter().map(|(n, t)| (n.clone(), t.to_vec_f64().iter().map(|v| v.to_bits()).collect())).collect()
}

/// save_training / load_training: a fresh model and optimizer loaded from the checkpoint hold
/// bit-identical parameters and optimizer state and the same training state, and two more steps
/// from there give the same weights as two more steps of the run that never stopped.
#[test]
fn a_training_checkpoint_resumes_exactly() {
    let dir = tmpdir("resume");
    let path = dir.join("run.safetensors");
    let optimizers: [(&str, MakeOptimizer); 3] = [
        ("adam", |p| Box::new(Adam::adam(p, 1e-2, 1e-3))),
        ("adamw", |p| Box::new(Adam::adamw(p, 1e-2, 1e-2))),
        ("nesterov", |p| Box::new(Sgd::new(p, 0.05, 0.9, 1e-4, true))),
    ];
    for (name, make) in optimizers {
        let model = mlp(2, 16, 3, 3, Activation::Relu, DType::F32, &mut Tensor::rng(0)).unwrap();
        let mut opt = make(model.named_parameters());
        for i in 0..3 {
            train_step(&model, opt.as_mut(), i);
        }
        let saved = TrainingState {
            step: 3,
            epoch: 1,
            config: HashMap::from([("width".into(), "16".into()), ("optimizer".into(), name.into())]),
        };
        save_training(&path, &model, opt.as_ref(), &saved).unwrap();

        let fresh = mlp(2, 16, 3, 3, Activation::Relu, DType::F32, &mut Tensor::rng(7)).unwrap();
        let mut fresh_opt = make(fresh.named_parameters());
        assert_ne!(bits(&fresh.named_parameters()), bits(&model.named_parameters()), "{name}: same start");
        let loaded = load_training(&path, &fresh, fresh_opt.as_mut()).unwrap();
        assert_eq!(loaded, saved, "{name}");
        assert_eq!(bits(&fresh.named_parameters()), bits(&model.named_parameters()), "{name}: parameters");
        let state = bits(&opt.state().unwrap());
        assert!(!state.is_empty());
        assert_eq!(bits(&fresh_opt.state().unwrap()), state, "{name}: optimizer state");

        for i in 3..5 {
            train_step(&model, opt.as_mut(), i);
            train_step(&fresh, fresh_opt.as_mut(), i);
        }
        let after = bits(&model.named_parameters());
        assert_ne!(after, bits(&loaded_params(&path)), "{name}: the steps changed nothing");
        assert_eq!(bits(&fresh.named_parameters()), after, "{name}: resumed training diverged");
        assert_eq!(bits(&fresh_opt.state().unwrap()), bits(&opt.state().unwrap()), "{name}: state diverged");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The parameters saved in a training checkpoint, by name, in the model's order.
fn loaded_params(path: &Path) -> Vec<(String, Tensor)> {
    let (t, _) = kiln::checkpoint::load(path).unwrap();
    let names = ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"];
    names.iter().map(|n| (n.to_string(), t[*n].clone())).collect()
}

/// load_training of a file without training state says what it lacks and what to use instead.
#[test]
fn load_training_of_a_plain_checkpoint_says_what_is_missing() {
    let dir = tmpdir("plain");
    let path = dir.join("c.safetensors");
    let model = mlp(2, 4, 2, 2, Activation::Relu, DType::F32, &mut Tensor::rng(0)).unwrap();
    kiln::checkpoint::save(&path, &model.named_parameters(), HashMap::new()).unwrap();
    let mut opt = Adam::adam(model.named_parameters(), 1e-2, 0.0);
    let e = load_training(&path, &model, &mut opt).err().expect("no training state").to_string();
    assert!(e.contains("kiln.step") && e.contains("checkpoint::load"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

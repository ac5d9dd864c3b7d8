//! Modules, optimizers, schedules, checkpoints, datasets and the training loop.

use kiln::data;
use kiln::nn::{Activation, Dropout, Linear, Module, mlp};
use kiln::optim::{Adam, LrSchedule, Optimizer, Sgd};
use kiln::tensor::{DType, Tensor};
use kiln::train::{DataSource, OptimizerKind, TrainConfig, train};
use std::collections::HashMap;

fn param(v: &[f64]) -> Tensor {
    Tensor::from_f64(v, [v.len()], DType::F64).unwrap().requires_grad()
}
fn set_grad(p: &Tensor, g: &[f64]) {
    p.zero_grad();
    // loss = sum(p * g) has gradient g
    p.mul(&Tensor::from_f64(g, [g.len()], DType::F64).unwrap()).unwrap().sum_all().unwrap().backward().unwrap();
}
fn close(a: &[f64], b: &[f64]) {
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

#[test]
fn linear_is_x_wt_plus_b_with_named_parameters() {
    let l = Linear::new(3, 2, true, DType::F64, &mut Tensor::rng(1)).unwrap();
    let x = Tensor::from_f64(&[1.0, 2.0, 3.0, -1.0, 0.0, 1.0], [2, 3], DType::F64).unwrap();
    let y = l.forward(&x).unwrap().to_vec_f64();
    let w = l.weight.to_vec_f64();
    for r in 0..2 {
        for o in 0..2 {
            let want: f64 = (0..3).map(|i| x.to_vec_f64()[r * 3 + i] * w[o * 3 + i]).sum();
            assert!((y[r * 2 + o] - want).abs() < 1e-12);
        }
    }
    let names: Vec<String> = l.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight", "bias"]);
    let m = mlp(2, 8, 3, 3, Activation::Relu, DType::F32, &mut Tensor::rng(0)).unwrap();
    let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]);
    // Kaiming normal: std sqrt(2 / fan_in)
    let big = Linear::new(400, 300, false, DType::F64, &mut Tensor::rng(2)).unwrap().weight.to_vec_f64();
    let std = (big.iter().map(|w| w * w).sum::<f64>() / big.len() as f64).sqrt();
    assert!((std / (2.0f64 / 400.0).sqrt() - 1.0).abs() < 0.02, "std {std}");
}

#[test]
fn sgd_momentum_and_nesterov_match_hand_computation() {
    let p = param(&[1.0, -2.0]);
    let mut opt = Sgd::new(vec![("p".into(), p.clone())], 0.1, 0.9, 0.0, false);
    set_grad(&p, &[1.0, 2.0]);
    opt.step().unwrap(); // v = g; p -= 0.1 v
    close(&p.to_vec_f64(), &[0.9, -2.2]);
    set_grad(&p, &[1.0, 2.0]);
    opt.step().unwrap(); // v = 0.9 v + g = 1.9 g
    close(&p.to_vec_f64(), &[0.9 - 0.19, -2.2 - 0.38]);

    let q = param(&[1.0]);
    let mut nes = Sgd::new(vec![("q".into(), q.clone())], 0.1, 0.9, 0.5, true);
    set_grad(&q, &[1.0]);
    nes.step().unwrap(); // g' = 1 + 0.5*1 = 1.5; v = 1.5; step = g' + 0.9 v = 2.85
    close(&q.to_vec_f64(), &[1.0 - 0.285]);
}

#[test]
fn adam_and_adamw_match_the_reference_formulas() {
    for decoupled in [false, true] {
        let p = param(&[0.5]);
        let mut opt = if decoupled {
            Adam::adamw(vec![("p".into(), p.clone())], 0.01, 0.1)
        } else {
            Adam::adam(vec![("p".into(), p.clone())], 0.01, 0.1)
        };
        let (mut w, mut m, mut v) = (0.5f64, 0.0, 0.0);
        for t in 1..=3 {
            let g0 = 0.3 * t as f64;
            set_grad(&p, &[g0]);
            opt.step().unwrap();
            let g = if decoupled { g0 } else { g0 + 0.1 * w };
            m = 0.9 * m + 0.1 * g;
            v = 0.999 * v + 0.001 * g * g;
            let (mh, vh) = (m / (1.0 - 0.9f64.powi(t)), v / (1.0 - 0.999f64.powi(t)));
            if decoupled {
                w -= 0.01 * 0.1 * w;
            }
            w -= 0.01 * mh / (vh.sqrt() + 1e-8);
            close(&p.to_vec_f64(), &[w]);
        }
    }
}

/// Gradient-norm clipping on the CPU reference: the global L2 norm over every parameter, the
/// scale min(1, max_norm / (norm + 1e-6)) applied by the next step only (before weight decay), the
/// gradients themselves untouched, and the range of max_norm checked.
#[test]
fn clip_grad_norm_scales_the_next_step_only() {
    let (p, q) = (param(&[1.0, -2.0]), param(&[0.5]));
    let mut opt = Sgd::new(vec![("p".into(), p.clone()), ("q".into(), q.clone())], 1.0, 0.0, 0.0, false);
    assert_eq!(opt.grad_norm().unwrap(), None);
    set_grad(&p, &[3.0, 4.0]);
    set_grad(&q, &[12.0]);
    opt.clip_grad_norm(1.3).unwrap();
    assert_eq!(opt.grad_norm().unwrap(), Some(13.0));
    close(&p.grad().unwrap().to_vec_f64(), &[3.0, 4.0]); // the gradients stay as they were
    opt.step().unwrap();
    let s = 1.3 / (13.0 + 1e-6);
    close(&p.to_vec_f64(), &[1.0 - 3.0 * s, -2.0 - 4.0 * s]);
    close(&q.to_vec_f64(), &[0.5 - 12.0 * s]);
    opt.step().unwrap(); // no clip since: the full gradient
    close(&q.to_vec_f64(), &[0.5 - 12.0 * s - 12.0]);
    // a norm below max_norm: scale 1
    opt.clip_grad_norm(100.0).unwrap();
    let before = q.to_vec_f64()[0];
    opt.step().unwrap();
    close(&q.to_vec_f64(), &[before - 12.0]);
    // a parameter without a gradient counts for nothing
    q.zero_grad();
    opt.clip_grad_norm(1.0).unwrap();
    assert_eq!(opt.grad_norm().unwrap(), Some(5.0));
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        match opt.clip_grad_norm(bad) {
            Err(kiln::Error::InvalidSetting { setting, .. }) => assert_eq!(setting, "--clip-grad-norm"),
            other => panic!("max_norm {bad}: {other:?}"),
        }
    }
    // Adam: the clipped gradient enters the moments, weight decay is added after the scale
    let r = param(&[0.5]);
    let mut adam = Adam::adam(vec![("r".into(), r.clone())], 0.01, 0.1);
    set_grad(&r, &[2.0]);
    adam.clip_grad_norm(0.5).unwrap();
    adam.step().unwrap();
    let g = 2.0 * (0.5 / (2.0 + 1e-6)) + 0.1 * 0.5;
    let (m, v) = (0.1 * g, 0.001 * g * g);
    let w = 0.5 - 0.01 * (m / 0.1) / ((v / (1.0 - 0.999f64)).sqrt() + 1e-8);
    close(&r.to_vec_f64(), &[w]);
    // no parameters: norm 0
    let mut empty = Sgd::new(Vec::new(), 0.1, 0.0, 0.0, false);
    empty.clip_grad_norm(1.0).unwrap();
    assert_eq!(empty.grad_norm().unwrap(), Some(0.0));
    empty.step().unwrap();
}

#[test]
fn schedules() {
    let s = LrSchedule::Step { every: 10, gamma: 0.5 };
    assert_eq!(s.lr(1.0, 9), 1.0);
    assert_eq!(s.lr(1.0, 10), 0.5);
    assert_eq!(s.lr(1.0, 25), 0.25);
    let c = LrSchedule::CosineWarmup { warmup: 10, total: 110, min_ratio: 0.1 };
    assert!((c.lr(1.0, 0) - 0.1).abs() < 1e-12);
    assert!((c.lr(1.0, 9) - 1.0).abs() < 1e-12);
    assert!((c.lr(1.0, 10) - 1.0).abs() < 1e-12);
    assert!((c.lr(1.0, 60) - 0.55).abs() < 1e-12);
    assert!((c.lr(1.0, 110) - 0.1).abs() < 1e-12);
    assert_eq!(LrSchedule::Constant.lr(0.3, 1000), 0.3);
}

#[test]
fn dropout_trains_and_evaluates() {
    let mut d = Dropout::new(0.5, 7);
    let x = Tensor::ones([1000], DType::F32);
    let y = d.forward(&x).unwrap().to_vec_f64();
    let kept = y.iter().filter(|&&v| v != 0.0).count();
    assert!(y.iter().all(|&v| v == 0.0 || v == 2.0));
    assert!((400..600).contains(&kept), "{kept}");
    d.set_training(false);
    assert_eq!(d.forward(&x).unwrap().to_vec_f64(), vec![1.0; 1000]);
}

fn small_config(dir: &std::path::Path) -> TrainConfig {
    TrainConfig {
        data: DataSource::Spirals { per_class: 200, classes: 3, noise: 0.2 },
        epochs: 25,
        checkpoint: Some(dir.join("model.safetensors")),
        progress: false,
        // The CPU reference, wherever the tests run (a GPU machine would pick CUDA under `Auto`,
        // and the checks below compare against a model loaded on the CPU).
        device: kiln::train::DeviceChoice::Cpu,
        ..TrainConfig::default()
    }
}

fn tmpdir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-test-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn training_learns_spirals_and_the_checkpoint_reproduces_the_model() {
    let dir = tmpdir("train");
    let cfg = small_config(&dir);
    let mut lines = Vec::new();
    let report = train(&cfg, |l| lines.push(l.to_string())).unwrap();
    let last = report.epochs.last().unwrap();
    assert!(last.test_accuracy >= 0.9, "test accuracy {}", last.test_accuracy);
    assert!(report.epochs[0].loss > last.loss);
    assert!(lines.iter().any(|l| l.contains("samples/s")));
    // a loaded model gives identical outputs
    let (loaded, meta) = kiln::train::load_model(&dir.join("model.safetensors")).unwrap();
    assert_eq!(meta["width"], "64");
    let x = Tensor::randn([50, 2], DType::F32, &mut Tensor::rng(3));
    assert_eq!(report.model.forward(&x).unwrap().to_vec_f64(), loaded.forward(&x).unwrap().to_vec_f64());
    // the optimizer state and the training state are in the checkpoint and load back in one call
    let fresh = mlp(2, 64, 3, 3, Activation::Relu, DType::F32, &mut Tensor::rng(5)).unwrap();
    let mut opt = Adam::adam(fresh.named_parameters(), 0.01, 0.0);
    let state = kiln::checkpoint::load_training(&dir.join("model.safetensors"), &fresh, &mut opt).unwrap();
    assert_eq!(opt.steps().unwrap() as usize, 25 * 480usize.div_ceil(64));
    assert_eq!((state.step, state.epoch), (opt.steps().unwrap(), 25));
    assert_eq!(state.config["width"], "64");
    assert_eq!(report.model.forward(&x).unwrap().to_vec_f64(), fresh.forward(&x).unwrap().to_vec_f64());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn same_seed_same_weights() {
    let dir = tmpdir("seed");
    let mut cfg = small_config(&dir);
    cfg.epochs = 2;
    cfg.checkpoint = None;
    let a = train(&cfg, |_| {}).unwrap().model.parameters();
    let b = train(&cfg, |_| {}).unwrap().model.parameters();
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.to_vec_f64(), y.to_vec_f64());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn non_finite_loss_stops_training_with_a_clear_message() {
    let dir = tmpdir("nan");
    let mut cfg = small_config(&dir);
    // a rate so large that the first update's weights overflow (a NaN rate is refused up front)
    cfg.lr = 1e300;
    cfg.warmup = 0;
    cfg.optimizer = OptimizerKind::Sgd { momentum: 0.0, nesterov: false };
    match train(&cfg, |_| {}) {
        Err(kiln::Error::NonFinite { step, .. }) => assert_eq!(step, 1),
        Err(e) => panic!("expected NonFinite, got {e}"),
        Ok(_) => panic!("training with a NaN learning rate must stop"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The library checks a configuration before any work starts, as the CLI does: every setting's
/// range, what the megakernel cannot honour, and the model's size against the memory there is.
#[test]
fn settings_are_checked_before_training_starts() {
    let dir = tmpdir("settings");
    let base = small_config(&dir);
    let refused = |cfg: TrainConfig| train(&cfg, |l| panic!("started: {l}")).err().expect("refused");
    for (cfg, setting) in [
        (TrainConfig { lr: -1.0, ..base.clone() }, "--lr"),
        (TrainConfig { lr: 0.0, ..base.clone() }, "--lr"),
        (TrainConfig { lr: f64::NAN, ..base.clone() }, "--lr"),
        (TrainConfig { weight_decay: -5.0, ..base.clone() }, "--weight-decay"),
        (TrainConfig { clip_grad_norm: Some(0.0), ..base.clone() }, "--clip-grad-norm"),
        (TrainConfig { clip_grad_norm: Some(f64::NAN), ..base.clone() }, "--clip-grad-norm"),
        (TrainConfig { clip_grad_norm: Some(-1.0), ..base.clone() }, "--clip-grad-norm"),
        (
            TrainConfig {
                megakernel: true,
                optimizer: OptimizerKind::Sgd { momentum: 0.9, nesterov: false },
                clip_grad_norm: Some(1.0),
                ..base.clone()
            },
            "--clip-grad-norm",
        ),
        (TrainConfig { width: 0, ..base.clone() }, "--width"),
        (TrainConfig { depth: 0, ..base.clone() }, "--depth"),
        (TrainConfig { batch: 0, ..base.clone() }, "--batch"),
        (TrainConfig { epochs: 0, ..base.clone() }, "--epochs"),
        (TrainConfig { mega_path: Some(kiln::megakernel::DataPath::Bf16), ..base.clone() }, "--mega-path"),
        (TrainConfig { megakernel: true, optimizer: OptimizerKind::Adam, ..base.clone() }, "--optimizer"),
        (
            TrainConfig {
                megakernel: true,
                optimizer: OptimizerKind::Sgd { momentum: 0.9, nesterov: true },
                ..base.clone()
            },
            "--optimizer",
        ),
        (
            TrainConfig {
                megakernel: true,
                optimizer: OptimizerKind::Sgd { momentum: 0.9, nesterov: false },
                activation: Activation::Gelu,
                ..base.clone()
            },
            "--activation",
        ),
        (
            TrainConfig {
                megakernel: true,
                optimizer: OptimizerKind::Sgd { momentum: 0.9, nesterov: false },
                dtype: DType::F64,
                ..base.clone()
            },
            "--dtype",
        ),
    ] {
        match refused(cfg) {
            kiln::Error::InvalidSetting { setting: s, .. } => assert_eq!(s, setting),
            e => panic!("{setting}: expected InvalidSetting, got {e}"),
        }
    }
    // a model that cannot fit: refused by its size (the width's square overflows 64 bits), not an abort
    for width in [100_000_000, usize::MAX] {
        let e = refused(TrainConfig { width, ..base.clone() });
        assert!(matches!(e, kiln::Error::OutOfMemory { place: "host", .. }), "{e}");
        assert!(e.to_string().contains("--width"), "{e}");
    }
    let need = TrainConfig { width: usize::MAX, ..base.clone() }.memory_need(2, 3, 100, false);
    assert_eq!(need.host, u64::MAX);
    let need = base.memory_need(2, 3, 100, false);
    assert!(need.host > 0 && need.host < 1 << 24 && need.device == 0, "{need:?}");
    assert!(!dir.join("model.safetensors").exists(), "a refused run saved a checkpoint");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn asking_for_cuda_without_a_gpu_is_a_typed_error() {
    if kiln::cuda::Device::count().is_ok_and(|n| n > 0) {
        return; // on a GPU machine the GPU suite trains on CUDA (gpu::train_main_job_on_cuda)
    }
    let mut cfg = small_config(&tmpdir("cuda"));
    cfg.device = kiln::train::DeviceChoice::Cuda;
    assert!(matches!(train(&cfg, |_| {}), Err(kiln::Error::NoDriver | kiln::Error::NoDevice { .. })));
}

fn write_idx(path: &std::path::Path, dims: &[u32], data: &[u8]) {
    let mut b = vec![0, 0, 0x08, dims.len() as u8];
    for d in dims {
        b.extend(d.to_be_bytes());
    }
    b.extend(data);
    std::fs::write(path, b).unwrap();
}

#[test]
fn mnist_idx_reader() {
    let dir = tmpdir("mnist");
    let pixels: Vec<u8> = (0..3 * 2 * 2).map(|i| (i * 20) as u8).collect();
    write_idx(&dir.join("train-images-idx3-ubyte"), &[3, 2, 2], &pixels);
    write_idx(&dir.join("train-labels-idx1-ubyte"), &[3], &[7, 0, 9]);
    let d = data::mnist(&dir, false).unwrap();
    assert_eq!((d.len(), d.features, d.classes), (3, 4, 10));
    assert_eq!(d.y, vec![7, 0, 9]);
    assert_eq!(d.x[5], 100.0 / 255.0);
    // errors: truncated data, bad magic, label out of range, mismatched counts, missing test split
    write_idx(&dir.join("train-labels-idx1-ubyte"), &[3], &[7, 0]);
    assert!(data::mnist(&dir, false).unwrap_err().to_string().contains("need 3 bytes"));
    std::fs::write(dir.join("train-labels-idx1-ubyte"), [1, 2, 3, 4]).unwrap();
    assert!(data::mnist(&dir, false).unwrap_err().to_string().contains("magic"));
    write_idx(&dir.join("train-labels-idx1-ubyte"), &[3], &[7, 0, 12]);
    assert!(data::mnist(&dir, false).unwrap_err().to_string().contains("label 12"));
    write_idx(&dir.join("train-labels-idx1-ubyte"), &[2], &[7, 0]);
    assert!(data::mnist(&dir, false).unwrap_err().to_string().contains("do not match"));
    assert!(data::mnist(&dir, true).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn checkpoint_shape_mismatch_is_an_error() {
    let dir = tmpdir("ckpt");
    let path = dir.join("c.safetensors");
    let w = Tensor::ones([2, 3], DType::F32);
    kiln::checkpoint::save(&path, &[("w".into(), w)], HashMap::new()).unwrap();
    let (saved, _) = kiln::checkpoint::load(&path).unwrap();
    let other = Tensor::zeros([3, 2], DType::F32);
    let e = kiln::checkpoint::assign(&[("w".into(), other.clone())], &saved, "").unwrap_err().to_string();
    assert!(e.contains("[2, 3]") && e.contains("[3, 2]"), "{e}");
    let e = kiln::checkpoint::assign(&[("missing".into(), other)], &saved, "").unwrap_err().to_string();
    assert!(e.contains("missing"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_megakernel_schedule_trains_the_main_job_on_the_cpu_interpreter() {
    let cfg = TrainConfig {
        data: DataSource::Spirals { per_class: 300, classes: 3, noise: 0.2 },
        epochs: 15,
        lr: 0.1,
        megakernel: true,
        optimizer: OptimizerKind::Sgd { momentum: 0.9, nesterov: false },
        device: kiln::train::DeviceChoice::Cpu,
        checkpoint: None,
        progress: false,
        ..TrainConfig::default()
    };
    let report = train(&cfg, |_| {}).unwrap();
    assert!(report.device.contains("interpreter"), "{}", report.device);
    let acc = report.epochs.last().unwrap().test_accuracy;
    assert!(acc >= 0.9, "test accuracy {acc}");
    // the bf16 path's arithmetic (operands rounded to bf16) trains as well
    let bf16 = TrainConfig { mega_path: Some(kiln::megakernel::DataPath::Bf16), ..cfg };
    let report = train(&bf16, |_| {}).unwrap();
    let acc = report.epochs.last().unwrap().test_accuracy;
    assert!(acc >= 0.9, "bf16 operands: test accuracy {acc}");
}

/// `--matmul-precision bf16` does not apply to the megakernel (its products follow `--mega-path`):
/// asking for both is a typed error that says so, not a silently ignored option.
#[test]
fn matmul_precision_with_the_megakernel_is_refused() {
    let cfg = TrainConfig {
        megakernel: true,
        optimizer: OptimizerKind::Sgd { momentum: 0.9, nesterov: false },
        matmul_precision: kiln::cuda::MatmulPrecision::Bf16,
        checkpoint: None,
        progress: false,
        ..TrainConfig::default()
    };
    let e = train(&cfg, |_| {}).err().expect("refused").to_string();
    assert!(e.contains("--matmul-precision") && e.contains("--mega-path"), "{e}");
}

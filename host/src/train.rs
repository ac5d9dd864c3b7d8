//! The main job: train a classifier MLP, report loss and accuracy per epoch, save a checkpoint.

use crate::checkpoint::{self, TrainingState};
use crate::data::{self, Dataset};
use crate::error::{Error, Result};
use crate::nn::{Activation, Module, Sequential, mlp};
use crate::optim::{Adam, LrSchedule, Optimizer, Sgd};
use crate::tensor::{DType, Device, Tensor, no_grad};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

/// Where the data comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum DataSource {
    /// Generated spirals (kiln ships the generator, not a file).
    Spirals {
        /// Points per class.
        per_class: usize,
        /// Number of classes (arms).
        classes: usize,
        /// Angle noise.
        noise: f64,
    },
    /// MNIST IDX files in a directory.
    Mnist(PathBuf),
}

/// The optimizer to train with.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OptimizerKind {
    /// SGD with momentum (Nesterov when the flag is set).
    Sgd {
        /// Momentum.
        momentum: f64,
        /// Nesterov momentum.
        nesterov: bool,
    },
    /// Adam.
    Adam,
    /// AdamW.
    AdamW,
}

/// Which device to train on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The GPU when kiln can train there, else the CPU.
    Auto,
    /// The CPU reference backend.
    Cpu,
    /// The GPU.
    Cuda,
}

/// Everything a training run needs.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    /// The data.
    pub data: DataSource,
    /// Hidden width.
    pub width: usize,
    /// Linear layers.
    pub depth: usize,
    /// Activation.
    pub activation: Activation,
    /// Batch size.
    pub batch: usize,
    /// Passes over the training set.
    pub epochs: usize,
    /// Optimizer.
    pub optimizer: OptimizerKind,
    /// Base learning rate.
    pub lr: f64,
    /// Weight decay.
    pub weight_decay: f64,
    /// Warmup steps of the cosine schedule (0: constant rate).
    pub warmup: usize,
    /// Device.
    pub device: DeviceChoice,
    /// Parameter dtype.
    pub dtype: DType,
    /// Seed for data, initialization and shuffling.
    pub seed: u64,
    /// Where to save the checkpoint (None: do not save): the model, the optimizer's state and the
    /// run's description, through [`checkpoint::save_training`]. [`train`] checks that it can be
    /// written before the first step ([`Error::CheckpointDestination`] otherwise).
    pub checkpoint: Option<PathBuf>,
    /// Show a progress bar.
    pub progress: bool,
    /// Train with the megakernel (one launch per step; bias-free ReLU MLP, SGD with momentum 0.9,
    /// cross-entropy) instead of the layer-by-layer path. Without a GPU its schedule runs on the
    /// CPU interpreter.
    pub megakernel: bool,
    /// The megakernel's data path on the GPU (None: the tensor-core path with 3xTF32 products
    /// where the GPU has TMA, sm_90 and newer; the CUDA-core path elsewhere).
    pub mega_path: Option<crate::megakernel::DataPath>,
    /// How the layer-by-layer path's f32 matrix products run on the GPU (set for the run on the
    /// training thread, restored afterwards; the CPU backend's products are always f32).
    pub matmul_precision: crate::cuda::MatmulPrecision,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            data: DataSource::Spirals { per_class: 1000, classes: 3, noise: 0.2 },
            width: 64,
            depth: 3,
            activation: Activation::Relu,
            batch: 64,
            epochs: 40,
            optimizer: OptimizerKind::Adam,
            lr: 1e-2,
            weight_decay: 0.0,
            warmup: 50,
            device: DeviceChoice::Auto,
            dtype: DType::F32,
            seed: 0,
            checkpoint: Some(PathBuf::from("kiln-mlp.safetensors")),
            progress: true,
            megakernel: false,
            mega_path: None,
            matmul_precision: crate::cuda::MatmulPrecision::F32,
        }
    }
}

/// One epoch's numbers.
#[derive(Clone, Debug)]
pub struct EpochReport {
    /// 1-based epoch.
    pub epoch: usize,
    /// Mean training loss.
    pub loss: f64,
    /// Accuracy on the training set (during the epoch's batches).
    pub train_accuracy: f64,
    /// Accuracy on the held-out set after the epoch.
    pub test_accuracy: f64,
    /// Mean wall time per step.
    pub step_ms: f64,
    /// Training samples per second.
    pub samples_per_s: f64,
}

/// What a run produced.
pub struct TrainReport {
    /// Per-epoch numbers.
    pub epochs: Vec<EpochReport>,
    /// The trained model.
    pub model: Sequential,
    /// Where the checkpoint went.
    pub checkpoint: Option<PathBuf>,
    /// The device trained on, in words.
    pub device: String,
}

fn load_data(cfg: &TrainConfig) -> Result<(Dataset, Dataset)> {
    match &cfg.data {
        DataSource::Spirals { per_class, classes, noise } => {
            let mut rng = Tensor::rng(cfg.seed);
            let all = data::spirals(*per_class, *classes, *noise, &mut rng);
            Ok(all.split(0.2, &mut rng))
        }
        DataSource::Mnist(dir) => Ok((data::mnist(dir, false)?, data::mnist(dir, true)?)),
    }
}

/// Accuracy of `model` on `data`, in batches, without recording a graph.
pub fn accuracy(model: &Sequential, data: &Dataset, dtype: DType, device: &Device) -> Result<f64> {
    let _g = no_grad();
    let mut correct = 0usize;
    let idx: Vec<usize> = (0..data.len()).collect();
    for chunk in idx.chunks(1024) {
        let (x, y) = data.gather(chunk);
        let x = Tensor::from_vec(x, [chunk.len(), data.features])?.to_dtype(dtype)?.to_device(device)?;
        let pred = model.forward(&x)?.argmax_last()?;
        correct += pred.iter().zip(&y).filter(|(p, t)| p == t).count();
    }
    Ok(correct as f64 / data.len().max(1) as f64)
}

fn pick_device(choice: DeviceChoice, dtype: DType) -> Result<(Device, String)> {
    let gpu = crate::cuda::Device::shared();
    match (choice, gpu) {
        (DeviceChoice::Cpu, _) => Ok((Device::Cpu, "CPU (as asked)".into())),
        (DeviceChoice::Cuda | DeviceChoice::Auto, Ok(_)) if dtype != DType::F32 => {
            if choice == DeviceChoice::Cuda {
                return Err(Error::Unsupported {
                    op: "train",
                    what: format!("{dtype:?} on CUDA: kiln's CUDA tensors are f32"),
                });
            }
            Ok((Device::Cpu, format!("CPU ({dtype:?} runs on the CPU backend; CUDA tensors are f32)")))
        }
        (DeviceChoice::Cuda | DeviceChoice::Auto, Ok(d)) => {
            let (major, minor) = d.compute_capability();
            let what = format!("GPU: {} (compute capability {major}.{minor}, {} module)", d.name(), d.arch().name());
            Ok((Device::Cuda(d), what))
        }
        (DeviceChoice::Cuda, Err(e)) => Err(e),
        (DeviceChoice::Auto, Err(e)) => Ok((Device::Cpu, format!("CPU (no usable GPU: {e})"))),
    }
}

fn precision_words(p: crate::cuda::MatmulPrecision) -> &'static str {
    match p {
        crate::cuda::MatmulPrecision::F32 => "f32 FMA chains (the GEMM ladder's FP32 rungs)",
        crate::cuda::MatmulPrecision::Bf16 => "bf16 operands, f32 accumulation, on the tensor cores",
    }
}

/// Checkpoint metadata describing the model, so `eval` can rebuild it.
fn metadata(cfg: &TrainConfig, data: &Dataset) -> HashMap<String, String> {
    let mut m = HashMap::new();
    m.insert("features".into(), data.features.to_string());
    m.insert("classes".into(), data.classes.to_string());
    m.insert("width".into(), cfg.width.to_string());
    m.insert("depth".into(), cfg.depth.to_string());
    m.insert("activation".into(), format!("{:?}", cfg.activation));
    m.insert("dtype".into(), checkpoint::dtype_name(cfg.dtype).into());
    m.insert("seed".into(), cfg.seed.to_string());
    m.insert("data".into(), format!("{:?}", cfg.data));
    m
}

/// Trains per `cfg`, printing one line per epoch to `log`.
pub fn train(cfg: &TrainConfig, mut log: impl FnMut(&str)) -> Result<TrainReport> {
    if cfg.batch == 0 || cfg.epochs == 0 {
        return Err(Error::shape("train", format!("batch {} and epochs {} must be positive", cfg.batch, cfg.epochs)));
    }
    // a checkpoint that cannot be written is found out before any work, not after the last epoch
    if let Some(path) = &cfg.checkpoint {
        checkpoint::check_destination(path)?;
    }
    if cfg.megakernel {
        if cfg.matmul_precision != crate::cuda::MatmulPrecision::F32 {
            return Err(Error::Unsupported {
                op: "train",
                what: "--matmul-precision with --megakernel: the megakernel's products follow --mega-path \
                       (cuda-cores, tf32, tf32x3 or bf16); drop one of the two options"
                    .into(),
            });
        }
        return train_megakernel(cfg, log);
    }
    let (device, device_name) = pick_device(cfg.device, cfg.dtype)?;
    log(&format!("training on the {device_name}"));
    // this thread's setting for the run (the training loop runs here), restored on return
    let _precision = crate::cuda::matmul_precision_scope(cfg.matmul_precision);
    match &device {
        Device::Cuda(_) => log(&format!("matrix products: {}", precision_words(cfg.matmul_precision))),
        Device::Cpu if cfg.matmul_precision != crate::cuda::MatmulPrecision::F32 => {
            log("matrix products: f32 (the CPU backend has no bf16 products; the precision applies on CUDA)")
        }
        Device::Cpu => {}
    }
    let (train_set, test_set) = load_data(cfg)?;
    if train_set.is_empty() || test_set.is_empty() {
        return Err(Error::shape("train", "the dataset split left no training or no test rows"));
    }
    let mut rng = Tensor::rng(cfg.seed.wrapping_add(1));
    let model = mlp(train_set.features, cfg.width, cfg.depth, train_set.classes, cfg.activation, cfg.dtype, &mut rng)?;
    let params = model.named_parameters();
    for (_, p) in &params {
        p.move_to(&device)?;
    }
    let n_params: usize = params.iter().map(|(_, p)| p.elem_count()).sum();
    log(&format!(
        "model: MLP {} -> {} x {} -> {} ({} parameters), {} train / {} test rows, batch {}, {:?}, lr {}",
        train_set.features,
        cfg.depth.saturating_sub(1),
        cfg.width,
        train_set.classes,
        n_params,
        train_set.len(),
        test_set.len(),
        cfg.batch,
        cfg.optimizer,
        cfg.lr
    ));
    let mut opt: Box<dyn Optimizer> = match cfg.optimizer {
        OptimizerKind::Sgd { momentum, nesterov } => {
            Box::new(Sgd::new(params, cfg.lr, momentum, cfg.weight_decay, nesterov))
        }
        OptimizerKind::Adam => Box::new(Adam::adam(params, cfg.lr, cfg.weight_decay)),
        OptimizerKind::AdamW => Box::new(Adam::adamw(params, cfg.lr, cfg.weight_decay)),
    };
    let steps_per_epoch = train_set.len().div_ceil(cfg.batch);
    let total = steps_per_epoch * cfg.epochs;
    let schedule = if cfg.warmup > 0 {
        LrSchedule::CosineWarmup { warmup: cfg.warmup.min(total), total, min_ratio: 0.05 }
    } else {
        LrSchedule::Constant
    };
    let mut reports = Vec::new();
    let mut step = 0usize;
    let mut order: Vec<usize> = (0..train_set.len()).collect();
    for epoch in 1..=cfg.epochs {
        for i in (1..order.len()).rev() {
            order.swap(i, rand::Rng::random_range(&mut rng, 0..=i));
        }
        let bar = if cfg.progress {
            let b = indicatif::ProgressBar::new(steps_per_epoch as u64);
            b.set_style(
                indicatif::ProgressStyle::with_template("epoch {prefix:>3} [{bar:30}] {pos}/{len} loss {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            b.set_prefix(epoch.to_string());
            b
        } else {
            indicatif::ProgressBar::hidden()
        };
        let (mut loss_sum, mut correct) = (0.0, 0usize);
        let started = Instant::now();
        for chunk in order.chunks(cfg.batch) {
            opt.set_lr(schedule.lr(cfg.lr, step));
            let (x, y) = train_set.gather(chunk);
            let x = Tensor::from_vec(x, [chunk.len(), train_set.features])?.to_dtype(cfg.dtype)?.to_device(&device)?;
            let logits = model.forward(&x)?;
            let loss = logits.cross_entropy(&y)?;
            let lv = loss.item()?;
            if !lv.is_finite() {
                return Err(Error::NonFinite { what: "the training loss".into(), value: lv, step });
            }
            loss.backward()?;
            opt.step()?;
            opt.zero_grad();
            loss_sum += lv * chunk.len() as f64;
            correct += logits.argmax_last()?.iter().zip(&y).filter(|(p, t)| p == t).count();
            step += 1;
            bar.set_message(format!("{lv:.4}"));
            bar.inc(1);
        }
        bar.finish_and_clear();
        let elapsed = started.elapsed().as_secs_f64();
        let r = EpochReport {
            epoch,
            loss: loss_sum / train_set.len() as f64,
            train_accuracy: correct as f64 / train_set.len() as f64,
            test_accuracy: accuracy(&model, &test_set, cfg.dtype, &device)?,
            step_ms: 1e3 * elapsed / steps_per_epoch as f64,
            samples_per_s: train_set.len() as f64 / elapsed,
        };
        log(&format!(
            "epoch {:>3}  loss {:.4}  train acc {:6.2}%  test acc {:6.2}%  step {:.3} ms  {:.0} samples/s",
            r.epoch,
            r.loss,
            100.0 * r.train_accuracy,
            100.0 * r.test_accuracy,
            r.step_ms,
            r.samples_per_s
        ));
        reports.push(r);
    }
    if let Some(path) = &cfg.checkpoint {
        let state = TrainingState { step: step as u64, epoch: cfg.epochs as u64, config: metadata(cfg, &train_set) };
        checkpoint::save_training(path, &model, opt.as_ref(), &state)?;
        log(&format!("saved checkpoint {}", path.display()));
    }
    Ok(TrainReport { epochs: reports, model, checkpoint: cfg.checkpoint.clone(), device: device_name })
}

/// Rebuilds the model a checkpoint describes and loads its parameters (the checksums checked; a
/// checkpoint from a kiln without checksums loads unchecked).
pub fn load_model(path: &std::path::Path) -> Result<(Sequential, HashMap<String, String>)> {
    let (tensors, meta) = checkpoint::load(path)?;
    let get = |k: &str| -> Result<usize> {
        meta.get(k)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| Error::File { path: path.into(), msg: format!("metadata `{k}` missing") })
    };
    let act =
        if meta.get("activation").map(String::as_str) == Some("Gelu") { Activation::Gelu } else { Activation::Relu };
    let dtype = match meta.get("dtype").map(String::as_str) {
        Some("f64") => DType::F64,
        _ => DType::F32,
    };
    let model = mlp(get("features")?, get("width")?, get("depth")?, get("classes")?, act, dtype, &mut Tensor::rng(0))?;
    checkpoint::assign(&model.named_parameters(), &tensors, "")?;
    Ok((model, meta))
}

/// The main job through the megakernel: one launch per training step (or, without a GPU, the same
/// schedule on the CPU interpreter). Full batches only (a last partial batch is dropped each epoch).
fn train_megakernel(cfg: &TrainConfig, mut log: impl FnMut(&str)) -> Result<TrainReport> {
    use crate::megakernel::{DataPath, GpuStep, Loss, MlpShape, StepInputs, StepState, build, interpret};
    use crate::nn::{Linear, ReLU};
    if cfg.depth == 0 {
        return Err(Error::shape("train", "depth must be at least 1"));
    }
    let (train_set, test_set) = load_data(cfg)?;
    // The megakernel's layers have no bias; a constant 1 appended to every input row gives the first
    // layer one (without it a ReLU network is positively homogeneous and cannot use the radius).
    let with_one = |d: &crate::data::Dataset| crate::data::Dataset {
        x: d.x.chunks(d.features).flat_map(|r| r.iter().copied().chain([1.0])).collect(),
        y: d.y.clone(),
        features: d.features + 1,
        classes: d.classes,
    };
    let (train_set, test_set) = (with_one(&train_set), with_one(&test_set));
    if train_set.len() < cfg.batch {
        return Err(Error::shape(
            "train",
            format!("{} training rows are fewer than one batch of {}", train_set.len(), cfg.batch),
        ));
    }
    let mut dims = vec![train_set.features];
    dims.extend(std::iter::repeat_n(cfg.width, cfg.depth - 1));
    dims.push(train_set.classes);
    let shape = MlpShape { batch: cfg.batch, dims: dims.clone() };
    let mut rng = Tensor::rng(cfg.seed.wrapping_add(1));
    let mut model = Sequential::new();
    for l in 0..cfg.depth {
        model = model.push(Linear::new(dims[l], dims[l + 1], false, DType::F32, &mut rng)?);
        if l + 1 < cfg.depth {
            model = model.push(ReLU);
        }
    }
    let weights: Vec<Vec<f32>> = model.parameters().iter().map(|p| p.to_vec_f32()).collect();
    let gpu = match cfg.device {
        DeviceChoice::Cpu => None,
        DeviceChoice::Cuda => Some(crate::cuda::Device::shared()?),
        DeviceChoice::Auto => crate::cuda::Device::shared().ok(),
    };
    let sms = match &gpu {
        Some(d) => d.sm_count()?,
        None => 8,
    };
    let path = cfg.mega_path.unwrap_or(match &gpu {
        Some(d) if crate::megakernel::tensor_core_step_supported(d) => DataPath::Tf32x3,
        Some(_) => DataPath::CudaCores,
        None => DataPath::default(),
    });
    let schedule = build(&shape, sms, path)?;
    let (mut on_gpu, mut on_cpu) = match &gpu {
        Some(d) => {
            let mut g = GpuStep::new(d.clone(), &schedule, &weights, path)?;
            // a stall is reported when the epoch's weights are read, without a wait after every step
            g.check_every = 0;
            (Some(g), None)
        }
        // the interpreter multiplies what the path's kernel would (operands rounded on tf32, bf16)
        None => (None, Some(StepState::new(&shape, weights)?.with_operands(path))),
    };
    let device_name = match &gpu {
        Some(d) => format!(
            "GPU: {} (megakernel, {path:?} path, tile {}, one launch per step, {} instructions on {sms} SMs)",
            d.name(),
            schedule.tile,
            schedule.order.len()
        ),
        None => format!("CPU (megakernel schedule on the CPU interpreter, {} instructions)", schedule.order.len()),
    };
    log(&format!("training on the {device_name}"));
    log(&format!("model: bias-free MLP {dims:?}, SGD lr {} momentum 0.9, batch {}", cfg.lr, cfg.batch));
    let steps_per_epoch = train_set.len() / cfg.batch;
    let mut order: Vec<usize> = (0..train_set.len()).collect();
    let mut reports = Vec::new();
    let mut step = 0usize;
    for epoch in 1..=cfg.epochs {
        for i in (1..order.len()).rev() {
            order.swap(i, rand::Rng::random_range(&mut rng, 0..=i));
        }
        let started = Instant::now();
        for chunk in order.chunks_exact(cfg.batch) {
            let (x, y) = train_set.gather(chunk);
            let inp =
                StepInputs { x: &x, y: &[], classes: &y, loss: Loss::CrossEntropy, lr: cfg.lr as f32, momentum: 0.9 };
            match (&mut on_gpu, &mut on_cpu) {
                (Some(g), _) => g.step(&inp)?,
                (_, Some(c)) => interpret(&schedule, c, &inp, step as u64)?,
                _ => unreachable!("one backend is set"),
            }
            step += 1;
        }
        let elapsed = started.elapsed().as_secs_f64();
        let weights = match (&mut on_gpu, &on_cpu) {
            (Some(g), _) => g.weights()?,
            (_, Some(c)) => c.weights.clone(),
            _ => unreachable!("one backend is set"),
        };
        for (p, w) in model.parameters().iter().zip(weights) {
            p.set_data(&Tensor::from_vec(w, p.shape().clone())?)?;
        }
        let test_accuracy = accuracy(&model, &test_set, DType::F32, &Device::Cpu)?;
        let train_accuracy = accuracy(&model, &train_set, DType::F32, &Device::Cpu)?;
        if !model.parameters().iter().all(|p| p.to_vec_f32().iter().all(|v| v.is_finite())) {
            return Err(Error::NonFinite { what: "a weight".into(), value: f64::NAN, step });
        }
        let r = EpochReport {
            epoch,
            loss: f64::NAN,
            train_accuracy,
            test_accuracy,
            step_ms: 1e3 * elapsed / steps_per_epoch.max(1) as f64,
            samples_per_s: (steps_per_epoch * cfg.batch) as f64 / elapsed,
        };
        log(&format!(
            "epoch {:>3}  train acc {:6.2}%  test acc {:6.2}%  step {:.3} ms  {:.0} samples/s",
            r.epoch,
            100.0 * r.train_accuracy,
            100.0 * r.test_accuracy,
            r.step_ms,
            r.samples_per_s
        ));
        reports.push(r);
    }
    Ok(TrainReport { epochs: reports, model, checkpoint: None, device: device_name })
}

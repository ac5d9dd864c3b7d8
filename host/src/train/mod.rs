//! The main job: check the configuration and the memory it needs, train a classifier MLP, report
//! loss and accuracy per epoch, save a checkpoint; and rebuild a saved model for `eval`.

pub mod data_parallel;
pub mod dist_bench;
pub mod gpt;
pub mod gpt_parallel;

use crate::checkpoint::{self, TrainingState};
use crate::data::{self, Dataset};
use crate::error::{Error, Result};
use crate::nn::{Activation, Module, Sequential, autocast, mlp};
use crate::optim::{Adam, LrSchedule, Optimizer, Sgd, attach_compute_copies};
use crate::tensor::{DType, Device, Targets, Tensor, no_grad};
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
    /// Clip the gradients to this global L2 norm before each step
    /// ([`Optimizer::clip_grad_norm`]; None: no clipping).
    pub clip_grad_norm: Option<f64>,
    /// Warmup steps of the cosine schedule (0: constant rate).
    pub warmup: usize,
    /// Device.
    pub device: DeviceChoice,
    /// Precision: the parameters' dtype (f32, f64; f16 on the CPU), or [`DType::BF16`] for mixed
    /// precision: f32 master parameters kept by the optimizer, products and activations in bf16
    /// inside an `autocast` scope ([`crate::nn::autocast`]), f32 losses (on CUDA the bf16 compute
    /// copies are written by the optimizer's launch, [`crate::optim::attach_compute_copies`]).
    /// [`DType::F16`] on CUDA is the same mixed precision in f16, with dynamic loss scaling
    /// ([`crate::optim::LossScaler`]: the loss scaled before the backward, the gradients unscaled
    /// inside the optimizer's update, a step with non-finite gradients skipped).
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
    /// Capture the training step in one CUDA graph once full batches repeat (after two eager
    /// warm-up steps) and replay it: CUDA f32 and bf16 with any optimizer and schedule (the
    /// learning rate is written to the device before each replay; Adam's step count and bias
    /// corrections advance on the device); f16 (the loss scaler reads the gradient norm on the
    /// host each step) and the CPU run eagerly. The last partial batch of an epoch runs eagerly.
    pub graph: bool,
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
            clip_grad_norm: None,
            warmup: 50,
            device: DeviceChoice::Auto,
            dtype: DType::F32,
            seed: 0,
            checkpoint: Some(PathBuf::from("kiln-mlp.safetensors")),
            progress: true,
            megakernel: false,
            graph: true,
            mega_path: None,
            matmul_precision: crate::cuda::MatmulPrecision::F32,
        }
    }
}

/// `setting = value` refused: `allowed` says what it may be.
fn invalid(setting: &'static str, value: impl std::fmt::Display, allowed: impl Into<String>) -> Error {
    Error::InvalidSetting { setting, value: value.to_string(), allowed: allowed.into() }
}

impl TrainConfig {
    /// Checks every setting's range, and that the chosen mode honours every setting, before any
    /// work starts ([`train`] calls it first). Errors name the setting as the CLI's flag does.
    pub fn validate(&self) -> Result<()> {
        for (setting, v) in
            [("--width", self.width), ("--depth", self.depth), ("--batch", self.batch), ("--epochs", self.epochs)]
        {
            if v == 0 {
                return Err(invalid(setting, v, "must be 1 or more"));
            }
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(invalid("--lr", self.lr, "the learning rate must be a finite number greater than 0"));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            return Err(invalid("--weight-decay", self.weight_decay, "must be a finite number, 0 or more"));
        }
        if let Some(c) = self.clip_grad_norm
            && !(c.is_finite() && c > 0.0)
        {
            return Err(invalid(
                "--clip-grad-norm",
                c,
                "the largest gradient norm must be a finite number greater than 0",
            ));
        }
        if let OptimizerKind::Sgd { momentum, .. } = self.optimizer
            && !(0.0..1.0).contains(&momentum)
        {
            return Err(invalid("momentum", momentum, "SGD's momentum must be at least 0 and below 1"));
        }
        if let DataSource::Spirals { per_class, classes, noise } = self.data {
            if per_class == 0 || classes == 0 {
                return Err(invalid(
                    "spirals",
                    format!("{per_class} points per class, {classes} classes"),
                    "both must be 1 or more",
                ));
            }
            if !(noise.is_finite() && noise >= 0.0) {
                return Err(invalid("spirals noise", noise, "must be a finite number, 0 or more"));
            }
        }
        if self.megakernel {
            self.validate_megakernel()
        } else if let Some(p) = self.mega_path {
            let name = match p {
                crate::megakernel::DataPath::CudaCores => "cuda-cores",
                crate::megakernel::DataPath::Tf32 => "tf32",
                crate::megakernel::DataPath::Tf32x3 => "tf32x3",
                crate::megakernel::DataPath::Bf16 => "bf16",
            };
            Err(invalid("--mega-path", name, "chooses the megakernel's arithmetic: add --megakernel, or drop it"))
        } else {
            Ok(())
        }
    }

    /// What the megakernel cannot honour: it trains a bias-free ReLU MLP in f32 with SGD (momentum,
    /// no Nesterov, no weight decay); the learning-rate schedule and the momentum it follows.
    fn validate_megakernel(&self) -> Result<()> {
        let drop = "drop --megakernel to train layer by layer";
        match self.optimizer {
            OptimizerKind::Sgd { nesterov: false, .. } => {}
            other => {
                let name = match other {
                    OptimizerKind::Sgd { .. } => "nesterov",
                    OptimizerKind::Adam => "adam",
                    OptimizerKind::AdamW => "adamw",
                };
                return Err(invalid(
                    "--optimizer",
                    name,
                    format!(
                        "--megakernel trains with SGD (with momentum, without Nesterov): pass --optimizer sgd, or {drop}"
                    ),
                ));
            }
        }
        if self.activation != Activation::Relu {
            return Err(invalid(
                "--activation",
                format!("{:?}", self.activation).to_lowercase(),
                format!("--megakernel's hidden layers are ReLU: pass --activation relu, or {drop}"),
            ));
        }
        if self.dtype != DType::F32 {
            return Err(invalid(
                "--dtype",
                checkpoint::dtype_name(self.dtype),
                format!(
                    "--megakernel keeps f32 weights (--mega-path chooses the products' precision): pass --dtype f32, or {drop}"
                ),
            ));
        }
        if self.weight_decay != 0.0 {
            return Err(invalid(
                "--weight-decay",
                self.weight_decay,
                format!("--megakernel's SGD has no weight decay: pass --weight-decay 0, or {drop}"),
            ));
        }
        if let Some(c) = self.clip_grad_norm {
            return Err(invalid(
                "--clip-grad-norm",
                c,
                format!("--megakernel's SGD does not clip gradients: drop --clip-grad-norm, or {drop}"),
            ));
        }
        if self.matmul_precision != crate::cuda::MatmulPrecision::F32 {
            return Err(Error::Unsupported {
                op: "train",
                what: "--matmul-precision with --megakernel: the megakernel's products follow --mega-path \
                       (cuda-cores, tf32, tf32x3 or bf16); drop one of the two options"
                    .into(),
            });
        }
        Ok(())
    }

    /// The memory a run of this configuration needs, for data of `features` inputs and `classes`
    /// classes with `rows` training rows, on the GPU when `on_gpu`: parameters, gradients,
    /// optimizer state, one batch's activations and the initialization's temporaries. An estimate
    /// from the sizes alone, on the high side, computed with checked arithmetic (a size beyond 64
    /// bits reads as `u64::MAX`), before anything is allocated.
    pub fn memory_need(&self, features: usize, classes: usize, rows: usize, on_gpu: bool) -> MemoryNeed {
        let mk = self.megakernel;
        let need = || -> Option<MemoryNeed> {
            // the layers' (inputs, outputs): the first, `depth - 2` alike hidden ones, the last
            let inputs = if mk { features.checked_add(1)? } else { features } as u64;
            let (width, classes, depth) = (self.width as u64, classes as u64, self.depth as u64);
            let layers: [(u64, u64, u64); 3] = match depth {
                0 => return None,
                1 => [(inputs, classes, 1), (0, 0, 0), (0, 0, 0)],
                d => [(inputs, width, 1), (width, width, d - 2), (width, classes, 1)],
            };
            let (mut params, mut largest, mut outs) = (0u64, 0u64, 0u64);
            for (i, o, count) in layers {
                let bias = if mk { 0 } else { o };
                params = params.checked_add(i.checked_mul(o)?.checked_add(bias)?.checked_mul(count)?)?;
                outs = outs.checked_add(o.checked_mul(count)?)?;
                if count > 0 {
                    largest = largest.max(i.checked_mul(o)?);
                }
            }
            let widest = inputs.max(width).max(classes);
            let elem = if mk { 4 } else { self.dtype.size() as u64 };
            // mixed precision (bf16; f16 on CUDA): f32 masters, gradients and state, and a 16-bit
            // compute copy
            let mixed = self.dtype == DType::BF16 || (self.dtype == DType::F16 && on_gpu);
            let (param_elem, compute_copy) = if !mk && mixed { (4, 2) } else { (elem, 0) };
            // copies of the parameters: the weights, their gradients and the optimizer's state (the
            // megakernel: the weights, the momentum, two product copies and the gradients)
            let copies = match (mk, self.optimizer) {
                (true, _) => 5,
                (false, OptimizerKind::Adam | OptimizerKind::AdamW) => 4,
                (false, OptimizerKind::Sgd { momentum, .. }) if momentum != 0.0 => 3,
                (false, OptimizerKind::Sgd { .. }) => 2,
            };
            let state =
                params.checked_mul(copies)?.checked_mul(param_elem)?.checked_add(params.checked_mul(compute_copy)?)?;
            // a batch's pre- and post-activations and their gradients, or an evaluation chunk
            let batch = self.batch.min(rows).max(1) as u64;
            let train = batch.checked_mul(outs)?.checked_mul(4 * elem)?;
            let eval = 1024u64.checked_mul(widest)?.checked_mul(2 * elem)?;
            let activations = train.max(eval);
            // initialization draws each layer in f64 and scales it before the cast; each layer's
            // module and tensor handles take a little besides
            let init = largest.checked_mul(3 * 8)?.checked_add(depth.checked_mul(1024)?)?;
            let model = params.checked_mul(param_elem)?;
            Some(if on_gpu {
                MemoryNeed { host: model.checked_mul(2)?.checked_add(init)?, device: state.checked_add(activations)? }
            } else {
                MemoryNeed { host: state.checked_add(activations)?.checked_add(init)?, device: 0 }
            })
        };
        need().unwrap_or(MemoryNeed { host: u64::MAX, device: if on_gpu { u64::MAX } else { 0 } })
    }

    /// [`TrainConfig::memory_need`] against the memory the host (and the GPU, when given) has
    /// available: an [`Error::OutOfMemory`] that says what to lower, never an abort.
    pub fn check_memory(
        &self,
        features: usize,
        classes: usize,
        rows: usize,
        gpu: Option<&crate::cuda::Device>,
    ) -> Result<()> {
        let need = self.memory_need(features, classes, rows, gpu.is_some());
        let what = format!(
            "an MLP of {features} inputs, {} hidden layers of width {} and {classes} outputs, trained in batches of {}",
            self.depth.saturating_sub(1),
            self.width,
            self.batch
        );
        check_memory(&what, need, gpu, "lower --width, --depth or --batch")
    }
}

/// Bytes of memory a piece of work needs, by place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryNeed {
    /// Host memory.
    pub host: u64,
    /// GPU memory (0 for work that stays on the CPU).
    pub device: u64,
}

/// The host memory available to this process, in bytes: `MemAvailable` of `/proc/meminfo`, and
/// no more than the room left under the cgroup's limit in a container (`memory.max` minus the
/// working set: `memory.current` less the reclaimable `inactive_file` of `memory.stat`). None
/// where neither can be read (the check is then skipped; a size beyond 64 bits is still refused).
pub fn host_memory_available() -> Option<u64> {
    let field = |text: &str, key: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.split_whitespace().next() == Some(key))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    let meminfo = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| field(&m, "MemAvailable:"))
        .and_then(|kib| kib.checked_mul(1024));
    let read = |f: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{f}")).ok();
    let cgroup = read("memory.max").and_then(|max| max.trim().parse::<u64>().ok()).map(|max| {
        let current = read("memory.current").and_then(|c| c.trim().parse::<u64>().ok()).unwrap_or(0);
        let inactive = read("memory.stat").and_then(|s| field(&s, "inactive_file")).unwrap_or(0);
        max.saturating_sub(current.saturating_sub(inactive))
    });
    match (meminfo, cgroup) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Checks `need` against the host's available memory and, when `gpu` is given, the GPU's free
/// memory: [`Error::OutOfMemory`] naming `what` and `hint` (what to lower) if either falls short.
pub fn check_memory(what: &str, need: MemoryNeed, gpu: Option<&crate::cuda::Device>, hint: &str) -> Result<()> {
    let short = |place, needed, available| Error::OutOfMemory {
        what: what.to_string(),
        place,
        needed,
        available,
        hint: hint.to_string(),
    };
    match host_memory_available() {
        Some(available) if need.host > available => return Err(short("host", need.host, available)),
        None if need.host == u64::MAX => return Err(short("host", need.host, 0)),
        _ => {}
    }
    if let Some(d) = gpu {
        let (free, _) = d.context().mem_get_info().map_err(Error::driver("reading the GPU's free memory"))?;
        if need.device > free as u64 {
            return Err(short("GPU", need.device, free as u64));
        }
    }
    Ok(())
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
    /// Training steps that ran as a replay of the captured CUDA graph (0: every step eager).
    pub graph_steps: usize,
}

fn load_data(cfg: &TrainConfig) -> Result<(Dataset, Dataset)> {
    match &cfg.data {
        DataSource::Spirals { per_class, classes, noise } => {
            // the points, their classes and the split's copies and shuffle, generated in memory
            let bytes = per_class.checked_mul(*classes).and_then(|rows| rows.checked_mul(3 * (2 * 4 + 2 * 8)));
            let need = MemoryNeed { host: bytes.map_or(u64::MAX, |b| b as u64), device: 0 };
            check_memory(
                &format!("{per_class} spiral points per class for {classes} classes"),
                need,
                None,
                "lower the points per class or the classes",
            )?;
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

/// Why `dtype` does not train on CUDA (None: it does; f32, and bf16 and f16 as mixed precision,
/// f16 with loss scaling).
fn cuda_refuses(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F32 | DType::BF16 | DType::F16 => None,
        DType::F64 => Some("f64 on CUDA: CUDA tensors are f32, bf16 or f16; train in f32, bf16 or f16 there"),
    }
}

fn pick_device(choice: DeviceChoice, dtype: DType) -> Result<(Device, String)> {
    let gpu = crate::cuda::Device::shared();
    match (choice, gpu) {
        (DeviceChoice::Cpu, _) => Ok((Device::Cpu, "CPU (as asked)".into())),
        (DeviceChoice::Cuda | DeviceChoice::Auto, Ok(_)) if cuda_refuses(dtype).is_some() => {
            let why = cuda_refuses(dtype).unwrap_or_default();
            if choice == DeviceChoice::Cuda {
                return Err(Error::Unsupported { op: "train", what: why.into() });
            }
            Ok((Device::Cpu, format!("CPU ({why})")))
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

/// The run's steps, `epochs` passes of `steps_per_epoch`, counted without overflow.
fn total_steps(steps_per_epoch: usize, epochs: usize) -> Result<usize> {
    steps_per_epoch.checked_mul(epochs).ok_or_else(|| {
        invalid(
            "--epochs",
            epochs,
            format!("{epochs} epochs of {steps_per_epoch} steps are more steps than can be counted"),
        )
    })
}

/// The learning-rate schedule of a run of `total` steps: cosine with `cfg.warmup` steps of
/// warmup, or constant when `cfg.warmup` is 0.
fn lr_schedule(cfg: &TrainConfig, total: usize) -> LrSchedule {
    if cfg.warmup > 0 {
        LrSchedule::CosineWarmup { warmup: cfg.warmup.min(total), total, min_ratio: 0.05 }
    } else {
        LrSchedule::Constant
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

/// Why `kiln train` runs its step eagerly (None: it captures the step in a CUDA graph).
fn graph_refusal(cfg: &TrainConfig, device: &Device) -> Option<&'static str> {
    if !cfg.graph {
        return Some("--no-graph");
    }
    if !matches!(device, Device::Cuda(_)) {
        return Some("the CPU runs every step eagerly");
    }
    if cfg.dtype == DType::F16 {
        return Some("f16's loss scaler reads the gradient norm on the host each step");
    }
    None
}

/// One training step on `x` and `y`: forward, cross-entropy, backward (scaled by `scaler`),
/// optional clipping, the optimizer's update, gradients cleared. Returns the loss and the logits;
/// nothing is read on the host, so the step can be captured.
fn train_step(
    model: &Sequential,
    opt: &mut dyn Optimizer,
    scaler: Option<&mut crate::optim::LossScaler>,
    clip: Option<f64>,
    x: &Tensor,
    y: &Targets,
) -> Result<(Tensor, Tensor)> {
    let logits = model.forward(x)?;
    let loss = logits.cross_entropy(y)?;
    match scaler {
        Some(s) => {
            loss.mul_scalar(s.scale())?.backward()?;
            s.step(opt, clip)?;
        }
        None => {
            loss.backward()?;
            if let Some(max_norm) = clip {
                opt.clip_grad_norm(max_norm)?;
            }
            opt.step()?;
        }
    }
    opt.zero_grad();
    Ok((loss, logits))
}

/// Trains per `cfg`, printing one line per epoch to `log`. Every setting is checked
/// ([`TrainConfig::validate`]), and the model's size against the memory there is
/// ([`TrainConfig::check_memory`]), before anything is built.
pub fn train(cfg: &TrainConfig, mut log: impl FnMut(&str)) -> Result<TrainReport> {
    cfg.validate()?;
    // a checkpoint that cannot be written is found out before any work, not after the last epoch
    if let Some(path) = &cfg.checkpoint {
        checkpoint::check_destination(path)?;
    }
    if cfg.megakernel {
        return train_megakernel(cfg, log);
    }
    let (device, device_name) = pick_device(cfg.device, cfg.dtype)?;
    let (train_set, test_set) = load_data(cfg)?;
    if train_set.is_empty() || test_set.is_empty() {
        return Err(Error::shape("train", "the dataset split left no training or no test rows"));
    }
    let gpu = match &device {
        Device::Cuda(d) => Some(&**d),
        Device::Cpu => None,
    };
    cfg.check_memory(train_set.features, train_set.classes, train_set.len(), gpu)?;
    let steps_per_epoch = train_set.len().div_ceil(cfg.batch);
    let total = total_steps(steps_per_epoch, cfg.epochs)?;
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
    // bf16 (and f16 on CUDA) is mixed precision: f32 masters, 16-bit compute inside this thread's
    // autocast scope; f16 adds dynamic loss scaling
    let compute = match (cfg.dtype, &device) {
        (DType::BF16, _) | (DType::F16, Device::Cuda(_)) => Some(cfg.dtype),
        _ => None,
    };
    let mixed = compute.is_some();
    let param_dtype = if mixed { DType::F32 } else { cfg.dtype };
    let _mixed = match compute {
        Some(d) => Some(autocast(d)?),
        None => None,
    };
    let mut scaler = (compute == Some(DType::F16)).then(crate::optim::LossScaler::f16_default);
    let mut rng = Tensor::rng(cfg.seed.wrapping_add(1));
    let model =
        mlp(train_set.features, cfg.width, cfg.depth, train_set.classes, cfg.activation, param_dtype, &mut rng)?;
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
    if let Some(c) = compute {
        let copies = attach_compute_copies(opt.as_mut(), c)?;
        let name = checkpoint::dtype_name(c);
        log(&format!(
            "mixed precision: f32 master weights, {name} products and activations, f32 loss ({})",
            if copies > 0 {
                format!("the {name} weight copies written by the optimizer's update")
            } else {
                format!("the {name} weight copies converted per step")
            }
        ));
    }
    if let Some(s) = &scaler {
        log(&format!(
            "loss scaling: dynamic, from {} (halved and the step skipped on non-finite gradients, doubled after a run of good steps), unscaled inside the optimizer's update",
            s.scale()
        ));
    }
    let schedule = lr_schedule(cfg, total);
    let no_graph = graph_refusal(cfg, &device);
    match no_graph {
        None => log("step: captured in one CUDA graph after two eager full-batch steps, then replayed"),
        Some(why) if cfg.graph && matches!(device, Device::Cuda(_)) => log(&format!("step: eager ({why})")),
        Some(_) => {}
    }
    // the graph's persistent buffers: the batch's input and targets written in place before each
    // replay, its loss and logits read after it (declared before the graph, dropped after it)
    let mut x_in: Option<Tensor> = None;
    let mut y_in: Option<Targets> = None;
    let mut outs: Option<(Tensor, Tensor)> = None;
    let mut graph: Option<crate::cuda::CapturedGraph> = None;
    let (mut warm, mut graph_steps) = (0usize, 0usize);
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
            let capturable = no_graph.is_none() && chunk.len() == cfg.batch;
            let (lv, pred) = if let (true, Some(g), Some(xi), Some(yi), Some((lo, lg))) =
                (capturable, &graph, &x_in, y_in.as_mut(), &outs)
            {
                xi.copy_from_host(&x)?;
                if !yi.overwrite(&y)? {
                    return Err(Error::Unsupported {
                        op: "kiln train",
                        what: "the captured step's targets could not be rewritten in place: run with --no-graph".into(),
                    });
                }
                // the step's learning rate, which the graph reads from the device
                opt.prepare_replay()?;
                // SAFETY: the model, the optimizer's state and copies, and the input, target, loss and
                // logits buffers the graph reads and writes live until the end of this function,
                // after the graph is dropped; nothing else runs on the device's stream meanwhile.
                unsafe { g.launch()? };
                graph_steps += 1;
                (lo.item()?, lg.argmax_last()?)
            } else if capturable {
                // eager warm-up on the persistent buffers, then the capture
                let xi = match &x_in {
                    Some(t) => {
                        t.copy_from_host(&x)?;
                        t.clone()
                    }
                    None => Tensor::from_vec(x, [chunk.len(), train_set.features])?.to_device(&device)?,
                };
                match y_in.as_mut() {
                    Some(t) => {
                        t.overwrite(&y)?;
                    }
                    None => y_in = Some(Targets::new(y.clone())),
                }
                x_in = Some(xi);
                let (xi, yi) = (x_in.as_ref().expect("set above"), y_in.as_ref().expect("set above"));
                let (loss, logits) = train_step(&model, opt.as_mut(), None, cfg.clip_grad_norm, xi, yi)?;
                let out = (loss.item()?, logits.argmax_last()?);
                warm += 1;
                if warm == 2 {
                    let (lo, lg) = (loss.detach(), logits.detach());
                    drop((loss, logits));
                    let Device::Cuda(dev) = &device else { unreachable!("graph_refusal refuses the CPU") };
                    let captured = dev
                        .capture(|| {
                            let (loss, logits) = train_step(&model, opt.as_mut(), None, cfg.clip_grad_norm, xi, yi)?;
                            lo.copy_from(&loss)?;
                            lg.copy_from(&logits)
                        })
                        .map_err(|e| Error::Unsupported {
                            op: "kiln train",
                            what: format!("capturing the training step failed ({e}): run with --no-graph"),
                        })?;
                    graph = Some(captured);
                    outs = Some((lo, lg));
                }
                out
            } else {
                let x = Tensor::from_vec(x, [chunk.len(), train_set.features])?
                    .to_dtype(param_dtype)?
                    .to_device(&device)?;
                let yt = Targets::new(y.clone());
                let (loss, logits) = train_step(&model, opt.as_mut(), scaler.as_mut(), cfg.clip_grad_norm, &x, &yt)?;
                (loss.item()?, logits.argmax_last()?)
            };
            if !lv.is_finite() {
                return Err(Error::NonFinite { what: "the training loss".into(), value: lv, step });
            }
            loss_sum += lv * chunk.len() as f64;
            correct += pred.iter().zip(&y).filter(|(p, t)| p == t).count();
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
            test_accuracy: accuracy(&model, &test_set, param_dtype, &device)?,
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
    drop(graph);
    if no_graph.is_none() {
        log(&format!("step graph: {graph_steps} of {step} steps replayed one captured CUDA graph"));
    }
    if let Some(path) = &cfg.checkpoint {
        let state = TrainingState { step: step as u64, epoch: cfg.epochs as u64, config: metadata(cfg, &train_set) };
        checkpoint::save_training(path, &model, opt.as_ref(), &state)?;
        log(&format!("saved checkpoint {}", path.display()));
    }
    Ok(TrainReport { epochs: reports, model, checkpoint: cfg.checkpoint.clone(), device: device_name, graph_steps })
}

/// Rebuilds the model a checkpoint describes and loads its parameters (the checksums checked; a
/// checkpoint from a kiln without checksums loads unchecked). The metadata (`features`, `width`,
/// `depth`, `classes`, `activation`) is checked against the shapes of the tensors the file holds
/// before any model is built from it, so a checkpoint whose metadata lies is an error naming the
/// key and the tensor, never an allocation of the size it claims.
pub fn load_model(path: &std::path::Path) -> Result<(Sequential, HashMap<String, String>)> {
    let (tensors, meta) = checkpoint::load(path)?;
    let bad = |msg: String| Error::File { path: path.into(), msg };
    if meta.get("model").map(String::as_str) == Some("gpt") {
        return Err(bad("it is a GPT checkpoint, not a classifier MLP's: generate from it with `kiln sample`".into()));
    }
    let get = |k: &str| -> Result<usize> {
        let v = meta.get(k).ok_or_else(|| bad(format!("metadata `{k}` missing")))?;
        v.parse().map_err(|_| bad(format!("metadata `{k}` = {v:?} is not a whole number")))
    };
    let act = match meta.get("activation").map(String::as_str) {
        Some("Relu") | None => Activation::Relu,
        Some("Gelu") => Activation::Gelu,
        Some(other) => return Err(bad(format!("metadata `activation` = {other:?}: kiln knows Relu and Gelu"))),
    };
    let dtype = match meta.get("dtype").map(String::as_str) {
        Some("f64") => DType::F64,
        _ => DType::F32,
    };
    let (features, width, depth, classes) = (get("features")?, get("width")?, get("depth")?, get("classes")?);
    check_mlp_tensors(&tensors, features, width, depth, classes).map_err(bad)?;
    let model = mlp(features, width, depth, classes, act, dtype, &mut Tensor::rng(0))?;
    checkpoint::assign(&model.named_parameters(), &tensors, "")?;
    Ok((model, meta))
}

/// Whether `tensors` hold the layers of [`mlp`]`(features, width, depth, classes)` (`"0.weight"`
/// and `"0.bias"`, `"2.weight"`, ...) with the shapes that metadata implies: a message naming the
/// metadata and the tensor where they disagree. Compares shapes only (no size is computed from
/// the metadata), so it is safe on any numbers.
fn check_mlp_tensors(
    tensors: &HashMap<String, Tensor>,
    features: usize,
    width: usize,
    depth: usize,
    classes: usize,
) -> std::result::Result<(), String> {
    let layers = (0..).take_while(|l: &usize| tensors.contains_key(&format!("{}.weight", 2 * l))).count();
    if depth == 0 || depth != layers {
        return Err(format!(
            "metadata `depth` = {depth}, but the file holds the weights of {layers} layers (`0.weight`, `2.weight`, ...)"
        ));
    }
    let described = format!("features {features}, width {width}, depth {depth}, classes {classes}");
    for l in 0..depth {
        let inputs = if l == 0 { features } else { width };
        let outputs = if l + 1 == depth { classes } else { width };
        for (name, want) in
            [(format!("{}.weight", 2 * l), vec![outputs, inputs]), (format!("{}.bias", 2 * l), vec![outputs])]
        {
            let got = tensors.get(&name).map(|t| t.dims().to_vec());
            if got.as_deref() != Some(&want[..]) {
                let got = got.map_or("no such tensor".to_string(), |g| format!("shape {g:?}"));
                return Err(format!(
                    "tensor `{name}` has {got}, but the metadata ({described}) describes shape {want:?}"
                ));
            }
        }
    }
    Ok(())
}

/// The main job through the megakernel: one launch per training step (or, without a GPU, the same
/// schedule on the CPU interpreter). Full batches only (a last partial batch is dropped each epoch).
fn train_megakernel(cfg: &TrainConfig, mut log: impl FnMut(&str)) -> Result<TrainReport> {
    use crate::megakernel::{DataPath, GpuStep, Loss, MlpShape, StepInputs, StepState, build, interpret};
    use crate::nn::{Linear, ReLU};
    let (train_set, test_set) = load_data(cfg)?;
    let gpu = match cfg.device {
        DeviceChoice::Cpu => None,
        DeviceChoice::Cuda => Some(crate::cuda::Device::shared()?),
        DeviceChoice::Auto => crate::cuda::Device::shared().ok(),
    };
    cfg.check_memory(train_set.features, train_set.classes, train_set.len(), gpu.as_deref())?;
    let (features, momentum) = match cfg.optimizer {
        OptimizerKind::Sgd { momentum, .. } => (train_set.features, momentum),
        // TrainConfig::validate refuses the others with the megakernel
        _ => unreachable!("validate_megakernel admits SGD only"),
    };
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
    log(&format!("model: bias-free MLP {dims:?}, SGD lr {} momentum {momentum}, batch {}", cfg.lr, cfg.batch));
    let steps_per_epoch = train_set.len() / cfg.batch;
    let lr_schedule = lr_schedule(cfg, total_steps(steps_per_epoch, cfg.epochs)?);
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
            let lr = lr_schedule.lr(cfg.lr, step) as f32;
            let inp =
                StepInputs { x: &x, y: &[], classes: &y, loss: Loss::CrossEntropy, lr, momentum: momentum as f32 };
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
    let model = with_biases(&model, features, cfg)?;
    if let Some(file) = &cfg.checkpoint {
        // the metadata of the model with biases: the data's own features, without the constant
        let mut meta = metadata(cfg, &test_set);
        meta.insert("features".into(), features.to_string());
        meta.insert("trained_with".into(), format!("megakernel, {path:?} path"));
        checkpoint::save(file, &model.named_parameters(), meta)?;
        log(&format!("saved checkpoint {}", file.display()));
    }
    Ok(TrainReport { epochs: reports, model, checkpoint: cfg.checkpoint.clone(), device: device_name, graph_steps: 0 })
}

/// The megakernel's bias-free model (its first layer reading `features` inputs and the constant 1
/// appended to them) as the [`mlp`] with biases that computes the same function: the first layer's
/// weights of the constant become its bias, the other layers' biases are 0. The model a megakernel
/// run reports and saves, so that [`load_model`] and `kiln eval` read its checkpoint as any other.
fn with_biases(bias_free: &Sequential, features: usize, cfg: &TrainConfig) -> Result<Sequential> {
    let weights = bias_free.parameters();
    let classes = weights.last().map_or(0, |w| w.dims()[0]);
    let model = mlp(features, cfg.width, cfg.depth, classes, Activation::Relu, DType::F32, &mut Tensor::rng(0))?;
    let params = model.named_parameters();
    for (l, w) in weights.iter().enumerate() {
        let (outputs, inputs) = (w.dims()[0], w.dims()[1]);
        let (weight, bias) = (&params[2 * l].1, &params[2 * l + 1].1);
        let v = w.to_vec_f32();
        if l == 0 {
            let row = |r: usize| &v[r * inputs..(r + 1) * inputs];
            let kept: Vec<f32> = (0..outputs).flat_map(|r| row(r)[..features].to_vec()).collect();
            let constant: Vec<f32> = (0..outputs).map(|r| row(r)[features]).collect();
            weight.set_data(&Tensor::from_vec(kept, [outputs, features])?)?;
            bias.set_data(&Tensor::from_vec(constant, [outputs])?)?;
        } else {
            weight.set_data(&Tensor::from_vec(v, [outputs, inputs])?)?;
            bias.set_data(&Tensor::zeros([outputs], DType::F32))?;
        }
    }
    Ok(model)
}

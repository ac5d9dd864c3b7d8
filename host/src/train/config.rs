//! The main job's settings ([`TrainConfig`]) and their checks, before any work starts.

use super::*;
use crate::checkpoint;
use crate::error::{Error, Result};
use crate::nn::Activation;
use crate::tensor::DType;
use std::path::PathBuf;

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
    /// ([`Optimizer::clip_grad_norm`](crate::optim::Optimizer::clip_grad_norm); None: no clipping).
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
pub(crate) fn invalid(setting: &'static str, value: impl std::fmt::Display, allowed: impl Into<String>) -> Error {
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

//! The main job on the tensor engine: train the classifier MLP epoch by epoch (optionally as one
//! captured graph per step), report, save; and rebuild a saved model for `eval`.

use super::*;
use crate::checkpoint::{self, TrainingState};
use crate::data::{self, Dataset};
use crate::error::{Error, Result};
use crate::nn::{Activation, Module, Sequential, autocast, mlp};
use crate::optim::{Adam, LrSchedule, Optimizer, Sgd, attach_compute_copies};
use crate::tensor::{DType, Device, Targets, Tensor, no_grad};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

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

pub(crate) fn load_data(cfg: &TrainConfig) -> Result<(Dataset, Dataset)> {
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
pub(crate) fn cuda_refuses(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F32 | DType::BF16 | DType::F16 => None,
        DType::F64 => Some("f64 on CUDA: CUDA tensors are f32, bf16 or f16; train in f32, bf16 or f16 there"),
    }
}

pub(crate) fn pick_device(choice: DeviceChoice, dtype: DType) -> Result<(Device, String)> {
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

pub(crate) fn precision_words(p: crate::cuda::MatmulPrecision) -> &'static str {
    match p {
        crate::cuda::MatmulPrecision::F32 => "f32 FMA chains (the GEMM ladder's FP32 rungs)",
        crate::cuda::MatmulPrecision::Bf16 => "bf16 operands, f32 accumulation, on the tensor cores",
    }
}

/// The run's steps, `epochs` passes of `steps_per_epoch`, counted without overflow.
pub(crate) fn total_steps(steps_per_epoch: usize, epochs: usize) -> Result<usize> {
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
pub(crate) fn lr_schedule(cfg: &TrainConfig, total: usize) -> LrSchedule {
    if cfg.warmup > 0 {
        LrSchedule::CosineWarmup { warmup: cfg.warmup.min(total), total, min_ratio: 0.05 }
    } else {
        LrSchedule::Constant
    }
}

/// Checkpoint metadata describing the model, so `eval` can rebuild it.
pub(crate) fn metadata(cfg: &TrainConfig, data: &Dataset) -> HashMap<String, String> {
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
pub(crate) fn graph_refusal(cfg: &TrainConfig, device: &Device) -> Option<&'static str> {
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
pub(crate) fn train_step(
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
pub(crate) fn check_mlp_tensors(
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

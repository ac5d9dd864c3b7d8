//! The main job through the training megakernel: one launch per step (or its CPU interpreter).

use super::*;
use crate::checkpoint;
use crate::error::{Error, Result};
use crate::nn::{Activation, Module, Sequential, mlp};
use crate::tensor::{DType, Device, Tensor};
use std::time::Instant;

/// The main job through the megakernel: one launch per training step (or, without a GPU, the same
/// schedule on the CPU interpreter). Full batches only (a last partial batch is dropped each epoch).
pub(crate) fn train_megakernel(cfg: &TrainConfig, mut log: impl FnMut(&str)) -> Result<TrainReport> {
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
pub(crate) fn with_biases(bias_free: &Sequential, features: usize, cfg: &TrainConfig) -> Result<Sequential> {
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

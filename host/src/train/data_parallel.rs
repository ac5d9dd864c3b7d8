//! Data-parallel training of the MLP over NCCL: one thread per GPU, each holding a replica.
//!
//! Every rank builds the same model and the same shuffled order from the seed; rank 0's
//! parameters are broadcast at the start. Each step's global batch (`--batch` rows) is split into
//! contiguous shards, one per rank ([`shard`]); a rank scales its shard's mean loss by its share of
//! the batch, so after backward the gradients summed over ranks (all-reduce, in buckets of about
//! 25 MiB in reverse parameter order, [`crate::dist::bucket`]) are the global batch's mean
//! gradient; then every rank takes the same optimizer step. Rank 0 logs and writes the checkpoint;
//! the throughput is the global rows over the wall time. The all-reduces run after the whole
//! backward pass, on the compute stream (no overlap with the backward pass yet).

use super::{EpochReport, TrainConfig, accuracy, load_data, lr_schedule, metadata, total_steps};
use crate::checkpoint::{self, TrainingState};
use crate::dist::{self, ReduceOp, bucket::DEFAULT_BUCKET_BYTES};
use crate::error::{Error, Result};
use crate::nn::{Module, mlp};
use crate::optim::{Adam, Optimizer, Sgd};
use crate::tensor::{DType, Device, Tensor};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

/// The rows of a global batch of `len` rows that rank `rank` of `ranks` takes: contiguous, the
/// first `len % ranks` ranks one row more.
pub fn shard(len: usize, ranks: usize, rank: usize) -> std::ops::Range<usize> {
    let (base, rem) = (len / ranks, len % ranks);
    let start = rank * base + rank.min(rem);
    start..start + base + usize::from(rank < rem)
}

/// What a data-parallel run produced.
#[derive(Debug)]
pub struct DataParallelReport {
    /// Per-epoch numbers (rank 0's view; loss and train accuracy over all ranks' rows).
    pub epochs: Vec<EpochReport>,
    /// The global batch's mean loss at every step.
    pub step_losses: Vec<f64>,
    /// Rank 0's parameters at the end, by name.
    pub params: Vec<(String, Vec<f32>)>,
    /// Ranks (GPUs).
    pub gpus: usize,
}

/// Trains the MLP per `cfg` on GPUs 0..`gpus` (f32 only; not with the megakernel), logging from
/// rank 0 to `log`. Typed errors: too few GPUs, NCCL missing, a mode this path does not take.
pub fn train_data_parallel(cfg: &TrainConfig, gpus: usize, log: impl FnMut(&str) + Send) -> Result<DataParallelReport> {
    cfg.validate()?;
    if cfg.megakernel {
        return Err(Error::Unsupported { op: "train --gpus", what: "--megakernel (train layer by layer)".into() });
    }
    if cfg.dtype != DType::F32 {
        return Err(Error::Unsupported {
            op: "train --gpus",
            what: format!("--dtype {} (data-parallel training is f32 for now)", checkpoint::dtype_name(cfg.dtype)),
        });
    }
    if cfg.device == super::DeviceChoice::Cpu {
        return Err(Error::Unsupported { op: "train --gpus", what: "--device cpu (it trains on GPUs)".into() });
    }
    dist::check_gpus(gpus)?;
    if cfg.batch < gpus {
        return Err(Error::InvalidSetting {
            setting: "--batch",
            value: cfg.batch.to_string(),
            allowed: format!("at least --gpus ({gpus}): each rank takes a share of every batch"),
        });
    }
    if let Some(path) = &cfg.checkpoint {
        checkpoint::check_destination(path)?;
    }
    let (train_set, test_set) = load_data(cfg)?;
    if train_set.is_empty() || test_set.is_empty() {
        return Err(Error::shape("train", "the dataset split left no training or no test rows"));
    }
    let steps_per_epoch = train_set.len().div_ceil(cfg.batch);
    let total = total_steps(steps_per_epoch, cfg.epochs)?;
    let schedule = lr_schedule(cfg, total);
    // per step: the sum over ranks of (shard mean loss x shard rows); per epoch: correct predictions
    let shared = Mutex::new((vec![0.0f64; total], vec![0usize; cfg.epochs]));
    let barrier = Barrier::new(gpus);
    let log = Mutex::new(log);
    let say = |s: &str| (log.lock().unwrap_or_else(|p| p.into_inner()))(s);
    let outs = dist::run(gpus, |r| {
        let _precision = crate::cuda::matmul_precision_scope(cfg.matmul_precision);
        let device = Device::Cuda(r.device.clone());
        let mut rng = Tensor::rng(cfg.seed.wrapping_add(1));
        let model =
            mlp(train_set.features, cfg.width, cfg.depth, train_set.classes, cfg.activation, DType::F32, &mut rng)?;
        let params = model.named_parameters();
        for (_, p) in &params {
            p.move_to(&device)?;
        }
        let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.clone()).collect();
        r.comm.broadcast_tensors(&r.device, &tensors, 0)?;
        if r.rank == 0 {
            let n: usize = tensors.iter().map(|t| t.elem_count()).sum();
            say(&format!(
                "data-parallel on {gpus} GPUs ({}), {n} parameters, global batch {} split across ranks, \
                 gradients averaged by NCCL all-reduce in buckets of {} MiB",
                r.device.name(),
                cfg.batch,
                DEFAULT_BUCKET_BYTES >> 20
            ));
        }
        let mut opt: Box<dyn Optimizer> = match cfg.optimizer {
            super::OptimizerKind::Sgd { momentum, nesterov } => {
                Box::new(Sgd::new(params.clone(), cfg.lr, momentum, cfg.weight_decay, nesterov))
            }
            super::OptimizerKind::Adam => Box::new(Adam::adam(params.clone(), cfg.lr, cfg.weight_decay)),
            super::OptimizerKind::AdamW => Box::new(Adam::adamw(params.clone(), cfg.lr, cfg.weight_decay)),
        };
        let mut order: Vec<usize> = (0..train_set.len()).collect();
        let mut step = 0usize;
        let mut epochs = Vec::new();
        for epoch in 1..=cfg.epochs {
            for i in (1..order.len()).rev() {
                order.swap(i, rand::Rng::random_range(&mut rng, 0..=i));
            }
            let started = Instant::now();
            let mut correct = 0usize;
            for chunk in order.chunks(cfg.batch) {
                opt.set_lr(schedule.lr(cfg.lr, step));
                let rows = &chunk[shard(chunk.len(), gpus, r.rank)];
                if !rows.is_empty() {
                    let (x, y) = train_set.gather(rows);
                    let x = Tensor::from_vec(x, [rows.len(), train_set.features])?.to_device(&device)?;
                    let logits = model.forward(&x)?;
                    let loss = logits.cross_entropy(&y)?;
                    let lv = loss.item()?;
                    if !lv.is_finite() {
                        return Err(Error::NonFinite { what: "the training loss".into(), value: lv, step });
                    }
                    loss.mul_scalar(rows.len() as f64 / chunk.len() as f64)?.backward()?;
                    correct += logits.argmax_last()?.iter().zip(&y).filter(|(p, t)| p == t).count();
                    shared.lock().unwrap_or_else(|p| p.into_inner()).0[step] += lv * rows.len() as f64;
                }
                let mut grads = Vec::with_capacity(tensors.len());
                for p in &tensors {
                    if p.grad().is_none() {
                        p.accumulate_grad(p.full_like(0.0)?)?;
                    }
                    grads.extend(p.grad());
                }
                r.comm.all_reduce_tensors(&r.device, &grads, ReduceOp::Sum, DEFAULT_BUCKET_BYTES)?;
                if let Some(max_norm) = cfg.clip_grad_norm {
                    opt.clip_grad_norm(max_norm)?;
                }
                opt.step()?;
                opt.zero_grad();
                step += 1;
            }
            r.device.synchronize()?;
            let elapsed = started.elapsed().as_secs_f64();
            shared.lock().unwrap_or_else(|p| p.into_inner()).1[epoch - 1] += correct;
            barrier.wait();
            if r.rank == 0 {
                let (losses, correct) = &*shared.lock().unwrap_or_else(|p| p.into_inner());
                let first = (epoch - 1) * steps_per_epoch;
                let loss_sum: f64 = losses[first..first + steps_per_epoch].iter().sum();
                let e = EpochReport {
                    epoch,
                    loss: loss_sum / train_set.len() as f64,
                    train_accuracy: correct[epoch - 1] as f64 / train_set.len() as f64,
                    test_accuracy: accuracy(&model, &test_set, DType::F32, &device)?,
                    step_ms: 1e3 * elapsed / steps_per_epoch as f64,
                    samples_per_s: train_set.len() as f64 / elapsed,
                };
                say(&format!(
                    "epoch {:>3}  loss {:.4}  train acc {:6.2}%  test acc {:6.2}%  step {:.3} ms  {:.0} samples/s (all {gpus} GPUs)",
                    e.epoch,
                    e.loss,
                    100.0 * e.train_accuracy,
                    100.0 * e.test_accuracy,
                    e.step_ms,
                    e.samples_per_s
                ));
                epochs.push(e);
            }
        }
        if r.rank != 0 {
            return Ok(None);
        }
        if let Some(path) = &cfg.checkpoint {
            let state =
                TrainingState { step: step as u64, epoch: cfg.epochs as u64, config: metadata(cfg, &train_set) };
            checkpoint::save_training(path, &model, opt.as_ref(), &state)?;
            say(&format!("saved checkpoint {}", path.display()));
        }
        let params = params.iter().map(|(n, p)| (n.clone(), p.to_vec_f32())).collect();
        Ok(Some((epochs, params)))
    })?;
    let (epochs, params) = outs.into_iter().flatten().next().unwrap_or_default();
    let (sums, _) = shared.into_inner().unwrap_or_else(|p| p.into_inner());
    let mut step_losses = Vec::with_capacity(total);
    for (s, chunk) in sums.iter().zip((0..cfg.epochs).flat_map(|_| (0..train_set.len()).step_by(cfg.batch))) {
        step_losses.push(s / (train_set.len() - chunk).min(cfg.batch) as f64);
    }
    Ok(DataParallelReport { epochs, step_losses, params, gpus })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_batch_in_order() {
        for len in [1, 2, 7, 64, 65, 1000] {
            for ranks in 1..=8 {
                let mut next = 0;
                for r in 0..ranks {
                    let s = shard(len, ranks, r);
                    assert_eq!(s.start, next, "len {len} ranks {ranks} rank {r}");
                    assert!(s.len() == len / ranks || s.len() == len / ranks + 1);
                    next = s.end;
                }
                assert_eq!(next, len);
            }
        }
        assert_eq!(shard(5, 2, 0), 0..3);
        assert_eq!(shard(5, 2, 1), 3..5);
    }

    #[test]
    fn refusals_before_any_work() {
        let cfg = TrainConfig {
            megakernel: true,
            optimizer: super::super::OptimizerKind::Sgd { momentum: 0.9, nesterov: false },
            activation: crate::nn::Activation::Relu,
            checkpoint: None,
            ..TrainConfig::default()
        };
        let e = train_data_parallel(&cfg, 2, |_| {}).unwrap_err().to_string();
        assert!(e.contains("--megakernel") || e.contains("megakernel"), "{e}");
        let cfg = TrainConfig { dtype: DType::BF16, checkpoint: None, ..TrainConfig::default() };
        assert!(matches!(train_data_parallel(&cfg, 2, |_| {}), Err(Error::Unsupported { .. })));
    }
}

//! Data-parallel training of the MLP over NCCL: one thread per GPU (or one process per GPU,
//! met over TCP), each holding a replica.
//!
//! Every rank builds the same model and the same shuffled order from the seed; rank 0's
//! parameters are broadcast at the start. Each step's global batch (`--batch` rows) is split into
//! contiguous shards, one per rank ([`shard`]); a rank scales its shard's mean loss by its share of
//! the batch, so the gradients summed over ranks are the global batch's mean gradient. The sums run
//! in buckets of about 25 MiB in reverse parameter order ([`crate::dist::ddp::GradSync`]), each
//! launched on the rank's communication stream as soon as its gradients are final, overlapping the
//! rest of the backward pass (or, with `overlap` off, after it); the optimizer step waits for the
//! last bucket on the GPU. With ZeRO-1 each rank updates only its shard of the parameters and of
//! the optimizer state, and the parameters are all-gathered after the step. Global rank 0 logs and
//! writes a checkpoint at the end of every epoch (atomically, so a failure leaves the last one
//! intact); losses and accuracy are summed over ranks (a small f64 all-reduce per epoch); the
//! throughput is the global rows over the wall time.
//!
//! A planted failure (`KILN_FAIL_RANK=r`, at step `KILN_FAIL_STEP`, default the first step of the
//! second epoch) makes rank `r` fail before its gradients are reduced: every rank then ends with an
//! error (see [`crate::dist`]'s failure handling), none hangs.

use super::{EpochReport, TrainConfig, accuracy, load_data, lr_schedule, metadata, total_steps};
use crate::checkpoint::{self, TrainingState};
use crate::dist::ddp::{GradSync, Sharding};
use crate::dist::rendezvous::Rendezvous;
use crate::dist::{self, RunConfig, TimelineEvent, bucket::DEFAULT_BUCKET_BYTES};
use crate::error::{Error, Result};
use crate::nn::{Module, mlp};
use crate::optim::{Adam, Optimizer, Sgd};
use crate::tensor::{DType, Device, Tensor};
use std::sync::Mutex;
use std::time::Instant;

/// The environment variable naming the rank that fails on purpose (a test of failure handling).
pub const FAIL_RANK_ENV: &str = "KILN_FAIL_RANK";
/// The environment variable naming the step at which the planted failure happens.
pub const FAIL_STEP_ENV: &str = "KILN_FAIL_STEP";

/// How a data-parallel run spreads over GPUs and processes.
#[derive(Clone, Debug, PartialEq)]
pub struct DataParallel {
    /// GPUs this process drives (1 in a multi-process run).
    pub gpus: usize,
    /// ZeRO-1: shard the optimizer state (reduce-scatter + all-gather).
    pub zero1: bool,
    /// Launch each bucket's collective during the backward pass (true) or after it.
    pub overlap: bool,
    /// Bytes of gradient per bucket.
    pub bucket_bytes: usize,
    /// A multi-process run: where to meet and this process's rank.
    pub rendezvous: Option<Rendezvous>,
    /// The GPU ordinal of this process's first rank (`--local-rank`).
    pub local_rank: usize,
    /// Record a timeline of the last step (compute and communication streams).
    pub timeline: bool,
    /// A planted failure: `(rank, step)` fails before its gradients are reduced (a test of failure
    /// handling). `None`: read `KILN_FAIL_RANK` / `KILN_FAIL_STEP` ([`planted_failure`]).
    pub fail: Option<(usize, usize)>,
}

impl DataParallel {
    /// The run this process takes part in (its GPUs, its first device, the rendezvous, the
    /// collectives' timeout from the environment), checked; in a single-process run also that the
    /// GPUs are there, before any data is read, so that too few GPUs is the first thing to hear.
    pub(crate) fn run_config(&self) -> Result<RunConfig> {
        let run_cfg = RunConfig {
            gpus: self.gpus,
            first_device: self.local_rank,
            rendezvous: self.rendezvous.clone(),
            timeout: dist::timeout_from_env()?,
        };
        run_cfg.validate()?;
        if run_cfg.rendezvous.is_none() {
            dist::check_gpus(run_cfg.gpus)?;
        }
        Ok(run_cfg)
    }

    /// `gpus` GPUs of this process, overlapped, replicated, 25 MiB buckets.
    pub fn local(gpus: usize) -> DataParallel {
        DataParallel {
            gpus,
            zero1: false,
            overlap: true,
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            rendezvous: None,
            local_rank: 0,
            timeline: false,
            fail: None,
        }
    }

    /// Ranks over all processes.
    pub fn world(&self) -> usize {
        self.rendezvous.as_ref().map_or(self.gpus, |r| r.world)
    }
}

/// The planted failure from the environment: `(rank, step)`, the step defaulting to `default_step`.
pub fn planted_failure(default_step: usize) -> Result<Option<(usize, usize)>> {
    let Ok(r) = std::env::var(FAIL_RANK_ENV) else { return Ok(None) };
    let rank = r.trim().parse::<usize>().map_err(|_| Error::InvalidSetting {
        setting: FAIL_RANK_ENV,
        value: r.clone(),
        allowed: "a rank number (the rank that fails on purpose)".into(),
    })?;
    let step = match std::env::var(FAIL_STEP_ENV) {
        Err(_) => default_step,
        Ok(s) => s.trim().parse::<usize>().map_err(|_| Error::InvalidSetting {
            setting: FAIL_STEP_ENV,
            value: s.clone(),
            allowed: "a step number (0 is the first)".into(),
        })?,
    };
    Ok(Some((rank, step)))
}

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
    /// Per-epoch numbers (global rank 0's view; loss and train accuracy over all ranks' rows;
    /// empty on the other ranks).
    pub epochs: Vec<EpochReport>,
    /// The global batch's mean loss at every step.
    pub step_losses: Vec<f64>,
    /// The first rank of this process's parameters at the end, by name.
    pub params: Vec<(String, Vec<f32>)>,
    /// Ranks (over all processes).
    pub gpus: usize,
    /// The last step's timeline on this process's first rank, when asked for.
    pub timeline: Vec<TimelineEvent>,
}

/// Trains the MLP per `cfg` on GPUs 0..`gpus` of this process (overlapped, replicated), logging
/// from rank 0 to `log`. See [`train_data_parallel_with`].
pub fn train_data_parallel(cfg: &TrainConfig, gpus: usize, log: impl FnMut(&str) + Send) -> Result<DataParallelReport> {
    train_data_parallel_with(cfg, &DataParallel::local(gpus), log)
}

/// Trains the MLP per `cfg` as `dp` says (f32 only; not with the megakernel), logging from global
/// rank 0 to `log`. Typed errors: too few GPUs, NCCL missing, a rendezvous that fails, a mode this
/// path does not take, a rank that failed ([`Error::RankFailed`], [`Error::CommTimeout`], or the
/// failed rank's own error).
pub fn train_data_parallel_with(
    cfg: &TrainConfig,
    dp: &DataParallel,
    log: impl FnMut(&str) + Send,
) -> Result<DataParallelReport> {
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
    if dp.zero1 && cfg.clip_grad_norm.is_some() {
        return Err(Error::Unsupported {
            op: "train --zero1",
            what: "--clip-grad-norm (each rank holds only its shard of the gradients); drop one of them".into(),
        });
    }
    let run_cfg = dp.run_config()?;
    let world = dp.world();
    if cfg.batch < world {
        return Err(Error::InvalidSetting {
            setting: "--batch",
            value: cfg.batch.to_string(),
            allowed: format!("at least the number of ranks ({world}): each rank takes a share of every batch"),
        });
    }
    let is_root_process = run_cfg.first_rank() == 0;
    if let Some(path) = &cfg.checkpoint
        && is_root_process
    {
        checkpoint::check_destination(path)?;
    }
    let (train_set, test_set) = load_data(cfg)?;
    if train_set.is_empty() || test_set.is_empty() {
        return Err(Error::shape("train", "the dataset split left no training or no test rows"));
    }
    let steps_per_epoch = train_set.len().div_ceil(cfg.batch);
    let total = total_steps(steps_per_epoch, cfg.epochs)?;
    let schedule = lr_schedule(cfg, total);
    let fail = match dp.fail {
        Some(f) => Some(f),
        None => planted_failure(steps_per_epoch.min(total.saturating_sub(1)))?,
    };
    let log = Mutex::new(log);
    let say = |s: &str| (log.lock().unwrap_or_else(|p| p.into_inner()))(s);
    let outs = dist::run_with(&run_cfg, |r| {
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
        r.broadcast_tensors(&tensors, 0)?;
        let sharding = if dp.zero1 { Sharding::Zero1 } else { Sharding::Replicated };
        let mut sync = GradSync::new(r, &tensors, dp.bucket_bytes, sharding, dp.overlap)?;
        if r.rank == 0 {
            let n: usize = tensors.iter().map(|t| t.elem_count()).sum();
            say(&format!(
                "data-parallel on {world} GPUs ({}), {n} parameters, global batch {} split across ranks, \
                 gradients summed by NCCL {} in {} bucket(s) of up to {} MiB{}",
                r.device.name(),
                cfg.batch,
                if dp.zero1 {
                    "reduce-scatter (ZeRO-1: optimizer state sharded, parameters all-gathered)"
                } else {
                    "all-reduce"
                },
                sync.plan().buckets.len(),
                dp.bucket_bytes >> 20,
                if dp.overlap { ", overlapped with the backward pass" } else { ", after the backward pass" }
            ));
        }
        let opt_params = match sync.shard() {
            Some(s) => vec![("shard".to_string(), s.clone())],
            None => params.clone(),
        };
        let mut opt: Box<dyn Optimizer> = match cfg.optimizer {
            super::OptimizerKind::Sgd { momentum, nesterov } => {
                Box::new(Sgd::new(opt_params, cfg.lr, momentum, cfg.weight_decay, nesterov))
            }
            super::OptimizerKind::Adam => Box::new(Adam::adam(opt_params, cfg.lr, cfg.weight_decay)),
            super::OptimizerKind::AdamW => Box::new(Adam::adamw(opt_params, cfg.lr, cfg.weight_decay)),
        };
        let mut order: Vec<usize> = (0..train_set.len()).collect();
        let mut step = 0usize;
        let mut epochs = Vec::new();
        // per step: this rank's (shard mean loss x shard rows), summed over ranks per epoch
        let mut step_losses = vec![0.0f64; total];
        let mut timeline = Vec::new();
        for epoch in 1..=cfg.epochs {
            for i in (1..order.len()).rev() {
                order.swap(i, rand::Rng::random_range(&mut rng, 0..=i));
            }
            let started = Instant::now();
            let mut correct = 0usize;
            let first_step = step;
            for chunk in order.chunks(cfg.batch) {
                let last = step + 1 == total;
                r.record_timeline(dp.timeline && last);
                opt.set_lr(schedule.lr(cfg.lr, step));
                // the rate's copy to the device now, not in the step behind this step's collectives
                opt.prepare_replay()?;
                let rows = &chunk[shard(chunk.len(), world, r.rank)];
                if rows.is_empty() {
                    if fail == Some((r.rank, step)) {
                        return Err(r.fail(Error::PlantedFailure { rank: r.rank, step }));
                    }
                    sync.backward_without_loss(r)?;
                } else {
                    let (x, y) = train_set.gather(rows);
                    let x = Tensor::from_vec(x, [rows.len(), train_set.features])?.to_device(&device)?;
                    r.mark(|| "forward start".into(), false)?;
                    let logits = model.forward(&x)?;
                    let loss = logits.cross_entropy(&y)?;
                    let lv = loss.item()?;
                    if !lv.is_finite() {
                        return Err(Error::NonFinite { what: "the training loss".into(), value: lv, step });
                    }
                    // downloaded before the backward pass: after it the compute stream waits for the
                    // gradients' collectives, and a blocking download there would never return
                    // if a peer failed before joining them
                    correct += logits.argmax_last()?.iter().zip(&y).filter(|(p, t)| p == t).count();
                    if fail == Some((r.rank, step)) {
                        // shared at once (the other ranks may be waiting in this step's collectives)
                        return Err(r.fail(Error::PlantedFailure { rank: r.rank, step }));
                    }
                    let scaled = loss.mul_scalar(rows.len() as f64 / chunk.len() as f64)?;
                    sync.backward(r, &scaled)?;
                    step_losses[step] = lv * rows.len() as f64;
                }
                if let Some(max_norm) = cfg.clip_grad_norm {
                    opt.clip_grad_norm(max_norm)?;
                }
                r.mark(|| "optimizer start".into(), false)?;
                opt.step()?;
                opt.zero_grad();
                sync.gather_parameters(r)?;
                r.mark(|| "step end".into(), false)?;
                r.settle()?;
                if dp.timeline && last {
                    timeline = r.take_timeline()?;
                    r.record_timeline(false);
                }
                step += 1;
            }
            r.synchronize()?;
            let elapsed = started.elapsed().as_secs_f64();
            // this epoch's per-step loss sums and the correct count, summed over ranks
            let mut stats: Vec<f64> = step_losses[first_step..step].to_vec();
            stats.push(correct as f64);
            r.all_reduce_host_f64(&mut stats)?;
            let correct = stats.pop().unwrap_or(0.0) as usize;
            step_losses[first_step..step].copy_from_slice(&stats);
            if r.rank == 0 {
                let loss_sum: f64 = stats.iter().sum();
                let e = EpochReport {
                    epoch,
                    loss: loss_sum / train_set.len() as f64,
                    train_accuracy: correct as f64 / train_set.len() as f64,
                    test_accuracy: accuracy(&model, &test_set, DType::F32, &device)?,
                    step_ms: 1e3 * elapsed / steps_per_epoch as f64,
                    samples_per_s: train_set.len() as f64 / elapsed,
                };
                say(&format!(
                    "epoch {:>3}  loss {:.4}  train acc {:6.2}%  test acc {:6.2}%  step {:.3} ms  {:.0} samples/s (all {world} GPUs)",
                    e.epoch,
                    e.loss,
                    100.0 * e.train_accuracy,
                    100.0 * e.test_accuracy,
                    e.step_ms,
                    e.samples_per_s
                ));
                epochs.push(e);
                if let Some(path) = &cfg.checkpoint {
                    // atomic (a temporary file renamed over the last one): a failure later leaves
                    // this checkpoint intact
                    if dp.zero1 {
                        // each rank holds only its shard of the optimizer state: the parameters only
                        checkpoint::save(path, &model.named_parameters(), metadata(cfg, &train_set))?;
                    } else {
                        let state =
                            TrainingState { step: step as u64, epoch: epoch as u64, config: metadata(cfg, &train_set) };
                        checkpoint::save_training(path, &model, opt.as_ref(), &state)?;
                    }
                    say(&format!("saved checkpoint {} (epoch {epoch})", path.display()));
                }
            }
        }
        let mut losses = Vec::with_capacity(total);
        for (s, chunk) in step_losses.iter().zip((0..cfg.epochs).flat_map(|_| (0..train_set.len()).step_by(cfg.batch)))
        {
            losses.push(s / (train_set.len() - chunk).min(cfg.batch) as f64);
        }
        let params = params.iter().map(|(n, p)| (n.clone(), p.to_vec_f32())).collect();
        Ok((epochs, losses, params, timeline))
    })?;
    let (epochs, step_losses, params, timeline) = outs.into_iter().next().unwrap_or_default();
    Ok(DataParallelReport { epochs, step_losses, params, gpus: world, timeline })
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
        let cfg = TrainConfig { clip_grad_norm: Some(1.0), checkpoint: None, ..TrainConfig::default() };
        let dp = DataParallel { zero1: true, ..DataParallel::local(2) };
        let e = train_data_parallel_with(&cfg, &dp, |_| {}).unwrap_err().to_string();
        assert!(e.contains("--clip-grad-norm"), "{e}");
        let cfg = TrainConfig { checkpoint: None, ..TrainConfig::default() };
        let dp = DataParallel {
            rendezvous: Some(Rendezvous { addr: "127.0.0.1".into(), port: 1, rank: 0, world: 2 }),
            ..DataParallel::local(2)
        };
        let e = train_data_parallel_with(&cfg, &dp, |_| {}).unwrap_err().to_string();
        assert!(e.contains("--gpus") && e.contains("--world-size"), "{e}");
    }

    #[test]
    fn planted_failure_reads_rank_and_step() {
        // the variables are read, not set, here (tests run in threads of one process)
        if std::env::var(FAIL_RANK_ENV).is_err() {
            assert_eq!(planted_failure(5).expect("unset"), None);
        }
    }
}

//! Data-parallel training of the GPT (`kiln train --model gpt --gpus N`, or one process per GPU):
//! the loop of [`super::gpt::train_gpt`] on every rank, the gradients summed across the ranks by
//! [`GradSync`] (buckets all-reduced on the communication stream during the last micro-batch's
//! backward pass).
//!
//! Every rank draws the same `batch` windows per micro-batch from the same seeded generator and
//! takes its contiguous share of them ([`super::data_parallel::shard`]), scaling its loss by its
//! share, so the summed gradient is the one-GPU run's up to the order of sums: `--batch` is the
//! global batch, as for the MLP. Micro-batches before the last of a step accumulate locally; the
//! last one's backward launches the buckets. Rank 0 logs (the training loss summed over ranks, one
//! small f64 all-reduce per step), measures the validation loss and writes the checkpoint
//! (atomically). Not here: `--resume`, `--save-init`, ZeRO-1 (AdamW's decay groups are per
//! parameter), the CPU, f64.

use super::data_parallel::{DataParallel, planted_failure, shard};
use super::gpt::{GptReport, GptTrainConfig, checkpoint_metadata, invalid, schedule, validation_loss};
use crate::checkpoint::{self, TrainingState};
use crate::corpus::{Corpus, WindowRng, windows};
use crate::dist;
use crate::dist::ddp::{GradSync, Sharding};
use crate::error::{Error, Result};
use crate::nn::{Gpt, Module, autocast};
use crate::optim::{Adam, Optimizer, attach_compute_copies};
use crate::tensor::{DType, Device, Tensor};
use std::sync::Mutex;
use std::time::Instant;

/// Refusals that need no GPU.
fn refuse(cfg: &GptTrainConfig, dp: &DataParallel) -> Result<()> {
    let no = |what: &str| Err(Error::Unsupported { op: "train --model gpt --gpus", what: what.into() });
    if cfg.steps == 0 {
        return Err(invalid("--steps", 0, "at least 1"));
    }
    if cfg.grad_accum == 0 {
        return Err(invalid("--grad-accum", 0, "at least 1"));
    }
    if cfg.eval_batches == 0 {
        return Err(invalid("--eval-batches", 0, "at least 1"));
    }
    if cfg.resume.is_some() {
        return no("--resume (a data-parallel GPT run starts from scratch for now)");
    }
    if cfg.save_init.is_some() {
        return no("--save-init (save it from a one-GPU run with the same seed: the model is the same)");
    }
    if !matches!(cfg.dtype, DType::F32 | DType::BF16) {
        return no("a --dtype other than f32 or bf16");
    }
    if cfg.device == super::DeviceChoice::Cpu {
        return no("--device cpu (it trains on GPUs)");
    }
    if dp.zero1 {
        return no("--zero1 (AdamW's weight decay is set per parameter; ZeRO-1 trains the MLP)");
    }
    if cfg.batch < dp.world() {
        return Err(invalid(
            "--batch",
            cfg.batch,
            format!("at least the number of ranks ({}): each rank takes a share of every batch", dp.world()),
        ));
    }
    Ok(())
}

/// Trains the GPT per `cfg` as `dp` says, logging from global rank 0. The report is rank 0's
/// (losses summed over ranks; ms per step and tokens per second of the whole run).
pub fn train_gpt_data_parallel(
    cfg: &GptTrainConfig,
    dp: &DataParallel,
    log: impl FnMut(&str) + Send,
) -> Result<GptReport> {
    refuse(cfg, dp)?;
    let run_cfg = dp.run_config()?;
    let world = dp.world();
    if let Some(path) = &cfg.checkpoint
        && run_cfg.first_rank() == 0
    {
        checkpoint::check_destination(path)?;
    }
    let block = cfg.spec.resolve(256)?.block;
    let corpus = Corpus::from_file(&cfg.data, cfg.tokens, block)?;
    let config = cfg.spec.resolve(corpus.vocab.len())?;
    let fail = match dp.fail {
        Some(f) => Some(f),
        None => planted_failure(0)?,
    };
    let log = Mutex::new(log);
    let say = |s: &str| (log.lock().unwrap_or_else(|p| p.into_inner()))(s);
    let (end, timed_from) = match cfg.bench_steps {
        Some(n) => (3 + n, 3),
        None => (cfg.steps, 0),
    };
    let tokens_per_step = cfg.batch * cfg.grad_accum * config.block;
    let outs = dist::run_with(&run_cfg, |r| {
        let device = Device::Cuda(r.device.clone());
        let mut model = Gpt::new(&config, DType::F32, cfg.seed)?;
        model.move_to(&device)?;
        let params = model.named_parameters();
        let tensors: Vec<Tensor> = params.iter().map(|(_, p)| p.clone()).collect();
        r.broadcast_tensors(&tensors, 0)?;
        let decay: Vec<bool> = params.iter().map(|(n, _)| Gpt::decays(n)).collect();
        let mut opt = Adam::adamw(params, cfg.lr, cfg.weight_decay);
        opt.beta2 = 0.95;
        opt.set_decay(&decay)?;
        let mut sync = GradSync::new(r, &tensors, dp.bucket_bytes, Sharding::Replicated, dp.overlap)?;
        if cfg.dtype == DType::BF16 {
            attach_compute_copies(&mut opt, DType::BF16)?;
        }
        model.set_training(true);
        if r.rank == 0 {
            say(&format!(
                "GPT data-parallel on {world} GPUs ({}): {} parameters (vocab {}, block {}, width {}, {} layers, {} heads), \
                 global batch {} windows split across ranks, {tokens_per_step} tokens per step, gradients summed by NCCL \
                 all-reduce in {} bucket(s){}",
                r.device.name(),
                config.parameter_count(),
                config.vocab,
                config.block,
                config.width,
                config.layers,
                config.heads,
                cfg.batch,
                sync.plan().buckets.len(),
                if dp.overlap { ", overlapped with the backward pass" } else { ", after the backward pass" }
            ));
        }
        let sched = schedule(cfg.warmup, cfg.steps);
        let mut rng = WindowRng::new(cfg.seed);
        let mut report = GptReport::default();
        let rows = shard(cfg.batch, world, r.rank);
        let mut timer = Instant::now();
        let mut last = Instant::now();
        for step in 0..end {
            if step == timed_from {
                r.synchronize()?;
                r.barrier()?;
                timer = Instant::now();
            }
            opt.set_lr(sched.lr(cfg.lr, step));
            // the rate's copy to the device now, not in the step behind this step's collectives
            opt.prepare_replay()?;
            opt.zero_grad();
            let mut loss_sum = 0.0;
            for micro in 0..cfg.grad_accum {
                let (x, y) = windows(&corpus.train, cfg.batch, config.block, &mut rng);
                let span = rows.start * config.block..rows.end * config.block;
                let (x, y) = (&x[span.clone()], &y[span]);
                let loss = {
                    let _mixed = if cfg.dtype == DType::BF16 { Some(autocast(DType::BF16)?) } else { None };
                    model.loss(x, y, rows.len())?
                };
                let share = rows.len() as f64 / cfg.batch as f64 / cfg.grad_accum as f64;
                let loss = loss.mul_scalar(share)?;
                if cfg.bench_steps.is_none() {
                    loss_sum += loss.item()?;
                }
                if micro + 1 < cfg.grad_accum {
                    loss.backward()?;
                } else {
                    if fail == Some((r.rank, step)) {
                        return Err(r.fail(Error::PlantedFailure { rank: r.rank, step }));
                    }
                    sync.backward(r, &loss)?;
                }
            }
            if let Some(c) = cfg.clip_grad_norm {
                opt.clip_grad_norm(c)?;
            }
            opt.step()?;
            r.settle()?;
            if cfg.bench_steps.is_some() {
                continue;
            }
            let mut l = [loss_sum];
            r.all_reduce_host_f64(&mut l)?;
            let loss_sum = l[0];
            report.train_losses.push((step + 1, loss_sum));
            let done = step + 1;
            if r.rank == 0 {
                let now = Instant::now();
                let tps = tokens_per_step as f64 / now.duration_since(last).as_secs_f64().max(1e-9);
                last = now;
                if (cfg.eval_every > 0 && done.is_multiple_of(cfg.eval_every)) || done == end {
                    let val = validation_loss(&mut model, &corpus, cfg)?;
                    report.val_losses.push((done, val));
                    say(&format!(
                        "step {done}/{}: train loss {loss_sum:.4}, validation loss {val:.4}, lr {:.2e}, {tps:.0} tokens/s \
                         (all {world} GPUs)",
                        cfg.steps,
                        opt.lr()
                    ));
                }
            }
        }
        r.synchronize()?;
        let timed = end - timed_from;
        let secs = timer.elapsed().as_secs_f64();
        report.ms_per_step = 1e3 * secs / timed as f64;
        report.tokens_per_s = (timed * tokens_per_step) as f64 / secs.max(1e-12);
        report.peak_bytes = r.device.peak_memory().ok();
        if r.rank == 0
            && cfg.bench_steps.is_none()
            && let Some(path) = &cfg.checkpoint
        {
            let mut meta = checkpoint_metadata(cfg, &config, &corpus, &rng, &report);
            meta.insert("gpt.gpus".into(), world.to_string());
            let state = TrainingState { step: end as u64, epoch: 0, config: meta };
            checkpoint::save_training(path, &model, &opt, &state)?;
            let svg = path.with_extension("svg");
            std::fs::write(&svg, super::gpt::loss_svg(&report.train_losses, &report.val_losses))
                .map_err(|e| Error::File { path: svg.clone(), msg: e.to_string() })?;
            say(&format!("saved {} (step {end}) and the loss curve {}", path.display(), svg.display()));
        }
        if cfg.bench_steps.is_some() && r.rank == 0 {
            say(&format!(
                "bench: {timed} steps on {world} GPUs, {:.2} ms/step, {:.0} tokens/s (all GPUs)",
                report.ms_per_step, report.tokens_per_s
            ));
        }
        Ok(report)
    })?;
    Ok(outs.into_iter().next().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_before_any_gpu_work() {
        let dp = DataParallel::local(2);
        let base = GptTrainConfig { checkpoint: None, ..GptTrainConfig::default() };
        let cases = [
            (GptTrainConfig { resume: Some("x".into()), ..base.clone() }, "--resume"),
            (GptTrainConfig { save_init: Some("x".into()), ..base.clone() }, "--save-init"),
            (GptTrainConfig { dtype: DType::F64, ..base.clone() }, "--dtype"),
            (GptTrainConfig { device: super::super::DeviceChoice::Cpu, ..base.clone() }, "--device cpu"),
            (GptTrainConfig { batch: 1, ..base.clone() }, "--batch"),
        ];
        for (cfg, needle) in cases {
            let e = train_gpt_data_parallel(&cfg, &dp, |_| {}).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        }
        let e = train_gpt_data_parallel(&base, &DataParallel { zero1: true, ..dp }, |_| {}).unwrap_err().to_string();
        assert!(e.contains("--zero1"), "{e}");
    }
}

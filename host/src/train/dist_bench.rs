//! `kiln dist-bench`: the data-parallel training step of the large MLP (per GPU a batch of
//! `batch` rows, `layers` bias-free Linear layers of `width`, ReLU between, `width` classes,
//! cross-entropy, f32, SGD lr 0.01: the model `benches/torch_ddp.py` runs under PyTorch DDP) on one
//! GPU (no NCCL) and on N, at a fixed per-GPU batch, with a timeline of one N-GPU step: when the
//! compute stream ran the forward, the backward and the optimizer, and when the communication
//! stream ran each bucket's all-reduce, from CUDA events.

use crate::dist::ddp::{GradSync, Sharding};
use crate::dist::{self, Rank, TimelineEvent};
use crate::error::{Error, Result};
use crate::nn::{Linear, Module, ReLU, Sequential};
use crate::optim::{Optimizer, Sgd};
use crate::tensor::{DType, Device, Targets, Tensor};
use std::time::Instant;

/// What `kiln dist-bench` runs.
#[derive(Clone, Debug, PartialEq)]
pub struct DistBenchConfig {
    /// GPUs of the data-parallel run (2 or more).
    pub gpus: usize,
    /// Rows per GPU.
    pub batch: usize,
    /// Layer width (and classes).
    pub width: usize,
    /// Linear layers.
    pub layers: usize,
    /// Timed steps.
    pub steps: usize,
    /// Untimed steps first.
    pub warmup: usize,
    /// Bytes of gradient per bucket.
    pub bucket_bytes: usize,
    /// Overlap the buckets' all-reduces with the backward pass.
    pub overlap: bool,
    /// ZeRO-1 instead of replicated.
    pub zero1: bool,
}

/// What `kiln dist-bench` measured.
#[derive(Clone, Debug, PartialEq)]
pub struct DistBenchReport {
    /// The GPU's name.
    pub device: String,
    /// The configuration.
    pub config: DistBenchConfig,
    /// Milliseconds per step on one GPU (no communication).
    pub ms_one: f64,
    /// Milliseconds per step on `gpus` GPUs (rank 0's wall time over the timed steps).
    pub ms_many: f64,
    /// Milliseconds per step with every rank's thread stepping its own replica at once and no
    /// communication (rank 0's wall time): where this exceeds `ms_one`, the ranks slow each
    /// other down before any collective does.
    pub ms_many_alone: f64,
    /// Buckets per step.
    pub buckets: usize,
    /// One N-GPU step's timeline on rank 0.
    pub timeline: Vec<TimelineEvent>,
}

impl DistBenchReport {
    /// Throughput on N GPUs over throughput on one (rows/s; `gpus` means linear scaling).
    pub fn scaling(&self) -> f64 {
        self.config.gpus as f64 * self.ms_one / self.ms_many
    }

    /// From the timeline: (backward ms, communication ms, communication ms inside the backward
    /// pass): how much of the all-reduce time the backward pass hid.
    pub fn overlap_ms(&self) -> (f64, f64, f64) {
        overlap_of(&self.timeline)
    }

    /// The report as JSON (what `benches/multi_gpu_report.py` reads).
    pub fn to_json(&self) -> String {
        let c = &self.config;
        let (bwd, comm, hidden) = self.overlap_ms();
        let events: Vec<String> = self
            .timeline
            .iter()
            .map(|e| format!("{{\"label\":{:?},\"stream\":{:?},\"ms\":{:.4}}}", e.label, e.stream, e.ms))
            .collect();
        format!(
            "{{\"device\":{:?},\"gpus\":{},\"batch\":{},\"width\":{},\"layers\":{},\"steps\":{},\"bucket_bytes\":{},\
             \"overlap\":{},\"zero1\":{},\"buckets\":{},\"ms_one\":{:.4},\"ms_many\":{:.4},\"ms_many_alone\":{:.4},\"scaling\":{:.4},\
             \"backward_ms\":{:.4},\"comm_ms\":{:.4},\"comm_hidden_ms\":{:.4},\"timeline\":[{}]}}",
            self.device,
            c.gpus,
            c.batch,
            c.width,
            c.layers,
            c.steps,
            c.bucket_bytes,
            c.overlap,
            c.zero1,
            self.buckets,
            self.ms_one,
            self.ms_many,
            self.ms_many_alone,
            self.scaling(),
            bwd,
            comm,
            hidden,
            events.join(",")
        )
    }
}

/// (backward ms, communication ms, communication ms inside the backward) of a timeline: the
/// backward runs from `backward start` to `backward end` on the compute stream; each collective
/// from its `... start` to its `... end` on the communication stream.
pub fn overlap_of(events: &[TimelineEvent]) -> (f64, f64, f64) {
    let at = |label: &str| events.iter().find(|e| e.label == label && e.stream == "compute").map(|e| e.ms);
    let (b0, b1) = (at("backward start").unwrap_or(0.0), at("backward end").unwrap_or(0.0));
    let mut comm = 0.0;
    let mut hidden = 0.0;
    for s in events.iter().filter(|e| e.stream == "comm" && e.label.ends_with(" start")) {
        let name = &s.label[..s.label.len() - " start".len()];
        if let Some(e) = events.iter().find(|e| e.stream == "comm" && e.label == format!("{name} end")) {
            comm += e.ms - s.ms;
            hidden += (e.ms.min(b1) - s.ms.max(b0)).max(0.0);
        }
    }
    (b1 - b0, comm, hidden)
}

/// The model on `device`, from seed 7 (every rank builds the same one; the run broadcasts rank
/// 0's anyway).
fn model(cfg: &DistBenchConfig, device: &Device) -> Result<Sequential> {
    let mut rng = Tensor::rng(7);
    let mut m = Sequential::new();
    for l in 0..cfg.layers {
        m = m.push(Linear::new(cfg.width, cfg.width, false, DType::F32, &mut rng)?);
        if l + 1 < cfg.layers {
            m = m.push(ReLU);
        }
    }
    for p in m.parameters() {
        p.move_to(device)?;
    }
    Ok(m)
}

/// Rank `rank`'s batch: random rows and classes of its own.
fn batch(cfg: &DistBenchConfig, rank: usize, device: &Device) -> Result<(Tensor, Targets)> {
    let mut rng = Tensor::rng(100 + rank as u64);
    let x = Tensor::randn([cfg.batch, cfg.width], DType::F32, &mut rng).to_device(device)?;
    let y: Vec<usize> = (0..cfg.batch).map(|i| (i * 7919 + rank * 31) % cfg.width).collect();
    Ok((x, Targets::new(y)))
}

/// One rank's timed loop: `(ms per step, buckets, timeline of one more step)`.
fn rank_loop(cfg: &DistBenchConfig, r: Option<&Rank>, device: &Device) -> Result<(f64, usize, Vec<TimelineEvent>)> {
    let m = model(cfg, device)?;
    let params: Vec<Tensor> = m.parameters();
    let (x, y) = batch(cfg, r.map_or(0, |r| r.rank), device)?;
    let mut sync = match r {
        Some(r) => {
            r.broadcast_tensors(&params, 0)?;
            let sharding = if cfg.zero1 { Sharding::Zero1 } else { Sharding::Replicated };
            Some(GradSync::new(r, &params, cfg.bucket_bytes, sharding, cfg.overlap)?)
        }
        None => None,
    };
    let opt_params = match sync.as_ref().and_then(|s| s.shard()) {
        Some(s) => vec![("shard".to_string(), s.clone())],
        None => m.named_parameters(),
    };
    let mut opt = Sgd::new(opt_params, 0.01, 0.0, 0.0, false);
    let world = r.map_or(1, |r| r.world);
    let mut step = |sync: &mut Option<GradSync>| -> Result<()> {
        if let Some(r) = r {
            r.mark(|| "forward start".into(), false)?;
        }
        let loss = m.forward(&x)?.cross_entropy(&y)?;
        match (sync.as_mut(), r) {
            (Some(s), Some(r)) => s.backward(r, &loss.mul_scalar(1.0 / world as f64)?)?,
            _ => loss.backward()?,
        }
        if let Some(r) = r {
            r.mark(|| "optimizer start".into(), false)?;
        }
        opt.step()?;
        opt.zero_grad();
        if let (Some(s), Some(r)) = (sync.as_mut(), r) {
            s.gather_parameters(r)?;
            r.mark(|| "step end".into(), false)?;
        }
        Ok(())
    };
    let settle = || -> Result<()> {
        if let Some(r) = r {
            r.settle()?;
        }
        match device {
            Device::Cuda(d) => d.synchronize(),
            Device::Cpu => Ok(()),
        }
    };
    for _ in 0..cfg.warmup {
        step(&mut sync)?;
    }
    settle()?;
    if let Some(r) = r {
        r.barrier()?;
    }
    let t0 = Instant::now();
    for _ in 0..cfg.steps {
        step(&mut sync)?;
    }
    settle()?;
    let ms = t0.elapsed().as_secs_f64() * 1e3 / cfg.steps as f64;
    let mut timeline = Vec::new();
    if let Some(r) = r {
        r.record_timeline(true);
        step(&mut sync)?;
        settle()?;
        timeline = r.take_timeline()?;
        r.record_timeline(false);
    }
    Ok((ms, sync.as_ref().map_or(0, |s| s.plan().buckets.len()), timeline))
}

/// Runs the benchmark (see the module's documentation).
pub fn dist_bench(cfg: &DistBenchConfig) -> Result<DistBenchReport> {
    for (v, setting) in
        [(cfg.batch, "--batch"), (cfg.width, "--width"), (cfg.layers, "--layers"), (cfg.steps, "--steps")]
    {
        if v == 0 {
            return Err(Error::InvalidSetting { setting, value: "0".into(), allowed: "1 or more".into() });
        }
    }
    if cfg.gpus < 2 {
        return Err(Error::InvalidSetting {
            setting: "--gpus",
            value: cfg.gpus.to_string(),
            allowed: "2 or more (one GPU is always measured as the baseline)".into(),
        });
    }
    dist::check_gpus(cfg.gpus)?;
    let dev = crate::cuda::Device::new(0)?;
    let name = dev.name().to_string();
    let (ms_one, _, _) = rank_loop(cfg, None, &Device::Cuda(std::sync::Arc::new(dev)))?;
    let outs = dist::run(cfg.gpus, |r| rank_loop(cfg, Some(r), &Device::Cuda(r.device.clone())))?;
    let (ms_many, buckets, timeline) = outs.into_iter().next().unwrap_or_default();
    let alone = dist::run(cfg.gpus, |r| rank_loop(cfg, None, &Device::Cuda(r.device.clone())))?;
    let ms_many_alone = alone.into_iter().next().map_or(f64::NAN, |(ms, _, _)| ms);
    Ok(DistBenchReport { device: name, config: cfg.clone(), ms_one, ms_many, ms_many_alone, buckets, timeline })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(label: &str, stream: &'static str, ms: f64) -> TimelineEvent {
        TimelineEvent { label: label.into(), stream, ms }
    }

    #[test]
    fn overlap_counts_communication_inside_the_backward() {
        let t = [
            ev("forward start", "compute", 0.0),
            ev("backward start", "compute", 1.0),
            ev("bucket 0 all-reduce start", "comm", 2.0),
            ev("bucket 0 all-reduce end", "comm", 3.0),
            ev("backward end", "compute", 3.5),
            ev("bucket 1 all-reduce start", "comm", 3.0),
            ev("bucket 1 all-reduce end", "comm", 4.5),
        ];
        let (b, c, h) = overlap_of(&t);
        assert!((b - 2.5).abs() < 1e-12 && (c - 2.5).abs() < 1e-12 && (h - 1.5).abs() < 1e-12, "{b} {c} {h}");
        assert_eq!(overlap_of(&[]), (0.0, 0.0, 0.0));
    }

    #[test]
    fn refusals_before_any_gpu_work() {
        let cfg = DistBenchConfig {
            gpus: 1,
            batch: 4,
            width: 4,
            layers: 2,
            steps: 1,
            warmup: 0,
            bucket_bytes: 1 << 20,
            overlap: true,
            zero1: false,
        };
        assert!(dist_bench(&cfg).unwrap_err().to_string().contains("2 or more"));
        assert!(dist_bench(&DistBenchConfig { steps: 0, ..cfg }).unwrap_err().to_string().contains("--steps"));
    }
}

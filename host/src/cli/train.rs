//! `kiln train` (the MLP, one GPU or many, and the GPT), `kiln sample` and `kiln eval`.

use super::args::*;
use kiln::nn::Activation;
use kiln::train::{DataSource, DeviceChoice, OptimizerKind, TrainConfig};
use kiln::{DType, Tensor};
use std::io::Write;
use std::path::PathBuf;

pub(crate) fn train(a: TrainArgs) -> kiln::Result<bool> {
    if a.gpus == 0 {
        return Err(kiln::Error::InvalidSetting { setting: "--gpus", value: "0".into(), allowed: "1 or more".into() });
    }
    if let ModelKind::Gpt = a.model {
        return train_gpt(a);
    }
    if let Some(flag) = a.gpt_only_flag() {
        return Err(kiln::Error::Unsupported {
            op: "train",
            what: format!("{flag} with the MLP: it is a GPT setting; add --model gpt"),
        });
    }
    let dp = data_parallel(&a)?;
    let data = match a.dataset {
        Data::Spirals if a.data_dir.is_some() => {
            return Err(kiln::Error::Unsupported {
                op: "train",
                what: "--data-dir with --dataset spirals (the spirals are generated): add --dataset mnist to read \
                       MNIST from the directory, or drop --data-dir"
                    .into(),
            });
        }
        Data::Spirals => DataSource::Spirals { per_class: 1000, classes: 3, noise: 0.2 },
        Data::Mnist => DataSource::Mnist(a.data_dir.clone().ok_or_else(|| kiln::Error::Unsupported {
            op: "train",
            what:
                "--dataset mnist without --data-dir (the directory holding train-images-idx3-ubyte and friends)".into(),
        })?),
    };
    let cfg = TrainConfig {
        data,
        width: a.width.unwrap_or(64),
        depth: a.depth,
        activation: match a.activation {
            Act::Relu => Activation::Relu,
            Act::Gelu => Activation::Gelu,
        },
        batch: a.batch.unwrap_or(64),
        epochs: a.epochs,
        optimizer: match a.optimizer.unwrap_or(if a.megakernel { Opt::Sgd } else { Opt::Adam }) {
            Opt::Sgd => OptimizerKind::Sgd { momentum: 0.9, nesterov: false },
            Opt::Nesterov => OptimizerKind::Sgd { momentum: 0.9, nesterov: true },
            Opt::Adam => OptimizerKind::Adam,
            Opt::Adamw => OptimizerKind::AdamW,
        },
        lr: a.lr.unwrap_or(1e-2),
        weight_decay: a.weight_decay.unwrap_or(0.0),
        clip_grad_norm: a.clip_grad_norm,
        warmup: a.warmup.unwrap_or(50),
        device: match a.device {
            Dev::Auto => DeviceChoice::Auto,
            Dev::Cpu => DeviceChoice::Cpu,
            Dev::Cuda => DeviceChoice::Cuda,
        },
        dtype: match a.dtype {
            Dt::F32 => DType::F32,
            Dt::F64 => DType::F64,
            Dt::Bf16 => DType::BF16,
            Dt::F16 => DType::F16,
        },
        seed: a.seed,
        checkpoint: Some(a.checkpoint.unwrap_or_else(|| PathBuf::from("kiln-mlp.safetensors"))),
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        megakernel: a.megakernel,
        graph: !a.no_graph,
        mega_path: a.mega_path.map(|p| match p {
            MegaPath::CudaCores => kiln::megakernel::DataPath::CudaCores,
            MegaPath::Tf32 => kiln::megakernel::DataPath::Tf32,
            MegaPath::Tf32x3 => kiln::megakernel::DataPath::Tf32x3,
            MegaPath::Bf16 => kiln::megakernel::DataPath::Bf16,
        }),
        matmul_precision: match a.matmul_precision {
            Precision::F32 => kiln::cuda::MatmulPrecision::F32,
            Precision::Bf16 => kiln::cuda::MatmulPrecision::Bf16,
        },
    };
    let epochs = if let Some(dp) = dp {
        let epochs = kiln::train::data_parallel::train_data_parallel_with(&cfg, &dp, |line| say!("{line}"))?.epochs;
        if let Some(r) = dp.rendezvous.as_ref().filter(|r| r.rank != 0) {
            // rank 0 evaluates, logs and judges the accuracy; the others only train
            say!("rank {} of {}: done", r.rank, r.world);
            return Ok(true);
        }
        epochs
    } else {
        kiln::train::train(&cfg, |line| say!("{line}"))?.epochs
    };
    let acc = epochs.last().map(|r| r.test_accuracy).unwrap_or(0.0);
    let target = a.target_accuracy.unwrap_or(match a.dataset {
        Data::Spirals => 0.95,
        Data::Mnist => 0.9,
    });
    if acc >= target {
        say!("reached {:.2}% test accuracy (target {:.0}%)", 100.0 * acc, 100.0 * target);
        Ok(true)
    } else {
        say!("test accuracy {:.2}% is below the target {:.0}%", 100.0 * acc, 100.0 * target);
        Ok(false)
    }
}

/// A torchrun environment variable, parsed (`None` when unset).
pub(crate) fn env_number<T: std::str::FromStr>(name: &'static str) -> kiln::Result<Option<T>> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(v) => v.trim().parse().map(Some).map_err(|_| kiln::Error::InvalidSetting {
            setting: name,
            value: v.clone(),
            allowed: "a whole number (torchrun sets it)".into(),
        }),
    }
}

/// The data-parallel setup the flags (and torchrun's environment) ask for; `None` for one GPU.
pub(crate) fn data_parallel(a: &TrainArgs) -> kiln::Result<Option<kiln::train::data_parallel::DataParallel>> {
    use kiln::dist::rendezvous::Rendezvous;
    let world = match a.world_size {
        Some(w) => Some(w),
        None => env_number::<usize>("WORLD_SIZE")?,
    };
    if world == Some(0) {
        return Err(kiln::Error::InvalidSetting {
            setting: "--world-size",
            value: "0".into(),
            allowed: "1 or more".into(),
        });
    }
    let multi = world.is_some_and(|w| w > 1);
    let rendezvous = if multi {
        let world = world.unwrap_or(1);
        let rank = match a.rank {
            Some(r) => r,
            None => env_number::<usize>("RANK")?.ok_or_else(|| kiln::Error::InvalidSetting {
                setting: "--rank",
                value: "(none)".into(),
                allowed: format!("this process's rank, 0 to {} (or RANK in the environment)", world - 1),
            })?,
        };
        if rank >= world {
            return Err(kiln::Error::InvalidSetting {
                setting: "--rank",
                value: rank.to_string(),
                allowed: format!("0 to {} (--world-size {world})", world - 1),
            });
        }
        let addr = a.master_addr.clone().or_else(|| std::env::var("MASTER_ADDR").ok()).unwrap_or("127.0.0.1".into());
        let port = match a.master_port {
            Some(p) => p,
            None => env_number::<u16>("MASTER_PORT")?.unwrap_or(29500),
        };
        Some(Rendezvous { addr, port, rank, world })
    } else {
        for (given, flag) in [
            (a.rank.is_some(), "--rank"),
            (a.local_rank.is_some(), "--local-rank"),
            (a.master_addr.is_some(), "--master-addr"),
            (a.master_port.is_some(), "--master-port"),
        ] {
            if given {
                return Err(kiln::Error::Unsupported {
                    op: "train",
                    what: format!("{flag} without --world-size above 1 (a multi-process run names its size)"),
                });
            }
        }
        None
    };
    if a.gpus == 1 && rendezvous.is_none() {
        for (given, flag) in
            [(a.zero1, "--zero1"), (a.no_overlap, "--no-overlap"), (a.bucket_mb.is_some(), "--bucket-mb")]
        {
            if given {
                return Err(kiln::Error::Unsupported {
                    op: "train",
                    what: format!("{flag} on one GPU (it is a data-parallel setting): add --gpus 2 or more"),
                });
            }
        }
        return Ok(None);
    }
    let local_rank = match (a.local_rank, &rendezvous) {
        (Some(l), _) => l,
        (None, Some(r)) => env_number::<usize>("LOCAL_RANK")?.unwrap_or(r.rank),
        (None, None) => 0,
    };
    Ok(Some(kiln::train::data_parallel::DataParallel {
        gpus: a.gpus,
        zero1: a.zero1,
        overlap: !a.no_overlap,
        bucket_bytes: a.bucket_mb.map_or(kiln::dist::bucket::DEFAULT_BUCKET_BYTES, |m| (m as usize) << 20),
        rendezvous,
        local_rank,
        timeline: false,
        fail: None,
    }))
}

pub(crate) fn train_gpt(a: TrainArgs) -> kiln::Result<bool> {
    use kiln::train::gpt::{GptSpec, GptTrainConfig};
    let data = a.data.clone().ok_or_else(|| kiln::Error::Unsupported {
        op: "train",
        what: "--model gpt without --data FILE (any text file to train on)".into(),
    })?;
    if a.megakernel || a.data_dir.is_some() || a.optimizer.is_some() {
        return Err(kiln::Error::Unsupported {
            op: "train",
            what: "--megakernel, --data-dir and --optimizer are MLP settings: a GPT trains with AdamW".into(),
        });
    }
    let dp = data_parallel(&a)?;
    let d = GptTrainConfig::default();
    let cfg = GptTrainConfig {
        data,
        tokens: match a.tokens {
            Tokens::Bytes => kiln::corpus::TokenKind::Bytes,
            Tokens::Chars => kiln::corpus::TokenKind::Chars,
        },
        spec: GptSpec {
            preset: Some(a.preset.clone()),
            block: a.block,
            width: a.width,
            layers: a.layers,
            heads: a.heads,
            dropout: a.dropout,
            untied: a.untied,
            vocab: a.vocab,
        },
        steps: a.steps,
        batch: a.batch.unwrap_or(d.batch),
        grad_accum: a.grad_accum,
        lr: a.lr.unwrap_or(d.lr),
        warmup: a.warmup.unwrap_or(d.warmup),
        weight_decay: a.weight_decay.unwrap_or(d.weight_decay),
        clip_grad_norm: a.clip_grad_norm.or(d.clip_grad_norm),
        eval_every: a.eval_every,
        eval_batches: a.eval_batches,
        dtype: match a.dtype {
            Dt::F32 => DType::F32,
            Dt::F64 => DType::F64,
            Dt::Bf16 => DType::BF16,
            Dt::F16 => DType::F16,
        },
        device: match a.device {
            Dev::Auto => DeviceChoice::Auto,
            Dev::Cpu => DeviceChoice::Cpu,
            Dev::Cuda => DeviceChoice::Cuda,
        },
        seed: a.seed,
        checkpoint: Some(a.checkpoint.unwrap_or_else(|| PathBuf::from("kiln-gpt.safetensors"))),
        resume: a.resume,
        loss_log: a.loss_log,
        save_init: a.save_init,
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        bench_steps: a.bench_steps,
    };
    let report = match &dp {
        Some(dp) => {
            let report = kiln::train::gpt_parallel::train_gpt_data_parallel(&cfg, dp, |line| say!("{line}"))?;
            if let Some(r) = dp.rendezvous.as_ref().filter(|r| r.rank != 0) {
                say!("rank {} of {}: done", r.rank, r.world);
                return Ok(true);
            }
            report
        }
        None => kiln::train::gpt::train_gpt(&cfg, |line| say!("{line}"))?,
    };
    if cfg.bench_steps.is_some() {
        say!(
            "{{\"kiln_ms\": {:.3}, \"tokens_per_s\": {:.0}, \"peak_bytes\": {}}}",
            report.ms_per_step,
            report.tokens_per_s,
            report.peak_bytes.map_or("null".to_string(), |b| b.to_string())
        );
    }
    Ok(true)
}

pub(crate) fn sample(a: SampleArgs) -> kiln::Result<()> {
    let cfg = kiln::train::gpt::SampleConfig {
        checkpoint: a.checkpoint,
        prompt: a.prompt,
        tokens: a.tokens,
        temperature: a.temperature,
        top_k: a.top_k,
        seed: a.seed,
        device: match a.device {
            Dev::Auto => DeviceChoice::Auto,
            Dev::Cpu => DeviceChoice::Cpu,
            Dev::Cuda => DeviceChoice::Cuda,
        },
    };
    say!("{}", kiln::train::gpt::sample(&cfg)?);
    Ok(())
}

pub(crate) fn eval(checkpoint: PathBuf, data_dir: Option<PathBuf>) -> kiln::Result<()> {
    let (model, meta) = kiln::train::load_model(&checkpoint)?;
    let data = meta.get("data").cloned().unwrap_or_default();
    let test = if data.starts_with("Mnist") {
        let dir = data_dir.ok_or_else(|| kiln::Error::Unsupported {
            op: "eval",
            what: "an MNIST checkpoint without --data-dir".into(),
        })?;
        kiln::data::mnist(&dir, true)?
    } else {
        let seed: u64 = meta.get("seed").and_then(|s| s.parse().ok()).unwrap_or(0);
        let mut rng = Tensor::rng(seed);
        kiln::data::spirals(1000, 3, 0.2, &mut rng).split(0.2, &mut rng).1
    };
    let dtype = if meta.get("dtype").map(String::as_str) == Some("f64") { DType::F64 } else { DType::F32 };
    let acc = kiln::train::accuracy(&model, &test, dtype, &kiln::Device::Cpu)?;
    say!("{}: {:.2}% accuracy on {} held-out rows", checkpoint.display(), 100.0 * acc, test.len());
    Ok(())
}

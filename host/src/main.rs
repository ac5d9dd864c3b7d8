//! The `kiln` command line: `train` (the default), `eval` and `info`.

use clap::{Parser, Subcommand, ValueEnum};
use kiln::cuda::Device;
use kiln::gpu::Arch;
use kiln::nn::Activation;
use kiln::train::{DataSource, DeviceChoice, OptimizerKind, TrainConfig};
use kiln::{DType, Tensor};

use std::io::Write;
use std::path::PathBuf;

/// `println!` that ignores a closed pipe (`kiln | head` ends the output, not the run).
macro_rules! say {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

#[derive(Parser)]
#[command(name = "kiln", version, about = "GPU kernels in Rust, and the engine that runs them")]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// With no subcommand, `kiln` trains with these options.
    #[command(flatten)]
    train: TrainArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum Opt {
    Sgd,
    Nesterov,
    Adam,
    Adamw,
}

#[derive(Clone, Copy, ValueEnum)]
enum Dev {
    Auto,
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, ValueEnum)]
enum Dt {
    F32,
    F64,
}

#[derive(Clone, Copy, ValueEnum)]
enum Act {
    Relu,
    Gelu,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
enum Data {
    Spirals,
    Mnist,
}

#[derive(clap::Args)]
struct TrainArgs {
    /// Dataset: generated spirals, or MNIST IDX files in --data-dir.
    #[arg(long, value_enum, default_value = "spirals")]
    dataset: Data,
    /// Directory with MNIST's IDX files (train-images-idx3-ubyte, ...).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Hidden width.
    #[arg(long, default_value_t = 64)]
    width: usize,
    /// Linear layers.
    #[arg(long, default_value_t = 3)]
    depth: usize,
    /// Activation.
    #[arg(long, value_enum, default_value = "relu")]
    activation: Act,
    /// Batch size.
    #[arg(long, default_value_t = 64)]
    batch: usize,
    /// Epochs.
    #[arg(long, default_value_t = 40)]
    epochs: usize,
    /// Optimizer.
    #[arg(long, value_enum, default_value = "adam")]
    optimizer: Opt,
    /// Learning rate.
    #[arg(long, default_value_t = 1e-2)]
    lr: f64,
    /// Weight decay.
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f64,
    /// Warmup steps of the cosine schedule (0: constant rate).
    #[arg(long, default_value_t = 50)]
    warmup: usize,
    /// Device.
    #[arg(long, value_enum, default_value = "auto")]
    device: Dev,
    /// Parameter dtype.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: Dt,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Checkpoint to write.
    #[arg(long, default_value = "kiln-mlp.safetensors")]
    checkpoint: PathBuf,
    /// Test accuracy the run must reach (exit status 1 otherwise).
    #[arg(long)]
    target_accuracy: Option<f64>,
    /// Train with the megakernel: one launch per step (bias-free MLP, SGD with momentum 0.9;
    /// without a GPU, its schedule runs on the CPU interpreter).
    #[arg(long)]
    megakernel: bool,
    /// The megakernel's data path: tf32x3 (tensor cores, about f32 accuracy), tf32 (tensor cores,
    /// tf32 inputs), bf16 (tensor cores, bf16 inputs, f32 weights and sums; the fastest on large
    /// models) or cuda-cores (FMA chains, any GPU). Default: tf32x3 where the GPU has TMA.
    #[arg(long)]
    mega_path: Option<kiln::megakernel::DataPath>,
    /// How f32 matrix products run on the GPU: f32 (FMA chains, bit-identical to the CPU reference)
    /// or bf16 (operands rounded to bf16, tensor cores with f32 accumulation; much faster).
    #[arg(long, default_value = "f32")]
    matmul_precision: kiln::cuda::MatmulPrecision,
}

#[derive(Subcommand)]
enum Command {
    /// Train a classifier MLP (the default command).
    Train(TrainArgs),
    /// Evaluate a checkpoint on its dataset's held-out split.
    Eval {
        /// The checkpoint.
        #[arg(long, default_value = "kiln-mlp.safetensors")]
        checkpoint: PathBuf,
        /// MNIST directory, for MNIST checkpoints.
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Show the device, its compute capability, the PTX modules and their kernels, the embedded
    /// cubins, and which image of its module the device loads.
    Info {
        /// Also time loading the device's module (and, when that is a cubin, its PTX). With
        /// CUDA_CACHE_DISABLE=1 the PTX time is the driver's JIT compilation; KILN_FORCE_PTX=1
        /// loads PTX only.
        #[arg(long)]
        load_time: bool,
    },
    /// Run one GEMM kernel of the ladder on random inputs: its error against an f64 reference and
    /// its time (without --kernel: list the kernels).
    Gemm {
        /// The kernel, e.g. sgemm_smem, hgemm_mma_bf16_wide, gemm_wgmma_bf16_persistent.
        #[arg(long)]
        kernel: Option<String>,
        /// The product, MxNxK.
        #[arg(long, default_value = "4096x4096x4096", value_parser = parse_shape)]
        shape: kiln::gpu::kernels::mma_tile::GemmShape,
        /// Timed launches (the median is reported).
        #[arg(long, default_value_t = 10)]
        reps: usize,
        /// Seed of the random inputs.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Cut k into this many parts (persistent wgmma kernels only).
        #[arg(long)]
        split_k: Option<u32>,
    },
}

fn parse_shape(s: &str) -> Result<kiln::gpu::kernels::mma_tile::GemmShape, String> {
    let v: Vec<u32> =
        s.split('x').map(|x| x.trim().parse::<u32>()).collect::<Result<_, _>>().map_err(|e| format!("{s}: {e}"))?;
    match v[..] {
        [m, n, k] => Ok(kiln::gpu::kernels::mma_tile::GemmShape { m, n, k }),
        _ => Err(format!("{s}: write the shape as MxNxK, e.g. 4096x4096x4096")),
    }
}

fn gemm(
    kernel: Option<String>,
    shape: kiln::gpu::kernels::mma_tile::GemmShape,
    reps: usize,
    seed: u64,
    split_k: Option<u32>,
) -> kiln::Result<bool> {
    let Some(name) = kernel else {
        say!("kernels (--kernel NAME), in ladder order:");
        for n in kiln::tools::gemm_ladder::kernel_names() {
            say!("  {n}");
        }
        return Ok(true);
    };
    let dev = Device::new(0)?;
    say!("device: {} ({})", dev.name(), dev.arch().name());
    let r = kiln::tools::gemm_ladder::run(&dev, &name, shape, reps, seed, split_k)?;
    say!("{r}");
    Ok(r.passed())
}

fn info(load_time: bool) -> kiln::Result<()> {
    say!("kiln {}", env!("CARGO_PKG_VERSION"));
    say!("PTX modules built into this binary:");
    for arch in Arch::ALL {
        let entries = kiln::ptx::entries(kiln::ptx::embedded(arch));
        say!("  {:8} {:2} kernels: {}", arch.name(), entries.len(), entries.join(", "));
    }
    say!("{}", kiln::ptx::cubin_summary());
    match Device::new(0) {
        Ok(dev) => {
            let (major, minor) = dev.compute_capability();
            let forced =
                if kiln::ptx::force_ptx() { format!(" ({}=1)", kiln::ptx::FORCE_PTX_ENV) } else { String::new() };
            say!(
                "device 0: {} (compute capability {major}.{minor}), loads the {} module: {}{forced}",
                dev.name(),
                dev.arch().name(),
                dev.module_source()
            );
            if load_time {
                for t in dev.time_module_loads()? {
                    say!("  loading {}: {:.1} ms", t.source, t.elapsed.as_secs_f64() * 1e3);
                }
                say!(
                    "  {}",
                    if kiln::cuda::jit_cache_disabled() {
                        "the driver's JIT cache is off (CUDA_CACHE_DISABLE=1): a PTX time is its compilation"
                    } else {
                        "the driver's JIT cache is on: a PTX time may be a cache hit (CUDA_CACHE_DISABLE=1 times the compilation)"
                    }
                );
            }
        }
        Err(e) if load_time => return Err(e),
        Err(e) => say!("no usable GPU: {e}"),
    }
    say!("CPU backend: {} threads", kiln::tensor::cpu::num_threads());
    Ok(())
}

fn train(a: TrainArgs) -> kiln::Result<bool> {
    let data = match a.dataset {
        Data::Spirals => DataSource::Spirals { per_class: 1000, classes: 3, noise: 0.2 },
        Data::Mnist => DataSource::Mnist(a.data_dir.clone().ok_or_else(|| kiln::Error::Unsupported {
            op: "train",
            what:
                "--dataset mnist without --data-dir (the directory holding train-images-idx3-ubyte and friends)".into(),
        })?),
    };
    let cfg = TrainConfig {
        data,
        width: a.width,
        depth: a.depth,
        activation: match a.activation {
            Act::Relu => Activation::Relu,
            Act::Gelu => Activation::Gelu,
        },
        batch: a.batch,
        epochs: a.epochs,
        optimizer: match a.optimizer {
            Opt::Sgd => OptimizerKind::Sgd { momentum: 0.9, nesterov: false },
            Opt::Nesterov => OptimizerKind::Sgd { momentum: 0.9, nesterov: true },
            Opt::Adam => OptimizerKind::Adam,
            Opt::Adamw => OptimizerKind::AdamW,
        },
        lr: a.lr,
        weight_decay: a.weight_decay,
        warmup: a.warmup,
        device: match a.device {
            Dev::Auto => DeviceChoice::Auto,
            Dev::Cpu => DeviceChoice::Cpu,
            Dev::Cuda => DeviceChoice::Cuda,
        },
        dtype: match a.dtype {
            Dt::F32 => DType::F32,
            Dt::F64 => DType::F64,
        },
        seed: a.seed,
        checkpoint: Some(a.checkpoint),
        progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        megakernel: a.megakernel,
        mega_path: a.mega_path,
        matmul_precision: a.matmul_precision,
    };
    let report = kiln::train::train(&cfg, |line| say!("{line}"))?;
    let acc = report.epochs.last().map(|r| r.test_accuracy).unwrap_or(0.0);
    let target = a.target_accuracy.unwrap_or(if a.dataset == Data::Spirals { 0.95 } else { 0.0 });
    if acc >= target {
        say!("reached {:.2}% test accuracy (target {:.0}%)", 100.0 * acc, 100.0 * target);
        Ok(true)
    } else {
        say!("test accuracy {:.2}% is below the target {:.0}%", 100.0 * acc, 100.0 * target);
        Ok(false)
    }
}

fn eval(checkpoint: PathBuf, data_dir: Option<PathBuf>) -> kiln::Result<()> {
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

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        None => train(cli.train),
        Some(Command::Train(a)) => train(a),
        Some(Command::Eval { checkpoint, data_dir }) => eval(checkpoint, data_dir).map(|_| true),
        Some(Command::Info { load_time }) => info(load_time).map(|_| true),
        Some(Command::Gemm { kernel, shape, reps, seed, split_k }) => gemm(kernel, shape, reps, seed, split_k),
    };
    match result {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

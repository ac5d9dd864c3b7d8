//! The `kiln` command line: `train` (the default; `--model gpt` trains a GPT), `sample`, `eval`, `info`, `gemm` and `attention`. Every number is
//! checked by its parser (a message naming the flag and its range, negative values included, so
//! `--lr=-1` and `--lr -1` read alike), and every combination the run cannot honour is refused,
//! before any work starts.

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
enum ModelKind {
    Mlp,
    Gpt,
}

#[derive(Clone, Copy, ValueEnum)]
enum Tokens {
    Bytes,
    Chars,
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
    Bf16,
    F16,
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

/// `--mega-path`: [`kiln::megakernel::DataPath`].
#[derive(Clone, Copy, ValueEnum)]
enum MegaPath {
    #[value(name = "cuda-cores")]
    CudaCores,
    #[value(name = "tf32")]
    Tf32,
    #[value(name = "tf32x3")]
    Tf32x3,
    #[value(name = "bf16")]
    Bf16,
}

/// `--matmul-precision`: [`kiln::cuda::MatmulPrecision`].
#[derive(Clone, Copy, ValueEnum)]
enum Precision {
    F32,
    Bf16,
}

/// The parsers of the numeric flags: each reads negative numbers too (the flags set
/// `allow_negative_numbers`), so that a value out of range gets the range, not "unexpected argument".
mod parse {
    /// A whole number of at least `min`.
    fn whole(s: &str, min: u64) -> Result<u64, String> {
        let range = if min == 0 { "0 or more".to_string() } else { format!("{min} or more") };
        match s.trim().parse::<i128>() {
            Ok(v) if v >= min as i128 && v <= u64::MAX as i128 => Ok(v as u64),
            Ok(v) if v > u64::MAX as i128 => Err(format!("must be a whole number, {range}, below 2^64")),
            _ => Err(format!("must be a whole number, {range}")),
        }
    }
    /// A count of at least 1 (`--width`, `--depth`, `--batch`, `--epochs`, `--reps`).
    pub fn count(s: &str) -> Result<usize, String> {
        let v = whole(s, 1)?;
        usize::try_from(v).map_err(|_| format!("must be a whole number, 1 or more, at most {}", usize::MAX))
    }
    /// A whole number of at least 0 (`--warmup`).
    pub fn steps(s: &str) -> Result<usize, String> {
        let v = whole(s, 0)?;
        usize::try_from(v).map_err(|_| format!("must be a whole number, 0 or more, at most {}", usize::MAX))
    }
    /// A seed: any whole number from 0 to 2^64 - 1.
    pub fn seed(s: &str) -> Result<u64, String> {
        whole(s, 0)
    }
    /// `--split-k`: at least 1.
    pub fn parts(s: &str) -> Result<u32, String> {
        let v = whole(s, 1)?;
        u32::try_from(v).map_err(|_| format!("must be a whole number, 1 or more, at most {}", u32::MAX))
    }
    fn real(s: &str) -> Result<f64, String> {
        s.trim().parse::<f64>().map_err(|_| "must be a number".to_string())
    }
    /// A finite number greater than 0 (`--lr`, `--clip-grad-norm`).
    pub fn positive(s: &str) -> Result<f64, String> {
        match real(s)? {
            v if v.is_finite() && v > 0.0 => Ok(v),
            _ => Err("must be a finite number greater than 0".into()),
        }
    }
    /// A finite number, 0 or more (`--weight-decay`).
    pub fn non_negative(s: &str) -> Result<f64, String> {
        match real(s)? {
            v if v.is_finite() && v >= 0.0 => Ok(v),
            _ => Err("must be a finite number, 0 or more".into()),
        }
    }
    /// A fraction between 0 and 1 (`--target-accuracy`).
    pub fn fraction(s: &str) -> Result<f64, String> {
        match real(s)? {
            v if (0.0..=1.0).contains(&v) => Ok(v),
            _ => Err("must be a fraction between 0 and 1 (0.9 asks for 90%)".into()),
        }
    }
}

#[derive(clap::Args)]
struct TrainArgs {
    /// Dataset: generated spirals, or MNIST IDX files in --data-dir.
    #[arg(long, value_enum, default_value = "spirals")]
    dataset: Data,
    /// Directory with MNIST's IDX files (train-images-idx3-ubyte, ...).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The model: a classifier MLP, or a GPT language model trained on --data (the flags from
    /// --data to --bench-steps are the GPT's).
    #[arg(long, value_enum, default_value = "mlp")]
    model: ModelKind,
    /// GPT: the text file to train on (any file; tokens are its bytes unless --tokens chars).
    #[arg(long)]
    data: Option<PathBuf>,
    /// GPT: tokens are bytes (vocabulary 256, any file) or the file's characters (UTF-8 only).
    #[arg(long, value_enum, default_value = "bytes")]
    tokens: Tokens,
    /// GPT: size preset, tiny (block 16, width 32, 2 layers, 4 heads), char-mini (256, 384, 6,
    /// 6) or gpt2-small (1024, 768, 12, 12; vocabulary 50304 when larger than 256); the size flags
    /// override it.
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// GPT: context length in tokens (1 or more) [default: the preset's].
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    block: Option<usize>,
    /// GPT: transformer blocks (1 or more) [default: the preset's].
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    layers: Option<usize>,
    /// GPT: attention heads (1 or more; the width is a multiple) [default: the preset's].
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    heads: Option<usize>,
    /// GPT: dropout probability, 0 to below 1 [default: the preset's: 0, char-mini 0.2].
    #[arg(long, value_parser = parse::fraction, allow_negative_numbers = true)]
    dropout: Option<f64>,
    /// GPT: a head of its own instead of the token embedding's weight.
    #[arg(long)]
    untied: bool,
    /// GPT: pad the vocabulary to N tokens (at least the data's), e.g. 50304 for GPT-2's size.
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    vocab: Option<usize>,
    /// GPT: save the freshly initialized model to this file before the first step (the PyTorch
    /// parity script starts from it).
    #[arg(long)]
    save_init: Option<PathBuf>,
    /// GPT: optimizer steps of the whole run (1 or more).
    #[arg(long, default_value_t = 1000, value_parser = parse::count, allow_negative_numbers = true)]
    steps: usize,
    /// GPT: micro-batches per optimizer step (1 or more).
    #[arg(long, default_value_t = 1, value_parser = parse::count, allow_negative_numbers = true)]
    grad_accum: usize,
    /// GPT: validation loss every N steps (0: only after the last).
    #[arg(long, default_value_t = 100, value_parser = parse::steps, allow_negative_numbers = true)]
    eval_every: usize,
    /// GPT: batches in each validation measurement (1 or more).
    #[arg(long, default_value_t = 8, value_parser = parse::count, allow_negative_numbers = true)]
    eval_batches: usize,
    /// GPT: continue from this checkpoint (same data, model and settings; --steps counts the
    /// whole run).
    #[arg(long)]
    resume: Option<PathBuf>,
    /// GPT: write each step's training loss (`step loss` lines) to this file.
    #[arg(long)]
    loss_log: Option<PathBuf>,
    /// GPT: time N steps after 3 warm-up steps; print ms/step, tokens/s and peak GPU memory
    /// (nothing is saved).
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    bench_steps: Option<usize>,
    /// Hidden width (1 or more) [default: 64; a GPT: the preset's].
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    width: Option<usize>,
    /// Linear layers (1 or more).
    #[arg(long, default_value_t = 3, value_parser = parse::count, allow_negative_numbers = true)]
    depth: usize,
    /// Activation.
    #[arg(long, value_enum, default_value = "relu")]
    activation: Act,
    /// Batch size (1 or more) [default: 64; a GPT: 16 windows].
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    batch: Option<usize>,
    /// Epochs (1 or more).
    #[arg(long, default_value_t = 40, value_parser = parse::count, allow_negative_numbers = true)]
    epochs: usize,
    /// Optimizer (sgd and nesterov: momentum 0.9) [default: adam; sgd with --megakernel, which
    /// takes sgd only].
    #[arg(long, value_enum)]
    optimizer: Option<Opt>,
    /// Learning rate (a finite number greater than 0) [default: 0.01; a GPT: 0.001].
    #[arg(long, value_parser = parse::positive, allow_negative_numbers = true)]
    lr: Option<f64>,
    /// Weight decay (a finite number, 0 or more) [default: 0; a GPT: 0.1, AdamW's decoupled decay
    /// on the linear layers' weights only].
    #[arg(long, value_parser = parse::non_negative, allow_negative_numbers = true)]
    weight_decay: Option<f64>,
    /// Clip the gradients to this global L2 norm before each step (a finite number greater than
    /// 0; on the GPU one reduction, no host round trip) [default: no clipping; a GPT: 1].
    #[arg(long, value_parser = parse::positive, allow_negative_numbers = true)]
    clip_grad_norm: Option<f64>,
    /// Warmup steps of the cosine schedule (0: constant rate) [default: 50; a GPT: 100].
    #[arg(long, value_parser = parse::steps, allow_negative_numbers = true)]
    warmup: Option<usize>,
    /// Device.
    #[arg(long, value_enum, default_value = "auto")]
    device: Dev,
    /// Precision: f32, f64 (CPU), bf16 (mixed precision: f32 master weights, bf16 products and
    /// activations, f32 losses) or f16 (on CUDA: the same mixed precision in f16 with dynamic loss
    /// scaling; on the CPU: f16 parameters).
    #[arg(long, value_enum, default_value = "f32")]
    dtype: Dt,
    /// Seed (0 to 2^64 - 1).
    #[arg(long, default_value_t = 0, value_parser = parse::seed, allow_negative_numbers = true)]
    seed: u64,
    /// Checkpoint to write [default: kiln-mlp.safetensors; a GPT: kiln-gpt.safetensors, with the
    /// loss curve beside it as kiln-gpt.svg].
    #[arg(long)]
    checkpoint: Option<PathBuf>,
    /// Test accuracy the run must reach, a fraction from 0 to 1 (exit status 1 otherwise).
    /// Default: 0.95 (95% on spirals) or 0.9 (90% on mnist).
    #[arg(long, value_parser = parse::fraction, allow_negative_numbers = true)]
    target_accuracy: Option<f64>,
    /// Train with the megakernel: one launch per step (bias-free ReLU MLP in f32, a constant input
    /// feature giving its first layer a bias; SGD with momentum 0.9 on the --warmup schedule;
    /// without a GPU, its schedule runs on the CPU interpreter). It saves --checkpoint as an
    /// ordinary MLP, which `kiln eval` reads. It refuses --optimizer other than sgd, --activation
    /// gelu, --dtype f64, --weight-decay, --clip-grad-norm and --matmul-precision.
    #[arg(long)]
    megakernel: bool,
    /// Run every training step eagerly instead of capturing the step in one CUDA graph. By
    /// default a CUDA f32 or bf16 run (any --optimizer and --warmup: the learning rate and Adam's
    /// step count live on the device) captures its step after two eager full-batch steps and
    /// replays it (the last partial batch of an epoch runs eagerly); f16 (its loss scaler reads
    /// the gradient norm on the host each step) and the CPU always run eagerly.
    #[arg(long)]
    no_graph: bool,
    /// The megakernel's data path: tf32x3 (tensor cores, about f32 accuracy), tf32 (tensor cores,
    /// tf32 inputs), bf16 (tensor cores, bf16 inputs, f32 weights and sums; the fastest on large
    /// models) or cuda-cores (FMA chains, any GPU). Default: tf32x3 where the GPU has TMA.
    #[arg(long, value_enum)]
    mega_path: Option<MegaPath>,
    /// How f32 matrix products run on the GPU: f32 (FMA chains, bit-identical to the CPU reference)
    /// or bf16 (operands rounded to bf16, tensor cores with f32 accumulation; much faster).
    #[arg(long, value_enum, default_value = "f32")]
    matmul_precision: Precision,
    /// GPUs to train on (data-parallel over NCCL: the MLP in f32, the GPT in f32 or bf16): each
    /// rank takes a share of every --batch rows (windows) and the gradients are summed by
    /// all-reduce in buckets, overlapped with the backward pass. 1: one GPU, no NCCL (unless
    /// --world-size is more than 1).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    gpus: usize,
    /// ZeRO-1: each rank keeps and updates only its shard of the optimizer state (gradients
    /// reduce-scattered, parameters all-gathered after the step). Not with --clip-grad-norm.
    #[arg(long)]
    zero1: bool,
    /// Reduce the gradients after the whole backward pass instead of bucket by bucket during it
    /// (the same sums; for comparison).
    #[arg(long)]
    no_overlap: bool,
    /// Megabytes of gradient per bucket (1 or more) [default: 25, PyTorch DDP's].
    #[arg(long, value_parser = parse::parts, allow_negative_numbers = true)]
    bucket_mb: Option<u32>,
    /// Processes in a multi-process run, one GPU each (torchrun's WORLD_SIZE, read when this is
    /// not given). More than 1: this process is rank --rank and meets the others at
    /// --master-addr:--master-port.
    #[arg(long, allow_negative_numbers = true)]
    world_size: Option<usize>,
    /// This process's rank, 0 to --world-size - 1 (torchrun's RANK); rank 0 listens.
    #[arg(long, allow_negative_numbers = true)]
    rank: Option<usize>,
    /// The GPU this process trains on (torchrun's LOCAL_RANK) [default: --rank].
    #[arg(long, allow_negative_numbers = true)]
    local_rank: Option<usize>,
    /// Rank 0's address (torchrun's MASTER_ADDR) [default: 127.0.0.1].
    #[arg(long)]
    master_addr: Option<String>,
    /// Rank 0's TCP port (torchrun's MASTER_PORT) [default: 29500].
    #[arg(long, allow_negative_numbers = true)]
    master_port: Option<u16>,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once; TrainArgs carries the MLP's and the GPT's flags
enum Command {
    /// Train a classifier MLP (the default command).
    Train(TrainArgs),
    /// Generate text from a GPT checkpoint, one position per new token (a key/value cache).
    Sample(SampleArgs),
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
    /// its time (without --kernel: list the kernels; with --ladder: every kernel, cuBLAS around each).
    Gemm {
        /// The kernel, e.g. sgemm_smem, hgemm_mma_bf16_wide, gemm_wgmma_bf16_persistent.
        #[arg(long)]
        kernel: Option<String>,
        /// Run every kernel of the ladder in order on the same inputs, each checked against the f64
        /// reference and timed with cuBLAS timed just before and after it, and print the table.
        #[arg(long, conflicts_with_all = ["kernel", "split_k"])]
        ladder: bool,
        /// With --ladder: also write the table as JSON to PATH, with the device, date, commit and
        /// command (what `cargo xtask figures` plots from `benches/results/`).
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
        /// The product, MxNxK (each 1 or more).
        #[arg(long, default_value = "4096x4096x4096", value_parser = parse_shape, allow_negative_numbers = true)]
        shape: kiln::gpu::kernels::mma_tile::GemmShape,
        /// Timed launches, 1 or more (the median is reported).
        #[arg(long, default_value_t = 10, value_parser = parse::count, allow_negative_numbers = true)]
        reps: usize,
        /// Seed of the random inputs (0 to 2^64 - 1).
        #[arg(long, default_value_t = 1, value_parser = parse::seed, allow_negative_numbers = true)]
        seed: u64,
        /// Cut k into this many parts, 1 or more (persistent wgmma kernels only).
        #[arg(long, value_parser = parse::parts, allow_negative_numbers = true)]
        split_k: Option<u32>,
    },
    /// Run one flash attention forward kernel on random inputs: its error against the f64
    /// reference and its time (without --kernel: list the kernels).
    Attention {
        /// The kernel, e.g. naive (tensor ops), flash_fwd_simt_f32, flash_fwd_mma_bf16.
        #[arg(long)]
        kernel: Option<String>,
        /// The problem, BxHxSxD: batch, heads, query length (and key length unless --kv-len), head
        /// dim (64 or 128), each 1 or more.
        #[arg(long, default_value = "4x16x4096x128", value_parser = parse_attention_shape, allow_negative_numbers = true)]
        shape: kiln::cuda::attention::AttentionShape,
        /// Keys and values per head, 1 or more (default: the query length).
        #[arg(long, value_parser = parse::parts, allow_negative_numbers = true)]
        kv_len: Option<u32>,
        /// The causal mask (bottom-right aligned: query i sees keys j <= i + kv_len - q_len).
        #[arg(long)]
        causal: bool,
        /// Also run the backward (dQ, dK, dV) of the kernel's rung (flash_fwd_simt_*: CUDA cores;
        /// flash_fwd_mma_*: mma.sync; flash_fwd_wgmma*_*: TMA + wgmma, sm_90a), checked against the f64 reference where B H Sq Skv D is at most 2^30, and timed.
        #[arg(long)]
        backward: bool,
        /// Timed launches, 1 or more (the median is reported).
        #[arg(long, default_value_t = 10, value_parser = parse::count, allow_negative_numbers = true)]
        reps: usize,
        /// Seed of the random inputs (0 to 2^64 - 1).
        #[arg(long, default_value_t = 1, value_parser = parse::seed, allow_negative_numbers = true)]
        seed: u64,
    },
    /// Time an NCCL all-reduce (f32 sum, in place) over GPUs 0..N and print its algorithm and bus
    /// bandwidth (busbw = algbw x 2 (N-1)/N, as nccl-tests reports it).
    Allreduce {
        /// Bytes per all-reduce, a positive multiple of 4.
        #[arg(long, default_value_t = 1 << 30, allow_negative_numbers = true)]
        bytes: usize,
        /// GPUs (ranks), at most the number present.
        #[arg(long, default_value_t = 2, allow_negative_numbers = true)]
        gpus: usize,
        /// Timed all-reduces (their mean is reported).
        #[arg(long, default_value_t = 20, value_parser = parse::count, allow_negative_numbers = true)]
        reps: usize,
        /// Untimed all-reduces first.
        #[arg(long, default_value_t = 5, allow_negative_numbers = true)]
        warmup: usize,
        /// Also write {"bytes", "gpus", "ms", "algbw_gbs", "busbw_gbs"} as JSON to PATH (what
        /// benches/multi_gpu_report.py reads).
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
    },
    /// Time the data-parallel training step of the large MLP (per GPU --batch rows, --layers
    /// bias-free Linear layers of --width, ReLU between, f32, SGD; the model of
    /// benches/torch_ddp.py) on one GPU and on --gpus, and print the scaling and a timeline of
    /// one step (compute and communication streams, from CUDA events).
    DistBench {
        /// GPUs of the data-parallel run (2 or more; one GPU is the baseline).
        #[arg(long, default_value_t = 2, allow_negative_numbers = true)]
        gpus: usize,
        /// Rows per GPU.
        #[arg(long, default_value_t = 4096, allow_negative_numbers = true)]
        batch: usize,
        /// Layer width (and classes).
        #[arg(long, default_value_t = 1024, allow_negative_numbers = true)]
        width: usize,
        /// Linear layers.
        #[arg(long, default_value_t = 8, allow_negative_numbers = true)]
        layers: usize,
        /// Timed steps.
        #[arg(long, default_value_t = 30, allow_negative_numbers = true)]
        steps: usize,
        /// Untimed steps first.
        #[arg(long, default_value_t = 5, allow_negative_numbers = true)]
        warmup: usize,
        /// Megabytes of gradient per bucket (1 or more).
        #[arg(long, default_value_t = 25, value_parser = parse::parts, allow_negative_numbers = true)]
        bucket_mb: u32,
        /// Reduce after the backward pass instead of overlapping.
        #[arg(long)]
        no_overlap: bool,
        /// ZeRO-1 (reduce-scatter, sharded SGD, all-gather).
        #[arg(long)]
        zero1: bool,
        /// Also write the report as JSON to PATH (what benches/multi_gpu_report.py reads).
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
    },
}

/// `kiln dist-bench`'s flags.
struct DistBenchArgs {
    cfg: kiln::train::dist_bench::DistBenchConfig,
    json: Option<PathBuf>,
}

fn dist_bench(a: DistBenchArgs) -> kiln::Result<bool> {
    let r = kiln::train::dist_bench::dist_bench(&a.cfg)?;
    let c = &r.config;
    println!(
        "kiln dist-bench: MLP {}x{}x{} per GPU, f32, SGD, on {} ({} bucket(s) of up to {} MiB, {}{})",
        c.batch,
        c.width,
        c.layers,
        r.device,
        r.buckets,
        c.bucket_bytes >> 20,
        if c.overlap { "overlapped with the backward pass" } else { "after the backward pass" },
        if c.zero1 { ", ZeRO-1" } else { "" }
    );
    println!("  1 GPU: {:.3} ms/step, {:.0} rows/s", r.ms_one, c.batch as f64 / r.ms_one * 1e3);
    println!(
        "  {} GPUs: {:.3} ms/step, {:.0} rows/s, {:.2}x the rows/s of one GPU",
        c.gpus,
        r.ms_many,
        (c.batch * c.gpus) as f64 / r.ms_many * 1e3,
        r.scaling()
    );
    println!("  {} GPUs, each rank its own step at once, no communication: {:.3} ms/step", c.gpus, r.ms_many_alone);
    let (bwd, comm, hidden) = r.overlap_ms();
    println!(
        "  one step on rank 0 (ms from the forward's start; backward {bwd:.3} ms, collectives {comm:.3} ms, {hidden:.3} ms of them during the backward):"
    );
    for e in &r.timeline {
        println!("    {:>9.3}  {:<7}  {}", e.ms, e.stream, e.label);
    }
    if let Some(path) = &a.json {
        std::fs::write(path, r.to_json() + "\n").map_err(|e| kiln::Error::File {
            path: path.to_path_buf(),
            msg: format!("writing the JSON report: {e}"),
        })?;
        println!("  wrote {}", path.display());
    }
    Ok(true)
}

fn allreduce(bytes: usize, gpus: usize, reps: usize, warmup: usize, json: Option<PathBuf>) -> kiln::Result<bool> {
    let b = kiln::dist::bench_all_reduce(gpus, bytes, reps, warmup)?;
    println!(
        "kiln all_reduce f32 sum: {} bytes on {} GPUs: {:.3} ms  algbw {:.1} GB/s  busbw {:.1} GB/s",
        b.bytes,
        b.gpus,
        b.seconds * 1e3,
        b.algbw_gbs,
        b.busbw_gbs
    );
    if let Some(path) = json {
        let text = format!(
            "{{\"bytes\":{},\"gpus\":{},\"ms\":{:.4},\"algbw_gbs\":{:.2},\"busbw_gbs\":{:.2}}}\n",
            b.bytes,
            b.gpus,
            b.seconds * 1e3,
            b.algbw_gbs,
            b.busbw_gbs
        );
        std::fs::write(&path, text).map_err(|e| kiln::Error::File {
            path: path.to_path_buf(),
            msg: format!("writing the JSON report: {e}"),
        })?;
    }
    Ok(true)
}

fn parse_attention_shape(s: &str) -> Result<kiln::cuda::attention::AttentionShape, String> {
    let form = "write the shape as BxHxSxD, e.g. 4x16x4096x128, each of B, H, S and D 1 or more";
    let v: Vec<u32> = s
        .split('x')
        .map(|x| x.trim().parse::<u32>().ok().filter(|&d| d >= 1))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("{form} (and at most {})", u32::MAX))?;
    match v[..] {
        [batch, heads, seq, head_dim] => {
            Ok(kiln::cuda::attention::AttentionShape { batch, heads, q_len: seq, kv_len: seq, head_dim })
        }
        _ => Err(form.into()),
    }
}

/// `kiln attention`: one flash forward kernel on random inputs, checked and timed.
fn attention(
    kernel: Option<String>,
    shape: kiln::cuda::attention::AttentionShape,
    kv_len: Option<u32>,
    causal: bool,
    backward: bool,
    reps: usize,
    seed: u64,
) -> kiln::Result<bool> {
    use kiln::cuda::attention::{FLASH_KERNELS, flash_entry};
    let Some(name) = kernel else {
        say!("kernels (--kernel NAME), rung by rung (head dims 64 and 128):");
        for &(n, dtype) in kiln::tools::attention::NAIVE_KERNELS {
            say!("  {n:22} rung 0, {dtype:?}: tensor ops (S and P materialized; any head dim)");
        }
        for e in FLASH_KERNELS {
            say!("  {:22} rung {}, {:?} in and out", e.name, e.rung, e.dtype);
        }
        return Ok(true);
    };
    if let Some(&(_, dtype)) = kiln::tools::attention::NAIVE_KERNELS.iter().find(|(n, _)| *n == name) {
        return attention_naive(&name, dtype, shape, kv_len, causal, backward, reps, seed);
    }
    // the name, the sizes and the table first: a mistake there is reported before the device opens
    let entry = flash_entry(&name)?;
    let shape = kiln::cuda::attention::AttentionShape { kv_len: kv_len.unwrap_or(shape.q_len), ..shape };
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let lens = [shape.q_elems(), shape.kv_elems(), shape.kv_elems(), shape.q_elems(), shape.lse_elems()];
    kiln::cuda::attention::check_forward(entry.kernel, entry.dtype, shape, scale, lens, [0; 5])?;
    // host: f32 inputs, their f64 copies and the outputs read back; device: inputs and outputs
    let (q, kv, l) = (shape.q_elems() as u64, shape.kv_elems() as u64, shape.lse_elems() as u64);
    let elem = entry.dtype.size() as u64;
    let bwd = backward as u64;
    let need = kiln::train::MemoryNeed {
        // with --backward: dO (f32 and f64), the gradients read back and the reference's
        host: (q + 2 * kv) * (4 + 8 + elem) + q * (4 + elem) + l * 4 + bwd * (q * 12 + (q + 2 * kv) * (4 + 8)),
        device: (2 * q + 2 * kv) * elem + l * 4 + bwd * ((2 * q + 2 * kv) * elem + l * 4),
    };
    let what = format!(
        "attention {}x{}x{}x{} (inputs, outputs and their f64 copies)",
        shape.batch, shape.heads, shape.q_len, shape.head_dim
    );
    kiln::train::check_memory(&what, need, None, "lower --shape")?;
    let Some(dev) = gemm_device() else { return Ok(false) };
    kiln::train::check_memory(&what, need, Some(&dev), "lower --shape")?;
    say!("device: {} ({})", dev.name(), dev.arch().name());
    let r = kiln::tools::attention::run(&dev, &name, shape, causal, reps, seed, backward)?;
    say!("{r}");
    Ok(r.passed())
}

/// `kiln attention --kernel naive`: the naive rung (tensor ops) on random inputs, checked and timed.
#[allow(clippy::too_many_arguments)]
fn attention_naive(
    name: &str,
    dtype: kiln::DType,
    shape: kiln::cuda::attention::AttentionShape,
    kv_len: Option<u32>,
    causal: bool,
    backward: bool,
    reps: usize,
    seed: u64,
) -> kiln::Result<bool> {
    if backward {
        return Err(kiln::Error::Unsupported {
            op: "attention",
            what: format!(
                "--backward with {name}: the naive rung's gradients come from autograd (tests/attention_op.rs); use flash_fwd_wgmma_bf16 or flash_fwd_mma_bf16 for a timed backward"
            ),
        });
    }
    let shape = kiln::cuda::attention::AttentionShape { kv_len: kv_len.unwrap_or(shape.q_len), ..shape };
    // host: f32 inputs, their rounded f64 copies, O; device: inputs, S and P (f32 or bf16), the mask, O
    let (q, kv) = (shape.q_elems() as u64, shape.kv_elems() as u64);
    let scores = shape.batch as u64 * shape.heads as u64 * shape.q_len as u64 * shape.kv_len as u64;
    let elem = dtype.size() as u64;
    let need = kiln::train::MemoryNeed {
        host: (q + 2 * kv) * (4 + 8 + elem) + q * 8,
        device: (2 * q + 2 * kv) * elem + 3 * scores * elem + q * 4,
    };
    let what = format!(
        "naive attention {}x{}x{}x{} (inputs, scores, probabilities, outputs)",
        shape.batch, shape.heads, shape.q_len, shape.head_dim
    );
    kiln::train::check_memory(&what, need, None, "lower --shape")?;
    let Some(dev) = gemm_device() else { return Ok(false) };
    kiln::train::check_memory(&what, need, Some(&dev), "lower --shape")?;
    say!("device: {} ({})", dev.name(), dev.arch().name());
    let r = kiln::tools::attention::run_naive(name, shape, causal, reps, seed)?;
    say!("{r}");
    Ok(r.passed())
}

fn parse_shape(s: &str) -> Result<kiln::gpu::kernels::mma_tile::GemmShape, String> {
    let form = "write the shape as MxNxK, e.g. 4096x4096x4096, each of M, N and K 1 or more";
    let v: Vec<u32> = s
        .split('x')
        .map(|x| x.trim().parse::<u32>().ok().filter(|&d| d >= 1))
        .collect::<Option<_>>()
        .ok_or_else(|| format!("{form} (and at most {})", u32::MAX))?;
    match v[..] {
        [m, n, k] => Ok(kiln::gpu::kernels::mma_tile::GemmShape { m, n, k }),
        _ => Err(form.into()),
    }
}

/// The memory `kiln gemm` holds for an `m x n x k` product: on the host the f32 operands, their
/// f64 reference copies, the poisoned and the read-back output; on the GPU the operands (and their
/// 16-bit copies) and the output. `--ladder` adds `gemm_bf16`'s packed copies and cuBLAS's on the
/// GPU (f32, bf16 and f16 operands, an output). Checked arithmetic: a size beyond 64 bits reads as `u64::MAX`.
fn gemm_memory(s: kiln::gpu::kernels::mma_tile::GemmShape, ladder: bool) -> kiln::train::MemoryNeed {
    let (m, n, k) = (s.m as u64, s.n as u64, s.k as u64);
    let need = || -> Option<kiln::train::MemoryNeed> {
        let operands = m.checked_mul(k)?.checked_add(k.checked_mul(n)?)?;
        let output = m.checked_mul(n)?;
        let (operand_bytes, output_bytes) = if ladder { (4 + 2 + 2 + 4 + 2 + 2, 4 + 4) } else { (4 + 2, 4) };
        Some(kiln::train::MemoryNeed {
            host: operands.checked_mul(4 + 8)?.checked_add(output.checked_mul(4 + 4)?)?,
            device: operands.checked_mul(operand_bytes)?.checked_add(output.checked_mul(output_bytes)?)?,
        })
    };
    need().unwrap_or(kiln::train::MemoryNeed { host: u64::MAX, device: u64::MAX })
}

/// Device 0 for `kiln gemm`, or why there is none, said as such.
fn gemm_device() -> Option<Device> {
    match Device::new(0) {
        Ok(dev) => Some(dev),
        Err(e) => {
            eprintln!(
                "error: no usable GPU: {e}. `kiln gemm` and `kiln attention` run their kernels on a CUDA GPU of \
                 compute capability 8.0 or newer"
            );
            None
        }
    }
}

/// `kiln gemm --ladder`: every kernel on the same inputs, cuBLAS around each, as the guide's table.
fn gemm_ladder(
    shape: kiln::gpu::kernels::mma_tile::GemmShape,
    reps: usize,
    seed: u64,
    json: Option<PathBuf>,
) -> kiln::Result<bool> {
    let kiln::gpu::kernels::mma_tile::GemmShape { m, n, k } = shape;
    let what = format!("gemm --ladder {m}x{n}x{k} (operands, output, their f64 reference and cuBLAS's copies)");
    let need = gemm_memory(shape, true);
    kiln::train::check_memory(&what, need, None, "lower --shape")?;
    let Some(dev) = gemm_device() else { return Ok(false) };
    kiln::train::check_memory(&what, need, Some(&dev), "lower --shape")?;
    // the JSON's file is created before the ladder runs, so a bad path fails at once
    let file_error = |path: &PathBuf, e: std::io::Error| kiln::Error::File { path: path.clone(), msg: e.to_string() };
    let json_file = match &json {
        Some(path) => Some(std::fs::File::create(path).map_err(|e| file_error(path, e))?),
        None => None,
    };
    let table = kiln::tools::ladder_table::run_ladder(&dev, shape, reps, seed)?;
    say!("{table}");
    if let (Some(path), Some(mut file)) = (json, json_file) {
        let p = kiln::tools::ladder_table::Provenance {
            date: kiln::tools::ladder_table::utc_date_today(),
            commit: source_commit(),
            command: std::env::args().collect::<Vec<_>>().join(" "),
        };
        file.write_all(table.to_json(&p).as_bytes()).map_err(|e| file_error(&path, e))?;
        say!("wrote {}", path.display());
    }
    Ok(table.passed())
}

/// The commit the binary's source is at: `KILN_COMMIT` if set, else `git rev-parse --short HEAD`
/// in the source tree it was built from, if that is still here (not on a machine that runs a GPU
/// bundle: there, set `KILN_COMMIT`).
fn source_commit() -> Option<String> {
    if let Ok(c) = std::env::var("KILN_COMMIT") {
        return Some(c);
    }
    let out = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|c| !c.is_empty())
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
    // the name and the sizes first: a mistake there is reported before the device is opened
    let names = kiln::tools::gemm_ladder::kernel_names();
    if !names.contains(&name.as_str()) {
        return Err(kiln::Error::Unsupported {
            op: "gemm",
            what: format!("--kernel {name}: no such kernel; known: {}", names.join(", ")),
        });
    }
    let kiln::gpu::kernels::mma_tile::GemmShape { m, n, k } = shape;
    let what = format!("gemm {m}x{n}x{k} (operands, output and their f64 reference)");
    let need = gemm_memory(shape, false);
    kiln::train::check_memory(&what, need, None, "lower --shape")?;
    let Some(dev) = gemm_device() else { return Ok(false) };
    kiln::train::check_memory(&what, need, Some(&dev), "lower --shape")?;
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
fn env_number<T: std::str::FromStr>(name: &'static str) -> kiln::Result<Option<T>> {
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
fn data_parallel(a: &TrainArgs) -> kiln::Result<Option<kiln::train::data_parallel::DataParallel>> {
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

impl TrainArgs {
    /// A GPT flag given to an MLP run, if any.
    fn gpt_only_flag(&self) -> Option<&'static str> {
        [
            (self.data.is_some(), "--data"),
            (self.block.is_some(), "--block"),
            (self.layers.is_some(), "--layers"),
            (self.heads.is_some(), "--heads"),
            (self.resume.is_some(), "--resume"),
            (self.loss_log.is_some(), "--loss-log"),
            (self.bench_steps.is_some(), "--bench-steps"),
            (self.vocab.is_some(), "--vocab"),
            (self.save_init.is_some(), "--save-init"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }
}

fn train_gpt(a: TrainArgs) -> kiln::Result<bool> {
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

fn sample(a: SampleArgs) -> kiln::Result<()> {
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

#[derive(clap::Args)]
struct SampleArgs {
    /// A checkpoint written by `kiln train --model gpt`.
    #[arg(long, default_value = "kiln-gpt.safetensors")]
    checkpoint: PathBuf,
    /// The text to continue (its characters must be in a char model's vocabulary; longer than the
    /// block, only its last block tokens are read).
    #[arg(long, default_value = "")]
    prompt: String,
    /// Tokens to generate (1 or more); past the block size the context is cropped to its last
    /// half block and the cache rebuilt.
    #[arg(long, default_value_t = 200, value_parser = parse::count, allow_negative_numbers = true)]
    tokens: usize,
    /// Softmax temperature (a finite number greater than 0).
    #[arg(long, default_value_t = 1.0, value_parser = parse::positive, allow_negative_numbers = true)]
    temperature: f64,
    /// Draw only from the K likeliest tokens (1 or more) [default: all].
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    top_k: Option<usize>,
    /// Seed of the sampler (0 to 2^64 - 1).
    #[arg(long, default_value_t = 0, value_parser = parse::seed, allow_negative_numbers = true)]
    seed: u64,
    /// Device.
    #[arg(long, value_enum, default_value = "auto")]
    device: Dev,
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
        Some(Command::Sample(a)) => sample(a).map(|_| true),
        Some(Command::Eval { checkpoint, data_dir }) => eval(checkpoint, data_dir).map(|_| true),
        Some(Command::Info { load_time }) => info(load_time).map(|_| true),
        Some(Command::Gemm { ladder: true, shape, reps, seed, json, .. }) => gemm_ladder(shape, reps, seed, json),
        Some(Command::Gemm { json: Some(_), .. }) => {
            // (clap's `requires` counts a flag's default `false` as given)
            use clap::CommandFactory;
            Cli::command()
                .error(
                    clap::error::ErrorKind::MissingRequiredArgument,
                    "--json PATH writes the table of --ladder: add --ladder",
                )
                .exit()
        }
        Some(Command::Gemm { kernel, shape, reps, seed, split_k, .. }) => gemm(kernel, shape, reps, seed, split_k),
        Some(Command::Attention { kernel, shape, kv_len, causal, backward, reps, seed }) => {
            attention(kernel, shape, kv_len, causal, backward, reps, seed)
        }
        Some(Command::Allreduce { bytes, gpus, reps, warmup, json }) => allreduce(bytes, gpus, reps, warmup, json),
        Some(Command::DistBench { gpus, batch, width, layers, steps, warmup, bucket_mb, no_overlap, zero1, json }) => {
            dist_bench(DistBenchArgs {
                cfg: kiln::train::dist_bench::DistBenchConfig {
                    gpus,
                    batch,
                    width,
                    layers,
                    steps,
                    warmup,
                    bucket_bytes: (bucket_mb as usize) << 20,
                    overlap: !no_overlap,
                    zero1,
                },
                json,
            })
        }
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

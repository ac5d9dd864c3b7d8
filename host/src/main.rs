//! The `kiln` command line: `train` (the default; `--model gpt` trains a GPT), `sample`, `eval`, `info`, `gemm` and `attention`. Every number is
//! checked by its parser (a message naming the flag and its range, negative values included, so
//! `--lr=-1` and `--lr -1` read alike), and every combination the run cannot honour is refused,
//! before any work starts.

use clap::{Parser, Subcommand};
use std::path::PathBuf;

/// `println!` that ignores a closed pipe (`kiln | head` ends the output, not the run).
macro_rules! say {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

mod cli;

use cli::args::*;
use cli::kernels::*;
use cli::train::*;

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
        /// flash_fwd_mma_*: mma.sync; flash_fwd_wgmma*_*: TMA + wgmma with two consumer
        /// warpgroups, sm_90a), checked against the f64 reference where B H Sq Skv D is at most
        /// 2^30, and timed.
        #[arg(long)]
        backward: bool,
        /// The backward kernel to run (implies --backward): simt, mma, wgmma (one consumer
        /// warpgroup) or wgmma2 (two); it must take the forward's dtype.
        #[arg(long, value_name = "NAME")]
        backward_kernel: Option<String>,
        /// Blocks of the persistent Hopper forwards (flash_fwd_wgmma_*, flash_fwd_wgmma2_*), 1 or
        /// more: their blocks take query tiles until none is left. Default: as many as the GPU
        /// holds at once.
        #[arg(long, value_parser = parse::parts, allow_negative_numbers = true)]
        blocks: Option<u32>,
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
        Some(Command::Attention { kernel, shape, kv_len, causal, backward, backward_kernel, blocks, reps, seed }) => {
            attention(kernel, shape, kv_len, causal, (backward, backward_kernel), blocks, reps, seed)
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

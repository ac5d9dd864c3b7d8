//! The flags of `kiln`'s commands, each checked by its parser ([`parse`]).

use clap::ValueEnum;
use std::path::PathBuf;

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum ModelKind {
    Mlp,
    Gpt,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Tokens {
    Bytes,
    Chars,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Opt {
    Sgd,
    Nesterov,
    Adam,
    Adamw,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Dev {
    Auto,
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Dt {
    F32,
    F64,
    Bf16,
    F16,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Act {
    Relu,
    Gelu,
}

#[derive(Clone, Copy, ValueEnum, PartialEq)]
pub(crate) enum Data {
    Spirals,
    Mnist,
}

/// `--mega-path`: [`kiln::megakernel::DataPath`].
#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum MegaPath {
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
pub(crate) enum Precision {
    F32,
    Bf16,
}

/// The parsers of the numeric flags: each reads negative numbers too (the flags set
/// `allow_negative_numbers`), so that a value out of range gets the range, not "unexpected argument".
pub(crate) mod parse {
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
    /// A u32 of at least 1 (`--split-k`, `--kv-len`, `--blocks`).
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
pub(crate) struct TrainArgs {
    /// Dataset: generated spirals, or MNIST IDX files in --data-dir.
    #[arg(long, value_enum, default_value = "spirals")]
    pub(crate) dataset: Data,
    /// Directory with MNIST's IDX files (train-images-idx3-ubyte, ...).
    #[arg(long)]
    pub(crate) data_dir: Option<PathBuf>,
    /// The model: a classifier MLP, or a GPT language model trained on --data (the flags from
    /// --data to --bench-steps are the GPT's).
    #[arg(long, value_enum, default_value = "mlp")]
    pub(crate) model: ModelKind,
    /// GPT: the text file to train on (any file; tokens are its bytes unless --tokens chars).
    #[arg(long)]
    pub(crate) data: Option<PathBuf>,
    /// GPT: tokens are bytes (vocabulary 256, any file) or the file's characters (UTF-8 only).
    #[arg(long, value_enum, default_value = "bytes")]
    pub(crate) tokens: Tokens,
    /// GPT: size preset, tiny (block 16, width 32, 2 layers, 4 heads), char-mini (256, 384, 6,
    /// 6) or gpt2-small (1024, 768, 12, 12; vocabulary 50304 when larger than 256); the size flags
    /// override it.
    #[arg(long, default_value = "tiny")]
    pub(crate) preset: String,
    /// GPT: context length in tokens (1 or more) [default: the preset's].
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) block: Option<usize>,
    /// GPT: transformer blocks (1 or more) [default: the preset's].
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) layers: Option<usize>,
    /// GPT: attention heads (1 or more; the width is a multiple) [default: the preset's].
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) heads: Option<usize>,
    /// GPT: dropout probability, 0 to below 1 [default: the preset's: 0, char-mini 0.2].
    #[arg(long, value_parser = parse::fraction, allow_negative_numbers = true)]
    pub(crate) dropout: Option<f64>,
    /// GPT: a head of its own instead of the token embedding's weight.
    #[arg(long)]
    pub(crate) untied: bool,
    /// GPT: pad the vocabulary to N tokens (at least the data's), e.g. 50304 for GPT-2's size.
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) vocab: Option<usize>,
    /// GPT: save the freshly initialized model to this file before the first step (the PyTorch
    /// parity script starts from it).
    #[arg(long)]
    pub(crate) save_init: Option<PathBuf>,
    /// GPT: optimizer steps of the whole run (1 or more).
    #[arg(long, default_value_t = 1000, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) steps: usize,
    /// GPT: micro-batches per optimizer step (1 or more).
    #[arg(long, default_value_t = 1, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) grad_accum: usize,
    /// GPT: validation loss every N steps (0: only after the last).
    #[arg(long, default_value_t = 100, value_parser = parse::steps, allow_negative_numbers = true)]
    pub(crate) eval_every: usize,
    /// GPT: batches in each validation measurement (1 or more).
    #[arg(long, default_value_t = 8, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) eval_batches: usize,
    /// GPT: continue from this checkpoint (same data, model and settings; --steps counts the
    /// whole run).
    #[arg(long)]
    pub(crate) resume: Option<PathBuf>,
    /// GPT: write each step's training loss (`step loss` lines) to this file.
    #[arg(long)]
    pub(crate) loss_log: Option<PathBuf>,
    /// GPT: time N steps after 3 warm-up steps; print ms/step, tokens/s and peak GPU memory
    /// (nothing is saved).
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) bench_steps: Option<usize>,
    /// Hidden width (1 or more) [default: 64; a GPT: the preset's].
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) width: Option<usize>,
    /// Linear layers (1 or more).
    #[arg(long, default_value_t = 3, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) depth: usize,
    /// Activation.
    #[arg(long, value_enum, default_value = "relu")]
    pub(crate) activation: Act,
    /// Batch size (1 or more) [default: 64; a GPT: 16 windows].
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) batch: Option<usize>,
    /// Epochs (1 or more).
    #[arg(long, default_value_t = 40, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) epochs: usize,
    /// Optimizer (sgd and nesterov: momentum 0.9) [default: adam; sgd with --megakernel, which
    /// takes sgd only].
    #[arg(long, value_enum)]
    pub(crate) optimizer: Option<Opt>,
    /// Learning rate (a finite number greater than 0) [default: 0.01; a GPT: 0.001].
    #[arg(long, value_parser = parse::positive, allow_negative_numbers = true)]
    pub(crate) lr: Option<f64>,
    /// Weight decay (a finite number, 0 or more) [default: 0; a GPT: 0.1, AdamW's decoupled decay
    /// on the linear layers' weights only].
    #[arg(long, value_parser = parse::non_negative, allow_negative_numbers = true)]
    pub(crate) weight_decay: Option<f64>,
    /// Clip the gradients to this global L2 norm before each step (a finite number greater than
    /// 0; on the GPU one reduction, no host round trip) [default: no clipping; a GPT: 1].
    #[arg(long, value_parser = parse::positive, allow_negative_numbers = true)]
    pub(crate) clip_grad_norm: Option<f64>,
    /// Warmup steps of the cosine schedule (0: constant rate) [default: 50; a GPT: 100].
    #[arg(long, value_parser = parse::steps, allow_negative_numbers = true)]
    pub(crate) warmup: Option<usize>,
    /// Device.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) device: Dev,
    /// Precision: f32, f64 (CPU), bf16 (mixed precision: f32 master weights, bf16 products and
    /// activations, f32 losses) or f16 (on CUDA: the same mixed precision in f16 with dynamic loss
    /// scaling; on the CPU: f16 parameters).
    #[arg(long, value_enum, default_value = "f32")]
    pub(crate) dtype: Dt,
    /// Seed (0 to 2^64 - 1).
    #[arg(long, default_value_t = 0, value_parser = parse::seed, allow_negative_numbers = true)]
    pub(crate) seed: u64,
    /// Checkpoint to write [default: kiln-mlp.safetensors; a GPT: kiln-gpt.safetensors, with the
    /// loss curve beside it as kiln-gpt.svg].
    #[arg(long)]
    pub(crate) checkpoint: Option<PathBuf>,
    /// Test accuracy the run must reach, a fraction from 0 to 1 (exit status 1 otherwise).
    /// Default: 0.95 (95% on spirals) or 0.9 (90% on mnist).
    #[arg(long, value_parser = parse::fraction, allow_negative_numbers = true)]
    pub(crate) target_accuracy: Option<f64>,
    /// Train with the megakernel: one launch per step (bias-free ReLU MLP in f32, a constant input
    /// feature giving its first layer a bias; SGD with momentum 0.9 on the --warmup schedule;
    /// without a GPU, its schedule runs on the CPU interpreter). It saves --checkpoint as an
    /// ordinary MLP, which `kiln eval` reads. It refuses --optimizer other than sgd, --activation
    /// gelu, --dtype f64, --weight-decay, --clip-grad-norm and --matmul-precision.
    #[arg(long)]
    pub(crate) megakernel: bool,
    /// Run every training step eagerly instead of capturing the step in one CUDA graph. By
    /// default a CUDA f32 or bf16 run (any --optimizer and --warmup: the learning rate and Adam's
    /// step count live on the device) captures its step after two eager full-batch steps and
    /// replays it (the last partial batch of an epoch runs eagerly); f16 (its loss scaler reads
    /// the gradient norm on the host each step) and the CPU always run eagerly.
    #[arg(long)]
    pub(crate) no_graph: bool,
    /// The megakernel's data path: tf32x3 (tensor cores, about f32 accuracy), tf32 (tensor cores,
    /// tf32 inputs), bf16 (tensor cores, bf16 inputs, f32 weights and sums; the fastest on large
    /// models) or cuda-cores (FMA chains, any GPU). Default: tf32x3 where the GPU has TMA.
    #[arg(long, value_enum)]
    pub(crate) mega_path: Option<MegaPath>,
    /// How f32 matrix products run on the GPU: f32 (FMA chains, bit-identical to the CPU reference)
    /// or bf16 (operands rounded to bf16, tensor cores with f32 accumulation; much faster).
    #[arg(long, value_enum, default_value = "f32")]
    pub(crate) matmul_precision: Precision,
    /// GPUs to train on (data-parallel over NCCL: the MLP in f32, the GPT in f32 or bf16): each
    /// rank takes a share of every --batch rows (windows) and the gradients are summed by
    /// all-reduce in buckets, overlapped with the backward pass. 1: one GPU, no NCCL (unless
    /// --world-size is more than 1).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub(crate) gpus: usize,
    /// ZeRO-1: each rank keeps and updates only its shard of the optimizer state (gradients
    /// reduce-scattered, parameters all-gathered after the step). Not with --clip-grad-norm.
    #[arg(long)]
    pub(crate) zero1: bool,
    /// Reduce the gradients after the whole backward pass instead of bucket by bucket during it
    /// (the same sums; for comparison).
    #[arg(long)]
    pub(crate) no_overlap: bool,
    /// Megabytes of gradient per bucket (1 or more) [default: 25, PyTorch DDP's].
    #[arg(long, value_parser = parse::parts, allow_negative_numbers = true)]
    pub(crate) bucket_mb: Option<u32>,
    /// Processes in a multi-process run, one GPU each (torchrun's WORLD_SIZE, read when this is
    /// not given). More than 1: this process is rank --rank and meets the others at
    /// --master-addr:--master-port.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) world_size: Option<usize>,
    /// This process's rank, 0 to --world-size - 1 (torchrun's RANK); rank 0 listens.
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) rank: Option<usize>,
    /// The GPU this process trains on (torchrun's LOCAL_RANK) [default: --rank].
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) local_rank: Option<usize>,
    /// Rank 0's address (torchrun's MASTER_ADDR) [default: 127.0.0.1].
    #[arg(long)]
    pub(crate) master_addr: Option<String>,
    /// Rank 0's TCP port (torchrun's MASTER_PORT) [default: 29500].
    #[arg(long, allow_negative_numbers = true)]
    pub(crate) master_port: Option<u16>,
}

/// `kiln dist-bench`'s flags.
pub(crate) struct DistBenchArgs {
    pub(crate) cfg: kiln::train::dist_bench::DistBenchConfig,
    pub(crate) json: Option<PathBuf>,
}

#[derive(clap::Args)]
pub(crate) struct SampleArgs {
    /// A checkpoint written by `kiln train --model gpt`.
    #[arg(long, default_value = "kiln-gpt.safetensors")]
    pub(crate) checkpoint: PathBuf,
    /// The text to continue (its characters must be in a char model's vocabulary; longer than the
    /// block, only its last block tokens are read).
    #[arg(long, default_value = "")]
    pub(crate) prompt: String,
    /// Tokens to generate (1 or more); past the block size the context is cropped to its last
    /// half block and the cache rebuilt.
    #[arg(long, default_value_t = 200, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) tokens: usize,
    /// Softmax temperature (a finite number greater than 0).
    #[arg(long, default_value_t = 1.0, value_parser = parse::positive, allow_negative_numbers = true)]
    pub(crate) temperature: f64,
    /// Draw only from the K likeliest tokens (1 or more) [default: all].
    #[arg(long, value_parser = parse::count, allow_negative_numbers = true)]
    pub(crate) top_k: Option<usize>,
    /// Seed of the sampler (0 to 2^64 - 1).
    #[arg(long, default_value_t = 0, value_parser = parse::seed, allow_negative_numbers = true)]
    pub(crate) seed: u64,
    /// Device.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) device: Dev,
}

impl TrainArgs {
    /// A GPT flag given to an MLP run, if any.
    pub(crate) fn gpt_only_flag(&self) -> Option<&'static str> {
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

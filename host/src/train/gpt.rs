//! Training a GPT on a text file (`kiln train --model gpt`) and sampling from its checkpoint
//! (`kiln sample`).
//!
//! A step: `grad_accum` micro-batches of `batch` random windows of `block + 1` tokens from the
//! training part ([`crate::corpus::windows`]), each loss scaled by `1 / grad_accum` and
//! back-propagated (inside a bf16 [`autocast`] scope for `--dtype bf16`); then the gradients are
//! clipped to `clip_grad_norm` and AdamW steps (decoupled weight decay on the linear layers'
//! weights only, [`Gpt::decays`]) at the rate of the warmup-then-cosine schedule. Every
//! `eval_every` steps (and after the last) the validation loss is measured on `eval_batches`
//! fixed windows of the validation part. The checkpoint holds the model, AdamW's state, the step,
//! the configuration, the vocabulary, the window generator's state and the loss history; a
//! loss-curve SVG is written beside it.

use super::{DeviceChoice, pick_device};
use crate::checkpoint::{self, TrainingState};
use crate::corpus::{Corpus, TokenKind, Vocab, WindowRng, windows};
use crate::error::{Error, Result};
use crate::nn::{Gpt, GptConfig, KvCache, Module, autocast};
use crate::optim::{Adam, LrSchedule, Optimizer, attach_compute_copies};
use crate::tensor::{DType, Device, no_grad};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The model's shape as asked on the command line: a preset and overrides.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GptSpec {
    /// `tiny`, `char-mini` or `gpt2-small` (None: `tiny`).
    pub preset: Option<String>,
    /// Context length.
    pub block: Option<usize>,
    /// Width.
    pub width: Option<usize>,
    /// Blocks.
    pub layers: Option<usize>,
    /// Heads.
    pub heads: Option<usize>,
    /// Dropout.
    pub dropout: Option<f64>,
    /// Untie the head from the token embedding.
    pub untied: bool,
    /// Pad the vocabulary to this many tokens (at least the data's; GPT-2's 50304 for speed
    /// comparisons on byte data). Ids past the data's vocabulary are never sampled.
    pub vocab: Option<usize>,
}

impl GptSpec {
    /// The configuration for a vocabulary of `vocab` tokens.
    pub fn resolve(&self, vocab: usize) -> Result<GptConfig> {
        let padded = match self.vocab {
            Some(v) if v < vocab => {
                return Err(invalid("--vocab", v, format!("at least the data's vocabulary of {vocab} tokens")));
            }
            Some(v) => v,
            None => vocab,
        };
        let mut c = GptConfig::preset(self.preset.as_deref().unwrap_or("tiny"), padded)?;
        if let Some(v) = self.block {
            c.block = v;
        }
        if let Some(v) = self.width {
            c.width = v;
        }
        if let Some(v) = self.layers {
            c.layers = v;
        }
        if let Some(v) = self.heads {
            c.heads = v;
        }
        if let Some(v) = self.dropout {
            c.dropout = v;
        }
        if self.untied {
            c.tie_weights = false;
        }
        c.validate()?;
        Ok(c)
    }
}

/// Everything a GPT training run needs.
#[derive(Clone, Debug)]
pub struct GptTrainConfig {
    /// The text file.
    pub data: PathBuf,
    /// Bytes or characters.
    pub tokens: TokenKind,
    /// The model.
    pub spec: GptSpec,
    /// Optimizer steps (the total, counting those of a resumed run).
    pub steps: usize,
    /// Windows per micro-batch.
    pub batch: usize,
    /// Micro-batches per optimizer step.
    pub grad_accum: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warmup steps, then cosine decay to a tenth of the rate at `steps`.
    pub warmup: usize,
    /// AdamW's decoupled weight decay (linear layers' weights only).
    pub weight_decay: f64,
    /// Clip the global gradient norm to this (None: no clipping).
    pub clip_grad_norm: Option<f64>,
    /// Validation loss every this many steps (0: only after the last).
    pub eval_every: usize,
    /// Windows of `batch` in each validation measurement.
    pub eval_batches: usize,
    /// f32, bf16 (f32 masters, bf16 products under autocast) or f64 (CPU).
    pub dtype: DType,
    /// Device.
    pub device: DeviceChoice,
    /// Seed of the initialization and of the windows.
    pub seed: u64,
    /// Where to save (None: nowhere).
    pub checkpoint: Option<PathBuf>,
    /// Continue from this checkpoint (same model, vocabulary and settings).
    pub resume: Option<PathBuf>,
    /// Write each step's training loss as `step loss` lines to this file.
    pub loss_log: Option<PathBuf>,
    /// Save the freshly initialized model here (parameters and the run's metadata) before the
    /// first step: `benches/torch_gpt.py` starts PyTorch from it.
    pub save_init: Option<PathBuf>,
    /// Show a progress bar.
    pub progress: bool,
    /// Time this many steps after 3 warm-up steps and report ms/step, tokens/s and peak memory
    /// instead of training to `steps` (nothing is saved).
    pub bench_steps: Option<usize>,
}

impl Default for GptTrainConfig {
    fn default() -> Self {
        GptTrainConfig {
            data: PathBuf::new(),
            tokens: TokenKind::Bytes,
            spec: GptSpec::default(),
            steps: 1000,
            batch: 16,
            grad_accum: 1,
            lr: 1e-3,
            warmup: 100,
            weight_decay: 0.1,
            clip_grad_norm: Some(1.0),
            eval_every: 100,
            eval_batches: 8,
            dtype: DType::F32,
            device: DeviceChoice::Auto,
            seed: 0,
            checkpoint: Some(PathBuf::from("kiln-gpt.safetensors")),
            resume: None,
            loss_log: None,
            save_init: None,
            progress: false,
            bench_steps: None,
        }
    }
}

pub(super) fn invalid(setting: &'static str, value: impl std::fmt::Display, allowed: impl Into<String>) -> Error {
    Error::InvalidSetting { setting, value: value.to_string(), allowed: allowed.into() }
}

/// What a run reports.
#[derive(Clone, Debug, Default)]
pub struct GptReport {
    /// (step, training loss) of every step run.
    pub train_losses: Vec<(usize, f64)>,
    /// (step, validation loss) of every measurement.
    pub val_losses: Vec<(usize, f64)>,
    /// Mean milliseconds per optimizer step (of the timed steps with `bench_steps`).
    pub ms_per_step: f64,
    /// Tokens per second (of the timed steps with `bench_steps`).
    pub tokens_per_s: f64,
    /// Peak GPU memory in bytes, where measured.
    pub peak_bytes: Option<u64>,
}

/// The learning rate of step `t`: linear warmup, cosine decay to a tenth at `total`.
pub fn schedule(warmup: usize, total: usize) -> LrSchedule {
    LrSchedule::CosineWarmup { warmup: warmup.min(total), total, min_ratio: 0.1 }
}

pub(super) fn history(list: &[(usize, f64)]) -> String {
    list.iter().map(|(s, l)| format!("{s}:{l}")).collect::<Vec<_>>().join(",")
}

fn parse_history(s: Option<&String>) -> Vec<(usize, f64)> {
    s.map(|s| {
        s.split(',')
            .filter_map(|p| {
                let (a, b) = p.split_once(':')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .collect()
    })
    .unwrap_or_default()
}

/// Settings a resumed run must share with its checkpoint (beside the model and the vocabulary).
pub(super) fn run_metadata(cfg: &GptTrainConfig) -> Vec<(&'static str, String)> {
    vec![
        ("gpt.batch", cfg.batch.to_string()),
        ("gpt.grad_accum", cfg.grad_accum.to_string()),
        ("gpt.dtype", checkpoint::dtype_name(cfg.dtype).to_string()),
        ("gpt.seed", cfg.seed.to_string()),
    ]
}

/// A run's checkpoint metadata: the model's configuration, the vocabulary, the settings a resume
/// must share ([`run_metadata`]), the window sampler's state and the loss histories.
pub(super) fn checkpoint_metadata(
    cfg: &GptTrainConfig,
    config: &GptConfig,
    corpus: &Corpus,
    rng: &WindowRng,
    report: &GptReport,
) -> HashMap<String, String> {
    let mut meta: HashMap<String, String> = config.to_metadata();
    meta.extend(corpus.vocab.to_metadata());
    meta.insert("model".into(), "gpt".into());
    for (k, v) in run_metadata(cfg) {
        meta.insert(k.into(), v);
    }
    meta.insert("gpt.rng".into(), rng.state().to_string());
    meta.insert("gpt.train_losses".into(), history(&report.train_losses));
    meta.insert("gpt.val_losses".into(), history(&report.val_losses));
    meta.insert("data".into(), cfg.data.display().to_string());
    meta
}

/// Trains per `cfg`, one line per validation to `log`.
pub fn train_gpt(cfg: &GptTrainConfig, mut log: impl FnMut(&str)) -> Result<GptReport> {
    if cfg.steps == 0 {
        return Err(invalid("--steps", 0, "at least 1"));
    }
    if cfg.batch == 0 {
        return Err(invalid("--batch", 0, "at least 1"));
    }
    if cfg.grad_accum == 0 {
        return Err(invalid("--grad-accum", 0, "at least 1"));
    }
    if cfg.eval_batches == 0 {
        return Err(invalid("--eval-batches", 0, "at least 1"));
    }
    if !matches!(cfg.dtype, DType::F32 | DType::BF16 | DType::F64) {
        return Err(invalid("--dtype", format!("{:?}", cfg.dtype), "f32, bf16 or f64 (CPU) for a GPT"));
    }
    if let Some(path) = &cfg.checkpoint {
        checkpoint::check_destination(path)?;
    }
    // The vocabulary comes from the data (bytes: 256 whatever the preset).
    let block = cfg.spec.resolve(256)?.block;
    let corpus = Corpus::from_file(&cfg.data, cfg.tokens, block)?;
    let config = cfg.spec.resolve(corpus.vocab.len())?;
    let (device, where_) = pick_device(cfg.device, cfg.dtype)?;
    let param_dtype = if cfg.dtype == DType::F64 { DType::F64 } else { DType::F32 };
    let mut model = Gpt::new(&config, param_dtype, cfg.seed)?;
    let params = model.named_parameters();
    let decay: Vec<bool> = params.iter().map(|(n, _)| Gpt::decays(n)).collect();
    let mut opt = Adam::adamw(params, cfg.lr, cfg.weight_decay);
    opt.beta2 = 0.95;
    opt.set_decay(&decay)?;
    if let Some(path) = &cfg.save_init {
        let mut meta = config.to_metadata();
        meta.extend(corpus.vocab.to_metadata());
        meta.insert("model".into(), "gpt".into());
        checkpoint::save(path, &model.named_parameters(), meta)?;
    }
    // On the device before a resume loads the optimizer's state, so the fused update starts from
    // the saved moments.
    model.move_to(&device)?;
    let mut rng = WindowRng::new(cfg.seed);
    let mut report = GptReport::default();
    let mut start = 0usize;
    if let Some(path) = &cfg.resume {
        let (_, meta) = checkpoint::load(path)?;
        check_kind(path, &meta)?;
        let saved = GptConfig::from_metadata(&meta)?;
        if saved != config {
            return Err(Error::File {
                path: path.clone(),
                msg: format!(
                    "it holds a GPT of {saved:?}, this run builds {config:?}: pass the same --preset and size \
                     flags as the run that wrote it"
                ),
            });
        }
        let vocab = Vocab::from_metadata(&meta)?;
        if vocab != corpus.vocab {
            return Err(Error::File {
                path: path.clone(),
                msg: format!(
                    "its vocabulary ({} tokens) is not the one of {} ({} tokens): resume on the same text with the \
                     same --tokens",
                    vocab.len(),
                    cfg.data.display(),
                    corpus.vocab.len()
                ),
            });
        }
        for (k, v) in run_metadata(cfg) {
            if meta.get(k) != Some(&v) {
                return Err(Error::File {
                    path: path.clone(),
                    msg: format!(
                        "`{k}` is {:?} there and {v:?} in this run: resume with the same setting",
                        meta.get(k)
                    ),
                });
            }
        }
        let state = checkpoint::load_training(path, &model, &mut opt)?;
        start = state.step as usize;
        let rs = meta.get("gpt.rng").and_then(|s| s.parse().ok()).unwrap_or(cfg.seed);
        rng = WindowRng::from_state(rs);
        report.train_losses = parse_history(meta.get("gpt.train_losses"));
        report.val_losses = parse_history(meta.get("gpt.val_losses"));
        if start >= cfg.steps {
            return Err(invalid(
                "--steps",
                cfg.steps,
                format!("more than the {start} steps the checkpoint has taken (--steps counts the whole run)"),
            ));
        }
    }
    if cfg.dtype == DType::BF16 && matches!(device, Device::Cuda(_)) {
        attach_compute_copies(&mut opt, DType::BF16)?;
    }
    model.set_training(true);
    let tokens_per_step = cfg.batch * cfg.grad_accum * config.block;
    log(&format!(
        "GPT: {} parameters (vocab {}, block {}, width {}, {} layers, {} heads), {} tokens ({} train, {} validation), \
         {} tokens per step, on {where_}",
        config.parameter_count(),
        config.vocab,
        config.block,
        config.width,
        config.layers,
        config.heads,
        corpus.train.len() + corpus.val.len(),
        corpus.train.len(),
        corpus.val.len(),
        tokens_per_step
    ));
    let sched = schedule(cfg.warmup, cfg.steps);
    let mut loss_log = match &cfg.loss_log {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(|e| Error::File { path: p.clone(), msg: e.to_string() })?,
        )),
        None => None,
    };
    let (end, timed_from) = match cfg.bench_steps {
        Some(n) => (start + 3 + n, start + 3),
        None => (cfg.steps, start),
    };
    let bar = if cfg.progress {
        let b = indicatif::ProgressBar::new((end - start) as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template("step {pos}/{len} [{bar:30}] {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut timer = Instant::now();
    let mut last = Instant::now();
    let cuda_dev = match &device {
        Device::Cuda(d) => Some(d.clone()),
        Device::Cpu => None,
    };
    for step in start..end {
        if step == timed_from {
            if let Some(d) = &cuda_dev {
                d.synchronize()?;
            }
            timer = Instant::now();
        }
        opt.set_lr(sched.lr(cfg.lr, step));
        opt.zero_grad();
        let mut loss_sum = 0.0;
        for _ in 0..cfg.grad_accum {
            let (x, y) = windows(&corpus.train, cfg.batch, config.block, &mut rng);
            let loss = {
                let _mixed = if cfg.dtype == DType::BF16 { Some(autocast(DType::BF16)?) } else { None };
                model.loss(&x, &y, cfg.batch)?
            };
            let loss = if cfg.grad_accum > 1 { loss.mul_scalar(1.0 / cfg.grad_accum as f64)? } else { loss };
            loss.backward()?;
            if cfg.bench_steps.is_none() {
                loss_sum += loss.item()?;
            }
        }
        if let Some(c) = cfg.clip_grad_norm {
            opt.clip_grad_norm(c)?;
        }
        opt.step()?;
        if cfg.bench_steps.is_some() {
            bar.inc(1);
            continue;
        }
        report.train_losses.push((step + 1, loss_sum));
        if let Some(w) = &mut loss_log {
            use std::io::Write;
            writeln!(w, "{} {loss_sum}", step + 1)
                .map_err(|e| Error::File { path: cfg.loss_log.clone().unwrap_or_default(), msg: e.to_string() })?;
        }
        let now = Instant::now();
        let tps = tokens_per_step as f64 / now.duration_since(last).as_secs_f64().max(1e-9);
        last = now;
        bar.set_message(format!("loss {loss_sum:.4}, {tps:.0} tokens/s"));
        bar.inc(1);
        let done = step + 1;
        if (cfg.eval_every > 0 && done % cfg.eval_every == 0) || done == end {
            let val = validation_loss(&mut model, &corpus, cfg)?;
            report.val_losses.push((done, val));
            bar.suspend(|| {
                log(&format!(
                    "step {done}/{}: train loss {loss_sum:.4}, validation loss {val:.4}, lr {:.2e}, {tps:.0} tokens/s",
                    cfg.steps,
                    opt.lr()
                ))
            });
        }
    }
    bar.finish_and_clear();
    if let Some(d) = &cuda_dev {
        d.synchronize()?;
    }
    let timed = end - timed_from;
    let secs = timer.elapsed().as_secs_f64();
    report.ms_per_step = 1e3 * secs / timed as f64;
    report.tokens_per_s = (timed * tokens_per_step) as f64 / secs.max(1e-12);
    report.peak_bytes = cuda_dev.as_ref().and_then(|d| d.peak_memory().ok());
    if cfg.bench_steps.is_some() {
        log(&format!(
            "bench: {timed} steps, {:.2} ms/step, {:.0} tokens/s{}",
            report.ms_per_step,
            report.tokens_per_s,
            report
                .peak_bytes
                .map(|b| format!(", peak memory {:.1} MiB", b as f64 / (1 << 20) as f64))
                .unwrap_or_default()
        ));
        return Ok(report);
    }
    if let Some(path) = &cfg.checkpoint {
        let meta = checkpoint_metadata(cfg, &config, &corpus, &rng, &report);
        let state = TrainingState { step: end as u64, epoch: 0, config: meta };
        checkpoint::save_training(path, &model, &opt, &state)?;
        let svg = path.with_extension("svg");
        std::fs::write(&svg, loss_svg(&report.train_losses, &report.val_losses))
            .map_err(|e| Error::File { path: svg.clone(), msg: e.to_string() })?;
        log(&format!("saved {} (step {end}) and the loss curve {}", path.display(), svg.display()));
    }
    Ok(report)
}

/// The mean loss of `eval_batches` fixed windows of the validation part (the same windows every
/// time), in evaluation mode (no dropout) and without recording gradients.
pub(super) fn validation_loss(model: &mut Gpt, corpus: &Corpus, cfg: &GptTrainConfig) -> Result<f64> {
    model.set_training(false);
    let _g = no_grad();
    let mut rng = WindowRng::new(cfg.seed ^ 0x5eed_f00d);
    let mut total = 0.0;
    let result = (|| {
        for _ in 0..cfg.eval_batches {
            let (x, y) = windows(&corpus.val, cfg.batch, model.config.block, &mut rng);
            let _mixed = if cfg.dtype == DType::BF16 { Some(autocast(DType::BF16)?) } else { None };
            total += model.loss(&x, &y, cfg.batch)?.item()?;
        }
        Ok(total / cfg.eval_batches as f64)
    })();
    model.set_training(true);
    result
}

/// Refuses a checkpoint that is not a GPT's.
fn check_kind(path: &Path, meta: &HashMap<String, String>) -> Result<()> {
    match meta.get("model").map(String::as_str) {
        Some("gpt") => Ok(()),
        other => Err(Error::File {
            path: path.to_path_buf(),
            msg: format!(
                "it is not a GPT checkpoint (model {}): GPT checkpoints are written by `kiln train --model gpt`",
                other.unwrap_or("mlp, or unknown")
            ),
        }),
    }
}

/// A GPT checkpoint's model (on the CPU, f32 or f64 as saved), configuration and vocabulary.
pub fn load_gpt(path: &Path) -> Result<(Gpt, Vocab)> {
    let (tensors, meta) = checkpoint::load(path)?;
    check_kind(path, &meta)?;
    let config = GptConfig::from_metadata(&meta)?;
    let vocab = Vocab::from_metadata(&meta)?;
    if vocab.len() > config.vocab {
        return Err(Error::File {
            path: path.to_path_buf(),
            msg: format!("a vocabulary of {} tokens for a model of {}", vocab.len(), config.vocab),
        });
    }
    let dtype = if meta.get("gpt.dtype").map(String::as_str) == Some("f64") { DType::F64 } else { DType::F32 };
    let mut model = Gpt::new(&config, dtype, 0)?;
    checkpoint::assign(&model.named_parameters(), &tensors, "")?;
    model.set_training(false);
    Ok((model, vocab))
}

/// What `kiln sample` asks for.
#[derive(Clone, Debug)]
pub struct SampleConfig {
    /// The checkpoint.
    pub checkpoint: PathBuf,
    /// The text to continue (empty: generation starts from token 0, the byte 0 or the first
    /// character of a char vocabulary, a newline in most texts).
    pub prompt: String,
    /// Tokens to generate.
    pub tokens: usize,
    /// Softmax temperature (greater than 0).
    pub temperature: f64,
    /// Keep only the `k` likeliest tokens (None: all).
    pub top_k: Option<usize>,
    /// Seed of the sampler.
    pub seed: u64,
    /// Device.
    pub device: DeviceChoice,
}

/// Generates `cfg.tokens` tokens after the prompt with the key/value cache (one position per new
/// token) and returns the prompt and the continuation as text. When the context reaches the
/// model's block size, the cache is rebuilt from the last `block / 2` tokens (nanoGPT crops the
/// context to the block the same way, from the right); the model never sees more positions than
/// it was trained for.
pub fn sample(cfg: &SampleConfig) -> Result<String> {
    if !(cfg.temperature.is_finite() && cfg.temperature > 0.0) {
        return Err(invalid("--temperature", cfg.temperature, "a finite number greater than 0"));
    }
    if cfg.top_k == Some(0) {
        return Err(invalid("--top-k", 0, "at least 1"));
    }
    let (model, vocab) = load_gpt(&cfg.checkpoint)?;
    let (device, _) = pick_device(cfg.device, model.wte.weight.dtype())?;
    model.move_to(&device)?;
    let mut ids = if cfg.prompt.is_empty() { vec![0] } else { vocab.encode(&cfg.prompt)? };
    let block = model.config.block;
    if ids.len() > block {
        ids.drain(..ids.len() - block);
    }
    let _g = no_grad();
    let mut rng = WindowRng::new(cfg.seed);
    let mut cache: KvCache = model.cache();
    let mut logits = model.logits_cached(&ids, 1, &mut cache)?;
    let v = model.config.vocab;
    let mut out = Vec::with_capacity(cfg.tokens);
    for _ in 0..cfg.tokens {
        let all = logits.to_vec_f64();
        let last = &all[all.len() - v..];
        let next = pick(last, cfg.temperature, cfg.top_k, vocab.len(), &mut rng);
        out.push(next);
        ids.push(next);
        if cache.len() >= block {
            let keep = ids.len().min(block / 2).max(1);
            cache.clear();
            logits = model.logits_cached(&ids[ids.len() - keep..], 1, &mut cache)?;
        } else {
            logits = model.logits_cached(&[next], 1, &mut cache)?;
        }
    }
    Ok(format!("{}{}", cfg.prompt, vocab.decode(&out)))
}

/// Draws a token from `logits / temperature` (the first `n` entries: the vocabulary's; the model
/// may be padded past it), keeping the `top_k` largest.
fn pick(logits: &[f64], temperature: f64, top_k: Option<usize>, n: usize, rng: &mut WindowRng) -> usize {
    let l = &logits[..n.min(logits.len())];
    let mut scaled: Vec<f64> = l.iter().map(|x| x / temperature).collect();
    if let Some(k) = top_k.filter(|&k| k < scaled.len()) {
        let mut sorted = scaled.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let cut = sorted[k - 1];
        for s in &mut scaled {
            if *s < cut {
                *s = f64::NEG_INFINITY;
            }
        }
    }
    let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scaled.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = w.iter().sum();
    let mut u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
    for (i, wi) in w.iter().enumerate() {
        if u < *wi {
            return i;
        }
        u -= wi;
    }
    w.iter().rposition(|&x| x > 0.0).unwrap_or(0)
}

/// An SVG of the training loss (a line) and the validation loss (dots) against the step.
pub fn loss_svg(train: &[(usize, f64)], val: &[(usize, f64)]) -> String {
    let (w, h, m) = (640.0, 400.0, 50.0);
    let all = train.iter().chain(val);
    let max_step = all.clone().map(|p| p.0).max().unwrap_or(1).max(1) as f64;
    let lo = all.clone().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let hi = all.map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > lo { (lo, hi) } else { (0.0, 1.0) };
    let x = |s: usize| m + (w - 2.0 * m) * s as f64 / max_step;
    let y = |l: f64| h - m - (h - 2.0 * m) * (l - lo) / (hi - lo);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" \
         font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <line x1=\"{m}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{b}\" stroke=\"black\"/>\n\
         <text x=\"{cx}\" y=\"{ty}\" text-anchor=\"middle\">step (0 to {max_step})</text>\n\
         <text x=\"10\" y=\"{m}\">{hi:.3}</text>\n<text x=\"10\" y=\"{b}\">{lo:.3}</text>\n\
         <text x=\"{cx}\" y=\"30\" text-anchor=\"middle\">loss: training (line), validation (dots)</text>\n",
        b = h - m,
        r = w - m,
        cx = w / 2.0,
        ty = h - 15.0
    );
    let pts: Vec<String> = train.iter().map(|&(st, l)| format!("{:.1},{:.1}", x(st), y(l))).collect();
    s.push_str(&format!("<polyline fill=\"none\" stroke=\"steelblue\" points=\"{}\"/>\n", pts.join(" ")));
    for &(st, l) in val {
        s.push_str(&format!("<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"darkorange\"/>\n", x(st), y(l)));
    }
    s.push_str("</svg>\n");
    s
}

/// The loss of a freshly initialized model on the first batch of `cfg`'s windows (what the
/// PyTorch parity script checks first), without training.
pub fn initial_loss(cfg: &GptTrainConfig) -> Result<f64> {
    let block = cfg.spec.resolve(256)?.block;
    let corpus = Corpus::from_file(&cfg.data, cfg.tokens, block)?;
    let config = cfg.spec.resolve(corpus.vocab.len())?;
    let model = Gpt::new(&config, DType::F64, cfg.seed)?;
    let (x, y) = windows(&corpus.train, cfg.batch, config.block, &mut WindowRng::new(cfg.seed));
    let _g = no_grad();
    model.loss(&x, &y, cfg.batch)?.item()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_respects_top_k_and_temperature() {
        let mut r = WindowRng::new(1);
        let logits = [0.0, 5.0, 4.9, -1.0];
        for _ in 0..50 {
            let t = pick(&logits, 1.0, Some(2), 4, &mut r);
            assert!(t == 1 || t == 2);
        }
        assert_eq!(pick(&logits, 1e-3, None, 4, &mut r), 1);
        // padded vocabulary: ids past the vocabulary are never drawn
        for _ in 0..50 {
            assert!(pick(&[0.0, 0.0, 9.0], 1.0, None, 2, &mut r) < 2);
        }
    }

    #[test]
    fn svg_and_history() {
        let t = vec![(1, 3.0), (2, 2.5)];
        let svg = loss_svg(&t, &[(2, 2.7)]);
        assert!(svg.starts_with("<svg") && svg.contains("polyline") && svg.contains("circle"));
        assert_eq!(parse_history(Some(&history(&t))), t);
    }
}

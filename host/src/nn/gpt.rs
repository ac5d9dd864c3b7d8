//! A GPT: token and position embeddings, pre-LayerNorm blocks of causal self-attention and a GELU
//! MLP with residual connections, a final LayerNorm and a language-model head (optionally tied to
//! the token embedding).
//!
//! Parameter names (the checkpoint keys, and `benches/torch_gpt.py`'s mapping) follow GPT-2:
//! `wte.weight`, `wpe.weight`, `h.{i}.ln_1.{weight,bias}`, `h.{i}.attn.c_attn.{weight,bias}`,
//! `h.{i}.attn.c_proj.{weight,bias}`, `h.{i}.ln_2.{weight,bias}`, `h.{i}.mlp.c_fc.{weight,bias}`,
//! `h.{i}.mlp.c_proj.{weight,bias}`, `ln_f.{weight,bias}`, and `lm_head.weight` when the head is
//! not tied (a tied head is `wte.weight`, listed once).
//!
//! ```
//! use kiln::nn::{Gpt, GptConfig, Module};
//! use kiln::tensor::DType;
//!
//! let cfg = GptConfig::tiny(16);
//! let model = Gpt::new(&cfg, DType::F32, 0)?;
//! let ids = vec![1, 2, 3, 4, 5, 6];
//! let logits = model.logits(&ids, 2)?; // 2 sequences of 3 tokens
//! assert_eq!(logits.dims(), &[2, 3, 16]);
//! # Ok::<(), kiln::Error>(())
//! ```

use super::attention::{KvCache, normal_linear};
use super::{Activation, CausalSelfAttention, Dropout, Embedding, LayerNorm, Linear, Module, compute_dtype};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};
use std::collections::HashMap;

/// A GPT's shape.
#[derive(Clone, Debug, PartialEq)]
pub struct GptConfig {
    /// Vocabulary size.
    pub vocab: usize,
    /// Longest context (positions of the position embedding).
    pub block: usize,
    /// Features per position.
    pub width: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Attention heads (the width is a multiple of them).
    pub heads: usize,
    /// Dropout probability (after the embeddings and on the attention's and the MLP's outputs; the
    /// attention probabilities are not dropped).
    pub dropout: f64,
    /// The head shares the token embedding's weight.
    pub tie_weights: bool,
    /// Linear layers have biases.
    pub bias: bool,
}

/// The preset names [`GptConfig::preset`] knows.
pub const PRESETS: &[&str] = &["tiny", "char-mini", "gpt2-small"];

impl GptConfig {
    /// A test-sized model: block 16, width 32, 2 layers, 4 heads.
    pub fn tiny(vocab: usize) -> GptConfig {
        GptConfig { vocab, block: 16, width: 32, layers: 2, heads: 4, dropout: 0.0, tie_weights: true, bias: true }
    }

    /// A named preset for a vocabulary of `vocab` tokens: `tiny`, `char-mini` (block 256, width
    /// 384, 6 layers, 6 heads) or `gpt2-small` (block 1024, width 768, 12 layers, 12 heads; a
    /// vocabulary larger than 256 is padded to 50304, GPT-2's 50257 rounded up to a multiple of 64).
    pub fn preset(name: &str, vocab: usize) -> Result<GptConfig> {
        let base = GptConfig::tiny(vocab);
        Ok(match name {
            "tiny" => base,
            "char-mini" => GptConfig { block: 256, width: 384, layers: 6, heads: 6, dropout: 0.2, ..base },
            "gpt2-small" => GptConfig {
                vocab: if vocab > 256 { vocab.max(50304) } else { vocab },
                block: 1024,
                width: 768,
                layers: 12,
                heads: 12,
                ..base
            },
            other => {
                return Err(Error::InvalidSetting {
                    setting: "--preset",
                    value: other.to_string(),
                    allowed: PRESETS.join(", "),
                });
            }
        })
    }

    /// Checks the sizes fit together.
    pub fn validate(&self) -> Result<()> {
        let bad = |setting: &'static str, value: usize, allowed: &str| Error::InvalidSetting {
            setting,
            value: value.to_string(),
            allowed: allowed.to_string(),
        };
        if self.vocab == 0 {
            return Err(bad("vocab", 0, "at least 1"));
        }
        if self.block == 0 {
            return Err(bad("--block", 0, "at least 1"));
        }
        if self.layers == 0 {
            return Err(bad("--layers", 0, "at least 1"));
        }
        if self.heads == 0 || self.width == 0 || !self.width.is_multiple_of(self.heads) {
            return Err(bad("--width", self.width, &format!("a positive multiple of --heads ({})", self.heads)));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::InvalidSetting {
                setting: "--dropout",
                value: self.dropout.to_string(),
                allowed: "0 <= p < 1".into(),
            });
        }
        Ok(())
    }

    /// The configuration as checkpoint metadata (`gpt.vocab`, ...).
    pub fn to_metadata(&self) -> HashMap<String, String> {
        [
            ("gpt.vocab", self.vocab.to_string()),
            ("gpt.block", self.block.to_string()),
            ("gpt.width", self.width.to_string()),
            ("gpt.layers", self.layers.to_string()),
            ("gpt.heads", self.heads.to_string()),
            ("gpt.dropout", self.dropout.to_string()),
            ("gpt.tie_weights", self.tie_weights.to_string()),
            ("gpt.bias", self.bias.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Reads [`GptConfig::to_metadata`]'s keys back.
    pub fn from_metadata(meta: &HashMap<String, String>) -> Result<GptConfig> {
        fn get<T: std::str::FromStr>(meta: &HashMap<String, String>, key: &str) -> Result<T> {
            let v = meta.get(key).ok_or_else(|| Error::InvalidSetting {
                setting: "--checkpoint",
                value: format!("a checkpoint without `{key}`"),
                allowed: "a checkpoint written by `kiln train --model gpt`".into(),
            })?;
            v.parse().map_err(|_| Error::InvalidSetting {
                setting: "--checkpoint",
                value: format!("metadata `{key}` = `{v}`"),
                allowed: "a checkpoint written by `kiln train --model gpt`".into(),
            })
        }
        let cfg = GptConfig {
            vocab: get(meta, "gpt.vocab")?,
            block: get(meta, "gpt.block")?,
            width: get(meta, "gpt.width")?,
            layers: get(meta, "gpt.layers")?,
            heads: get(meta, "gpt.heads")?,
            dropout: get(meta, "gpt.dropout")?,
            tie_weights: get(meta, "gpt.tie_weights")?,
            bias: get(meta, "gpt.bias")?,
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parameters of the model this configuration builds.
    pub fn parameter_count(&self) -> usize {
        let (c, b) = (self.width, usize::from(self.bias));
        let block =
            2 * 2 * c + (3 * c * c + 3 * c * b) + (c * c + c * b) + (4 * c * c + 4 * c * b) + (4 * c * c + c * b);
        let head = if self.tie_weights { 0 } else { self.vocab * c };
        self.vocab * c + self.block * c + self.layers * block + 2 * c + head
    }
}

/// The MLP of a block: `c_proj(gelu(c_fc(x)))`, 4x wide, then dropout.
pub struct Mlp {
    /// C -> 4C.
    pub c_fc: Linear,
    /// 4C -> C.
    pub c_proj: Linear,
    /// Dropout on the output.
    pub dropout: Dropout,
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.c_fc.forward_with(x, Some(Activation::Gelu))?;
        self.dropout.forward(&self.c_proj.forward(&h)?)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = Vec::new();
        for (prefix, l) in [("c_fc", &self.c_fc), ("c_proj", &self.c_proj)] {
            v.extend(l.named_parameters().into_iter().map(|(n, t)| (format!("{prefix}.{n}"), t)));
        }
        v
    }
    fn set_training(&mut self, on: bool) {
        self.dropout.set_training(on);
    }
}

/// A pre-LayerNorm transformer block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
pub struct Block {
    /// Before attention.
    pub ln_1: LayerNorm,
    /// Causal self-attention.
    pub attn: CausalSelfAttention,
    /// Before the MLP.
    pub ln_2: LayerNorm,
    /// The MLP.
    pub mlp: Mlp,
}

/// `x + y`, `y` converted to `x`'s dtype (under autocast the branches are 16-bit, the residual
/// stream stays in the parameters' dtype).
fn residual(x: &Tensor, y: &Tensor) -> Result<Tensor> {
    if y.dtype() == x.dtype() { x.add(y) } else { x.add(&y.to_dtype(x.dtype())?) }
}

impl Block {
    fn forward_cache(&self, x: &Tensor, cache: Option<&mut KvCache>) -> Result<Tensor> {
        let a = self.ln_1.forward(x)?;
        let a = match cache {
            Some(c) => self.attn.forward_cached(&a, c)?,
            None => self.attn.forward(&a)?,
        };
        let x = residual(x, &a)?;
        let m = self.mlp.forward(&self.ln_2.forward(&x)?)?;
        residual(&x, &m)
    }
}

impl Module for Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_cache(x, None)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = Vec::new();
        let parts: [(&str, &dyn Module); 4] =
            [("ln_1", &self.ln_1), ("attn", &self.attn), ("ln_2", &self.ln_2), ("mlp", &self.mlp)];
        for (prefix, m) in parts {
            v.extend(m.named_parameters().into_iter().map(|(n, t)| (format!("{prefix}.{n}"), t)));
        }
        v
    }
    fn set_training(&mut self, on: bool) {
        self.attn.set_training(on);
        self.mlp.set_training(on);
    }
}

/// The GPT (see the module documentation).
pub struct Gpt {
    /// Its shape.
    pub config: GptConfig,
    /// Token embedding (vocab, C).
    pub wte: Embedding,
    /// Position embedding (block, C).
    pub wpe: Embedding,
    /// Dropout after the embeddings.
    pub drop: Dropout,
    /// The blocks.
    pub h: Vec<Block>,
    /// Final LayerNorm.
    pub ln_f: LayerNorm,
    /// The head (vocab, C), when not tied to `wte`.
    pub lm_head: Option<Tensor>,
}

impl Gpt {
    /// A model of `config` with parameters of `dtype` (f32 for training, f64 for gradient checks),
    /// on the CPU, initialized as GPT-2 from `seed`: weights N(0, 0.02), the residual projections
    /// (`attn.c_proj`, `mlp.c_proj`) N(0, 0.02 / sqrt(2 layers)), biases zero, norms one.
    pub fn new(config: &GptConfig, dtype: DType, seed: u64) -> Result<Gpt> {
        config.validate()?;
        let mut rng = Tensor::rng(seed);
        let c = config.width;
        let std = 0.02;
        let proj_std = std / (2.0 * config.layers as f64).sqrt();
        let normal = |rows: usize, rng: &mut rand::rngs::StdRng| -> Result<Tensor> {
            Ok(Tensor::randn([rows, c], DType::F64, rng).mul_scalar(std)?.to_dtype(dtype)?.detach().requires_grad())
        };
        let wte = Embedding { weight: normal(config.vocab, &mut rng)? };
        let wpe = Embedding { weight: normal(config.block, &mut rng)? };
        let mut h = Vec::with_capacity(config.layers);
        for i in 0..config.layers {
            let attn = CausalSelfAttention::new(
                c,
                config.heads,
                config.bias,
                config.dropout,
                std,
                proj_std,
                i,
                dtype,
                &mut rng,
            )?;
            let seed = rand::Rng::random::<u64>(&mut rng);
            let mlp = Mlp {
                c_fc: normal_linear(c, 4 * c, config.bias, std, dtype, &mut rng)?,
                c_proj: normal_linear(4 * c, c, config.bias, proj_std, dtype, &mut rng)?,
                dropout: Dropout::new(config.dropout, seed),
            };
            h.push(Block { ln_1: LayerNorm::new(c, 1e-5, dtype), attn, ln_2: LayerNorm::new(c, 1e-5, dtype), mlp });
        }
        let lm_head = if config.tie_weights { None } else { Some(normal(config.vocab, &mut rng)?) };
        let seed = rand::Rng::random::<u64>(&mut rng);
        Ok(Gpt {
            config: config.clone(),
            wte,
            wpe,
            drop: Dropout::new(config.dropout, seed),
            h,
            ln_f: LayerNorm::new(c, 1e-5, dtype),
            lm_head,
        })
    }

    /// The parameters' device.
    pub fn device(&self) -> crate::tensor::Device {
        self.wte.weight.device()
    }

    /// Moves every parameter to `device`.
    pub fn move_to(&self, device: &crate::tensor::Device) -> Result<()> {
        for (_, p) in self.named_parameters() {
            p.move_to(device)?;
        }
        Ok(())
    }

    /// Whether a parameter takes weight decay: the weights of the linear layers (and an untied
    /// head) do; biases, LayerNorms and embeddings do not.
    pub fn decays(name: &str) -> bool {
        name.ends_with(".weight") && (name.contains(".attn.") || name.contains(".mlp.") || name == "lm_head.weight")
    }

    fn check_ids(&self, ids: &[usize], batch: usize, start: usize) -> Result<usize> {
        if batch == 0 || ids.is_empty() || !ids.len().is_multiple_of(batch) {
            return Err(Error::shape("Gpt", format!("{} token ids in {batch} sequences", ids.len())));
        }
        let t = ids.len() / batch;
        if start + t > self.config.block {
            return Err(Error::InvalidSetting {
                setting: "context",
                value: format!("{} positions", start + t),
                allowed: format!("at most the block size {} the model was built for", self.config.block),
            });
        }
        if let Some(bad) = ids.iter().find(|&&i| i >= self.config.vocab) {
            return Err(Error::Index {
                op: "Gpt",
                msg: format!("token id {bad} outside the vocabulary of {}", self.config.vocab),
            });
        }
        Ok(t)
    }

    fn run(&self, ids: &[usize], batch: usize, mut cache: Option<&mut KvCache>) -> Result<Tensor> {
        let start = cache.as_ref().map_or(0, |c| c.len());
        let t = self.check_ids(ids, batch, start)?;
        let tok = self.wte.lookup(ids, [batch, t])?;
        let positions: Vec<usize> = (start..start + t).collect();
        let pos = self.wpe.lookup(&positions, [t])?;
        let mut x = self.drop.forward(&tok.add(&pos)?)?;
        for b in &self.h {
            x = b.forward_cache(&x, cache.as_deref_mut())?;
        }
        let x = self.ln_f.forward(&x)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.wte.weight);
        let c = compute_dtype(head.dtype());
        if c == head.dtype() {
            x.linear(head, None, None)
        } else {
            x.to_dtype(c)?.linear(&head.compute_copy(c)?, None, None)
        }
    }

    /// Logits `[batch, T, vocab]` of `ids` (`batch` sequences of `T` tokens, row-major), for
    /// positions `0..T` (T at most the block size). Inside an autocast scope, 16-bit.
    pub fn logits(&self, ids: &[usize], batch: usize) -> Result<Tensor> {
        self.run(ids, batch, None)
    }

    /// Logits of `ids` (`batch` sequences of `Tnew` tokens) at the positions after those in
    /// `cache`, whose keys and values are appended to it: generation costs one position per
    /// token. The total must stay within the block size.
    pub fn logits_cached(&self, ids: &[usize], batch: usize, cache: &mut KvCache) -> Result<Tensor> {
        self.run(ids, batch, Some(cache))
    }

    /// An empty cache for this model.
    pub fn cache(&self) -> KvCache {
        KvCache::new(self.config.layers)
    }

    /// Mean cross-entropy of the next-token predictions: `ids` and `targets` are `batch` rows of
    /// `T` tokens each.
    pub fn loss(&self, ids: &[usize], targets: &[usize], batch: usize) -> Result<Tensor> {
        if targets.len() != ids.len() {
            return Err(Error::shape("Gpt::loss", format!("{} ids and {} targets", ids.len(), targets.len())));
        }
        let logits = self.logits(ids, batch)?;
        let v = self.config.vocab;
        logits.reshape([ids.len(), v])?.cross_entropy(targets)
    }
}

impl Module for Gpt {
    /// Reads `x` `[B, T]` as token ids and returns the logits `[B, T, vocab]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let d = x.dims();
        if d.len() != 2 {
            return Err(Error::shape("Gpt", format!("input {d:?}: token ids are [B, T]")));
        }
        let v = x.to_vec_f64();
        if let Some(bad) = v.iter().find(|f| **f < 0.0 || f.fract() != 0.0) {
            return Err(Error::Index { op: "Gpt", msg: format!("id {bad} is not a non-negative integer") });
        }
        let ids: Vec<usize> = v.iter().map(|&f| f as usize).collect();
        self.logits(&ids, d[0])
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("wte.weight".to_string(), self.wte.weight.clone())];
        v.push(("wpe.weight".to_string(), self.wpe.weight.clone()));
        for (i, b) in self.h.iter().enumerate() {
            v.extend(b.named_parameters().into_iter().map(|(n, t)| (format!("h.{i}.{n}"), t)));
        }
        v.extend(self.ln_f.named_parameters().into_iter().map(|(n, t)| (format!("ln_f.{n}"), t)));
        if let Some(w) = &self.lm_head {
            v.push(("lm_head.weight".to_string(), w.clone()));
        }
        v
    }
    fn set_training(&mut self, on: bool) {
        self.drop.set_training(on);
        for b in &mut self.h {
            b.set_training(on);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_counts() {
        let cfg = GptConfig { tie_weights: false, ..GptConfig::tiny(11) };
        let m = Gpt::new(&cfg, DType::F32, 1).unwrap();
        let names: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names[0], "wte.weight");
        assert!(names.contains(&"h.1.attn.c_attn.bias".to_string()));
        assert!(names.contains(&"h.0.mlp.c_proj.weight".to_string()));
        assert_eq!(names.last().unwrap(), "lm_head.weight");
        let total: usize = m.parameters().iter().map(|p| p.elem_count()).sum();
        assert_eq!(total, cfg.parameter_count());
        let tied = Gpt::new(&GptConfig::tiny(11), DType::F32, 1).unwrap();
        assert_eq!(tied.named_parameters().len(), names.len() - 1);
        assert!(Gpt::decays("h.0.attn.c_attn.weight") && !Gpt::decays("h.0.attn.c_attn.bias"));
        assert!(!Gpt::decays("wte.weight") && !Gpt::decays("h.0.ln_1.weight"));
    }

    #[test]
    fn presets_and_metadata() {
        let c = GptConfig::preset("gpt2-small", 50257).unwrap();
        assert_eq!((c.vocab, c.block, c.width, c.layers, c.heads), (50304, 1024, 768, 12, 12));
        assert_eq!(GptConfig::preset("gpt2-small", 256).unwrap().vocab, 256);
        let m = GptConfig::preset("char-mini", 65).unwrap();
        assert_eq!((m.block, m.width, m.layers, m.heads), (256, 384, 6, 6));
        assert_eq!(GptConfig::from_metadata(&m.to_metadata()).unwrap(), m);
        assert!(GptConfig::preset("huge", 1).unwrap_err().to_string().contains("char-mini"));
        assert!(GptConfig { width: 30, ..GptConfig::tiny(4) }.validate().is_err());
    }

    #[test]
    fn block_and_vocab_are_checked() {
        let m = Gpt::new(&GptConfig::tiny(5), DType::F32, 0).unwrap();
        assert!(m.logits(&[0; 17], 1).unwrap_err().to_string().contains("block size 16"));
        assert!(m.logits(&[5], 1).is_err());
    }
}

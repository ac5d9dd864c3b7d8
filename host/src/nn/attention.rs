//! Causal multi-head self-attention with a key/value cache for generation.
//!
//! One fused projection makes queries, keys and values (`c_attn`, width -> 3 width); the heads are
//! views of it (reshape to `[B, T, 3H, D]`, narrow, permute to `[B, H, T, D]`); attention is
//! one [`Tensor::scaled_dot_product_attention`] call (the flash kernels on CUDA in bf16 and f16); the heads are merged back (`[B, T, H, D]` -> `[B, T, C]`) and
//! projected (`c_proj`), then dropped out while training.

use super::{Dropout, Linear, Module};
use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};
use rand::rngs::StdRng;

/// The keys and values of every layer seen so far, `[B, H, S, D]` each, appended to by
/// [`CausalSelfAttention::forward_cached`].
#[derive(Default)]
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
}

impl KvCache {
    /// An empty cache for `layers` attention layers.
    pub fn new(layers: usize) -> KvCache {
        KvCache { layers: (0..layers).map(|_| None).collect() }
    }
    /// Positions cached (those of the first layer; every layer holds as many after a full pass).
    pub fn len(&self) -> usize {
        self.layers.first().and_then(|l| l.as_ref()).map_or(0, |(k, _)| k.dims()[2])
    }
    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Forgets everything.
    pub fn clear(&mut self) {
        for l in &mut self.layers {
            *l = None;
        }
    }
    /// Layer `i`'s entry.
    fn layer(&mut self, i: usize) -> Result<&mut Option<(Tensor, Tensor)>> {
        let n = self.layers.len();
        self.layers.get_mut(i).ok_or_else(|| Error::shape("KvCache", format!("layer {i} of a cache of {n}")))
    }
}

/// Causal multi-head self-attention. Parameters: `c_attn.weight` (3C, C), `c_attn.bias` (3C),
/// `c_proj.weight` (C, C), `c_proj.bias` (C) (the biases only with `bias`).
pub struct CausalSelfAttention {
    /// Query, key and value projection (C -> 3C; rows `[q; k; v]`, each head's D features together).
    pub c_attn: Linear,
    /// Output projection (C -> C).
    pub c_proj: Linear,
    /// Heads.
    pub heads: usize,
    /// Dropout on the output projection.
    pub dropout: Dropout,
    /// Index of this layer in a [`KvCache`].
    pub layer: usize,
}

impl CausalSelfAttention {
    /// A layer of `width` features in `heads` heads (width must be a multiple of heads), weights
    /// N(0, `std`) (the output projection N(0, `proj_std`)), zero biases.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        width: usize,
        heads: usize,
        bias: bool,
        dropout: f64,
        std: f64,
        proj_std: f64,
        layer: usize,
        dtype: DType,
        rng: &mut StdRng,
    ) -> Result<CausalSelfAttention> {
        if heads == 0 || !width.is_multiple_of(heads) {
            return Err(Error::shape(
                "CausalSelfAttention::new",
                format!("width {width} in {heads} heads: the width must be a positive multiple of the heads"),
            ));
        }
        let seed = rand::Rng::random::<u64>(rng);
        Ok(CausalSelfAttention {
            c_attn: normal_linear(width, 3 * width, bias, std, dtype, rng)?,
            c_proj: normal_linear(width, width, bias, proj_std, dtype, rng)?,
            heads,
            dropout: Dropout::new(dropout, seed),
            layer,
        })
    }

    /// q, k, v `[B, H, T, D]` (views of the fused projection) of `x` `[B, T, C]`.
    fn qkv(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let d = x.dims();
        if d.len() != 3 {
            return Err(Error::shape("CausalSelfAttention", format!("input {:?}: it is [B, T, C]", d)));
        }
        let (b, t, c) = (d[0], d[1], d[2]);
        let h = self.heads;
        // [B, T, 3C] read as [B, T, 3H, D]: q, k and v are H heads each along dim 2
        let qkv = self.c_attn.forward(x)?.reshape([b, t, 3 * h, c / h])?;
        let part = |i: usize| -> Result<Tensor> { qkv.narrow(2, i * h, h)?.permute(&[0, 2, 1, 3]) };
        Ok((part(0)?, part(1)?, part(2)?))
    }

    /// Merges heads `[B, H, T, D]` -> `[B, T, C]`, projects and drops out.
    fn out(&self, y: &Tensor) -> Result<Tensor> {
        let d = y.dims();
        let (b, h, t, hd) = (d[0], d[1], d[2], d[3]);
        let y = y.permute(&[0, 2, 1, 3])?.reshape([b, t, h * hd])?;
        self.dropout.forward(&self.c_proj.forward(&y)?)
    }

    /// Attention of `x` `[B, Tnew, C]` over the cached positions and itself; appends its keys and
    /// values to `cache` (layer [`CausalSelfAttention::layer`]), so each new position costs one
    /// position of work. With an empty cache this is [`Module::forward`].
    pub fn forward_cached(&self, x: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let (q, k, v) = self.qkv(x)?;
        let entry = cache.layer(self.layer)?;
        let (k, v) = match entry.take() {
            None => (k.contiguous()?, v.contiguous()?),
            Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
        };
        let y = q.scaled_dot_product_attention(&k, &v, true, None)?;
        *entry = Some((k, v));
        self.out(&y)
    }
}

impl Module for CausalSelfAttention {
    /// `[B, T, C]` -> `[B, T, C]`, each position attending to itself and those before it.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (q, k, v) = self.qkv(x)?;
        let y = q.scaled_dot_product_attention(&k, &v, true, None)?;
        self.out(&y)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = Vec::new();
        for (prefix, l) in [("c_attn", &self.c_attn), ("c_proj", &self.c_proj)] {
            v.extend(l.named_parameters().into_iter().map(|(n, t)| (format!("{prefix}.{n}"), t)));
        }
        v
    }
    fn set_training(&mut self, on: bool) {
        self.dropout.set_training(on);
    }
}

/// A [`Linear`] with N(0, `std`) weights and zero bias (GPT-2's initialization).
pub(crate) fn normal_linear(
    inputs: usize,
    outputs: usize,
    bias: bool,
    std: f64,
    dtype: DType,
    rng: &mut StdRng,
) -> Result<Linear> {
    if inputs == 0 || outputs == 0 {
        return Err(Error::shape("Linear", format!("{inputs} inputs and {outputs} outputs: both must be positive")));
    }
    let weight =
        Tensor::randn([outputs, inputs], DType::F64, rng).mul_scalar(std)?.to_dtype(dtype)?.detach().requires_grad();
    let bias = bias.then(|| Tensor::zeros([outputs], dtype).requires_grad());
    Ok(Linear { weight, bias })
}

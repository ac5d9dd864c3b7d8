//! Modules: layers with named parameters.

use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};
use rand::rngs::StdRng;
use std::sync::Mutex;

/// A layer or model: a forward function and its parameters, by name.
pub trait Module: Send + Sync {
    /// Applies the module.
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
    /// Every parameter with a dotted name (`"0.weight"`), in a fixed order.
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        Vec::new()
    }
    /// The parameters, in the order of [`Module::named_parameters`].
    fn parameters(&self) -> Vec<Tensor> {
        self.named_parameters().into_iter().map(|(_, t)| t).collect()
    }
    /// Switches training behaviour (dropout) on or off.
    fn set_training(&mut self, _on: bool) {}
}

/// `y = x W^T + b`, with W of shape (out, in): Kaiming-normal weights (std sqrt(2 / in), for ReLU
/// networks) and zero bias.
pub struct Linear {
    /// Weight, (out, in).
    pub weight: Tensor,
    /// Bias, (out), if any.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// A new layer.
    pub fn new(inputs: usize, outputs: usize, bias: bool, dtype: DType, rng: &mut StdRng) -> Result<Linear> {
        if inputs == 0 || outputs == 0 {
            return Err(Error::shape(
                "Linear::new",
                format!("{inputs} inputs and {outputs} outputs: both must be positive"),
            ));
        }
        let std = (2.0 / inputs as f64).sqrt();
        let weight = Tensor::randn([outputs, inputs], DType::F64, rng)
            .mul_scalar(std)?
            .to_dtype(dtype)?
            .detach()
            .requires_grad();
        let bias = bias.then(|| Tensor::zeros([outputs], dtype).requires_grad());
        Ok(Linear { weight, bias })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul_t(&self.weight)?;
        match &self.bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = vec![("weight".to_string(), self.weight.clone())];
        if let Some(b) = &self.bias {
            v.push(("bias".to_string(), b.clone()));
        }
        v
    }
}

/// max(x, 0).
pub struct ReLU;
impl Module for ReLU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.relu()
    }
}

/// GELU (tanh form).
pub struct GELU;
impl Module for GELU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.gelu()
    }
}

/// Layer normalization over the last dimension, with learned scale (ones) and shift (zeros).
pub struct LayerNorm {
    /// Scale.
    pub weight: Tensor,
    /// Shift.
    pub bias: Tensor,
    /// Added to the variance.
    pub eps: f64,
}
impl LayerNorm {
    /// A new layer over `dim` features.
    pub fn new(dim: usize, eps: f64, dtype: DType) -> LayerNorm {
        LayerNorm {
            weight: Tensor::ones([dim], dtype).requires_grad(),
            bias: Tensor::zeros([dim], dtype).requires_grad(),
            eps,
        }
    }
}
impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(&self.weight, &self.bias, self.eps)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".into(), self.weight.clone()), ("bias".into(), self.bias.clone())]
    }
}

/// A table of `num` vectors of `dim` features; [`Embedding::lookup`] gathers rows by id.
pub struct Embedding {
    /// The table, (num, dim), N(0, 1) initialized.
    pub weight: Tensor,
}
impl Embedding {
    /// A new table.
    pub fn new(num: usize, dim: usize, dtype: DType, rng: &mut StdRng) -> Result<Embedding> {
        Ok(Embedding { weight: Tensor::randn([num, dim], DType::F64, rng).to_dtype(dtype)?.detach().requires_grad() })
    }
    /// Rows for `ids`, shaped `ids_shape + [dim]`.
    pub fn lookup(&self, ids: &[usize], ids_shape: impl Into<crate::tensor::Shape>) -> Result<Tensor> {
        self.weight.embedding(ids, ids_shape)
    }
}
impl Module for Embedding {
    /// Reads `x`'s values as ids (they must be non-negative integers).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let v = x.to_vec_f64();
        if let Some(bad) = v.iter().find(|f| **f < 0.0 || f.fract() != 0.0) {
            return Err(Error::Index { op: "embedding", msg: format!("id {bad} is not a non-negative integer") });
        }
        let ids: Vec<usize> = v.iter().map(|&f| f as usize).collect();
        self.lookup(&ids, x.shape().clone())
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        vec![("weight".into(), self.weight.clone())]
    }
}

/// Zeroes activations with probability `p` while training (seeded), identity in evaluation.
pub struct Dropout {
    /// Drop probability.
    pub p: f64,
    rng: Mutex<StdRng>,
    training: bool,
}
impl Dropout {
    /// A new layer with its own seeded generator.
    pub fn new(p: f64, seed: u64) -> Dropout {
        Dropout { p, rng: Mutex::new(Tensor::rng(seed)), training: true }
    }
}
impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training {
            return Ok(x.clone());
        }
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        x.dropout(self.p, &mut *rng)
    }
    fn set_training(&mut self, on: bool) {
        self.training = on;
    }
}

/// Modules applied in order; parameters are named `"<index>.<name>"`.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}
impl Sequential {
    /// An empty stack.
    pub fn new() -> Sequential {
        Sequential::default()
    }
    /// Appends a layer.
    pub fn push(mut self, m: impl Module + 'static) -> Sequential {
        self.layers.push(Box::new(m));
        self
    }
    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }
    /// Whether it has no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}
impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for l in &self.layers {
            h = l.forward(&h)?;
        }
        Ok(h)
    }
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.layers
            .iter()
            .enumerate()
            .flat_map(|(i, l)| l.named_parameters().into_iter().map(move |(n, t)| (format!("{i}.{n}"), t)))
            .collect()
    }
    fn set_training(&mut self, on: bool) {
        for l in &mut self.layers {
            l.set_training(on);
        }
    }
}

/// Which activation an [`mlp`] uses between layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// ReLU.
    Relu,
    /// GELU (tanh form).
    Gelu,
}

/// The GEMM epilogue's activation of the same name (`cuda::gemm::GemmEpilogue` fuses it).
impl From<Activation> for crate::cuda::gemm::Activation {
    fn from(a: Activation) -> Self {
        match a {
            Activation::Relu => crate::cuda::gemm::Activation::Relu,
            Activation::Gelu => crate::cuda::gemm::Activation::Gelu,
        }
    }
}

/// A classifier MLP: `depth` linear layers (`depth - 1` hidden layers of `width`), activation between.
pub fn mlp(
    inputs: usize,
    width: usize,
    depth: usize,
    outputs: usize,
    act: Activation,
    dtype: DType,
    rng: &mut StdRng,
) -> Result<Sequential> {
    if depth == 0 {
        return Err(Error::shape("mlp", "depth must be at least 1"));
    }
    let mut s = Sequential::new();
    let mut fan_in = inputs;
    for _ in 0..depth - 1 {
        s = s.push(Linear::new(fan_in, width, true, dtype, rng)?);
        s = match act {
            Activation::Relu => s.push(ReLU),
            Activation::Gelu => s.push(GELU),
        };
        fan_in = width;
    }
    Ok(s.push(Linear::new(fan_in, outputs, true, dtype, rng)?))
}

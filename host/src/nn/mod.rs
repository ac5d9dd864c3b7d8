//! Modules: layers with named parameters, and the autocast scope of mixed-precision training.
//!
//! # Mixed precision
//!
//! The parameters stay f32 masters (the optimizer updates them in f32); inside an [`autocast`]
//! scope a [`Linear`] computes in the scope's 16-bit dtype: it takes its input in that dtype, its
//! weight and bias through [`Tensor::compute_copy`] (the optimizer-written copy where one is
//! attached, see [`crate::optim::attach_compute_copies`], else a conversion), and returns a 16-bit
//! output. Gradients flow back through the copies' records into f32 gradients of the masters.
//! [`LayerNorm`] normalizes in its parameters' dtype (f32): reductions stay wide. The loss of
//! 16-bit logits (`cross_entropy`) accumulates in f32 on both backends.
//!
//! ```
//! use kiln::nn::{Activation, Module, autocast, mlp};
//! use kiln::tensor::{DType, Tensor};
//!
//! let model = mlp(4, 8, 2, 3, Activation::Relu, DType::F32, &mut Tensor::rng(0))?;
//! let x = Tensor::ones([5, 4], DType::F32);
//! let logits = {
//!     let _mixed = autocast(DType::BF16)?;
//!     model.forward(&x)?
//! };
//! assert_eq!(logits.dtype(), DType::BF16);
//! logits.cross_entropy(&[0, 1, 2, 0, 1])?.backward()?;
//! // the masters' gradients are f32
//! assert!(model.parameters().iter().all(|p| p.grad().unwrap().dtype() == DType::F32));
//! # Ok::<(), kiln::Error>(())
//! ```

pub mod attention;
pub mod gpt;

pub use attention::{CausalSelfAttention, KvCache};
pub use gpt::{Gpt, GptConfig};

use crate::error::{Error, Result};
use crate::tensor::{DType, Tensor};
use rand::rngs::StdRng;
use std::cell::Cell;
use std::sync::Mutex;

thread_local! {
    static AUTOCAST: Cell<Option<DType>> = const { Cell::new(None) };
}

/// The 16-bit dtype this thread's [`autocast`] scope computes in, if one is open.
pub fn autocast_dtype() -> Option<DType> {
    AUTOCAST.with(|c| c.get())
}

/// Opens an autocast scope on this thread: until the guard drops, [`Linear`] layers whose
/// parameters are wider than `dtype` compute in `dtype` (bf16 or f16) from their masters' compute
/// copies (see the module's documentation). `let _mixed = autocast(DType::BF16)?;`
///
/// f16's narrow range needs loss scaling against underflowing gradients: pair an f16 scope with
/// [`crate::optim::LossScaler`] (as `kiln train --dtype f16` on CUDA does), or compute in bf16
/// (f32's range), which needs none.
#[must_use = "the scope holds only while the guard lives"]
pub fn autocast(dtype: DType) -> Result<AutocastGuard> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return Err(Error::Unsupported {
            op: "autocast",
            what: format!("{dtype:?} as the compute dtype: autocast computes in bf16 or f16 (f32 needs no scope)"),
        });
    }
    let previous = AUTOCAST.with(|c| c.replace(Some(dtype)));
    Ok(AutocastGuard { previous, _not_send: std::marker::PhantomData })
}

/// The guard of [`autocast`] (stays on its thread). Nested scopes must end in the reverse order
/// they began, as blocks do: each guard restores the setting it found.
pub struct AutocastGuard {
    previous: Option<DType>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        AUTOCAST.with(|c| c.set(self.previous));
    }
}

/// The dtype a layer with parameters of `param` computes in: the autocast dtype when one is open
/// and the parameters are wider (f32, f64), else the parameters' own.
fn compute_dtype(param: DType) -> DType {
    match autocast_dtype() {
        Some(c) if matches!(param, DType::F32 | DType::F64) => c,
        _ => param,
    }
}

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
    /// The layer as a [`Linear`], if it is one ([`Sequential`] fuses a Linear with the activation
    /// after it).
    fn as_linear(&self) -> Option<&Linear> {
        None
    }
    /// The activation this layer is, if it is one that a preceding [`Linear`] can fuse.
    fn as_activation(&self) -> Option<Activation> {
        None
    }
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

impl Linear {
    /// `act(x W^T + b)` ([`Tensor::linear`]): inside an [`autocast`] scope, in the scope's dtype
    /// from the weight's compute copy (the input converted to it) and the f32 master bias, with a
    /// 16-bit output; on CUDA in bf16 (sm_90a, inputs a multiple of 8) one fused GEMM with the
    /// bias and the activation in its epilogue. Outside a scope, in the parameters' dtype.
    pub fn forward_with(&self, x: &Tensor, act: Option<Activation>) -> Result<Tensor> {
        let c = compute_dtype(self.weight.dtype());
        let act = act.map(Into::into);
        if c == self.weight.dtype() {
            return x.linear(&self.weight, self.bias.as_ref(), act);
        }
        x.to_dtype(c)?.linear(&self.weight.compute_copy(c)?, self.bias.as_ref(), act)
    }
}

impl Module for Linear {
    /// `x W^T + b` ([`Linear::forward_with`] without an activation).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, None)
    }
    fn as_linear(&self) -> Option<&Linear> {
        Some(self)
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
    fn as_activation(&self) -> Option<Activation> {
        Some(Activation::Relu)
    }
}

/// GELU (tanh form).
pub struct GELU;
impl Module for GELU {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.gelu()
    }
    fn as_activation(&self) -> Option<Activation> {
        Some(Activation::Gelu)
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
    /// Normalizes in the parameters' dtype (inside an [`autocast`] scope a 16-bit input is widened
    /// first, so the statistics are f32), returning the parameters' dtype.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = if autocast_dtype().is_some() { x.to_dtype(self.weight.dtype())? } else { x.clone() };
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
        if !self.training || self.p == 0.0 {
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
    /// The layers in order, a [`Linear`] followed by an activation run as one
    /// [`Linear::forward_with`] (on CUDA in bf16: one fused GEMM; elsewhere the same ops as the
    /// two layers one after the other).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        let mut i = 0;
        while i < self.layers.len() {
            let next_act = self.layers.get(i + 1).and_then(|l| l.as_activation());
            if let (Some(lin), Some(act)) = (self.layers[i].as_linear(), next_act) {
                h = lin.forward_with(&h, Some(act))?;
                i += 2;
            } else {
                h = self.layers[i].forward(&h)?;
                i += 1;
            }
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

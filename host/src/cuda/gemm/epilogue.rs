//! What a fused GEMM epilogue applies to each output: a bias per column, an activation, then a
//! residual and a periodic table added after it, rounded once to C's element type. The runtime's
//! own [`Activation`]: layers above (`nn`) map theirs onto it.

use crate::cuda::DeviceBuffer;

/// An activation the GEMM epilogue fuses (the tensor-op kernels' unary ops of the same names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// GELU, tanh form.
    Gelu,
}

impl Activation {
    /// The kernels' code for this activation (`kiln_gpu::kernels::tensor_ops::unary`).
    pub(super) fn code(self) -> u32 {
        use kiln_gpu::kernels::tensor_ops::unary;
        match self {
            Activation::Relu => unary::RELU,
            Activation::Gelu => unary::GELU,
        }
    }
}

/// An element type the fused wgmma epilogue stores C in (and reads the residual and the periodic
/// table in): f32, bf16 or f16. The f32 accumulator is rounded once, to nearest-even.
pub trait GemmOutput: cudarc::driver::DeviceRepr + Copy + std::fmt::Debug + 'static {
    /// `kiln_gpu::kernels::gemm_wgmma_fused::format` code.
    const FORMAT: u32;
    /// The type's name, for errors.
    const NAME: &'static str;
}
impl GemmOutput for f32 {
    const FORMAT: u32 = kiln_gpu::kernels::gemm_wgmma_fused::format::F32;
    const NAME: &'static str = "f32";
}
impl GemmOutput for half::bf16 {
    const FORMAT: u32 = kiln_gpu::kernels::gemm_wgmma_fused::format::BF16;
    const NAME: &'static str = "bf16";
}
impl GemmOutput for half::f16 {
    const FORMAT: u32 = kiln_gpu::kernels::gemm_wgmma_fused::format::F16;
    const NAME: &'static str = "f16";
}

/// What a GEMM's epilogue applies to each output `(row, col)` of the m x n product, in f32 from the
/// f32 accumulator, in this order, then rounded once to `T` (C's element type):
///
/// `c = act(a b^T + bias[col]) + residual[row][col] + table[row % period][col]`
///
/// The bias and activation come first and the additions after, which is what a transformer needs:
/// a residual block `x + act(x W^T + b)` is one product with `x` as the residual, and a token
/// embedding plus a position table (`tok + pos[row % seq]`, seed 002's fused position embedding) is
/// one product with the table as `periodic`. `GemmEpilogue::default()` applies nothing.
#[derive(Debug)]
pub struct GemmEpilogue<'a, T = f32> {
    /// `n` biases, one per column of C.
    pub bias: Option<&'a DeviceBuffer<f32>>,
    /// The activation, after the bias.
    pub act: Option<Activation>,
    /// An m x n matrix (row-major, C's type) added after the activation.
    pub residual: Option<&'a DeviceBuffer<T>>,
    /// A `period` x n table (row-major, C's type) whose row `row % period` is added to row `row`
    /// of C, after the activation; `period >= 1` (it need not divide m).
    pub periodic: Option<(&'a DeviceBuffer<T>, u32)>,
}

impl<T> Clone for GemmEpilogue<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for GemmEpilogue<'_, T> {}
impl<T> Default for GemmEpilogue<'_, T> {
    fn default() -> Self {
        GemmEpilogue { bias: None, act: None, residual: None, periodic: None }
    }
}

impl<T> GemmEpilogue<'_, T> {
    /// Whether it fuses more than the persistent kernel's own epilogue (bias, activation).
    pub fn has_additions(&self) -> bool {
        self.residual.is_some() || self.periodic.is_some()
    }
}

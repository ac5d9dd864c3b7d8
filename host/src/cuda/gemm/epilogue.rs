//! What a fused GEMM epilogue applies to each output: a bias per column, then an activation. The
//! runtime's own [`Activation`]: layers above (`nn`) map theirs onto it.

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

/// What a GEMM's epilogue applies to each output: `c = act(a b^T + bias)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct GemmEpilogue<'a> {
    /// `n` biases, one per column of C.
    pub bias: Option<&'a DeviceBuffer<f32>>,
    /// The activation, after the bias.
    pub act: Option<Activation>,
}

//! The elementwise functions ops name and every backend implements: a leaf shared by the op records
//! (`ops.rs`), the CPU reference maps (`cpu/`) and the CUDA opcode table (`cuda_backend.rs`).

/// Elementwise functions of one tensor.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unary {
    /// -x
    Neg,
    /// e^x
    Exp,
    /// ln x
    Log,
    /// sqrt x
    Sqrt,
    /// max(x, 0)
    Relu,
    /// GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    Gelu,
    /// d GELU / dx
    GeluGrad,
    /// tanh x
    Tanh,
    /// 1 / (1 + e^-x)
    Sigmoid,
    /// 1 where x > 0, else 0
    Step,
    /// x + s
    AddScalar(f64),
    /// x * s
    MulScalar(f64),
}

/// Elementwise functions of two tensors (with broadcasting).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b
    Div,
    /// a * step(b) (`a` where `b > 0`, else `a * 0`): ReLU's backward from its output, one pass
    /// instead of a step mask and a product (the same bits).
    ReluGrad,
}

impl Binary {
    /// The op's name, for messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
            Binary::ReluGrad => "relu_grad",
        }
    }
}

//! Element types of tensors: a leaf that the error type, the tensor frontend and every backend name.

/// Element types of tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit float: the default compute type.
    F32,
    /// 64-bit float: for gradient checks and references.
    F64,
    /// bfloat16: storage and matrix products.
    BF16,
    /// IEEE half: storage and matrix products.
    F16,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F64 => 8,
            DType::BF16 | DType::F16 => 2,
        }
    }
}

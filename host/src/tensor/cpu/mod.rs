//! The CPU backend: host storage and the reference implementation of every op. Multi-threaded where
//! the work is large (std scoped threads over row blocks), with a blocked matrix product.
//!
//! Dispatch follows candle's split: each op is written once, generically over [`Float`], and the
//! dtype is matched in one place (`Map1::map`, `Map2::map`).
//!
//! - this file: [`CpuStorage`], [`Float`], the dtype dispatch and the row-parallel helper.
//! - `ops.rs`: the reference maps, and the `CpuStorage` method per op that the backend table calls.
//! - `matmul.rs`: the blocked matrix product.

mod matmul;
mod ops;

use crate::dtype::DType;
use crate::error::{Error, Result};
use half::{bf16, f16};

/// Tensor data on the host.
#[derive(Clone, Debug)]
pub enum CpuStorage {
    /// f32 elements.
    F32(Vec<f32>),
    /// f64 elements.
    F64(Vec<f64>),
    /// bf16 elements.
    BF16(Vec<bf16>),
    /// f16 elements.
    F16(Vec<f16>),
}

/// The float types ops compute in.
pub trait Float:
    Copy
    + Send
    + Sync
    + 'static
    + PartialOrd
    + Default
    + std::fmt::Debug
    + std::ops::Add<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Div<Output = Self>
    + std::ops::Neg<Output = Self>
    + std::ops::AddAssign
{
    /// The dtype tag.
    const DTYPE: DType;
    /// Zero.
    const ZERO: Self;
    /// One.
    const ONE: Self;
    /// Conversion from f64 (rounding).
    fn from_f64(x: f64) -> Self;
    /// Conversion to f64 (exact).
    fn to_f64(self) -> f64;
    /// e^x.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// Fused multiply-add `self * a + b`.
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// Wraps a vector as storage.
    fn wrap(v: Vec<Self>) -> CpuStorage;
    /// The slice, when the storage holds this type.
    fn slice(s: &CpuStorage) -> Option<&[Self]>;
    /// The mutable slice, when the storage holds this type.
    fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
    /// The larger of two values (NaN propagates).
    fn maxf(self, o: Self) -> Self {
        if self.is_nan_() || o.is_nan_() {
            return if self.is_nan_() { self } else { o };
        }
        if o > self { o } else { self }
    }
    /// NaN test.
    fn is_nan_(self) -> bool {
        self.partial_cmp(&self).is_none()
    }
}

macro_rules! float_impl {
    ($t:ty, $d:ident) => {
        impl Float for $t {
            const DTYPE: DType = DType::$d;
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            fn from_f64(x: f64) -> Self {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            fn ln(self) -> Self {
                <$t>::ln(self)
            }
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            fn mul_add(self, a: Self, b: Self) -> Self {
                <$t>::mul_add(self, a, b)
            }
            fn wrap(v: Vec<Self>) -> CpuStorage {
                CpuStorage::$d(v)
            }
            fn slice(s: &CpuStorage) -> Option<&[Self]> {
                match s {
                    CpuStorage::$d(v) => Some(v),
                    _ => None,
                }
            }
            fn slice_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
                match s {
                    CpuStorage::$d(v) => Some(v),
                    _ => None,
                }
            }
        }
    };
}
float_impl!(f32, F32);
float_impl!(f64, F64);

/// An operation on one input, written once for every float type (bf16 and f16: computed in f32,
/// each output rounded once to the input's dtype, as the CUDA kernels do).
pub(crate) trait Map1 {
    fn f<T: Float>(&self, x: &[T]) -> Result<Vec<T>>;
    fn map(&self, s: &CpuStorage) -> Result<CpuStorage> {
        match s {
            CpuStorage::F32(v) => Ok(f32::wrap(self.f(v)?)),
            CpuStorage::F64(v) => Ok(f64::wrap(self.f(v)?)),
            CpuStorage::BF16(_) | CpuStorage::F16(_) => Ok(f32::wrap(self.f(&s.as_f32())?).to_dtype(s.dtype())),
        }
    }
}

/// An operation on two inputs of the same dtype (bf16 and f16 as in [`Map1`]).
pub(crate) trait Map2 {
    const OP: &'static str;
    fn f<T: Float>(&self, a: &[T], b: &[T]) -> Result<Vec<T>>;
    fn map(&self, a: &CpuStorage, b: &CpuStorage) -> Result<CpuStorage> {
        match (a, b) {
            (CpuStorage::F32(x), CpuStorage::F32(y)) => Ok(f32::wrap(self.f(x, y)?)),
            (CpuStorage::F64(x), CpuStorage::F64(y)) => Ok(f64::wrap(self.f(x, y)?)),
            (x, y) if x.dtype() != y.dtype() => Err(Error::DType { op: Self::OP, got: y.dtype(), expected: x.dtype() }),
            // bf16 / f16 (both the same): in f32, rounded once
            (x, y) => Ok(f32::wrap(self.f(&x.as_f32(), &y.as_f32())?).to_dtype(x.dtype())),
        }
    }
}

impl CpuStorage {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F64(_) => DType::F64,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::F16(_) => DType::F16,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            CpuStorage::F32(v) => v.len(),
            CpuStorage::F64(v) => v.len(),
            CpuStorage::BF16(v) => v.len(),
            CpuStorage::F16(v) => v.len(),
        }
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Every element as f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            CpuStorage::F32(v) => v.iter().map(|&x| x as f64).collect(),
            CpuStorage::F64(v) => v.clone(),
            CpuStorage::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            CpuStorage::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
        }
    }
    /// Converts from f64 values (rounding once).
    pub fn from_f64(d: DType, v: &[f64]) -> CpuStorage {
        match d {
            DType::F32 => CpuStorage::F32(v.iter().map(|&x| x as f32).collect()),
            DType::F64 => CpuStorage::F64(v.to_vec()),
            DType::BF16 => CpuStorage::BF16(v.iter().map(|&x| crate::dtype::bf16_from_f64(x)).collect()),
            DType::F16 => CpuStorage::F16(v.iter().map(|&x| crate::dtype::f16_from_f64(x)).collect()),
        }
    }
    /// Converts to another dtype (f32 <-> bf16/f16 round to nearest even).
    pub fn to_dtype(&self, d: DType) -> CpuStorage {
        match (self, d) {
            (CpuStorage::F32(v), DType::BF16) => CpuStorage::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
            (CpuStorage::F32(v), DType::F16) => CpuStorage::F16(v.iter().map(|&x| f16::from_f32(x)).collect()),
            (CpuStorage::BF16(v), DType::F32) => CpuStorage::F32(v.iter().map(|x| x.to_f32()).collect()),
            (CpuStorage::F16(v), DType::F32) => CpuStorage::F32(v.iter().map(|x| x.to_f32()).collect()),
            (s, d) if s.dtype() == d => s.clone(),
            (s, d) => CpuStorage::from_f64(d, &s.to_f64_vec()),
        }
    }
    /// f32 view of the data (converting 16-bit types), for matrix products.
    pub(crate) fn as_f32(&self) -> std::borrow::Cow<'_, [f32]> {
        match self {
            CpuStorage::F32(v) => std::borrow::Cow::Borrowed(v),
            other => match other.to_dtype(DType::F32) {
                CpuStorage::F32(v) => std::borrow::Cow::Owned(v),
                _ => unreachable!("to_dtype(F32) gives F32"),
            },
        }
    }
}

/// How many threads the CPU backend uses (`KILN_CPU_THREADS`, default: available parallelism).
pub fn num_threads() -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::env::var("KILN_CPU_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
            .max(1)
    })
}

/// Runs `f(row_start, rows_chunk)` over `out` split into chunks of whole rows of `row_len`, in
/// parallel when the work is large. Each chunk is written by one thread: results do not depend on
/// the thread count.
pub(crate) fn par_rows<T: Send>(
    out: &mut [T],
    row_len: usize,
    work_per_row: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let rows = out.len().checked_div(row_len).unwrap_or(0);
    let threads = num_threads().min(rows.max(1));
    if threads <= 1 || rows * work_per_row.max(1) < 1 << 15 {
        f(0, out);
        return;
    }
    let per = rows.div_ceil(threads);
    std::thread::scope(|s| {
        for (i, chunk) in out.chunks_mut(per * row_len).enumerate() {
            let f = &f;
            s.spawn(move || f(i * per, chunk));
        }
    });
}

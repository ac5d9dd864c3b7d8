//! Batched 16-bit products with both sides batched (`[batch, m, k] x [batch, k, n]`) on the tensor
//! cores: the persistent `wgmma` kernel's strided batches (sm_90a, bf16), f32 accumulation, one
//! narrowing pass to bf16.
//!
//! The kernel reads both operands K-major (`a_i` m x k, `b_i` n x k: `c_i = a_i b_i^T`), so a
//! right operand that is a transposed view of contiguous `[batch, n, k]` data (attention's `q
//! k^T`, the input gradient `g b^T`) is read in place; a contiguous `[batch, k, n]` one is
//! transposed once by a strided copy. Rows whose k is not a multiple of 8 (TMA's 16-byte pitch)
//! are zero-padded by one packing pass. Elsewhere (f16, devices without sm_90a, stacked rows past
//! the tensor maps' 32-bit coordinates) the product is the parent's widened f32 path.

use super::super::{CudaData, CudaStorage, grid};
use super::{narrow_to, output, p, pm};
use crate::cuda::gemm::{BatchSpec, WgmmaGemm};
use crate::dtype::DType;
use crate::error::{Error, Result};
use half::bf16;
use kiln_gpu::kernels::convert::PACK_K_MULTIPLE;
use kiln_gpu::kernels::gemm_wgmma::GemmWgmmaBf16Persistent;
use kiln_gpu::kernels::mma_tile::GemmShape;
use kiln_gpu::kernels::tensor_b16 as t;

/// Whether a batch of `batch` products (m x n out, reduction k) of `dtype` operands runs on the
/// strided-batch `wgmma` kernel on a device that `has_wgmma`: bf16, more than one non-empty
/// product, each product's sizes within 32 bits and the stacked rows of A (`batch m`) and B
/// (`batch n`) within the tensor maps' signed 32-bit coordinates. Pure; unit-tested on the CPU.
pub(crate) fn takes_batched_wgmma(dtype: DType, has_wgmma: bool, batch: usize, m: usize, k: usize, n: usize) -> bool {
    let fits = |x: usize| x <= i32::MAX as usize;
    let kp = k.next_multiple_of(PACK_K_MULTIPLE as usize);
    dtype == DType::BF16
        && has_wgmma
        && batch > 1
        && m > 0
        && k > 0
        && n > 0
        && batch <= u32::MAX as usize
        && [m, n, kp].into_iter().all(fits)
        && batch.checked_mul(m).is_some_and(fits)
        && batch.checked_mul(n).is_some_and(fits)
}

impl CudaStorage {
    /// Whether [`CudaStorage::matmul_batched_abt`] multiplies this batch on the `wgmma` kernel
    /// (see [`takes_batched_wgmma`]).
    pub(in crate::tensor) fn batched_on_wgmma(&self, batch: usize, m: usize, k: usize, n: usize) -> bool {
        takes_batched_wgmma(self.dtype(), self.dev.supports::<GemmWgmmaBf16Persistent>(), batch, m, k, n)
    }

    /// `batch` products `c_i = a_i b_i^T`: `self` holds the `a_i` (`[batch, m, k]`, row-major),
    /// `bt` the `b_i` transposed (`[batch, n, k]`, row-major); the result is `[batch, m, n]`. bf16
    /// on sm_90a: the strided-batch `wgmma` kernel reading both in place (rows padded to a
    /// multiple of 8 by one packing pass where k is not), f32 accumulation, rounded once. Other
    /// dtypes and devices: `bt` transposed back by a strided copy and [`CudaStorage::matmul`].
    pub fn matmul_batched_abt(
        &self,
        bt: &CudaStorage,
        batch: usize,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<CudaStorage> {
        let (na, nb) = (batch.checked_mul(m * k), batch.checked_mul(n * k));
        if na != Some(self.len) || nb != Some(bt.len) {
            return Err(Error::shape(
                "matmul",
                format!(
                    "a batch of {batch} products {m}x{k} by ({n}x{k})^T needs {na:?} and {nb:?} elements, got {} and {}",
                    self.len, bt.len
                ),
            ));
        }
        if self.dtype() != bt.dtype() {
            return Err(Error::DType { op: "matmul", got: bt.dtype(), expected: self.dtype() });
        }
        if let (CudaData::BF16(x), CudaData::BF16(y)) = (&self.data, &bt.data)
            && self.batched_on_wgmma(batch, m, k, n)
        {
            return self.batched_wgmma(x, y, batch, m, k, n);
        }
        // B (n x k per product) read back as k x n: the batched product of the dtype
        let b = bt.view_copy(&[batch, k, n], &[n * k, 1, k], 0)?;
        self.matmul(&b, batch, m, k, n, true)
    }

    /// The strided-batch `wgmma` product of [`CudaStorage::matmul_batched_abt`] (checked there).
    fn batched_wgmma(
        &self,
        x: &crate::cuda::DeviceBuffer<bf16>,
        y: &crate::cuda::DeviceBuffer<bf16>,
        batch: usize,
        m: usize,
        k: usize,
        n: usize,
    ) -> Result<CudaStorage> {
        let kp = k.next_multiple_of(PACK_K_MULTIPLE as usize);
        // rows of k zero-padded to kp (None: already kp wide)
        let pack = |src: &crate::cuda::DeviceBuffer<bf16>, rows: usize| -> Result<Option<_>> {
            if kp == k {
                return Ok(None);
            }
            let len = rows * kp;
            let mut dst = output::<bf16>(&self.dev, len)?;
            let (_, cfg) = grid(len, "matmul")?;
            // SAFETY: src holds rows x k values, dst rows x kp (grid checked rows kp below 2^32).
            unsafe {
                self.dev.launch(t::PackB16, cfg, (p(src), pm(&mut dst), rows as u32, k as u32, kp as u32, 0u32))?
            };
            Ok(Some(dst))
        };
        let (pa, pb) = (pack(x, batch * m)?, pack(y, batch * n)?);
        let (a, b) = (pa.as_ref().unwrap_or(x), pb.as_ref().unwrap_or(y));
        let mut c32 = CudaStorage::output(&self.dev, batch * m * n)?;
        let s = GemmShape { m: m as u32, n: n as u32, k: kp as u32 };
        let spec = BatchSpec { count: batch as u32, a_stride: m * kp, b_stride: n * kp, c_stride: m * n };
        WgmmaGemm::batched(&self.dev, a, b, s, spec)?.run(c32.f32_mut())?;
        narrow_to::<bf16>(&c32)
    }
}

#[cfg(test)]
mod tests {
    use super::takes_batched_wgmma;
    use crate::dtype::DType;

    #[test]
    fn batched_wgmma_takes_bf16_batches_on_sm90a_only() {
        assert!(takes_batched_wgmma(DType::BF16, true, 3, 5, 7, 9));
        assert!(!takes_batched_wgmma(DType::BF16, false, 3, 5, 7, 9), "no sm_90a");
        assert!(!takes_batched_wgmma(DType::F16, true, 3, 5, 7, 9), "f16 has no wgmma kernel here");
        assert!(!takes_batched_wgmma(DType::F32, true, 3, 5, 7, 9));
        assert!(!takes_batched_wgmma(DType::BF16, true, 1, 5, 7, 9), "one product: the 2-D path");
        assert!(!takes_batched_wgmma(DType::BF16, true, 3, 0, 7, 9), "empty");
        assert!(!takes_batched_wgmma(DType::BF16, true, 3, 5, 0, 9), "empty sum");
        // stacked rows past the tensor maps' signed 32-bit coordinates
        assert!(!takes_batched_wgmma(DType::BF16, true, 1 << 20, 1 << 12, 8, 8));
        assert!(takes_batched_wgmma(DType::BF16, true, 1 << 10, 1 << 12, 8, 8));
    }
}

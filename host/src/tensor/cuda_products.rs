//! The CUDA backend's matrix products: one product in a GEMM layout read in place
//! ([`CudaStorage::matmul_layout`]) and the batched product ([`CudaStorage::matmul`]); bf16 / f16
//! through `cuda_b16.rs` (and its strided-batch `wgmma` path, `cuda_batched.rs`).

use super::*;

impl CudaStorage {
    /// One product `op(self) op(b)` in `layout` (m x n out, reduction k), read in place: by the
    /// GEMM ladder's layout rungs at [`MatmulPrecision::F32`], where `None` says the rows are not
    /// 16-byte multiples (the caller transposes and multiplies NN instead); by
    /// [`gemm_bf16`](crate::cuda::gemm::gemm_bf16) at [`MatmulPrecision::Bf16`], which takes every
    /// shape.
    pub fn matmul_layout(
        &self,
        b: &CudaStorage,
        m: usize,
        k: usize,
        n: usize,
        layout: Layout,
    ) -> Result<Option<CudaStorage>> {
        let (x, y) = match (&self.data, &b.data) {
            (CudaData::F32(x), CudaData::F32(y)) => (x, y),
            (CudaData::BF16(x), CudaData::BF16(y)) => return self.matmul_layout_b16(x, y, m, k, n, layout).map(Some),
            (CudaData::F16(x), CudaData::F16(y)) => return self.matmul_layout_b16(x, y, m, k, n, layout).map(Some),
            _ => return Err(Error::DType { op: "matmul", got: b.dtype(), expected: self.dtype() }),
        };
        let v = u32s("matmul", &[m, n, k])?;
        let s = kiln_gpu::kernels::mma_tile::GemmShape { m: v[0], n: v[1], k: v[2] };
        let bf16 = crate::cuda::matmul_precision() == MatmulPrecision::Bf16;
        if m * n == 0 || k == 0 || !(bf16 || layout.rows_aligned(s)) {
            return Ok(None);
        }
        let mut c = Self::alloc(&self.dev, m * n)?;
        if bf16 {
            crate::cuda::gemm::gemm_bf16(&self.dev, x, y, c.f32_mut(), s, layout)?;
        } else {
            crate::cuda::gemm::sgemm_layout(&self.dev, x, y, c.f32_mut(), s, layout)?;
        }
        Ok(Some(c))
    }

    /// `self b^T` (m x n; `self` m x k, `b` stored n x k), `b` read in place: the NT layout (see
    /// [`CudaStorage::matmul_layout`]; `None` where its rungs do not take the shape).
    pub fn matmul_abt(&self, b: &CudaStorage, m: usize, k: usize, n: usize) -> Result<Option<CudaStorage>> {
        self.matmul_layout(b, m, k, n, Layout::NT)
    }

    /// `self^T b` (m x n; `self` stored k x m, `b` k x n), `self` read in place: the TN layout (see
    /// [`CudaStorage::matmul_layout`]; `None` where its rungs do not take the shape).
    pub fn matmul_atb(&self, b: &CudaStorage, m: usize, k: usize, n: usize) -> Result<Option<CudaStorage>> {
        self.matmul_layout(b, m, k, n, Layout::TN)
    }

    /// Batched product (see `Tensor::matmul`). bf16 batches with a batched B on sm_90a run on the
    /// strided-batch `wgmma` kernel ([`CudaStorage::matmul_batched_abt`], B transposed once).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        b: &CudaStorage,
        batch: usize,
        m: usize,
        kk: usize,
        n: usize,
        b_batched: bool,
    ) -> Result<CudaStorage> {
        let (x, y) = match (&self.data, &b.data) {
            (CudaData::F32(x), CudaData::F32(y)) => (x, y),
            (CudaData::BF16(_), CudaData::BF16(_)) if b_batched && self.batched_on_wgmma(batch, m, kk, n) => {
                // B transposed once to n x k per product, for the strided-batch wgmma kernel
                let bt = b.view_copy(&[batch, n, kk], &[kk * n, 1, n], 0)?;
                return self.matmul_batched_abt(&bt, batch, m, kk, n);
            }
            (CudaData::BF16(x), CudaData::BF16(y)) => return self.matmul_b16(x, y, batch, m, kk, n, b_batched),
            (CudaData::F16(x), CudaData::F16(y)) => return self.matmul_b16(x, y, batch, m, kk, n, b_batched),
            _ => return Err(Error::DType { op: "matmul", got: b.dtype(), expected: self.dtype() }),
        };
        let mut c = Self::alloc(&self.dev, batch * m * n)?;
        if batch * m * n == 0 || kk == 0 {
            return Ok(c); // zeros
        }
        if batch == 1 || !b_batched {
            // One product (a batch against a shared B is one (batch * m) x k product): the GEMM
            // ladder's chooser picks the kernel.
            let s = kiln_gpu::kernels::mma_tile::GemmShape { m: (batch * m) as u32, n: n as u32, k: kk as u32 };
            if crate::cuda::matmul_precision() == MatmulPrecision::Bf16 {
                let nn = Layout::NN;
                crate::cuda::gemm::gemm_bf16(&self.dev, x, y, c.f32_mut(), s, nn)?;
            } else {
                crate::cuda::gemm::sgemm(&self.dev, x, y, c.f32_mut(), s)?;
            }
            return Ok(c);
        }
        let v = u32s("matmul", &[m, n, kk, batch])?;
        let s = MatmulShape {
            m: v[0],
            n: v[1],
            k: v[2],
            a_stride: (m * kk) as u32,
            b_stride: if b_batched { (kk * n) as u32 } else { 0 },
        };
        let t = k::MATMUL_TILE;
        if v[0].div_ceil(t) > 65535 || v[3] > 65535 {
            return Err(Error::Unsupported {
                op: "matmul",
                what: format!(
                    "{m} rows or {batch} batches on CUDA (the grid allows 65535 x 16 rows and 65535 batches)"
                ),
            });
        }
        let cfg = LaunchConfig {
            grid_dim: (v[1].div_ceil(t), v[0].div_ceil(t), v[3]),
            block_dim: (t, t, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: a, b and c hold the products' operands as described by `s`.
        unsafe { self.dev.launch(k::MatmulF32, cfg, (x.ptr(), y.ptr(), c.f32_mut().ptr_mut(), s))? };
        Ok(c)
    }
}

//! The fused Linear layer of the CUDA backend: `y = act(x W^T + b)` as one `wgmma` GEMM whose
//! epilogue adds the f32 bias and applies the activation to the f32 accumulator, then stores bf16
//! once (no f32 product, no narrowing pass); and its backward with every operand read in place:
//! `dX = dY W` (the [`WgmmaLayout::AB`] layout, bf16 out), `dW = dY^T X` ([`WgmmaLayout::AtB`],
//! f32 out: the master weights' gradient directly), `db` by [`column_sums`] in f32.
//!
//! Whether the fused kernels take a case is decided before anything is launched
//! ([`fused_linear_refusal`], a pure function of the dtypes, the shape and the device's module);
//! where they do not, the methods return `None` and the tensor layer composes the layer from its
//! ordinary ops (`matmul_t`, `add`, the activation), so no case is ever computed wrongly.

use super::{CudaData, CudaStorage, u32s};
use crate::cuda::gemm::{Activation, GemmEpilogue, WgmmaGemm, WgmmaLayout, column_sums};
use crate::dtype::DType;
use crate::error::Result;
use kiln_gpu::kernels::gemm_wgmma_fused::GemmWgmmaBf16Fused;
use kiln_gpu::kernels::mma_tile::GemmShape;

/// Why the fused Linear does not take a case, or `None` when it does: `x` (rows x k) and `w`
/// (n x k) bf16, the bias (if any) f32, the device's module has the fused `wgmma` kernel (sm_90a),
/// `k % 8 == 0` (TMA's 16-byte row pitch of both operands), no empty dimension; the backward's
/// in-place layouts also need `n % 8 == 0` (the pitch of dY read MN-major and of W read
/// MN-major).
pub(crate) fn fused_linear_refusal(
    has_fused_kernel: bool,
    x: DType,
    w: DType,
    bias: Option<DType>,
    (rows, k, n): (usize, usize, usize),
    backward: bool,
) -> Option<String> {
    if x != DType::BF16 || w != DType::BF16 {
        return Some(format!("{x:?} input and {w:?} weight: the fused Linear multiplies bf16"));
    }
    if let Some(b) = bias.filter(|b| *b != DType::F32) {
        return Some(format!("a {b:?} bias: the fused epilogue adds an f32 bias"));
    }
    if !has_fused_kernel {
        return Some("the device's module has no gemm_wgmma_bf16_fused (sm_90a only)".into());
    }
    if rows == 0 || k == 0 || n == 0 {
        return Some(format!("an empty product ({rows} x {k} by {n} x {k})"));
    }
    if !k.is_multiple_of(8) {
        return Some(format!("{k} inputs: TMA needs rows of a multiple of 8 bf16 (16 bytes)"));
    }
    if backward && !n.is_multiple_of(8) {
        return Some(format!("{n} outputs: the backward reads dY and W with rows of n, a multiple of 8"));
    }
    if u32s("linear", &[rows, k, n]).is_err() {
        return Some(format!("{rows} x {k} by {n}: beyond 32-bit sizes"));
    }
    None
}

impl CudaStorage {
    /// The fused Linear forward, `act(self w^T + bias)` (rows x n, bf16), or `None` where
    /// [`fused_linear_refusal`] refuses the case.
    pub(crate) fn linear_fused(
        &self,
        w: &CudaStorage,
        bias: Option<&CudaStorage>,
        act: Option<Activation>,
        (rows, k, n): (usize, usize, usize),
    ) -> Result<Option<CudaStorage>> {
        let has = self.dev.supports::<GemmWgmmaBf16Fused>();
        if fused_linear_refusal(has, self.dtype(), w.dtype(), bias.map(|b| b.dtype()), (rows, k, n), false).is_some() {
            return Ok(None);
        }
        let (CudaData::BF16(x), CudaData::BF16(wb)) = (&self.data, &w.data) else { return Ok(None) };
        let b = match bias.map(|b| &b.data) {
            None => None,
            Some(CudaData::F32(b)) => Some(b),
            Some(_) => return Ok(None),
        };
        // the GEMM checks its buffers' exact lengths: storages of exactly the tensors' elements
        if x.len() != rows * k || wb.len() != n * k || b.is_some_and(|b| b.len() != n) {
            return Ok(None);
        }
        let s = GemmShape { m: rows as u32, n: n as u32, k: k as u32 };
        let mut y = self.dev.alloc_uninit_bf16(rows * n)?;
        let epi = GemmEpilogue { bias: b, act, residual: None, periodic: None };
        WgmmaGemm::new(&self.dev, x, wb, s)?.run_fused(&mut y, epi)?;
        Ok(Some(CudaStorage::wrap(&self.dev, CudaData::BF16(y), rows * n)))
    }

    /// The fused Linear backward from `self`, the gradient of the product before the activation
    /// (rows x n, bf16): `(dx, dw, db)` with `dx = self w` (rows x k, bf16), `dw = self^T x`
    /// (n x k, f32) and, when `bias`, `db` the column sums of `self` (n, f32); `None` where
    /// [`fused_linear_refusal`] refuses the case (with `backward`).
    pub(crate) fn linear_fused_backward(
        &self,
        x: &CudaStorage,
        w: &CudaStorage,
        (rows, k, n): (usize, usize, usize),
        bias: bool,
    ) -> Result<Option<(CudaStorage, CudaStorage, Option<CudaStorage>)>> {
        let has = self.dev.supports::<GemmWgmmaBf16Fused>();
        let dtypes_match = self.dtype() == DType::BF16;
        if !dtypes_match || fused_linear_refusal(has, x.dtype(), w.dtype(), None, (rows, k, n), true).is_some() {
            return Ok(None);
        }
        let (CudaData::BF16(g), CudaData::BF16(xb), CudaData::BF16(wb)) = (&self.data, &x.data, &w.data) else {
            return Ok(None);
        };
        if g.len() != rows * n || xb.len() != rows * k || wb.len() != n * k {
            return Ok(None);
        }
        let (r, k32, n32) = (rows as u32, k as u32, n as u32);
        // dX (rows x k) = dY (rows x n) W (n x k): W read MN-major in place
        let mut dx = self.dev.alloc_uninit_bf16(rows * k)?;
        WgmmaGemm::with_layout(&self.dev, g, wb, GemmShape { m: r, n: k32, k: n32 }, WgmmaLayout::AB)?
            .run_fused(&mut dx, GemmEpilogue::default())?;
        // dW (n x k) = dY^T (n x rows) X (rows x k): both read MN-major in place, f32 out; few
        // output tiles over many rows take a k split (fixed order: the same bits every run)
        let mut dw = self.dev.alloc_uninit_f32(n * k)?;
        let plan = WgmmaGemm::with_layout(&self.dev, g, xb, GemmShape { m: n32, n: k32, k: r }, WgmmaLayout::AtB)?;
        let split = plan.auto_split_k();
        plan.with_split_k(split)?.run_fused(&mut dw, GemmEpilogue::default())?;
        let db = if bias {
            let mut db = self.dev.alloc_uninit_f32(n)?;
            column_sums(&self.dev, g, &mut db, r, n32)?;
            Some(CudaStorage::wrap(&self.dev, CudaData::F32(db), n))
        } else {
            None
        };
        Ok(Some((
            CudaStorage::wrap(&self.dev, CudaData::BF16(dx), rows * k),
            CudaStorage::wrap(&self.dev, CudaData::F32(dw), n * k),
            db,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: DType = DType::BF16;

    #[test]
    fn the_fused_linear_takes_bf16_k_multiple_of_8_on_sm_90a_only() {
        assert_eq!(fused_linear_refusal(true, B, B, Some(DType::F32), (37, 64, 29), false), None);
        assert_eq!(fused_linear_refusal(true, B, B, None, (1, 8, 1), false), None);
        // the backward also needs n % 8
        assert!(fused_linear_refusal(true, B, B, None, (37, 64, 29), true).unwrap().contains("29 outputs"));
        assert_eq!(fused_linear_refusal(true, B, B, None, (37, 64, 24), true), None);
        let refused = [
            (true, DType::F32, DType::F32, None, (4, 8, 8), "multiplies bf16"),
            (true, B, DType::F16, None, (4, 8, 8), "multiplies bf16"),
            (true, B, B, Some(B), (4, 8, 8), "f32 bias"),
            (false, B, B, None, (4, 8, 8), "sm_90a"),
            (true, B, B, None, (4, 12, 8), "12 inputs"),
            (true, B, B, None, (0, 8, 8), "empty"),
            (true, B, B, None, (1 << 33, 8, 8), "32-bit"),
        ];
        for (has, x, w, b, shape, why) in refused {
            let r = fused_linear_refusal(has, x, w, b, shape, false).expect("refused");
            assert!(r.contains(why), "{r} (expected {why})");
        }
    }
}

//! Flash attention in the CUDA backend: the forward of `Tensor::scaled_dot_product_attention` on
//! the flash kernels of [`crate::cuda::attention`] (the best verified forward per dtype:
//! [`FlashKernel::MmaSync`] for bf16 and f16), and its backward through
//! [`flash_backward_with`](crate::cuda::attention::flash_backward_with) on the kernel
//! [`flash_backward_kernel`](crate::cuda::attention::flash_backward_kernel) names.
//!
//! Whether the flash kernels take a case is decided before anything is launched
//! ([`flash_op_kernel`]); where they do not, the forward returns `None` and the tensor layer
//! composes attention from its ordinary ops (the naive path), so no case is computed wrongly.

use super::{CudaData, CudaStorage};
use crate::cuda::attention::{self as fa, AttentionShape, FlashKernel};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The forward kernel the attention op runs for `dtype` at `shape` on a device whose module is
/// `arch`, or `None` where the op takes its naive path: bf16 and f16 at the flash head dims on the
/// best verified forward ([`fa::flash_forward_kernel`]: the TMA + `wgmma` rung on sm_90a,
/// [`FlashKernel::MmaSync`] elsewhere), and only where a backward kernel exists for the dtype when
/// `need_grad` (f32 runs the naive path: its products are the verified f32 GEMMs). Cases the
/// launcher's checks refuse (grid limits) are naive too.
pub(crate) fn flash_op_kernel(
    dtype: DType,
    shape: AttentionShape,
    scale: f32,
    need_grad: bool,
    arch: kiln_gpu::Arch,
) -> Option<FlashKernel> {
    if !matches!(dtype, DType::BF16 | DType::F16) {
        return None;
    }
    let kernel = fa::flash_forward_kernel(dtype, shape.head_dim, arch)?;
    if need_grad && fa::flash_backward_kernel(dtype, shape.head_dim, arch).is_none() {
        return None;
    }
    let lens = [shape.q_elems(), shape.kv_elems(), shape.kv_elems(), shape.q_elems(), shape.lse_elems()];
    // the tensors' buffers are fresh allocations (aligned); the sizes are the shape's own
    fa::check_forward(kernel, dtype, shape, scale, lens, [0; 5]).ok()?;
    fa::check_arch(kernel, arch).ok()?;
    Some(kernel)
}

impl CudaStorage {
    /// `(o, lse)` of attention of `self` (q), `k`, `v` (dense `[batch, heads, seq, head_dim]`, one
    /// dtype, equal heads), `lse` f32 `[batch, heads, q_len]`; `None` where [`flash_op_kernel`]
    /// refuses the case.
    pub(crate) fn flash_attention(
        &self,
        k: &CudaStorage,
        v: &CudaStorage,
        shape: AttentionShape,
        causal: bool,
        scale: f32,
        need_grad: bool,
    ) -> Result<Option<(CudaStorage, CudaStorage)>> {
        let Some(kernel) = flash_op_kernel(self.dtype(), shape, scale, need_grad, self.dev.arch()) else {
            return Ok(None);
        };
        if shape.q_elems() == 0 || shape.kv_elems() == 0 {
            return Ok(None);
        }
        let mut o = CudaStorage::scratch(&self.dev, shape.q_elems(), self.dtype())?;
        let mut lse = CudaStorage::scratch(&self.dev, shape.lse_elems(), DType::F32)?;
        let lse_buf = lse.f32_mut();
        let dev = &self.dev;
        match (&self.data, &k.data, &v.data, &mut o.data) {
            (CudaData::BF16(q), CudaData::BF16(k), CudaData::BF16(v), CudaData::BF16(o)) => {
                fa::flash_forward(dev, kernel, q, k, v, o, lse_buf, shape, causal, scale)?
            }
            (CudaData::F16(q), CudaData::F16(k), CudaData::F16(v), CudaData::F16(o)) => {
                fa::flash_forward(dev, kernel, q, k, v, o, lse_buf, shape, causal, scale)?
            }
            _ => return Ok(None),
        }
        Ok(Some((o, lse)))
    }

    /// `(dq, dk, dv)` of the attention whose forward [`CudaStorage::flash_attention`] computed:
    /// `self` is q; `o` and `lse` the forward's outputs, `d_o` the output's gradient (dense, q's
    /// dtype).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn flash_attention_backward(
        &self,
        k: &CudaStorage,
        v: &CudaStorage,
        o: &CudaStorage,
        d_o: &CudaStorage,
        lse: &CudaStorage,
        shape: AttentionShape,
        causal: bool,
        scale: f32,
    ) -> Result<(CudaStorage, CudaStorage, CudaStorage)> {
        const OP: &str = "attention backward";
        let dtype = self.dtype();
        let kernel =
            fa::flash_backward_kernel(dtype, shape.head_dim, self.dev.arch()).ok_or_else(|| Error::Unsupported {
                op: OP,
                what: format!("{dtype:?} at head dim {}: no flash backward kernel takes it", shape.head_dim),
            })?;
        let lse = lse.f32_buf(OP)?;
        let mut dq = CudaStorage::scratch(&self.dev, shape.q_elems(), dtype)?;
        let mut dk = CudaStorage::scratch(&self.dev, shape.kv_elems(), dtype)?;
        let mut dv = CudaStorage::scratch(&self.dev, shape.kv_elems(), dtype)?;
        let dev = &self.dev;
        match (&self.data, &k.data, &v.data, &o.data, &d_o.data, &mut dq.data, &mut dk.data, &mut dv.data) {
            (
                CudaData::BF16(q),
                CudaData::BF16(k),
                CudaData::BF16(v),
                CudaData::BF16(o),
                CudaData::BF16(d_o),
                CudaData::BF16(dq),
                CudaData::BF16(dk),
                CudaData::BF16(dv),
            ) => fa::flash_backward_with(dev, kernel, (q, k, v, o, d_o), lse, (dq, dk, dv), shape, causal, scale)?,
            (
                CudaData::F16(q),
                CudaData::F16(k),
                CudaData::F16(v),
                CudaData::F16(o),
                CudaData::F16(d_o),
                CudaData::F16(dq),
                CudaData::F16(dk),
                CudaData::F16(dv),
            ) => fa::flash_backward_with(dev, kernel, (q, k, v, o, d_o), lse, (dq, dk, dv), shape, causal, scale)?,
            (
                CudaData::F32(q),
                CudaData::F32(k),
                CudaData::F32(v),
                CudaData::F32(o),
                CudaData::F32(d_o),
                CudaData::F32(dq),
                CudaData::F32(dk),
                CudaData::F32(dv),
            ) => fa::flash_backward_with(dev, kernel, (q, k, v, o, d_o), lse, (dq, dk, dv), shape, causal, scale)?,
            _ => {
                return Err(Error::Unsupported {
                    op: OP,
                    what: "q, k, v, o and the output's gradient of different dtypes".into(),
                });
            }
        }
        Ok((dq, dk, dv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_op_runs_flash_for_16_bit_types_at_the_flash_head_dims_and_naive_elsewhere() {
        const A: kiln_gpu::Arch = kiln_gpu::Arch::Sm80;
        let s = AttentionShape { batch: 2, heads: 4, q_len: 17, kv_len: 129, head_dim: 64 };
        assert_eq!(flash_op_kernel(DType::BF16, s, 0.125, true, A), Some(FlashKernel::MmaSync));
        assert_eq!(flash_op_kernel(DType::BF16, s, 0.125, true, kiln_gpu::Arch::Sm90a), Some(FlashKernel::Wgmma));
        assert_eq!(flash_op_kernel(DType::F16, s, 0.125, false, A), Some(FlashKernel::MmaSync));
        // f16 with a gradient runs flash only once a backward kernel takes f16
        assert_eq!(
            flash_op_kernel(DType::F16, s, 0.125, true, A).is_some(),
            fa::flash_backward_kernel(DType::F16, 64, A).is_some()
        );
        assert_eq!(flash_op_kernel(DType::F32, s, 0.125, false, A), None);
        assert_eq!(flash_op_kernel(DType::BF16, AttentionShape { head_dim: 96, ..s }, 0.1, false, A), None);
        assert_eq!(flash_op_kernel(DType::BF16, s, -1.0, false, A), None);
        assert_eq!(flash_op_kernel(DType::BF16, AttentionShape { batch: 300, heads: 300, ..s }, 0.1, false, A), None);
    }
}

//! The GEMM ladder's kernels (the files in `gemm/`), from the FP32 rungs to the tensor cores: each
//! rung changes one thing, and the guide (`guide/src/gemm/`) measures what it buys. The modules are
//! `kernels::sgemm` and so on (see [`crate::kernels`]), re-exported here; this module holds the
//! problem shape they share.
//!
//! - [`sgemm`]: FP32 on CUDA cores, naive to warp tiling, and the NT / TN layouts.
//! - [`hgemm_mma`]: bf16 / f16 on `mma.sync` with a `cp.async` pipeline, and a TMA-fed variant.
//! - [`gemm_wgmma`]: Hopper TMA + `wgmma`, wide, persistent in clusters, split k, strided batches.
//! - [`gemm_wgmma_fused`]: the persistent wgmma kernel with a wider epilogue (bf16 / f16 C,
//!   residual, periodic table) and MN-major operands (backward products read in place).
//! - [`gemm_tcgen05`]: Blackwell `tcgen05.mma` into tensor memory (assembled only).

use crate::KernelParam;

pub use super::{gemm_tcgen05, gemm_wgmma, gemm_wgmma_fused, hgemm_mma, sgemm};

/// Problem shape of a tile product `C[m][n] = sum_k A[m][k] * B[n][k]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmShape {
    /// Rows of A and C.
    pub m: u32,
    /// Rows of B, columns of C.
    pub n: u32,
    /// Columns of A and B (the reduction).
    pub k: u32,
}
// SAFETY: repr(C), three u32.
unsafe impl KernelParam for GemmShape {}

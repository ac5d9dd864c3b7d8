//! GEMMs on the host: every matrix-product kernel's launcher, its checks and its choice of kernel.
//!
//! ```text
//!   f32 tensors ──▶ fp32   (the FP32 ladder's rungs; the chooser reads `tuned`, keyed by `layout`)
//!               └─▶ bf16   (pack once, then the best verified tensor-core kernel:)
//!                          ├─▶ wgmma    (sm_90a: persistent TMA + wgmma, fused `epilogue`:
//!                          │             bias, activation, residual, periodic table, bf16/f16 C;
//!                          │             A B^T, A B and A^T B read in place; column sums)
//!                          ├─▶ tcgen05  (sm_100a; not verified on a GPU)
//!                          └─▶ mma_sync (every GPU: mma.sync + cp.async)
//!   bf16 / f16  ──▶ typed  (deterministic: widen, FP32 rung, round once)
//! ```
//!
//! Every entry point checks its operands and launches through one helper (`check.rs`): sizes
//! against the shape, 32-bit indexing, k's multiple, alignment, empty products, the grid.

mod bf16;
mod check;
mod epilogue;
mod fp32;
mod layout;
mod mma_sync;
mod tcgen05;
pub mod tuned;
mod typed;
mod wgmma;

pub use bf16::{TCGEN05_VERIFIED, TensorCores, gemm_bf16, gemm_bf16_on};
pub use check::MAX_OPERAND_ELEMENTS;
pub use epilogue::{Activation, GemmEpilogue, GemmOutput};
pub use fp32::{
    LAYOUT_RUNGS, Mapping, RUNGS, Rung, choose, choose_layout, rung, sgemm, sgemm_layout, tuning_candidates,
    tuning_pick,
};
pub use layout::{Layout, SizeClass};
pub use mma_sync::{HgemmArgs, HgemmInput, hgemm, hgemm_tile_for, hgemm_with_tile};
pub use tcgen05::gemm_tcgen05;
pub use typed::{TypedTier, typed_gemm};
pub use wgmma::{BatchSpec, WgmmaGemm, WgmmaLayout, WgmmaTile, column_sum_chunks, column_sums, engine_split_k};

/// The tensor map of a K-major bf16 operand of the TMA-fed kernels (`wgmma`, `tcgen05`, the
/// TMA-fed `mma.sync`): `rows` rows of `k`, boxes of `box_rows` rows by one 64-wide k tile, 128-byte
/// swizzle.
fn operand_spec(rows: u32, k: u32, box_rows: u32) -> super::TensorMapSpec {
    use kiln_gpu::kernels::gemm_wgmma::{WG_BK, WG_SWIZZLE};
    super::TensorMapSpec {
        dtype: super::TmaDtype::Bf16,
        rows: rows as u64,
        cols: k as u64,
        row_pitch: k as u64,
        box_rows,
        box_cols: WG_BK,
        swizzle: WG_SWIZZLE,
    }
}

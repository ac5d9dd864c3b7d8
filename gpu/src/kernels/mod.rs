//! kiln's kernels, one folder per family: the GEMM ladder (`gemm/`, index [`gemm`]), attention
//! (`attention/`, index [`attention`]), the training
//! megakernel (`megakernel/`, index [`megakernel`]), the hardware probes (`probe/`, index
//! [`probe`]), and the tensor ops, conversions, reductions and the multi-tensor optimizer beside them. Each kernel's doc
//! comment gives its parameters, tiling and thread mapping; the host launches it through the
//! descriptor `#[kernel]` generates (for `vector_add`, `VectorAdd`).
//!
//! The families' modules keep their paths (`kernels::sgemm`, `kernels::megakernel_tc`, ...): rustc
//! hands LLVM the crate's functions (one codegen unit) sorted by symbol name, LLVM's inlining
//! follows that order, and nesting the modules one level deeper (renaming their symbols) changes
//! the PTX (register numbering in the FP32 warp-tiled GEMMs and the tile-64 `wgmma` megakernels).
//! `#[path]` puts their files in the family folders instead, and the index modules re-export them
//! (`kernels::gemm::sgemm` is `kernels::sgemm`).
// Device-library imports are used only by kernel bodies, which exist on the device alone, and only
// in the modules a kernel is built for (`#[kernel(sm = 90)]` bodies are absent from sm_80's).
#![allow(unused_imports)]

// In their old (alphabetical) order: the PTX declares the modules' shared arrays in this order.

#[path = "probe/barrier.rs"]
pub mod barrier;
pub mod convert;
pub mod elementwise;
#[path = "attention/flash_bwd_mma.rs"]
pub mod flash_bwd_mma;
#[path = "attention/flash_bwd_simt.rs"]
pub mod flash_bwd_simt;
#[path = "attention/flash_bwd_wgmma.rs"]
pub mod flash_bwd_wgmma;
#[path = "attention/flash_mma.rs"]
pub mod flash_mma;
#[path = "attention/flash_simt.rs"]
pub mod flash_simt;
#[path = "attention/flash_wgmma.rs"]
pub mod flash_wgmma;
#[path = "attention/flash_wgmma_pp.rs"]
pub mod flash_wgmma_pp;
#[path = "gemm/gemm_tcgen05.rs"]
pub mod gemm_tcgen05;
#[path = "gemm/gemm_wgmma.rs"]
pub mod gemm_wgmma;
#[path = "gemm/gemm_wgmma_fused.rs"]
pub mod gemm_wgmma_fused;
#[path = "gemm/hgemm_mma.rs"]
pub mod hgemm_mma;
#[path = "megakernel/cuda_cores.rs"]
pub mod megakernel_step;
#[path = "megakernel/tensor_cores/mod.rs"]
pub mod megakernel_tc;
#[path = "probe/mma_tile.rs"]
pub mod mma_tile;
pub mod optim;
pub mod reduce;
#[path = "gemm/sgemm.rs"]
pub mod sgemm;
pub mod tensor_b16;
pub mod tensor_ops;
#[path = "probe/tma_stream.rs"]
pub mod tma_stream;
#[path = "probe/tma_tile.rs"]
pub mod tma_tile;
#[path = "probe/tmem.rs"]
pub mod tmem;

// The families' indexes (each a folder's `mod.rs`).
pub mod attention;
pub mod gemm;
pub mod megakernel;
pub mod probe;

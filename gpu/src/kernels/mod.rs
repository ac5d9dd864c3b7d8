//! kiln's kernels, one file per family. Each kernel's doc comment gives its parameters, tiling and
//! thread mapping; the host launches it through the descriptor `#[kernel]` generates (for
//! `vector_add`, `VectorAdd`).
// Device-library imports are used only by kernel bodies, which exist on the device alone, and only
// in the modules a kernel is built for (`#[kernel(sm = 90)]` bodies are absent from sm_80's).
#![allow(unused_imports)]

pub mod barrier;
pub mod convert;
pub mod elementwise;
pub mod gemm_tcgen05;
pub mod gemm_wgmma;
pub mod hgemm_mma;
pub mod megakernel_step;
pub mod megakernel_tc;
pub mod mma_tile;
pub mod reduce;
pub mod sgemm;
pub mod tensor_ops;
pub mod tma_stream;
pub mod tma_tile;
pub mod tmem;

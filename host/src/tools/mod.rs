//! The runners behind the CLI's tool commands (not part of the training engine): they sit above the
//! CUDA runtime and below `main.rs`, so the binary and the GPU tests share them.
//!
//! - [`attention`]: `kiln attention --kernel NAME --shape BxHxSxD`, a flash forward kernel on
//!   random inputs, its error against the f64 reference and its time.
//! - [`gemm_ladder`]: `kiln gemm --kernel NAME --shape MxNxK`, any GEMM kernel by name on random
//!   inputs, its error against an f64 reference and its time.
//! - [`ladder_table`]: `kiln gemm --ladder`, every kernel of the ladder on the same inputs with
//!   cuBLAS timed around each, as the guide's table.

pub mod attention;
pub mod gemm_ladder;
pub mod ladder_table;

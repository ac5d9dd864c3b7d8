//! Deterministic, batch-invariant f32 matrix products (the f32 tier).
//!
//! Every f32 matrix product kiln computes on CUDA — each rung of the GEMM ladder, the batched tile
//! kernel, and so Linear's forward and both backward products — gives each output element as one
//! fixed association: starting from +0.0, the ascending-k chain of fused multiply-adds
//! `acc = fma(a[i][p], b[p][j], acc)`. The kernels differ in how they tile and how far they zero-pad
//! k, and padding can change one thing: the sign of a zero result. A chain from +0.0 can hold -0.0
//! (a product that underflows rounds to a zero of its sign: `fma(-1e-30, 1e-30, +0.0)` is -0.0),
//! and a padded step `fma(0, 0, -0.0)` is +0.0; on any other `acc` it returns `acc` unchanged. The
//! association depends on k alone, never on m, the grid, or which kernel the chooser picks, so, up
//! to the sign of a zero result (a kernel that pads gives +0.0 where the unpadded chain gives
//! -0.0; results always compare equal):
//!
//! - the same inputs give the same bits on every run (exactly: one kernel, one sign);
//! - row i of `X W^T` is the same whatever batch it is computed in (batch invariance);
//! - the GPU's bits equal [`matmul_chain`]'s on the CPU (the unpadded chain).
//!
//! [`set_deterministic`]`(true)` makes the CPU backend compute its f32 and f64 products with the same
//! chain (its default blocked product rounds the multiply and the add separately, which is faster
//! without a hardware FMA on the host). `dW = dY^T X` reduces over the batch, so it depends on the
//! batch by definition; for a fixed batch it is bit-reproducible too.

use std::sync::atomic::{AtomicBool, Ordering};

static DETERMINISTIC: AtomicBool = AtomicBool::new(false);

/// Makes the CPU backend's matrix products use the fixed FMA chain (process-wide), so that they
/// agree bit for bit with the CUDA backend's.
pub fn set_deterministic(on: bool) {
    DETERMINISTIC.store(on, Ordering::SeqCst);
}

/// Whether the CPU backend uses the fixed FMA chain.
pub fn is_deterministic() -> bool {
    DETERMINISTIC.load(Ordering::SeqCst)
}

/// The reference: `c = a b` with every element the fixed FMA chain (see the module docs); `a` is
/// m x k and `b` k x n, row-major. `f32::mul_add` is the correctly rounded fused multiply-add, the
/// same operation as the GPU's `fma.rn.f32`.
pub fn matmul_chain(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for p in 0..k {
                acc = a[i * k + p].mul_add(b[p * n + j], acc);
            }
            c[i * n + j] = acc;
        }
    }
    c
}

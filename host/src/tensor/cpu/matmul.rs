//! The CPU matrix product: a blocked, row-parallel loop over f32 or f64, with the fixed FMA chain of
//! `kiln::deterministic` when that is on.

use super::{CpuStorage, Float, par_rows};

impl CpuStorage {
    /// The (batched) product of `self` (batch x m x k) and `b` (k x n, or batch x k x n when
    /// `b_batched`): f32 and f64 directly; bf16 and f16 multiplied in f32 and rounded once to the
    /// input dtype.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul(
        &self,
        b: &CpuStorage,
        batch: usize,
        m: usize,
        k: usize,
        n: usize,
        b_batched: bool,
    ) -> CpuStorage {
        match (self, b) {
            (CpuStorage::F32(x), CpuStorage::F32(y)) => CpuStorage::F32(matmul(x, y, batch, m, k, n, b_batched)),
            (CpuStorage::F64(x), CpuStorage::F64(y)) => CpuStorage::F64(matmul(x, y, batch, m, k, n, b_batched)),
            (x, y) => CpuStorage::F32(matmul(&x.as_f32(), &y.as_f32(), batch, m, k, n, b_batched)).to_dtype(x.dtype()),
        }
    }
}

/// Blocked matrix product on f32 or f64: `c[b] = a[b] · b[b]` for `batch` independent products,
/// `a` m x k, `b` k x n, all row-major. Each output row is computed by one thread with a fixed
/// summation order over k (ascending), so results do not depend on the thread count. With
/// `kiln::deterministic::set_deterministic(true)` each element is the fused multiply-add chain the
/// CUDA kernels compute, bit for bit.
fn matmul<T: Float>(a: &[T], b: &[T], batch: usize, m: usize, k: usize, n: usize, b_batched: bool) -> Vec<T> {
    let mut c = vec![T::ZERO; batch * m * n];
    if c.is_empty() {
        return c; // no outputs (a zero-sized dimension): nothing to sum
    }
    const KB: usize = 256;
    let chain = crate::deterministic::is_deterministic();
    par_rows(&mut c, n, k * n, |row0, chunk| {
        for (r, crow) in chunk.chunks_mut(n).enumerate() {
            let row = row0 + r;
            let (bi, i) = (row / m, row % m);
            let arow = &a[(bi * m + i) * k..(bi * m + i + 1) * k];
            let bmat = if b_batched { &b[bi * k * n..(bi + 1) * k * n] } else { b };
            if chain {
                // The fixed association of kiln::deterministic: per element, +0.0 then an
                // ascending-k chain of fused multiply-adds.
                for (j, cv) in crow.iter_mut().enumerate() {
                    let mut acc = T::ZERO;
                    for p in 0..k {
                        acc = arow[p].mul_add(bmat[p * n + j], acc);
                    }
                    *cv = acc;
                }
                continue;
            }
            // k blocked so the block of B rows stays in cache across the row's columns.
            for k0 in (0..k).step_by(KB) {
                for p in k0..(k0 + KB).min(k) {
                    let av = arow[p];
                    let brow = &bmat[p * n..(p + 1) * n];
                    for (cv, &bv) in crow.iter_mut().zip(brow) {
                        *cv += av * bv;
                    }
                }
            }
        }
    });
    c
}

//! Shared by the GEMM benchmarks: cuBLAS calls on kiln's row-major buffers.
#![allow(dead_code)]

use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, sys::cublasOperation_t};
use kiln::gpu::kernels::mma_tile::GemmShape;

/// cuBLAS SGEMM (row-major `c (m x n) = a (m x k) b (k x n)`, f32): column-major `c^T = b^T a^T`
/// with the buffers as they are.
pub fn cublas_sgemm(
    blas: &CudaBlas,
    a: &kiln::cuda::DeviceBuffer<f32>,
    b: &kiln::cuda::DeviceBuffer<f32>,
    c: &mut kiln::cuda::DeviceBuffer<f32>,
    s: GemmShape,
) {
    cublas_sgemm_layout(blas, a, b, c, s, kiln::cuda::gemm::Layout::NN)
}

/// cuBLAS SGEMM, row-major `c (m x n) = op(a) op(b)` with the operands stored as `layout` says:
/// `a` m x k (NN, NT) or k x m (TN), `b` k x n (NN, TN) or n x k (NT).
pub fn cublas_sgemm_layout(
    blas: &CudaBlas,
    a: &kiln::cuda::DeviceBuffer<f32>,
    b: &kiln::cuda::DeviceBuffer<f32>,
    c: &mut kiln::cuda::DeviceBuffer<f32>,
    s: GemmShape,
    layout: kiln::cuda::gemm::Layout,
) {
    use kiln::cuda::gemm::Layout;
    // Column-major cuBLAS computes c^T (n x m) = b^T a^T. A row-major r x c buffer reads as its
    // transpose in column-major, so b stored k x n is already b^T (no op) and b stored n x k needs
    // OP_T; likewise a stored m x k is a^T, and a stored k x m needs OP_T. Leading dimensions are
    // the stored row lengths.
    let (op_b, ld_b) = match layout {
        Layout::NT => (cublasOperation_t::CUBLAS_OP_T, s.k),
        _ => (cublasOperation_t::CUBLAS_OP_N, s.n),
    };
    let (op_a, ld_a) = match layout {
        Layout::TN => (cublasOperation_t::CUBLAS_OP_T, s.m),
        _ => (cublasOperation_t::CUBLAS_OP_N, s.k),
    };
    let cfg = GemmConfig {
        transa: op_b,
        transb: op_a,
        m: s.n as i32,
        n: s.m as i32,
        k: s.k as i32,
        alpha: 1.0f32,
        lda: ld_b as i32,
        ldb: ld_a as i32,
        beta: 0.0f32,
        ldc: s.n as i32,
    };
    // SAFETY: the buffers hold m*k, k*n and m*n elements (allocated by the caller for `s`).
    unsafe { blas.gemm(cfg, b.slice(), a.slice(), c.slice_mut()) }.expect("cublas sgemm");
}

/// cuBLAS's math mode for the handle.
pub fn set_math_mode(blas: &CudaBlas, mode: cudarc::cublas::sys::cublasMath_t) {
    // SAFETY: a live handle and a valid enum value.
    let st = unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.handle(), mode) };
    assert_eq!(st, cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS, "cublasSetMathMode");
}

/// cuBLAS GemmEx, row-major `c (m x n, f32) = a (m x k, bf16) b^T (b: n x k, bf16)`, f32 compute:
/// column-major `c^T = b a^T`, i.e. op(A) = the (k x n) column-major `b` transposed.
pub fn cublas_bf16_f32out(
    blas: &CudaBlas,
    a: &kiln::cuda::DeviceBuffer<half::bf16>,
    b: &kiln::cuda::DeviceBuffer<half::bf16>,
    c: &mut kiln::cuda::DeviceBuffer<f32>,
    s: GemmShape,
    compute: cudarc::cublas::sys::cublasComputeType_t,
) {
    use cudarc::cublas::sys::{cublasGemmAlgo_t, cudaDataType};
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: the buffers hold m*k, n*k and m*n elements (allocated by the caller for `s`).
    unsafe {
        cudarc::cublas::result::gemm_ex(
            *blas.handle(),
            cublasOperation_t::CUBLAS_OP_T,
            cublasOperation_t::CUBLAS_OP_N,
            s.n as i32,
            s.m as i32,
            s.k as i32,
            (&alpha) as *const f32 as *const _,
            b.addr() as *const _,
            cudaDataType::CUDA_R_16BF,
            s.k as i32,
            a.addr() as *const _,
            cudaDataType::CUDA_R_16BF,
            s.k as i32,
            (&beta) as *const f32 as *const _,
            c.addr() as *mut _,
            cudaDataType::CUDA_R_32F,
            s.n as i32,
            compute,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .expect("cublas GemmEx bf16");
}

//! Shared by the GEMM benchmarks: the library's cuBLAS reference calls (`kiln::cuda::cublas`),
//! with a failure ending the benchmark.
#![allow(dead_code)]

use cudarc::cublas::CudaBlas;
use kiln::cuda::cublas;
use kiln::gpu::kernels::mma_tile::GemmShape;

/// cuBLAS SGEMM, row-major `c (m x n) = a (m x k) b (k x n)`.
pub fn cublas_sgemm(
    blas: &CudaBlas,
    a: &kiln::cuda::DeviceBuffer<f32>,
    b: &kiln::cuda::DeviceBuffer<f32>,
    c: &mut kiln::cuda::DeviceBuffer<f32>,
    s: GemmShape,
) {
    cublas_sgemm_layout(blas, a, b, c, s, kiln::cuda::gemm::Layout::NN)
}

/// cuBLAS SGEMM, row-major `c (m x n) = op(a) op(b)` with the operands stored as `layout` says.
pub fn cublas_sgemm_layout(
    blas: &CudaBlas,
    a: &kiln::cuda::DeviceBuffer<f32>,
    b: &kiln::cuda::DeviceBuffer<f32>,
    c: &mut kiln::cuda::DeviceBuffer<f32>,
    s: GemmShape,
    layout: kiln::cuda::gemm::Layout,
) {
    cublas::sgemm(blas, a, b, c, s, layout).expect("cublas sgemm");
}

/// cuBLAS's math mode for the handle.
pub fn set_math_mode(blas: &CudaBlas, mode: cudarc::cublas::sys::cublasMath_t) {
    cublas::set_math_mode(blas, mode).expect("cublasSetMathMode");
}

/// cuBLAS GemmEx, row-major `c (m x n, f32) = a (m x k, bf16) b^T (b: n x k, bf16)`.
pub fn cublas_bf16_f32out(
    blas: &CudaBlas,
    a: &kiln::cuda::DeviceBuffer<half::bf16>,
    b: &kiln::cuda::DeviceBuffer<half::bf16>,
    c: &mut kiln::cuda::DeviceBuffer<f32>,
    s: GemmShape,
    compute: cudarc::cublas::sys::cublasComputeType_t,
) {
    cublas::gemm_ex_abt(blas, a, b, c, s, compute).expect("cublas GemmEx bf16");
}

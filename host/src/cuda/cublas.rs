//! cuBLAS as the reference kiln's GEMMs are timed against: row-major products on kiln's own
//! buffers, with cuBLAS loaded at run time (cudarc's dynamic loading). Column-major cuBLAS computes
//! `C^T (n x m) = op(B) op(A)` with the buffers as they are (a row-major r x c buffer reads as its
//! transpose in column-major); leading dimensions are the stored row lengths. Used by
//! `kiln gemm --ladder` and the GEMM benchmarks.

use super::DeviceBuffer;
use super::gemm::Layout;
use crate::error::{Error, Result};
use cudarc::cublas::CudaBlas;
use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasMath_t, cublasOperation_t, cublasStatus_t, cudaDataType,
};
use kiln_gpu::kernels::mma_tile::GemmShape;

/// Whether libcublas can be loaded on this machine.
pub fn available() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

fn failed(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Unsupported { op: "cublas", what: format!("{what} (it failed: {e:?})") }
}

/// Sets the handle's math mode (`CUBLAS_DEFAULT_MATH` keeps SGEMM off the TF32 tensor cores).
pub fn set_math_mode(blas: &CudaBlas, mode: cublasMath_t) -> Result<()> {
    // SAFETY: a live handle and a valid enum value.
    let st = unsafe { cudarc::cublas::sys::cublasSetMathMode(*blas.handle(), mode) };
    if st != cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        return Err(failed("setting the math mode", st));
    }
    Ok(())
}

/// Refuses buffers too small for `s`: `a` and `b` hold at least `a_len` and `b_len` elements, `c` m n.
fn check(
    op: &'static str,
    (a, b, c): (usize, usize, usize),
    (a_len, b_len): (usize, usize),
    s: GemmShape,
) -> Result<()> {
    let mn = s.m as usize * s.n as usize;
    if a < a_len || b < b_len || c < mn {
        return Err(Error::shape(
            op,
            format!("{}x{}x{} needs a: {a_len}, b: {b_len}, c: {mn}; got {a}, {b}, {c}", s.m, s.n, s.k),
        ));
    }
    Ok(())
}

/// cuBLAS SGEMM, row-major `c (m x n) = op(a) op(b)` with the operands stored as `layout` says:
/// `a` m x k (NN, NT) or k x m (TN), `b` k x n (NN, TN) or n x k (NT).
pub fn sgemm(
    blas: &CudaBlas,
    a: &DeviceBuffer<f32>,
    b: &DeviceBuffer<f32>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
    layout: Layout,
) -> Result<()> {
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    check("cublas sgemm", (a.len(), b.len(), c.len()), (m * k, k * n), s)?;
    let (op_b, ld_b) = match layout {
        Layout::NT => (cublasOperation_t::CUBLAS_OP_T, s.k), // b stored n x k
        _ => (cublasOperation_t::CUBLAS_OP_N, s.n),          // b stored k x n
    };
    let (op_a, ld_a) = match layout {
        Layout::TN => (cublasOperation_t::CUBLAS_OP_T, s.m), // a stored k x m
        _ => (cublasOperation_t::CUBLAS_OP_N, s.k),          // a stored m x k
    };
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: the buffers hold the elements `s` and `layout` read (checked above).
    unsafe {
        cudarc::cublas::result::sgemm(
            *blas.handle(),
            op_b,
            op_a,
            s.n as i32,
            s.m as i32,
            s.k as i32,
            &alpha,
            b.addr() as *const f32,
            ld_b as i32,
            a.addr() as *const f32,
            ld_a as i32,
            &beta,
            c.addr() as *mut f32,
            s.n as i32,
        )
    }
    .map_err(|e| failed("SGEMM", e))
}

/// A 16-bit input type of [`gemm_ex_abt`].
pub trait GemmExInput: cudarc::driver::DeviceRepr + Copy + 'static {
    /// cuBLAS's name for the type.
    const DATA_TYPE: cudaDataType;
}
impl GemmExInput for half::bf16 {
    const DATA_TYPE: cudaDataType = cudaDataType::CUDA_R_16BF;
}
impl GemmExInput for half::f16 {
    const DATA_TYPE: cudaDataType = cudaDataType::CUDA_R_16F;
}

/// cuBLAS GemmEx, row-major `c (m x n, f32) = a (m x k) b^T (b: n x k)` with bf16 or f16 inputs and
/// `compute` (`CUBLAS_COMPUTE_32F`, or its pedantic form).
pub fn gemm_ex_abt<T: GemmExInput>(
    blas: &CudaBlas,
    a: &DeviceBuffer<T>,
    b: &DeviceBuffer<T>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
    compute: cublasComputeType_t,
) -> Result<()> {
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    check("cublas gemm_ex", (a.len(), b.len(), c.len()), (m * k, n * k), s)?;
    let (alpha, beta) = (1.0f32, 0.0f32);
    // SAFETY: the buffers hold m k, n k and m n elements (checked above).
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
            T::DATA_TYPE,
            s.k as i32,
            a.addr() as *const _,
            T::DATA_TYPE,
            s.k as i32,
            (&beta) as *const f32 as *const _,
            c.addr() as *mut _,
            cudaDataType::CUDA_R_32F,
            s.n as i32,
            compute,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(|e| failed("GemmEx", e))
}

//! The deterministic typed tier: bf16 / f16 products computed as the FP32 rungs' chains on the
//! exactly widened inputs, rounded once.

use super::check::Checked;
use super::fp32::sgemm;
use crate::cuda::{Device, DeviceBuffer, LaunchConfig};
use crate::error::Result;
use kiln_gpu::kernels::mma_tile::GemmShape;

/// A 16-bit float type of the deterministic typed tier ([`typed_gemm`]).
pub trait TypedTier: cudarc::driver::DeviceRepr + Copy + 'static {
    /// `kiln_gpu::kernels::convert::format` code.
    const FORMAT: u32;
}
impl TypedTier for half::bf16 {
    const FORMAT: u32 = kiln_gpu::kernels::convert::format::BF16;
}
impl TypedTier for half::f16 {
    const FORMAT: u32 = kiln_gpu::kernels::convert::format::F16;
}

/// The deterministic typed tier: `c = a b` for bf16 or f16 `a` (m x k) and `b` (k x n), row-major,
/// computed as the f32 tier's ascending-k FMA chains on the exactly widened inputs (the rung
/// [`choose`](super::choose) picks), then rounded once to `T`, nearest-even. Bit-identical to
/// `kiln::deterministic::matmul_chain` on the widened inputs followed by one rounding, on every
/// run, and batch-invariant like the f32 tier.
pub fn typed_gemm<T: TypedTier>(
    dev: &Device,
    a: &DeviceBuffer<T>,
    b: &DeviceBuffer<T>,
    c: &mut DeviceBuffer<T>,
    s: GemmShape,
) -> Result<()> {
    use kiln_gpu::kernels::convert::{NarrowF32B16, WidenB16F32};
    use kiln_gpu::{DevicePtr, DevicePtrMut};
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    let checked = Checked::operands("typed gemm", a.len(), b.len(), c.len(), s)?;
    if checked.writes_nothing() {
        return Ok(());
    }
    // Operand sizes are below 2^31 (checked above), so they fit the kernels' u32 counts.
    let cfg = |len: usize| LaunchConfig::for_num_elems(len as u32);
    let c32 = if k == 0 {
        dev.zeros::<f32>(m * n)? // an empty sum
    } else {
        let (mut a32, mut b32) = (dev.alloc_uninit_f32(m * k)?, dev.alloc_uninit_f32(k * n)?);
        let mut c32 = dev.alloc_uninit_f32(m * n)?;
        // SAFETY: each conversion reads and writes `len` elements of buffers that hold them; the
        // 16-bit buffers are read as their bit patterns.
        unsafe {
            let src = DevicePtr::<u16>::from_addr(a.addr());
            dev.launch(WidenB16F32, cfg(m * k), (src, a32.ptr_mut(), (m * k) as u32, T::FORMAT))?;
            let src = DevicePtr::<u16>::from_addr(b.addr());
            dev.launch(WidenB16F32, cfg(k * n), (src, b32.ptr_mut(), (k * n) as u32, T::FORMAT))?;
        }
        sgemm(dev, &a32, &b32, &mut c32, s)?;
        c32
    };
    // SAFETY: c holds m * n 16-bit values, c32 as many f32.
    unsafe {
        let dst = DevicePtrMut::<u16>::from_addr(c.addr());
        dev.launch(NarrowF32B16, cfg(m * n), (c32.ptr(), dst, (m * n) as u32, T::FORMAT))
    }
}

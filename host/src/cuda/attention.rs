//! Attention on the GPU: the flash forward kernels' table, their checks and their launcher.
//!
//! ```text
//!   FlashKernel::Simt     rung 1: tiled online softmax on CUDA cores     f32, bf16   D 64, 128
//!   FlashKernel::MmaSync  rung 2: FlashAttention-2 on mma.sync           bf16, f16   D 64, 128
//! ```
//!
//! The backward ([`flash_backward`]) runs on CUDA cores (`flash_bwd_simt`: f32, bf16; D 64, 128).
//!
//! Every kernel runs on every module (sm_80 and newer). [`flash_forward`] checks the buffers
//! against the shape, the dtype and head dim against the kernel, the alignment the kernel's
//! 16-byte copies need, the grid and the shared memory, and refuses the rest with an error that
//! says what to change. The layout and the causal mask (bottom-right aligned) are
//! [`crate::attention`]'s.

use crate::cuda::{Device, DeviceBuffer, LaunchConfig};
use crate::dtype::DType;
use crate::error::{Error, Result};
use half::{bf16, f16};
use kiln_gpu::kernels::attention::AttentionParams;
use kiln_gpu::kernels::flash_bwd_simt::{self as bwd, FLASH_BWD_ROWS, FLASH_BWD_THREADS, flash_bwd_smem_bytes};
use kiln_gpu::kernels::flash_mma::{self as mma, FLASH_MMA_BQ, FLASH_MMA_THREADS, flash_mma_smem_bytes};
use kiln_gpu::kernels::flash_simt::{self as simt, FLASH_SIMT_BQ, FLASH_SIMT_THREADS, flash_simt_smem_bytes};
use kiln_gpu::{DevicePtr, DevicePtrMut, Kernel};

/// The shape of one attention problem: Q and O are `[batch, heads, q_len, head_dim]`, K and V
/// `[batch, heads, kv_len, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Batch size.
    pub batch: u32,
    /// Heads.
    pub heads: u32,
    /// Query rows per head.
    pub q_len: u32,
    /// Key / value rows per head.
    pub kv_len: u32,
    /// Elements per row.
    pub head_dim: u32,
}

impl AttentionShape {
    /// The kernels' parameters for this shape with the mask and scale given.
    pub fn params(self, causal: bool, scale: f32) -> AttentionParams {
        AttentionParams {
            batch: self.batch,
            heads: self.heads,
            q_len: self.q_len,
            kv_len: self.kv_len,
            head_dim: self.head_dim,
            scale,
            causal: causal as u32,
        }
    }
    /// Elements of Q (and O).
    pub fn q_elems(self) -> usize {
        self.heads_total() * self.q_len as usize * self.head_dim as usize
    }
    /// Elements of K (and V).
    pub fn kv_elems(self) -> usize {
        self.heads_total() * self.kv_len as usize * self.head_dim as usize
    }
    /// Elements of the log-sum-exp.
    pub fn lse_elems(self) -> usize {
        self.heads_total() * self.q_len as usize
    }
    fn heads_total(self) -> usize {
        self.batch as usize * self.heads as usize
    }
}

/// The flash forward kernels, rung by rung.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlashKernel {
    /// Rung 1: tiled online softmax on CUDA cores (`flash_simt`), f32 or bf16.
    Simt,
    /// Rung 2: FlashAttention-2 on `mma.sync` (`flash_mma`), bf16 or f16.
    MmaSync,
}

/// One row of the kernel table: a kernel and the dtype it runs, under the name `kiln attention
/// --kernel` takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashEntry {
    /// The name (`kiln attention --kernel NAME`); the PTX entries add `_d64` / `_d128`.
    pub name: &'static str,
    /// The kernel.
    pub kernel: FlashKernel,
    /// The element type of Q, K, V and O.
    pub dtype: DType,
    /// The guide's rung.
    pub rung: u32,
}

/// Every (kernel, dtype) pair that runs, in ladder order.
pub const FLASH_KERNELS: &[FlashEntry] = &[
    FlashEntry { name: "flash_fwd_simt_f32", kernel: FlashKernel::Simt, dtype: DType::F32, rung: 1 },
    FlashEntry { name: "flash_fwd_simt_bf16", kernel: FlashKernel::Simt, dtype: DType::BF16, rung: 1 },
    FlashEntry { name: "flash_fwd_mma_bf16", kernel: FlashKernel::MmaSync, dtype: DType::BF16, rung: 2 },
    FlashEntry { name: "flash_fwd_mma_f16", kernel: FlashKernel::MmaSync, dtype: DType::F16, rung: 2 },
];

/// Head dims every flash kernel is built for.
pub const FLASH_HEAD_DIMS: &[u32] = &[64, 128];

impl FlashKernel {
    /// The dtypes this kernel runs.
    pub fn dtypes(self) -> Vec<DType> {
        FLASH_KERNELS.iter().filter(|e| e.kernel == self).map(|e| e.dtype).collect()
    }
    /// Threads per block.
    pub fn threads(self) -> u32 {
        match self {
            FlashKernel::Simt => FLASH_SIMT_THREADS,
            FlashKernel::MmaSync => FLASH_MMA_THREADS,
        }
    }
    /// Query rows per block.
    pub fn block_rows(self) -> u32 {
        match self {
            FlashKernel::Simt => FLASH_SIMT_BQ,
            FlashKernel::MmaSync => FLASH_MMA_BQ,
        }
    }
    /// Dynamic shared memory per block at head dim `d`.
    pub fn smem_bytes(self, d: u32) -> u32 {
        match self {
            FlashKernel::Simt => flash_simt_smem_bytes(d),
            FlashKernel::MmaSync => flash_mma_smem_bytes(d),
        }
    }
    /// Whether the kernel copies rows in 16-byte chunks (buffers 16-byte aligned, rows of a
    /// multiple of 8 elements).
    pub fn needs_16_byte_alignment(self) -> bool {
        self == FlashKernel::MmaSync
    }
}

/// The table's entry named `name`.
pub fn flash_entry(name: &str) -> Result<FlashEntry> {
    FLASH_KERNELS.iter().copied().find(|e| e.name == name).ok_or_else(|| Error::Unsupported {
        op: "attention",
        what: format!(
            "--kernel {name}: no such kernel; known: {}",
            FLASH_KERNELS.iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
        ),
    })
}

/// The kernel [`flash_backward`] runs for `dtype` at head dim `head_dim`, or `None` where no
/// backward kernel takes the case (the tensor op then computes attention by its naive path when a
/// gradient is needed).
pub fn flash_backward_kernel(dtype: DType, head_dim: u32) -> Option<FlashKernel> {
    (FLASH_HEAD_DIMS.contains(&head_dim) && matches!(dtype, DType::F32 | DType::BF16)).then_some(FlashKernel::Simt)
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// The element types the flash kernels take: f32, bf16 and f16 (sealed: the launcher picks the
/// kernel by [`FlashElement::DTYPE`]).
pub trait FlashElement: sealed::Sealed + cudarc::driver::DeviceRepr + Copy + 'static {
    /// Its dtype.
    const DTYPE: DType;
}
impl FlashElement for f32 {
    const DTYPE: DType = DType::F32;
}
impl FlashElement for bf16 {
    const DTYPE: DType = DType::BF16;
}
impl FlashElement for f16 {
    const DTYPE: DType = DType::F16;
}

/// A forward launch's buffers: q, k, v, o and the log-sum-exp.
type Bufs<'a, T> =
    (&'a DeviceBuffer<T>, &'a DeviceBuffer<T>, &'a DeviceBuffer<T>, &'a mut DeviceBuffer<T>, &'a mut DeviceBuffer<f32>);

/// The arguments every flash forward kernel takes (the element pointers cast to the kernel's own).
type Args<T> = (DevicePtr<T>, DevicePtr<T>, DevicePtr<T>, DevicePtrMut<T>, DevicePtrMut<f32>, AttentionParams);

/// Checks a forward problem for `kernel` with elements of `dtype` before any launch: the
/// dispatch table, the shape, the scale, the buffers' sizes and (for the 16-byte copies) their
/// alignment. `lens` are the element counts of (q, k, v, o, lse), `addrs` their addresses.
pub fn check_forward(
    kernel: FlashKernel,
    dtype: DType,
    shape: AttentionShape,
    scale: f32,
    lens: [usize; 5],
    addrs: [u64; 5],
) -> Result<()> {
    const OP: &str = "flash_forward";
    if !FLASH_KERNELS.iter().any(|e| e.kernel == kernel && e.dtype == dtype) {
        let takers: Vec<&str> = FLASH_KERNELS.iter().filter(|e| e.dtype == dtype).map(|e| e.name).collect();
        return Err(Error::Unsupported {
            op: OP,
            what: format!(
                "{dtype:?} with {kernel:?} (it takes {:?}); {}",
                kernel.dtypes(),
                if takers.is_empty() {
                    "no flash kernel takes it: convert the inputs to bf16 or f32".to_string()
                } else {
                    format!("use {}", takers.join(" or "))
                }
            ),
        });
    }
    if !FLASH_HEAD_DIMS.contains(&shape.head_dim) {
        return Err(Error::Unsupported {
            op: OP,
            what: format!(
                "head dim {} (the kernels are built for {FLASH_HEAD_DIMS:?}): pad the heads to one of them",
                shape.head_dim
            ),
        });
    }
    if !(scale.is_finite() && scale > 0.0) {
        return Err(Error::Unsupported {
            op: OP,
            what: format!("scale = {scale}: the kernels take a finite positive scale (usually 1 / sqrt(head_dim))"),
        });
    }
    let want = [shape.q_elems(), shape.kv_elems(), shape.kv_elems(), shape.q_elems(), shape.lse_elems()];
    if lens != want {
        return Err(Error::shape(
            OP,
            format!(
                "{shape:?} needs q: {}, k: {}, v: {}, o: {}, lse: {} elements; got {}, {}, {}, {}, {}",
                want[0], want[1], want[2], want[3], want[4], lens[0], lens[1], lens[2], lens[3], lens[4]
            ),
        ));
    }
    // the kernels index a head's rows in 32 bits and put batch * heads on the grid's y
    let per_head = shape.q_len.max(shape.kv_len) as u64 * shape.head_dim as u64;
    if per_head > u32::MAX as u64 {
        return Err(Error::Unsupported {
            op: OP,
            what: format!(
                "{} rows of {} per head: over 2^32 elements; split the sequence",
                shape.q_len.max(shape.kv_len),
                shape.head_dim
            ),
        });
    }
    if shape.batch as u64 * shape.heads as u64 > 65535 {
        return Err(Error::Unsupported {
            op: OP,
            what: format!(
                "batch * heads = {} (at most 65535, the grid's y): split the batch",
                shape.batch as u64 * shape.heads as u64
            ),
        });
    }
    if kernel.needs_16_byte_alignment()
        && let Some(a) = addrs[..4].iter().find(|a| *a % 16 != 0)
    {
        return Err(Error::Unsupported {
            op: OP,
            what: format!("a buffer at {a:#x} with {kernel:?}: its 16-byte copies need 16-byte-aligned q, k, v and o"),
        });
    }
    Ok(())
}

/// Attention forward with `kernel`: `o = softmax(scale q k^T [masked]) v` and the log-sum-exp of
/// each query row (`lse`, f32, for the backward), on `[batch, heads, seq, head_dim]` buffers
/// (see [`crate::attention`] for the layout and the causal mask). Refuses, with a typed error, a
/// dtype or head dim the kernel does not take, buffers of the wrong size, misaligned buffers
/// (`MmaSync`) and a device without the kernel's shared memory.
#[allow(clippy::too_many_arguments)]
pub fn flash_forward<T: FlashElement>(
    dev: &Device,
    kernel: FlashKernel,
    q: &DeviceBuffer<T>,
    k: &DeviceBuffer<T>,
    v: &DeviceBuffer<T>,
    o: &mut DeviceBuffer<T>,
    lse: &mut DeviceBuffer<f32>,
    shape: AttentionShape,
    causal: bool,
    scale: f32,
) -> Result<()> {
    let lens = [q.len(), k.len(), v.len(), o.len(), lse.len()];
    let addrs = [q.addr(), k.addr(), v.addr(), o.addr(), lse.addr()];
    check_forward(kernel, T::DTYPE, shape, scale, lens, addrs)?;
    if shape.q_len == 0 || shape.batch == 0 || shape.heads == 0 {
        return Ok(());
    }
    let smem = kernel.smem_bytes(shape.head_dim);
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
    let max_smem = dev.attribute(OPTIN)?.max(0) as u32;
    if smem > max_smem {
        return Err(Error::Unsupported {
            op: "flash_forward",
            what: format!(
                "{kernel:?} at head dim {}: it needs {smem} bytes of shared memory per block and {} allows {max_smem}; use another kernel",
                shape.head_dim,
                dev.name()
            ),
        });
    }
    let cfg = LaunchConfig {
        grid_dim: (shape.q_len.div_ceil(kernel.block_rows()), shape.batch * shape.heads, 1),
        block_dim: (kernel.threads(), 1, 1),
        shared_mem_bytes: smem,
    };
    let p = shape.params(causal, scale);
    // the table's kernels take the element type under its own name; the buffers hold T
    fn args<T, U>(
        q: &DeviceBuffer<T>,
        k: &DeviceBuffer<T>,
        v: &DeviceBuffer<T>,
        o: &mut DeviceBuffer<T>,
        lse: &mut DeviceBuffer<f32>,
        p: AttentionParams,
    ) -> Args<U>
    where
        T: cudarc::driver::DeviceRepr,
    {
        (q.ptr().cast(), k.ptr().cast(), v.ptr().cast(), o.ptr_mut().cast(), lse.ptr_mut(), p)
    }
    /// Launches `K` (whose element type `U` is `T`'s, as the dtype match below guarantees).
    unsafe fn go<K: Kernel<Args = Args<U>>, U, T: cudarc::driver::DeviceRepr>(
        dev: &Device,
        cfg: LaunchConfig,
        bufs: Bufs<'_, T>,
        p: AttentionParams,
    ) -> Result<()> {
        let (q, k, v, o, lse) = bufs;
        // SAFETY: the caller checked sizes, dtype and alignment.
        unsafe { dev.launch(K::default(), cfg, args::<T, U>(q, k, v, o, lse, p)) }
    }
    let bufs = (q, k, v, o, lse);
    let d128 = shape.head_dim == 128;
    // SAFETY: `check_forward` matched the buffers' sizes to the shape, the dtype to the kernel and
    // the alignment to its copies; the kernels mask every edge.
    unsafe {
        match (kernel, T::DTYPE, d128) {
            (FlashKernel::Simt, DType::F32, false) => go::<simt::FlashFwdSimtF32D64, f32, T>(dev, cfg, bufs, p),
            (FlashKernel::Simt, DType::F32, true) => go::<simt::FlashFwdSimtF32D128, f32, T>(dev, cfg, bufs, p),
            (FlashKernel::Simt, DType::BF16, false) => go::<simt::FlashFwdSimtBf16D64, bf16, T>(dev, cfg, bufs, p),
            (FlashKernel::Simt, DType::BF16, true) => go::<simt::FlashFwdSimtBf16D128, bf16, T>(dev, cfg, bufs, p),
            (FlashKernel::MmaSync, DType::BF16, false) => go::<mma::FlashFwdMmaBf16D64, bf16, T>(dev, cfg, bufs, p),
            (FlashKernel::MmaSync, DType::BF16, true) => go::<mma::FlashFwdMmaBf16D128, bf16, T>(dev, cfg, bufs, p),
            (FlashKernel::MmaSync, DType::F16, false) => go::<mma::FlashFwdMmaF16D64, f16, T>(dev, cfg, bufs, p),
            (FlashKernel::MmaSync, DType::F16, true) => go::<mma::FlashFwdMmaF16D128, f16, T>(dev, cfg, bufs, p),
            (kernel, dtype, _) => Err(Error::Unsupported {
                op: "flash_forward",
                what: format!("{dtype:?} with {kernel:?}: not in the kernel table"),
            }),
        }
    }
}

/// The backward's inputs: q, k, v, the forward's output o, and its gradient d_o.
pub type BwdInputs<'a, T> =
    (&'a DeviceBuffer<T>, &'a DeviceBuffer<T>, &'a DeviceBuffer<T>, &'a DeviceBuffer<T>, &'a DeviceBuffer<T>);

/// The arguments every flash backward kernel takes.
type BwdArgs<T> = (
    DevicePtr<T>,
    DevicePtr<T>,
    DevicePtr<T>,
    DevicePtr<T>,
    DevicePtr<T>,
    DevicePtr<f32>,
    DevicePtrMut<f32>,
    DevicePtrMut<T>,
    AttentionParams,
);

/// The backward's three kernels for one element type and head dim: dQ (and delta), dK, dV.
trait BwdKernels {
    type Dq: Kernel;
    type Dk: Kernel;
    type Dv: Kernel;
}

/// Attention backward (FlashAttention-2 on CUDA cores, [`FlashKernel::Simt`] only, f32 or bf16):
/// from the forward's inputs, its output `o` and log-sum-exp `lse`, and the output's gradient
/// `d_o`, the gradients `dq`, `dk`, `dv` (the shapes of q, k, v). Deterministic: no atomics, each
/// gradient row summed by one thread in a fixed order (three passes: dQ with `delta = dO . O`,
/// then dK, then dV), so the same inputs give the same bits. The checks are
/// [`flash_forward`]'s, plus the gradients' sizes.
#[allow(clippy::too_many_arguments)]
pub fn flash_backward<T: FlashElement>(
    dev: &Device,
    kernel: FlashKernel,
    (q, k, v, o, d_o): BwdInputs<'_, T>,
    lse: &DeviceBuffer<f32>,
    (dq, dk, dv): (&mut DeviceBuffer<T>, &mut DeviceBuffer<T>, &mut DeviceBuffer<T>),
    shape: AttentionShape,
    causal: bool,
    scale: f32,
) -> Result<()> {
    const OP: &str = "flash_backward";
    if kernel != FlashKernel::Simt {
        return Err(Error::Unsupported {
            op: OP,
            what: format!("{kernel:?}: the backward runs on FlashKernel::Simt (f32 or bf16) so far"),
        });
    }
    let lens = [q.len(), k.len(), v.len(), o.len(), lse.len()];
    check_forward(kernel, T::DTYPE, shape, scale, lens, [0; 5])?;
    let grads = [d_o.len(), dq.len(), dk.len(), dv.len()];
    let want = [shape.q_elems(), shape.q_elems(), shape.kv_elems(), shape.kv_elems()];
    if grads != want {
        return Err(Error::shape(
            OP,
            format!(
                "{shape:?} needs d_o: {}, dq: {}, dk: {}, dv: {} elements; got {}, {}, {}, {}",
                want[0], want[1], want[2], want[3], grads[0], grads[1], grads[2], grads[3]
            ),
        ));
    }
    if shape.batch == 0 || shape.heads == 0 {
        return Ok(());
    }
    let smem = flash_bwd_smem_bytes(shape.head_dim);
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
    let max_smem = dev.attribute(OPTIN)?.max(0) as u32;
    if smem > max_smem {
        return Err(Error::Unsupported {
            op: OP,
            what: format!(
                "head dim {}: the backward needs {smem} bytes of shared memory per block and {} allows {max_smem}",
                shape.head_dim,
                dev.name()
            ),
        });
    }
    let mut delta = dev.zeros::<f32>(shape.lse_elems())?;
    let p = shape.params(causal, scale);
    let cfg = |rows: u32| LaunchConfig {
        grid_dim: (rows.div_ceil(FLASH_BWD_ROWS), shape.batch * shape.heads, 1),
        block_dim: (FLASH_BWD_THREADS, 1, 1),
        shared_mem_bytes: smem,
    };
    // SAFETY: sizes and dtype checked above; delta holds one f32 per query row; the kernels mask
    // every edge; dQ (which writes delta) runs before dK (which reads it), on one stream.
    unsafe fn three<B: BwdKernels, U, T: cudarc::driver::DeviceRepr>(
        dev: &Device,
        cfg: impl Fn(u32) -> LaunchConfig,
        shape: AttentionShape,
        ins: [&DeviceBuffer<T>; 5],
        lse: &DeviceBuffer<f32>,
        delta: &mut DeviceBuffer<f32>,
        outs: [&mut DeviceBuffer<T>; 3],
        p: AttentionParams,
    ) -> Result<()>
    where
        B::Dq: Kernel<Args = BwdArgs<U>>,
        B::Dk: Kernel<Args = BwdArgs<U>>,
        B::Dv: Kernel<Args = BwdArgs<U>>,
    {
        let [q, k, v, o, d_o] = ins.map(|b| b.ptr().cast::<U>());
        let [dq, dk, dv] = outs;
        let args = |out: &mut DeviceBuffer<T>, delta: &mut DeviceBuffer<f32>| {
            (q, k, v, o, d_o, lse.ptr(), delta.ptr_mut(), out.ptr_mut().cast::<U>(), p)
        };
        unsafe {
            if shape.q_len > 0 {
                dev.launch(B::Dq::default(), cfg(shape.q_len), args(dq, delta))?;
            }
            if shape.kv_len > 0 {
                dev.launch(B::Dk::default(), cfg(shape.kv_len), args(dk, delta))?;
                dev.launch(B::Dv::default(), cfg(shape.kv_len), args(dv, delta))?;
            }
        }
        Ok(())
    }
    let ins = [q, k, v, o, d_o];
    let outs = [dq, dk, dv];
    let d128 = shape.head_dim == 128;
    // SAFETY: as above.
    unsafe {
        match (T::DTYPE, d128) {
            (DType::F32, false) => three::<BwdF32D64, f32, T>(dev, cfg, shape, ins, lse, &mut delta, outs, p),
            (DType::F32, true) => three::<BwdF32D128, f32, T>(dev, cfg, shape, ins, lse, &mut delta, outs, p),
            (DType::BF16, false) => three::<BwdBf16D64, bf16, T>(dev, cfg, shape, ins, lse, &mut delta, outs, p),
            (DType::BF16, true) => three::<BwdBf16D128, bf16, T>(dev, cfg, shape, ins, lse, &mut delta, outs, p),
            (dtype, _) => Err(Error::Unsupported { op: OP, what: format!("{dtype:?}: not in the kernel table") }),
        }
    }
}

macro_rules! bwd_kernels {
    ($($name:ident: $dq:ident, $dk:ident, $dv:ident;)*) => {$(
        struct $name;
        impl BwdKernels for $name {
            type Dq = bwd::$dq;
            type Dk = bwd::$dk;
            type Dv = bwd::$dv;
        }
    )*};
}

bwd_kernels! {
    BwdF32D64: FlashBwdDqSimtF32D64, FlashBwdDkSimtF32D64, FlashBwdDvSimtF32D64;
    BwdF32D128: FlashBwdDqSimtF32D128, FlashBwdDkSimtF32D128, FlashBwdDvSimtF32D128;
    BwdBf16D64: FlashBwdDqSimtBf16D64, FlashBwdDkSimtBf16D64, FlashBwdDvSimtBf16D64;
    BwdBf16D128: FlashBwdDqSimtBf16D128, FlashBwdDkSimtBf16D128, FlashBwdDvSimtBf16D128;
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHAPE: AttentionShape = AttentionShape { batch: 2, heads: 3, q_len: 17, kv_len: 33, head_dim: 64 };

    fn lens(s: AttentionShape) -> [usize; 5] {
        [s.q_elems(), s.kv_elems(), s.kv_elems(), s.q_elems(), s.lse_elems()]
    }

    #[test]
    fn the_table_accepts_its_pairs_and_refuses_the_rest_with_what_to_use() {
        for e in FLASH_KERNELS {
            for d in FLASH_HEAD_DIMS {
                let s = AttentionShape { head_dim: *d, ..SHAPE };
                check_forward(e.kernel, e.dtype, s, 0.125, lens(s), [0; 5]).unwrap();
            }
            assert_eq!(flash_entry(e.name).unwrap(), *e);
        }
        let e = check_forward(FlashKernel::MmaSync, DType::F32, SHAPE, 0.125, lens(SHAPE), [0; 5]).unwrap_err();
        assert!(e.to_string().contains("use flash_fwd_simt_f32"), "{e}");
        let e = check_forward(FlashKernel::Simt, DType::F16, SHAPE, 0.125, lens(SHAPE), [0; 5]).unwrap_err();
        assert!(e.to_string().contains("flash_fwd_mma_f16"), "{e}");
        let e = check_forward(FlashKernel::Simt, DType::F64, SHAPE, 0.125, lens(SHAPE), [0; 5]).unwrap_err();
        assert!(e.to_string().contains("convert the inputs"), "{e}");
        assert!(flash_entry("flash_fwd_nope").unwrap_err().to_string().contains("flash_fwd_mma_bf16"));
    }

    #[test]
    fn head_dims_scales_sizes_and_alignment_are_checked() {
        let s = AttentionShape { head_dim: 96, ..SHAPE };
        let e = check_forward(FlashKernel::Simt, DType::F32, s, 0.1, lens(s), [0; 5]).unwrap_err();
        assert!(e.to_string().contains("head dim 96"), "{e}");
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(check_forward(FlashKernel::Simt, DType::F32, SHAPE, bad, lens(SHAPE), [0; 5]).is_err());
        }
        let mut l = lens(SHAPE);
        l[4] -= 1;
        let e = check_forward(FlashKernel::Simt, DType::F32, SHAPE, 0.1, l, [0; 5]).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }) && e.to_string().contains("lse: 102"), "{e}");
        let e = check_forward(FlashKernel::MmaSync, DType::BF16, SHAPE, 0.1, lens(SHAPE), [0, 0, 8, 0, 0]).unwrap_err();
        assert!(e.to_string().contains("16-byte"), "{e}");
        check_forward(FlashKernel::Simt, DType::BF16, SHAPE, 0.1, lens(SHAPE), [0, 0, 8, 0, 0]).unwrap();
        let wide = AttentionShape { batch: 256, heads: 256, ..SHAPE };
        assert!(check_forward(FlashKernel::Simt, DType::F32, wide, 0.1, lens(wide), [0; 5]).is_err());
    }

    #[test]
    fn shared_memory_fits_an_sm_80_block() {
        // sm_80 (A100) allows 163 KiB per block with the opt-in; sm_86/89 99 KiB
        for e in FLASH_KERNELS {
            for &d in FLASH_HEAD_DIMS {
                assert!(e.kernel.smem_bytes(d) <= 99 * 1024, "{e:?} d {d}: {}", e.kernel.smem_bytes(d));
            }
        }
        assert_eq!(FlashKernel::MmaSync.smem_bytes(128), 80 * 1024);
        // the backward needs the opt-in on every GPU: 106 KiB at head dim 128 (an A100 allows 163)
        assert!(flash_bwd_smem_bytes(128) <= 163 * 1024 && flash_bwd_smem_bytes(64) <= 99 * 1024);
    }
}

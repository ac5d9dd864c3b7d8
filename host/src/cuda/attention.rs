//! Attention on the GPU: the flash forward kernels' table, their checks and their launcher.
//!
//! ```text
//!   FlashKernel::Simt     rung 1: tiled online softmax on CUDA cores     f32, bf16   D 64, 128
//!   FlashKernel::MmaSync  rung 2: FlashAttention-2 on mma.sync           bf16, f16   D 64, 128
//!   FlashKernel::Wgmma    rung 3: TMA + wgmma, producer warp (sm_90a)    bf16, f16   D 64, 128
//!   FlashKernel::Wgmma2   rung 3, two consumer warpgroups (sm_90a)        bf16, f16   D 64, 128
//! ```
//!
//! The backward ([`flash_backward`]) has its own table, [`FlashBwdKernel`]:
//!
//! ```text
//!   FlashBwdKernel::Simt     rung 1: three passes on CUDA cores            f32, bf16   D 64, 128
//!   FlashBwdKernel::MmaSync  rung 2: FlashAttention-2 on mma.sync          bf16, f16   D 64, 128
//! ```
//!
//! [`flash_backward`] picks the best one for the dtype and head dim ([`flash_backward_kernel`]);
//! [`flash_backward_with`] runs a chosen one. Both are deterministic (no atomics).
//!
//! Every kernel but `Wgmma` and `Wgmma2` runs on every module (sm_80 and newer); those two run
//! only on the sm_90a module (compute capability 9.0) and are refused elsewhere ([`check_arch`]).
//! They read Q, K and V through tensor maps ([`wgmma_qkv_spec`]), made and cached as the wgmma
//! GEMM's are. The forward's best-kernel choice ([`flash_forward_kernel`]) picks `Wgmma` on sm_90a
//! ([`FLASH_WGMMA_DISPATCH`]) and `MmaSync` elsewhere. [`flash_forward`] checks the buffers
//! against the shape, the dtype and head dim against the kernel, the alignment the kernel's
//! 16-byte copies need, the grid and the shared memory, and refuses the rest with an error that
//! says what to change. The layout and the causal mask (bottom-right aligned) are
//! [`crate::attention`]'s.

use crate::cuda::{Device, DeviceBuffer, LaunchConfig};
use crate::dtype::DType;
use crate::error::{Error, Result};
use half::{bf16, f16};
use kiln_gpu::kernels::attention::AttentionParams;
use kiln_gpu::kernels::flash_bwd_mma::{
    self as bwd_mma, FLASH_BWD_MMA_BKV, FLASH_BWD_MMA_BQ, FLASH_BWD_MMA_THREADS, flash_bwd_mma_smem_bytes,
};
use kiln_gpu::kernels::flash_bwd_simt::{self as bwd, FLASH_BWD_ROWS, FLASH_BWD_THREADS, flash_bwd_smem_bytes};
use kiln_gpu::kernels::flash_mma::{self as mma, FLASH_MMA_BQ, FLASH_MMA_THREADS, flash_mma_smem_bytes};
use kiln_gpu::kernels::flash_simt::{self as simt, FLASH_SIMT_BQ, FLASH_SIMT_THREADS, flash_simt_smem_bytes};
use kiln_gpu::kernels::flash_wgmma::{
    self as fwg, FLASH_WGMMA_BOX_COLS, FLASH_WGMMA_BOX_ROWS, FLASH_WGMMA_BQ, FLASH_WGMMA_THREADS, FLASH_WGMMA2_BQ,
    FLASH_WGMMA2_THREADS, flash_wgmma_smem_bytes, flash_wgmma2_smem_bytes,
};
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
    /// Rung 3: TMA + `wgmma` with a producer warp (`flash_wgmma`, sm_90a only), bf16 or f16.
    Wgmma,
    /// Rung 3 with two consumer warpgroups sharing each K/V tile (`flash_fwd_wgmma2_*`, sm_90a
    /// only), bf16 or f16.
    Wgmma2,
}

/// Whether [`flash_forward_kernel`] picks [`FlashKernel::Wgmma`] on sm_90a: on since its GPU tests
/// passed on an H200 (run 220), where it ran 1.8-1.9x faster than `MmaSync`.
pub const FLASH_WGMMA_DISPATCH: bool = true;

/// The forward kernel the attention op should run for `dtype` at `head_dim` on a device whose
/// module is `arch`: the best verified one (`MmaSync` for bf16 / f16, `Wgmma` instead on sm_90a
/// once [`FLASH_WGMMA_DISPATCH`] is on, `Simt` for f32), or `None` where no kernel takes the pair.
pub fn flash_forward_kernel(dtype: DType, head_dim: u32, arch: kiln_gpu::Arch) -> Option<FlashKernel> {
    if !FLASH_HEAD_DIMS.contains(&head_dim) {
        return None;
    }
    let wgmma = FLASH_WGMMA_DISPATCH && arch == kiln_gpu::Arch::Sm90a;
    let order: &[FlashKernel] = if wgmma {
        &[FlashKernel::Wgmma, FlashKernel::MmaSync, FlashKernel::Simt]
    } else {
        &[FlashKernel::MmaSync, FlashKernel::Simt]
    };
    order.iter().copied().find(|k| k.dtypes().contains(&dtype))
}

/// Refuses a kernel the device's module does not hold: `Wgmma` needs the sm_90a module (compute
/// capability 9.0); every other kernel runs everywhere.
pub fn check_arch(kernel: FlashKernel, arch: kiln_gpu::Arch) -> Result<()> {
    if kernel.is_hopper() && arch != kiln_gpu::Arch::Sm90a {
        return Err(Error::Unsupported {
            op: "flash_forward",
            what: format!(
                "{kernel:?} needs an sm_90a device (Hopper, compute capability 9.0); this device loads the {arch:?} module: use MmaSync"
            ),
        });
    }
    Ok(())
}

/// The tensor map `flash_fwd_wgmma_*` reads Q (`rows = batch * heads * q_len`) or K / V (`rows =
/// batch * heads * kv_len`) through: a `[rows, head_dim]` 16-bit matrix, boxes of 64 rows by 64
/// columns, 128-byte swizzle.
pub fn wgmma_qkv_spec(dtype: DType, rows: u64, head_dim: u32) -> crate::cuda::TensorMapSpec {
    crate::cuda::TensorMapSpec {
        dtype: if dtype == DType::F16 { crate::cuda::TmaDtype::F16 } else { crate::cuda::TmaDtype::Bf16 },
        rows,
        cols: head_dim as u64,
        row_pitch: head_dim as u64,
        box_rows: FLASH_WGMMA_BOX_ROWS,
        box_cols: FLASH_WGMMA_BOX_COLS,
        swizzle: kiln_gpu::swizzle::Swizzle::B128,
    }
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
    FlashEntry { name: "flash_fwd_wgmma_bf16", kernel: FlashKernel::Wgmma, dtype: DType::BF16, rung: 3 },
    FlashEntry { name: "flash_fwd_wgmma_f16", kernel: FlashKernel::Wgmma, dtype: DType::F16, rung: 3 },
    FlashEntry { name: "flash_fwd_wgmma2_bf16", kernel: FlashKernel::Wgmma2, dtype: DType::BF16, rung: 3 },
    FlashEntry { name: "flash_fwd_wgmma2_f16", kernel: FlashKernel::Wgmma2, dtype: DType::F16, rung: 3 },
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
            FlashKernel::Wgmma => FLASH_WGMMA_THREADS,
            FlashKernel::Wgmma2 => FLASH_WGMMA2_THREADS,
        }
    }
    /// Query rows per block.
    pub fn block_rows(self) -> u32 {
        match self {
            FlashKernel::Simt => FLASH_SIMT_BQ,
            FlashKernel::MmaSync => FLASH_MMA_BQ,
            FlashKernel::Wgmma => FLASH_WGMMA_BQ,
            FlashKernel::Wgmma2 => FLASH_WGMMA2_BQ,
        }
    }
    /// Dynamic shared memory per block at head dim `d`.
    pub fn smem_bytes(self, d: u32) -> u32 {
        match self {
            FlashKernel::Simt => flash_simt_smem_bytes(d),
            FlashKernel::MmaSync => flash_mma_smem_bytes(d),
            FlashKernel::Wgmma => flash_wgmma_smem_bytes(d),
            FlashKernel::Wgmma2 => flash_wgmma2_smem_bytes(d),
        }
    }
    /// Whether the kernel copies rows in 16-byte chunks or through TMA (buffers 16-byte aligned,
    /// rows of a multiple of 8 elements).
    pub fn needs_16_byte_alignment(self) -> bool {
        matches!(self, FlashKernel::MmaSync | FlashKernel::Wgmma | FlashKernel::Wgmma2)
    }
    /// Whether the kernel is a Hopper one (sm_90a module only, Q / K / V through tensor maps).
    pub fn is_hopper(self) -> bool {
        matches!(self, FlashKernel::Wgmma | FlashKernel::Wgmma2)
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
            what: format!(
                "a buffer at {a:#x} with {kernel:?}: its 16-byte copies (TMA for Wgmma) need 16-byte-aligned q, k, v and o"
            ),
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
    check_arch(kernel, dev.arch())?;
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
    if kernel.is_hopper() {
        return flash_forward_wgmma(dev, kernel, cfg, (q, k, v, o, lse), shape, p);
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

/// Launches `flash_fwd_wgmma_*` (the caller checked the problem and the device): the tensor maps of
/// Q, K and V from the device's cache, then the kernel for `T` and the head dim.
fn flash_forward_wgmma<T: FlashElement>(
    dev: &Device,
    kernel: FlashKernel,
    cfg: LaunchConfig,
    bufs: Bufs<'_, T>,
    shape: AttentionShape,
    p: AttentionParams,
) -> Result<()> {
    let (q, k, v, o, lse) = bufs;
    let bh = shape.batch as u64 * shape.heads as u64;
    // the kernel's TMA row coordinates are i32
    let rows = bh * shape.q_len.max(shape.kv_len) as u64;
    if rows > i32::MAX as u64 {
        return Err(Error::Unsupported {
            op: "flash_forward",
            what: format!("{rows} rows over all heads with Wgmma (its TMA coordinates are i32): split the batch"),
        });
    }
    let q_map = dev.tensor_map_cached(q.addr(), &wgmma_qkv_spec(T::DTYPE, bh * shape.q_len as u64, shape.head_dim))?;
    // with no key the kernel loads no K/V tile (every row gets O = 0, LSE = -inf), and a map of 0
    // rows cannot be made: Q's map stands in
    let (k_map, v_map) = if shape.kv_len == 0 {
        (q_map.clone(), q_map.clone())
    } else {
        let kv_spec = wgmma_qkv_spec(T::DTYPE, bh * shape.kv_len as u64, shape.head_dim);
        (dev.tensor_map_cached(k.addr(), &kv_spec)?, dev.tensor_map_cached(v.addr(), &kv_spec)?)
    };
    let (qm, km, vm) = (q_map.ptr(), k_map.ptr(), v_map.ptr());
    let (op, lp) = (o.ptr_mut(), lse.ptr_mut());
    // SAFETY: `check_forward` matched the buffers' sizes to the shape and their alignment to TMA,
    // `check_arch` the device to sm_90a; the maps describe exactly these buffers.
    unsafe {
        let pair = kernel == FlashKernel::Wgmma2;
        match (T::DTYPE, shape.head_dim == 128, pair) {
            (DType::BF16, false, false) => dev.launch(fwg::FlashFwdWgmmaBf16D64, cfg, (qm, km, vm, op.cast(), lp, p)),
            (DType::BF16, true, false) => dev.launch(fwg::FlashFwdWgmmaBf16D128, cfg, (qm, km, vm, op.cast(), lp, p)),
            (DType::F16, false, false) => dev.launch(fwg::FlashFwdWgmmaF16D64, cfg, (qm, km, vm, op.cast(), lp, p)),
            (DType::F16, true, false) => dev.launch(fwg::FlashFwdWgmmaF16D128, cfg, (qm, km, vm, op.cast(), lp, p)),
            (DType::BF16, false, true) => dev.launch(fwg::FlashFwdWgmma2Bf16D64, cfg, (qm, km, vm, op.cast(), lp, p)),
            (DType::BF16, true, true) => dev.launch(fwg::FlashFwdWgmma2Bf16D128, cfg, (qm, km, vm, op.cast(), lp, p)),
            (DType::F16, false, true) => dev.launch(fwg::FlashFwdWgmma2F16D64, cfg, (qm, km, vm, op.cast(), lp, p)),
            (DType::F16, true, true) => dev.launch(fwg::FlashFwdWgmma2F16D128, cfg, (qm, km, vm, op.cast(), lp, p)),
            (dtype, _, _) => Err(Error::Unsupported {
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

/// The flash backward kernels, rung by rung.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlashBwdKernel {
    /// Rung 1: three passes on CUDA cores (`flash_bwd_simt`), f32 or bf16.
    Simt,
    /// Rung 2: FlashAttention-2 on `mma.sync` (`flash_bwd_mma`: delta, dK / dV, dQ), bf16 or f16.
    MmaSync,
}

impl FlashBwdKernel {
    /// The forward kernel of the same rung (the one whose dtype table this kernel shares).
    pub fn forward(self) -> FlashKernel {
        match self {
            FlashBwdKernel::Simt => FlashKernel::Simt,
            FlashBwdKernel::MmaSync => FlashKernel::MmaSync,
        }
    }
    /// The backward kernel of the forward rung `k`.
    pub fn of_forward(k: FlashKernel) -> Self {
        match k {
            FlashKernel::Simt => FlashBwdKernel::Simt,
            // the Hopper rung has no backward of its own yet: mma.sync's takes its O and LSE
            FlashKernel::MmaSync | FlashKernel::Wgmma | FlashKernel::Wgmma2 => FlashBwdKernel::MmaSync,
        }
    }
    /// Whether this kernel runs `dtype` at head dim `head_dim`.
    pub fn supports(self, dtype: DType, head_dim: u32) -> bool {
        FLASH_HEAD_DIMS.contains(&head_dim) && self.forward().dtypes().contains(&dtype)
    }
    /// Dynamic shared memory per block at head dim `d`.
    pub fn smem_bytes(self, d: u32) -> u32 {
        match self {
            FlashBwdKernel::Simt => flash_bwd_smem_bytes(d),
            FlashBwdKernel::MmaSync => flash_bwd_mma_smem_bytes(d),
        }
    }
}

/// The backward kernel [`flash_backward`] runs for `dtype` at `head_dim`: the best verified one
/// (`MmaSync` for bf16 / f16, `Simt` for f32), or `None` where no kernel takes the pair.
pub fn flash_backward_kernel(dtype: DType, head_dim: u32) -> Option<FlashBwdKernel> {
    [FlashBwdKernel::MmaSync, FlashBwdKernel::Simt].into_iter().find(|k| k.supports(dtype, head_dim))
}

/// Whether [`flash_backward`] runs `dtype` at `head_dim` (f32, bf16 and f16 at head dims 64 and
/// 128).
pub fn flash_backward_supports(dtype: DType, head_dim: u32) -> bool {
    flash_backward_kernel(dtype, head_dim).is_some()
}

/// Checks a backward problem for `kernel` before any launch: the forward's checks (dtype table,
/// head dim, scale, sizes, grid) for the rung's forward kernel, the gradients' sizes and (for
/// `MmaSync`'s 16-byte copies) the alignment of every 16-bit buffer. `lens` and `addrs` are those
/// of (q, k, v, o, lse, d_o, dq, dk, dv).
pub fn check_backward(
    kernel: FlashBwdKernel,
    dtype: DType,
    shape: AttentionShape,
    scale: f32,
    lens: [usize; 9],
    addrs: [u64; 9],
) -> Result<()> {
    const OP: &str = "flash_backward";
    let fwd_lens = [lens[0], lens[1], lens[2], lens[3], lens[4]];
    check_forward(kernel.forward(), dtype, shape, scale, fwd_lens, [0; 5]).map_err(|e| match e {
        Error::Unsupported { what, .. } => Error::Unsupported { op: OP, what: format!("{kernel:?} backward: {what}") },
        e => e,
    })?;
    let grads = [lens[5], lens[6], lens[7], lens[8]];
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
    if kernel == FlashBwdKernel::MmaSync
        && let Some(a) = addrs.iter().enumerate().filter(|(i, _)| *i != 4).map(|(_, a)| a).find(|a| *a % 16 != 0)
    {
        return Err(Error::Unsupported {
            op: OP,
            what: format!(
                "a buffer at {a:#x} with {kernel:?}: its 16-byte copies need 16-byte-aligned q, k, v, o, d_o, dq, dk and dv"
            ),
        });
    }
    Ok(())
}

/// Attention backward with the best verified kernel for `T` and the head dim
/// ([`flash_backward_kernel`]: `MmaSync` for bf16 / f16, `Simt` for f32): from the forward's
/// inputs, its output `o` and log-sum-exp `lse`, and the output's gradient `d_o`, the gradients
/// `dq`, `dk`, `dv` (the shapes of q, k, v). `kernel` is the forward kernel that made `o` and
/// `lse`; any forward's are valid inputs, so it does not restrict the choice. Deterministic (no
/// atomics): the same inputs give the same bits. See [`flash_backward_with`].
#[allow(clippy::too_many_arguments)]
pub fn flash_backward<T: FlashElement>(
    dev: &Device,
    kernel: FlashKernel,
    inputs: BwdInputs<'_, T>,
    lse: &DeviceBuffer<f32>,
    grads: (&mut DeviceBuffer<T>, &mut DeviceBuffer<T>, &mut DeviceBuffer<T>),
    shape: AttentionShape,
    causal: bool,
    scale: f32,
) -> Result<()> {
    let bwd = flash_backward_kernel(T::DTYPE, shape.head_dim).unwrap_or(FlashBwdKernel::of_forward(kernel));
    flash_backward_with(dev, bwd, inputs, lse, grads, shape, causal, scale)
}

/// Attention backward with `kernel` (FlashAttention-2: P recomputed from `lse`): see
/// [`flash_backward`]. `Simt` runs three passes on CUDA cores (dQ with `delta = dO . O`, then dK,
/// then dV), `MmaSync` three kernels on the tensor cores (delta, then dK and dV together, then dQ);
/// both own every gradient row in one block and sum it in a fixed order (no atomics). Refuses,
/// with a typed error, what [`check_backward`] refuses and a device without the shared memory.
#[allow(clippy::too_many_arguments)]
pub fn flash_backward_with<T: FlashElement>(
    dev: &Device,
    kernel: FlashBwdKernel,
    (q, k, v, o, d_o): BwdInputs<'_, T>,
    lse: &DeviceBuffer<f32>,
    (dq, dk, dv): (&mut DeviceBuffer<T>, &mut DeviceBuffer<T>, &mut DeviceBuffer<T>),
    shape: AttentionShape,
    causal: bool,
    scale: f32,
) -> Result<()> {
    const OP: &str = "flash_backward";
    let lens = [q.len(), k.len(), v.len(), o.len(), lse.len(), d_o.len(), dq.len(), dk.len(), dv.len()];
    let addrs = [q.addr(), k.addr(), v.addr(), o.addr(), lse.addr(), d_o.addr(), dq.addr(), dk.addr(), dv.addr()];
    check_backward(kernel, T::DTYPE, shape, scale, lens, addrs)?;
    if shape.batch == 0 || shape.heads == 0 {
        return Ok(());
    }
    let smem = kernel.smem_bytes(shape.head_dim);
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
    let max_smem = dev.attribute(OPTIN)?.max(0) as u32;
    if smem > max_smem {
        return Err(Error::Unsupported {
            op: OP,
            what: format!(
                "{kernel:?} at head dim {}: the backward needs {smem} bytes of shared memory per block and {} allows {max_smem}",
                shape.head_dim,
                dev.name()
            ),
        });
    }
    if kernel == FlashBwdKernel::MmaSync {
        return mma_backward(dev, (q, k, v, o, d_o), lse, (dq, dk, dv), shape, causal, scale);
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

/// The `MmaSync` backward's launches (checked by [`flash_backward_with`]): delta, dK / dV, dQ.
#[allow(clippy::too_many_arguments)]
fn mma_backward<T: FlashElement>(
    dev: &Device,
    ins: BwdInputs<'_, T>,
    lse: &DeviceBuffer<f32>,
    outs: (&mut DeviceBuffer<T>, &mut DeviceBuffer<T>, &mut DeviceBuffer<T>),
    shape: AttentionShape,
    causal: bool,
    scale: f32,
) -> Result<()> {
    let p = shape.params(causal, scale);
    let mut delta = dev.zeros::<f32>(shape.lse_elems())?;
    let smem = flash_bwd_mma_smem_bytes(shape.head_dim);
    let cfg = |rows: u32, block: u32, smem: u32| LaunchConfig {
        grid_dim: (rows.div_ceil(block), shape.batch * shape.heads, 1),
        block_dim: (FLASH_BWD_MMA_THREADS, 1, 1),
        shared_mem_bytes: smem,
    };
    /// Launches the three kernels of `B` (element type `U`, which is `T`'s by the dtype match).
    #[allow(clippy::too_many_arguments)]
    unsafe fn three<B: MmaBwdKernels, U, T: cudarc::driver::DeviceRepr>(
        dev: &Device,
        cfgs: [LaunchConfig; 3],
        shape: AttentionShape,
        (q, k, v, o, d_o): BwdInputs<'_, T>,
        lse: &DeviceBuffer<f32>,
        delta: &mut DeviceBuffer<f32>,
        (dq, dk, dv): (&mut DeviceBuffer<T>, &mut DeviceBuffer<T>, &mut DeviceBuffer<T>),
        p: AttentionParams,
    ) -> Result<()>
    where
        B::Delta: Kernel<Args = (DevicePtr<U>, DevicePtr<U>, DevicePtrMut<f32>, AttentionParams)>,
        B::DkDv: Kernel<Args = MmaDkDvArgs<U>>,
        B::Dq: Kernel<Args = MmaDqArgs<U>>,
    {
        let [q, k, v, o, d_o] = [q, k, v, o, d_o].map(|b| b.ptr().cast::<U>());
        // SAFETY: the caller checked sizes, dtype and alignment; delta holds one f32 per query
        // row, written by the first launch before the others read it (one stream).
        unsafe {
            if shape.q_len > 0 {
                dev.launch(B::Delta::default(), cfgs[0], (o, d_o, delta.ptr_mut(), p))?;
            }
            if shape.kv_len > 0 {
                let args =
                    (q, k, v, d_o, lse.ptr(), delta.ptr(), dk.ptr_mut().cast::<U>(), dv.ptr_mut().cast::<U>(), p);
                dev.launch(B::DkDv::default(), cfgs[1], args)?;
            }
            if shape.q_len > 0 {
                dev.launch(
                    B::Dq::default(),
                    cfgs[2],
                    (q, k, v, d_o, lse.ptr(), delta.ptr(), dq.ptr_mut().cast::<U>(), p),
                )?;
            }
        }
        Ok(())
    }
    let cfgs = [
        cfg(shape.q_len, FLASH_BWD_MMA_BQ, 0),
        cfg(shape.kv_len, FLASH_BWD_MMA_BKV, smem),
        cfg(shape.q_len, FLASH_BWD_MMA_BQ, smem),
    ];
    let d128 = shape.head_dim == 128;
    // SAFETY: as above.
    unsafe {
        match (T::DTYPE, d128) {
            (DType::BF16, false) => three::<MmaBf16D64, bf16, T>(dev, cfgs, shape, ins, lse, &mut delta, outs, p),
            (DType::BF16, true) => three::<MmaBf16D128, bf16, T>(dev, cfgs, shape, ins, lse, &mut delta, outs, p),
            (DType::F16, false) => three::<MmaF16D64, f16, T>(dev, cfgs, shape, ins, lse, &mut delta, outs, p),
            (DType::F16, true) => three::<MmaF16D128, f16, T>(dev, cfgs, shape, ins, lse, &mut delta, outs, p),
            (dtype, _) => Err(Error::Unsupported {
                op: "flash_backward",
                what: format!("{dtype:?} with MmaSync: not in the kernel table"),
            }),
        }
    }
}

/// The `MmaSync` dK / dV kernel's arguments.
type MmaDkDvArgs<T> = (
    DevicePtr<T>,
    DevicePtr<T>,
    DevicePtr<T>,
    DevicePtr<T>,
    DevicePtr<f32>,
    DevicePtr<f32>,
    DevicePtrMut<T>,
    DevicePtrMut<T>,
    AttentionParams,
);
/// The `MmaSync` dQ kernel's arguments.
type MmaDqArgs<T> = (
    DevicePtr<T>,
    DevicePtr<T>,
    DevicePtr<T>,
    DevicePtr<T>,
    DevicePtr<f32>,
    DevicePtr<f32>,
    DevicePtrMut<T>,
    AttentionParams,
);

/// The `MmaSync` backward's three kernels for one element type and head dim.
trait MmaBwdKernels {
    type Delta: Kernel;
    type DkDv: Kernel;
    type Dq: Kernel;
}

macro_rules! mma_bwd_kernels {
    ($($name:ident: $delta:ident, $dkdv:ident, $dq:ident;)*) => {$(
        struct $name;
        impl MmaBwdKernels for $name {
            type Delta = bwd_mma::$delta;
            type DkDv = bwd_mma::$dkdv;
            type Dq = bwd_mma::$dq;
        }
    )*};
}

mma_bwd_kernels! {
    MmaBf16D64: FlashBwdDeltaBf16D64, FlashBwdDkdvMmaBf16D64, FlashBwdDqMmaBf16D64;
    MmaBf16D128: FlashBwdDeltaBf16D128, FlashBwdDkdvMmaBf16D128, FlashBwdDqMmaBf16D128;
    MmaF16D64: FlashBwdDeltaF16D64, FlashBwdDkdvMmaF16D64, FlashBwdDqMmaF16D64;
    MmaF16D128: FlashBwdDeltaF16D128, FlashBwdDkdvMmaF16D128, FlashBwdDqMmaF16D128;
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

    #[test]
    fn the_hopper_rung_is_refused_off_sm90a_and_not_dispatched_yet() {
        use kiln_gpu::Arch;
        check_arch(FlashKernel::Wgmma, Arch::Sm90a).unwrap();
        for arch in [Arch::Sm80, Arch::Sm100a] {
            let e = check_arch(FlashKernel::Wgmma, arch).unwrap_err();
            assert!(e.to_string().contains("sm_90a") && e.to_string().contains("MmaSync"), "{e}");
            check_arch(FlashKernel::MmaSync, arch).unwrap();
            check_arch(FlashKernel::Simt, arch).unwrap();
        }
        for arch in Arch::ALL {
            let want =
                if FLASH_WGMMA_DISPATCH && arch == Arch::Sm90a { FlashKernel::Wgmma } else { FlashKernel::MmaSync };
            assert_eq!(flash_forward_kernel(DType::BF16, 128, arch), Some(want));
            assert_eq!(flash_forward_kernel(DType::F16, 64, arch), Some(want));
            assert_eq!(flash_forward_kernel(DType::F32, 64, arch), Some(FlashKernel::Simt));
            assert_eq!(flash_forward_kernel(DType::BF16, 96, arch), None);
            assert_eq!(flash_forward_kernel(DType::F64, 64, arch), None);
        }
        assert_eq!(FlashBwdKernel::of_forward(FlashKernel::Wgmma), FlashBwdKernel::MmaSync);
        assert!(FlashKernel::Wgmma.needs_16_byte_alignment());
        assert_eq!(FlashKernel::Wgmma.dtypes(), vec![DType::BF16, DType::F16]);
        // Q, two stages of K and V, five barriers; under the 227 KiB opt-in of Hopper
        assert_eq!(FlashKernel::Wgmma.smem_bytes(64), 5 * 8192 + 40);
        assert_eq!(FlashKernel::Wgmma.smem_bytes(128), 5 * 16384 + 40);
        assert_eq!(FlashKernel::Wgmma2.smem_bytes(128), 6 * 16384 + 40);
        assert!(check_arch(FlashKernel::Wgmma2, Arch::Sm80).is_err());
        assert_eq!(FlashKernel::Wgmma2.threads(), 288);
        assert_eq!(FlashBwdKernel::of_forward(FlashKernel::Wgmma2), FlashBwdKernel::MmaSync);
        let e = check_forward(FlashKernel::Wgmma, DType::BF16, SHAPE, 0.1, lens(SHAPE), [0, 8, 0, 0, 0]).unwrap_err();
        assert!(e.to_string().contains("16-byte"), "{e}");
    }

    #[test]
    fn the_hopper_rung_maps_are_valid_tensor_maps() {
        for d in FLASH_HEAD_DIMS {
            for dtype in [DType::BF16, DType::F16] {
                let spec = wgmma_qkv_spec(dtype, 6 * 17, *d);
                spec.validate(0x1000).unwrap();
                assert_eq!(spec.box_bytes(), 64 * 64 * 2);
                assert!(spec.validate(0x1008).is_err());
            }
        }
    }

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

    fn bwd_lens(s: AttentionShape) -> [usize; 9] {
        let (q, kv) = (s.q_elems(), s.kv_elems());
        [q, kv, kv, q, s.lse_elems(), q, q, kv, kv]
    }

    #[test]
    fn the_backward_picks_mma_sync_for_16_bit_types_and_simt_for_f32() {
        for d in [64, 128] {
            assert_eq!(flash_backward_kernel(DType::BF16, d), Some(FlashBwdKernel::MmaSync));
            assert_eq!(flash_backward_kernel(DType::F16, d), Some(FlashBwdKernel::MmaSync));
            assert_eq!(flash_backward_kernel(DType::F32, d), Some(FlashBwdKernel::Simt));
            assert!(flash_backward_supports(DType::F16, d));
        }
        assert_eq!(flash_backward_kernel(DType::F64, 64), None);
        assert!(!flash_backward_supports(DType::BF16, 96));
        assert!(FlashBwdKernel::Simt.supports(DType::BF16, 64) && !FlashBwdKernel::Simt.supports(DType::F16, 64));
        for k in [FlashKernel::Simt, FlashKernel::MmaSync] {
            assert_eq!(FlashBwdKernel::of_forward(k).forward(), k);
        }
    }

    #[test]
    fn the_backward_checks_dtypes_sizes_and_alignment() {
        let l = bwd_lens(SHAPE);
        check_backward(FlashBwdKernel::MmaSync, DType::BF16, SHAPE, 0.1, l, [0; 9]).unwrap();
        check_backward(FlashBwdKernel::MmaSync, DType::F16, SHAPE, 0.1, l, [0; 9]).unwrap();
        let e = check_backward(FlashBwdKernel::MmaSync, DType::F32, SHAPE, 0.1, l, [0; 9]).unwrap_err();
        assert!(e.to_string().contains("flash_fwd_simt_f32") && e.to_string().contains("MmaSync backward"), "{e}");
        let e = check_backward(FlashBwdKernel::Simt, DType::F16, SHAPE, 0.1, l, [0; 9]).unwrap_err();
        assert!(e.to_string().contains("flash_fwd_mma_f16"), "{e}");
        let mut short = l;
        short[7] -= 1;
        let e = check_backward(FlashBwdKernel::MmaSync, DType::BF16, SHAPE, 0.1, short, [0; 9]).unwrap_err();
        assert!(matches!(e, Error::Shape { .. }) && e.to_string().contains("dk"), "{e}");
        // a misaligned gradient is refused by MmaSync; the lse (f32, read per element) may be at 4
        let mut addrs = [0u64; 9];
        addrs[8] = 8;
        let e = check_backward(FlashBwdKernel::MmaSync, DType::BF16, SHAPE, 0.1, l, addrs).unwrap_err();
        assert!(e.to_string().contains("16-byte"), "{e}");
        check_backward(FlashBwdKernel::Simt, DType::BF16, SHAPE, 0.1, l, addrs).unwrap();
        let mut addrs = [0u64; 9];
        addrs[4] = 4;
        check_backward(FlashBwdKernel::MmaSync, DType::BF16, SHAPE, 0.1, l, addrs).unwrap();
        let s = AttentionShape { head_dim: 96, ..SHAPE };
        assert!(check_backward(FlashBwdKernel::MmaSync, DType::BF16, s, 0.1, bwd_lens(s), [0; 9]).is_err());
    }

    #[test]
    fn the_mma_backward_fits_shared_memory_and_walks_the_right_query_blocks() {
        use kiln_gpu::kernels::flash_bwd_mma::flash_bwd_query_blocks;
        assert_eq!(FlashBwdKernel::MmaSync.smem_bytes(64), 48 * 1024);
        assert_eq!(FlashBwdKernel::MmaSync.smem_bytes(128), 96 * 1024);
        let p = |q_len, kv_len, causal: bool| {
            AttentionShape { batch: 1, heads: 1, q_len, kv_len, head_dim: 64 }.params(causal, 0.1)
        };
        // without the mask every key block walks every query block
        assert_eq!(flash_bwd_query_blocks(p(1000, 1000, false), 640), (0, 16));
        // with it, from the block of the first row that sees the first key (rows see j <= i + kv - q)
        assert_eq!(flash_bwd_query_blocks(p(1000, 1000, true), 0), (0, 16));
        assert_eq!(flash_bwd_query_blocks(p(1000, 1000, true), 640), (10, 6));
        assert_eq!(flash_bwd_query_blocks(p(1000, 1000, true), 960), (15, 1));
        // q_len < kv_len: the first keys are seen by every row
        assert_eq!(flash_bwd_query_blocks(p(17, 129, true), 64), (0, 1));
        // q_len > kv_len: rows 0..871 see no key; key 0 is first seen by row 871
        assert_eq!(flash_bwd_query_blocks(p(1000, 129, true), 0), (13, 3));
        // brute force against the mask itself
        for (q, kv) in [(1, 1), (17, 17), (129, 17), (17, 129), (1000, 129), (200, 1000)] {
            let pp = p(q, kv, true);
            for k0 in (0..kv).step_by(64) {
                let (b, n) = flash_bwd_query_blocks(pp, k0);
                let first = (0..q).find(|&i| pp.visible_keys(i) > k0);
                match first {
                    Some(i) => assert!(b * 64 <= i && i < (b + 1) * 64 && b + n == q.div_ceil(64), "{q} {kv} {k0}"),
                    None => assert_eq!(n, 0, "{q} {kv} {k0}"),
                }
            }
        }
    }
}

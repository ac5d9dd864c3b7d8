//! The flash forward: its kernels' table, checks and launcher.

use super::{AttentionShape, FlashElement};
use crate::cuda::{Device, DeviceBuffer, LaunchConfig};
use crate::dtype::DType;
use crate::error::{Error, Result};
use half::{bf16, f16};
use kiln_gpu::kernels::attention::AttentionParams;
use kiln_gpu::kernels::flash_mma::{self as mma, FLASH_MMA_BQ, FLASH_MMA_THREADS, flash_mma_smem_bytes};
use kiln_gpu::kernels::flash_simt::{self as simt, FLASH_SIMT_BQ, FLASH_SIMT_THREADS, flash_simt_smem_bytes};
use kiln_gpu::kernels::flash_wgmma::{
    self as fwg, FLASH_WGMMA_BOX_COLS, FLASH_WGMMA_BOX_ROWS, FLASH_WGMMA_BQ, FLASH_WGMMA_SCHED_WORDS,
    FLASH_WGMMA_THREADS, FLASH_WGMMA2_BQ, FLASH_WGMMA2_THREADS, flash_wgmma_smem_bytes, flash_wgmma_tiles,
    flash_wgmma2_smem_bytes,
};
use kiln_gpu::kernels::flash_wgmma_pp::{
    self as fpp, FLASH_WGMMA_PP_BQ, FLASH_WGMMA_PP_THREADS, flash_wgmma_pp_smem_bytes,
};
use kiln_gpu::{DevicePtr, DevicePtrMut, Kernel};

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
    /// Rung 3 with warp specialization (`flash_fwd_wgmma_pp_*`, sm_90a only): a producer warpgroup
    /// that gives its registers to two consumer warpgroups (`setmaxnreg`), which take turns on the
    /// tensor cores (named-barrier ping-pong), over a 3-stage K/V ring; bf16 or f16.
    WgmmaPingPong,
}

/// Whether [`flash_forward_kernel`] picks the Hopper forwards on sm_90a ([`FlashKernel::Wgmma2`]
/// at head dim 128, [`FlashKernel::Wgmma`] at 64): on since their GPU tests passed on an H200
/// (runs 220 and 235), where they ran 1.8-2.1x faster than `MmaSync`.
pub const FLASH_WGMMA_DISPATCH: bool = true;

/// Whether [`flash_forward_kernel`] picks [`FlashKernel::WgmmaPingPong`] (ahead of `Wgmma`) on
/// sm_90a: off until its GPU tests pass and it measures faster than `Wgmma`.
pub const FLASH_WGMMA_PP_DISPATCH: bool = false;

/// The forward kernel the attention op should run for `dtype` at `head_dim` on a device whose
/// module is `arch`: the best verified one (`MmaSync` for bf16 / f16; on sm_90a once
/// [`FLASH_WGMMA_DISPATCH`] is on `Wgmma2` at head dim 128 and `Wgmma` at 64, the faster at each
/// on an H200 (run 235: 0.93-0.96x the time at 128, 1.08x at 64); `Simt` for f32), or `None`
/// where no kernel takes the pair.
pub fn flash_forward_kernel(dtype: DType, head_dim: u32, arch: kiln_gpu::Arch) -> Option<FlashKernel> {
    if !FLASH_HEAD_DIMS.contains(&head_dim) {
        return None;
    }
    let wgmma = FLASH_WGMMA_DISPATCH && arch == kiln_gpu::Arch::Sm90a;
    let pp = FLASH_WGMMA_PP_DISPATCH && arch == kiln_gpu::Arch::Sm90a;
    let order: &[FlashKernel] = if pp {
        &[FlashKernel::WgmmaPingPong, FlashKernel::MmaSync, FlashKernel::Simt]
    } else if wgmma && head_dim == 128 {
        &[FlashKernel::Wgmma2, FlashKernel::MmaSync, FlashKernel::Simt]
    } else if wgmma {
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
    FlashEntry { name: "flash_fwd_wgmma_pp_bf16", kernel: FlashKernel::WgmmaPingPong, dtype: DType::BF16, rung: 3 },
    FlashEntry { name: "flash_fwd_wgmma_pp_f16", kernel: FlashKernel::WgmmaPingPong, dtype: DType::F16, rung: 3 },
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
            FlashKernel::WgmmaPingPong => FLASH_WGMMA_PP_THREADS,
        }
    }
    /// Query rows per block.
    pub fn block_rows(self) -> u32 {
        match self {
            FlashKernel::Simt => FLASH_SIMT_BQ,
            FlashKernel::MmaSync => FLASH_MMA_BQ,
            FlashKernel::Wgmma => FLASH_WGMMA_BQ,
            FlashKernel::Wgmma2 => FLASH_WGMMA2_BQ,
            FlashKernel::WgmmaPingPong => FLASH_WGMMA_PP_BQ,
        }
    }
    /// Dynamic shared memory per block at head dim `d`.
    pub fn smem_bytes(self, d: u32) -> u32 {
        match self {
            FlashKernel::Simt => flash_simt_smem_bytes(d),
            FlashKernel::MmaSync => flash_mma_smem_bytes(d),
            FlashKernel::Wgmma => flash_wgmma_smem_bytes(d),
            FlashKernel::Wgmma2 => flash_wgmma2_smem_bytes(d),
            FlashKernel::WgmmaPingPong => flash_wgmma_pp_smem_bytes(d),
        }
    }
    /// Whether the kernel copies rows in 16-byte chunks or through TMA (buffers 16-byte aligned,
    /// rows of a multiple of 8 elements).
    pub fn needs_16_byte_alignment(self) -> bool {
        matches!(self, FlashKernel::MmaSync | FlashKernel::Wgmma | FlashKernel::Wgmma2 | FlashKernel::WgmmaPingPong)
    }
    /// Whether the kernel is a Hopper one (sm_90a module only, Q / K / V through tensor maps).
    pub fn is_hopper(self) -> bool {
        matches!(self, FlashKernel::Wgmma | FlashKernel::Wgmma2 | FlashKernel::WgmmaPingPong)
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
    // the kernels index a head's rows in 32 bits, and the mma.sync, CUDA-core and ping-pong ones put
    // batch * heads on the grid's y
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
    flash_forward_blocks(dev, kernel, q, k, v, o, lse, shape, causal, scale, None)
}

/// [`flash_forward`] with the number of blocks of a `Wgmma` or `Wgmma2` launch chosen by the
/// caller. Those kernels are persistent: their blocks take the query tiles of
/// [`flash_wgmma_tiles`] (a head's tiles one after the other, its last rows first) in order from
/// the device's tile counter ([`Device::tile_counter`]), each loading its next tile's Q and K/V
/// while it finishes the current one. `None` launches as many blocks as the device holds at once
/// (one per multiprocessor for `Wgmma2`, two or three for `Wgmma`; at most one per tile). The tests
/// use a count to make blocks walk many tiles on small problems, `kiln attention --blocks` to time
/// a choice. Other kernels take `None` only.
#[allow(clippy::too_many_arguments)]
pub fn flash_forward_blocks<T: FlashElement>(
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
    blocks: Option<u32>,
) -> Result<()> {
    let lens = [q.len(), k.len(), v.len(), o.len(), lse.len()];
    let addrs = [q.addr(), k.addr(), v.addr(), o.addr(), lse.addr()];
    check_forward(kernel, T::DTYPE, shape, scale, lens, addrs)?;
    check_blocks(kernel, blocks)?;
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
        return flash_forward_wgmma(dev, kernel, cfg, (q, k, v, o, lse), shape, p, blocks);
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

// the forwards' tile counter fits the device's
const _: () = assert!(FLASH_WGMMA_SCHED_WORDS <= crate::cuda::TILE_COUNTER_WORDS);

/// Checks a block count given to [`flash_forward_blocks`]: only the `Wgmma` and `Wgmma2` forwards
/// take one, and it must be at least 1.
pub fn check_blocks(kernel: FlashKernel, blocks: Option<u32>) -> Result<()> {
    match blocks {
        None => Ok(()),
        Some(_) if !matches!(kernel, FlashKernel::Wgmma | FlashKernel::Wgmma2) => Err(Error::Unsupported {
            op: "flash_forward",
            what: format!(
                "a block count (--blocks) with {kernel:?}: only the Wgmma and Wgmma2 forwards (flash_fwd_wgmma_*, flash_fwd_wgmma2_*) run a chosen number of blocks; leave it out"
            ),
        }),
        Some(0) => Err(Error::Unsupported {
            op: "flash_forward",
            what: "0 blocks: give at least 1 (a block runs query tiles until none is left)".into(),
        }),
        Some(b) if b > i32::MAX as u32 => Err(Error::Unsupported {
            op: "flash_forward",
            what: format!(
                "{b} blocks: a grid holds at most 2^31 - 1; give fewer (one per query tile is the most that works)"
            ),
        }),
        Some(_) => Ok(()),
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
    blocks: Option<u32>,
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
    let (op, lp, sched) = (o.ptr_mut(), lse.ptr_mut(), dev.tile_counter());
    let tiles = flash_wgmma_tiles(p, kernel.block_rows());
    /// Launches `K` on `blocks` blocks, or (`None`) on as many as the device holds at once, at most
    /// one per query tile: a persistent grid whose blocks take tiles from the device's tile counter.
    unsafe fn persistent<K: Kernel>(
        dev: &Device,
        k: K,
        cfg: LaunchConfig,
        (blocks, tiles): (Option<u32>, u32),
        args: K::Args,
    ) -> Result<()> {
        let n = match blocks {
            Some(b) => b,
            None => dev.max_active_blocks::<K>(cfg.block_dim.0, cfg.shared_mem_bytes)?.clamp(1, tiles.max(1)),
        };
        // SAFETY: as the caller's.
        unsafe { dev.launch(k, LaunchConfig { grid_dim: (n, 1, 1), ..cfg }, args) }
    }
    let grid = (blocks, tiles);
    // SAFETY: `check_forward` matched the buffers' sizes to the shape and their alignment to TMA,
    // `check_arch` the device to sm_90a; the maps describe exactly these buffers.
    unsafe {
        // one launch per table row: the ping-pong kernels take a grid of their own, the others
        // a persistent one and the tile counter
        macro_rules! pp {
            ($k:expr) => {
                dev.launch($k, cfg, (qm, km, vm, op.cast(), lp, p))
            };
        }
        macro_rules! tiles {
            ($k:expr) => {
                persistent(dev, $k, cfg, grid, (qm, km, vm, op.cast(), lp, sched, p))
            };
        }
        if kernel == FlashKernel::WgmmaPingPong {
            return match (T::DTYPE, shape.head_dim == 128) {
                (DType::BF16, false) => pp!(fpp::FlashFwdWgmmaPpBf16D64),
                (DType::BF16, true) => pp!(fpp::FlashFwdWgmmaPpBf16D128),
                (DType::F16, false) => pp!(fpp::FlashFwdWgmmaPpF16D64),
                (DType::F16, true) => pp!(fpp::FlashFwdWgmmaPpF16D128),
                (dtype, _) => Err(Error::Unsupported {
                    op: "flash_forward",
                    what: format!("{dtype:?} with {kernel:?}: not in the kernel table"),
                }),
            };
        }
        let pair = kernel == FlashKernel::Wgmma2;
        match (T::DTYPE, shape.head_dim == 128, pair) {
            (DType::BF16, false, false) => tiles!(fwg::FlashFwdWgmmaBf16D64),
            (DType::BF16, true, false) => tiles!(fwg::FlashFwdWgmmaBf16D128),
            (DType::F16, false, false) => tiles!(fwg::FlashFwdWgmmaF16D64),
            (DType::F16, true, false) => tiles!(fwg::FlashFwdWgmmaF16D128),
            (DType::BF16, false, true) => tiles!(fwg::FlashFwdWgmma2Bf16D64),
            (DType::BF16, true, true) => tiles!(fwg::FlashFwdWgmma2Bf16D128),
            (DType::F16, false, true) => tiles!(fwg::FlashFwdWgmma2F16D64),
            (DType::F16, true, true) => tiles!(fwg::FlashFwdWgmma2F16D128),
            (dtype, _, _) => Err(Error::Unsupported {
                op: "flash_forward",
                what: format!("{dtype:?} with {kernel:?}: not in the kernel table"),
            }),
        }
    }
}

//! The flash backward: its kernels' table, checks and launcher (deterministic: no atomics).

use super::forward::*;
use super::{AttentionShape, FlashElement};
use crate::cuda::{Device, DeviceBuffer, LaunchConfig};
use crate::dtype::DType;
use crate::error::{Error, Result};
use half::{bf16, f16};
use kiln_gpu::kernels::attention::AttentionParams;
use kiln_gpu::kernels::flash_bwd_mma::{
    self as bwd_mma, FLASH_BWD_MMA_BKV, FLASH_BWD_MMA_BQ, FLASH_BWD_MMA_THREADS, flash_bwd_mma_smem_bytes,
};
use kiln_gpu::kernels::flash_bwd_simt::{self as bwd, FLASH_BWD_ROWS, FLASH_BWD_THREADS, flash_bwd_smem_bytes};
use kiln_gpu::kernels::flash_bwd_wgmma::{
    self as bwd_wg, FLASH_BWD_WGMMA_BKV, FLASH_BWD_WGMMA_BQ, FLASH_BWD_WGMMA_THREADS, FLASH_BWD_WGMMA2_ROWS,
    FLASH_BWD_WGMMA2_THREADS, flash_bwd_wgmma_smem_bytes, flash_bwd_wgmma2_smem_bytes,
};
use kiln_gpu::tma::TensorMap;
use kiln_gpu::{DevicePtr, DevicePtrMut, Kernel};

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
    /// Rung 3: TMA + `wgmma` with a producer warp (`flash_bwd_wgmma`: `mma.sync`'s delta, then dK /
    /// dV and dQ on `wgmma`; sm_90a only), bf16 or f16.
    Wgmma,
    /// Rung 3 with two consumer warpgroups per block sharing each streamed tile, and `setmaxnreg`
    /// (`flash_bwd_*_wgmma2_*`, sm_90a only), bf16 or f16.
    Wgmma2,
}

/// Whether [`flash_backward_kernel`] picks [`FlashBwdKernel::Wgmma2`] on sm_90a, and
/// [`FlashBwdKernel::of_forward`] pairs it with the Hopper forward rungs. On since the kernels were
/// written; the lead turns it off if their GPU tests fail (then sm_90a runs `MmaSync` again).
pub const FLASH_BWD_WGMMA_DISPATCH: bool = true;

impl FlashBwdKernel {
    /// Every backward kernel, rung by rung.
    pub const ALL: [FlashBwdKernel; 4] =
        [FlashBwdKernel::Simt, FlashBwdKernel::MmaSync, FlashBwdKernel::Wgmma, FlashBwdKernel::Wgmma2];
    /// The kernel's name on the command line (`kiln attention --backward-kernel NAME`).
    pub fn name(self) -> &'static str {
        match self {
            FlashBwdKernel::Simt => "simt",
            FlashBwdKernel::MmaSync => "mma",
            FlashBwdKernel::Wgmma => "wgmma",
            FlashBwdKernel::Wgmma2 => "wgmma2",
        }
    }
    /// The kernel named `name` ([`FlashBwdKernel::name`]); an unknown name is refused with the list.
    pub fn from_name(name: &str) -> Result<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name).ok_or_else(|| Error::Unsupported {
            op: "flash_backward",
            what: format!("no backward kernel named {name:?}: use one of {}", Self::ALL.map(|k| k.name()).join(", ")),
        })
    }
    /// The forward kernel of the same rung (the one whose dtype table this kernel shares).
    pub fn forward(self) -> FlashKernel {
        match self {
            FlashBwdKernel::Simt => FlashKernel::Simt,
            FlashBwdKernel::MmaSync => FlashKernel::MmaSync,
            FlashBwdKernel::Wgmma => FlashKernel::Wgmma,
            FlashBwdKernel::Wgmma2 => FlashKernel::Wgmma2,
        }
    }
    /// The backward kernel `kiln attention --kernel NAME --backward` runs after the forward rung
    /// `k` (without `--backward-kernel`): while [`FLASH_BWD_WGMMA_DISPATCH`] is on `Wgmma2` (the
    /// fastest, the one [`flash_backward_kernel`] picks on sm_90a) after every Hopper forward;
    /// `MmaSync` otherwise (it takes any forward's O and log-sum-exp), `Simt` after `Simt`.
    pub fn of_forward(k: FlashKernel) -> Self {
        match k {
            FlashKernel::Simt => FlashBwdKernel::Simt,
            k if k.is_hopper() && FLASH_BWD_WGMMA_DISPATCH => FlashBwdKernel::Wgmma2,
            _ => FlashBwdKernel::MmaSync,
        }
    }
    /// Whether the kernel is a Hopper one (sm_90a module only, inputs through tensor maps).
    pub fn is_hopper(self) -> bool {
        matches!(self, FlashBwdKernel::Wgmma | FlashBwdKernel::Wgmma2)
    }
    /// Whether the kernel copies rows in 16-byte chunks or through TMA (every 16-bit buffer
    /// 16-byte aligned).
    pub fn needs_16_byte_alignment(self) -> bool {
        matches!(self, FlashBwdKernel::MmaSync | FlashBwdKernel::Wgmma | FlashBwdKernel::Wgmma2)
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
            FlashBwdKernel::Wgmma => flash_bwd_wgmma_smem_bytes(d),
            FlashBwdKernel::Wgmma2 => flash_bwd_wgmma2_smem_bytes(d),
        }
    }
}

/// The backward kernel [`flash_backward`] runs for `dtype` at `head_dim` on a device whose module
/// is `arch`: the best one (`MmaSync` for bf16 / f16, `Wgmma2` instead on sm_90a while
/// [`FLASH_BWD_WGMMA_DISPATCH`] is on, `Simt` for f32), or `None` where no kernel takes the pair.
pub fn flash_backward_kernel(dtype: DType, head_dim: u32, arch: kiln_gpu::Arch) -> Option<FlashBwdKernel> {
    let wgmma = FLASH_BWD_WGMMA_DISPATCH && arch == kiln_gpu::Arch::Sm90a;
    let order: &[FlashBwdKernel] = if wgmma {
        &[FlashBwdKernel::Wgmma2, FlashBwdKernel::MmaSync, FlashBwdKernel::Simt]
    } else {
        &[FlashBwdKernel::MmaSync, FlashBwdKernel::Simt]
    };
    order.iter().copied().find(|k| k.supports(dtype, head_dim))
}

/// Whether [`flash_backward`] runs `dtype` at `head_dim` (f32, bf16 and f16 at head dims 64 and
/// 128, on every module).
pub fn flash_backward_supports(dtype: DType, head_dim: u32) -> bool {
    flash_backward_kernel(dtype, head_dim, kiln_gpu::Arch::Sm80).is_some()
}

/// Refuses a backward kernel the device's module does not hold: `Wgmma` needs the sm_90a module
/// (compute capability 9.0); the others run everywhere.
pub fn check_backward_arch(kernel: FlashBwdKernel, arch: kiln_gpu::Arch) -> Result<()> {
    if kernel.is_hopper() && arch != kiln_gpu::Arch::Sm90a {
        return Err(Error::Unsupported {
            op: "flash_backward",
            what: format!(
                "{kernel:?} needs an sm_90a device (Hopper, compute capability 9.0); this device loads the {arch:?} module: use MmaSync"
            ),
        });
    }
    Ok(())
}

/// Checks a backward problem for `kernel` before any launch: the forward's checks (dtype table,
/// head dim, scale, sizes, grid) for the rung's forward kernel, the gradients' sizes and (for
/// `MmaSync`'s 16-byte copies and `Wgmma`'s TMA) the alignment of every 16-bit buffer. The device's
/// module is [`check_backward_arch`]'s. `lens` and `addrs` are those
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
    if kernel.needs_16_byte_alignment()
        && let Some(a) = addrs.iter().enumerate().filter(|(i, _)| *i != 4).map(|(_, a)| a).find(|a| *a % 16 != 0)
    {
        return Err(Error::Unsupported {
            op: OP,
            what: format!(
                "a buffer at {a:#x} with {kernel:?}: its 16-byte copies (TMA for Wgmma) need 16-byte-aligned q, k, v, o, d_o, dq, dk and dv"
            ),
        });
    }
    Ok(())
}

/// Attention backward with the best kernel for `T`, the head dim and the device
/// ([`flash_backward_kernel`]: `MmaSync` for bf16 / f16, `Wgmma2` on sm_90a, `Simt` for f32): from
/// the forward's
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
    let bwd = flash_backward_kernel(T::DTYPE, shape.head_dim, dev.arch()).unwrap_or(FlashBwdKernel::of_forward(kernel));
    flash_backward_with(dev, bwd, inputs, lse, grads, shape, causal, scale)
}

/// Attention backward with `kernel` (FlashAttention-2: P recomputed from `lse`): see
/// [`flash_backward`]. `Simt` runs three passes on CUDA cores (dQ with `delta = dO . O`, then dK,
/// then dV), `MmaSync` three kernels on the tensor cores (delta, then dK and dV together, then dQ),
/// `Wgmma` and `Wgmma2` the same three passes with the products on `wgmma` (sm_90a; one and two
/// consumer warpgroups); all own every gradient row
/// in one block and sum it in a fixed order (no atomics). Refuses, with a typed error, what
/// [`check_backward`] and [`check_backward_arch`] refuse and a device without the shared memory.
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
    check_backward_arch(kernel, dev.arch())?;
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
    if kernel.is_hopper() {
        let pair = kernel == FlashBwdKernel::Wgmma2;
        return wgmma_backward(dev, pair, (q, k, v, o, d_o), lse, (dq, dk, dv), shape, causal, scale);
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
    unsafe fn three<B: ThreePassKernels, U, T: cudarc::driver::DeviceRepr>(
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

/// The `Wgmma` (`pair`: `Wgmma2`) backward's launches (checked by [`flash_backward_with`]):
/// `MmaSync`'s delta, then dK / dV and dQ on `wgmma`, reading Q, K, V and dO through tensor maps
/// ([`wgmma_qkv_spec`]).
#[allow(clippy::too_many_arguments)]
fn wgmma_backward<T: FlashElement>(
    dev: &Device,
    pair: bool,
    (q, k, v, o, d_o): BwdInputs<'_, T>,
    lse: &DeviceBuffer<f32>,
    (dq, dk, dv): (&mut DeviceBuffer<T>, &mut DeviceBuffer<T>, &mut DeviceBuffer<T>),
    shape: AttentionShape,
    causal: bool,
    scale: f32,
) -> Result<()> {
    const OP: &str = "flash_backward";
    let p = shape.params(causal, scale);
    let bh = shape.batch as u64 * shape.heads as u64;
    // the kernels' TMA row coordinates are i32
    let all_rows = bh * shape.q_len.max(shape.kv_len) as u64;
    if all_rows > i32::MAX as u64 {
        return Err(Error::Unsupported {
            op: OP,
            what: format!(
                "{all_rows} rows over all heads with the Wgmma backward (its TMA coordinates are i32): split the batch"
            ),
        });
    }
    let (q_rows, kv_rows) = (bh * shape.q_len as u64, bh * shape.kv_len as u64);
    // a map of 0 rows cannot be made; with no query (no key) the kernels load no Q / dO (K / V)
    // tile, and the other side's map stands in
    let (q_map, do_map, k_map, v_map) = match (q_rows > 0, kv_rows > 0) {
        (false, false) => return Ok(()),
        (true, true) => {
            let (qs, kvs) =
                (wgmma_qkv_spec(T::DTYPE, q_rows, shape.head_dim), wgmma_qkv_spec(T::DTYPE, kv_rows, shape.head_dim));
            (
                dev.tensor_map_cached(q.addr(), &qs)?,
                dev.tensor_map_cached(d_o.addr(), &qs)?,
                dev.tensor_map_cached(k.addr(), &kvs)?,
                dev.tensor_map_cached(v.addr(), &kvs)?,
            )
        }
        (true, false) => {
            let qs = wgmma_qkv_spec(T::DTYPE, q_rows, shape.head_dim);
            let (qm, dom) = (dev.tensor_map_cached(q.addr(), &qs)?, dev.tensor_map_cached(d_o.addr(), &qs)?);
            (qm.clone(), dom, qm.clone(), qm)
        }
        (false, true) => {
            let kvs = wgmma_qkv_spec(T::DTYPE, kv_rows, shape.head_dim);
            let (km, vm) = (dev.tensor_map_cached(k.addr(), &kvs)?, dev.tensor_map_cached(v.addr(), &kvs)?);
            (km.clone(), km.clone(), km, vm)
        }
    };
    let maps = [q_map.ptr(), k_map.ptr(), v_map.ptr(), do_map.ptr()];
    let mut delta = dev.zeros::<f32>(shape.lse_elems())?;
    // per block: keys (dK / dV) and query rows (dQ)
    let (smem, threads, rows) = if pair {
        (flash_bwd_wgmma2_smem_bytes(shape.head_dim), FLASH_BWD_WGMMA2_THREADS, [FLASH_BWD_WGMMA2_ROWS; 2])
    } else {
        (flash_bwd_wgmma_smem_bytes(shape.head_dim), FLASH_BWD_WGMMA_THREADS, [FLASH_BWD_WGMMA_BKV, FLASH_BWD_WGMMA_BQ])
    };
    let cfgs = [
        LaunchConfig {
            grid_dim: (shape.q_len.div_ceil(FLASH_BWD_MMA_BQ), shape.batch * shape.heads, 1),
            block_dim: (FLASH_BWD_MMA_THREADS, 1, 1),
            shared_mem_bytes: 0,
        },
        LaunchConfig {
            grid_dim: (shape.kv_len.div_ceil(rows[0]), shape.batch * shape.heads, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        },
        LaunchConfig {
            grid_dim: (shape.q_len.div_ceil(rows[1]), shape.batch * shape.heads, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        },
    ];
    /// Launches the three kernels of `B` (element type `U`, which is `T`'s by the dtype match).
    #[allow(clippy::too_many_arguments)]
    unsafe fn three<B: ThreePassKernels, U, T: cudarc::driver::DeviceRepr>(
        dev: &Device,
        cfgs: [LaunchConfig; 3],
        shape: AttentionShape,
        maps: [DevicePtr<TensorMap>; 4],
        (o, d_o): (&DeviceBuffer<T>, &DeviceBuffer<T>),
        lse: &DeviceBuffer<f32>,
        delta: &mut DeviceBuffer<f32>,
        (dq, dk, dv): (&mut DeviceBuffer<T>, &mut DeviceBuffer<T>, &mut DeviceBuffer<T>),
        p: AttentionParams,
    ) -> Result<()>
    where
        B::Delta: Kernel<Args = (DevicePtr<U>, DevicePtr<U>, DevicePtrMut<f32>, AttentionParams)>,
        B::DkDv: Kernel<Args = WgmmaDkDvArgs<U>>,
        B::Dq: Kernel<Args = WgmmaDqArgs<U>>,
    {
        let [qm, km, vm, dom] = maps;
        // SAFETY: the caller checked sizes, dtype, alignment and the module; the maps describe
        // exactly q, k, v and d_o; delta holds one f32 per query row, written by the first launch
        // before the others read it (one stream).
        unsafe {
            if shape.q_len > 0 {
                dev.launch(
                    B::Delta::default(),
                    cfgs[0],
                    (o.ptr().cast::<U>(), d_o.ptr().cast::<U>(), delta.ptr_mut(), p),
                )?;
            }
            if shape.kv_len > 0 {
                let args =
                    (qm, km, vm, dom, lse.ptr(), delta.ptr(), dk.ptr_mut().cast::<U>(), dv.ptr_mut().cast::<U>(), p);
                dev.launch(B::DkDv::default(), cfgs[1], args)?;
            }
            if shape.q_len > 0 {
                let args = (qm, km, vm, dom, lse.ptr(), delta.ptr(), dq.ptr_mut().cast::<U>(), p);
                dev.launch(B::Dq::default(), cfgs[2], args)?;
            }
        }
        Ok(())
    }
    let outs = (dq, dk, dv);
    let d128 = shape.head_dim == 128;
    // SAFETY: as above.
    unsafe {
        let od = (o, d_o);
        match (T::DTYPE, d128, pair) {
            (DType::BF16, false, false) => {
                three::<WgBf16D64, bf16, T>(dev, cfgs, shape, maps, od, lse, &mut delta, outs, p)
            }
            (DType::BF16, true, false) => {
                three::<WgBf16D128, bf16, T>(dev, cfgs, shape, maps, od, lse, &mut delta, outs, p)
            }
            (DType::F16, false, false) => {
                three::<WgF16D64, f16, T>(dev, cfgs, shape, maps, od, lse, &mut delta, outs, p)
            }
            (DType::F16, true, false) => {
                three::<WgF16D128, f16, T>(dev, cfgs, shape, maps, od, lse, &mut delta, outs, p)
            }
            (DType::BF16, false, true) => {
                three::<Wg2Bf16D64, bf16, T>(dev, cfgs, shape, maps, od, lse, &mut delta, outs, p)
            }
            (DType::BF16, true, true) => {
                three::<Wg2Bf16D128, bf16, T>(dev, cfgs, shape, maps, od, lse, &mut delta, outs, p)
            }
            (DType::F16, false, true) => {
                three::<Wg2F16D64, f16, T>(dev, cfgs, shape, maps, od, lse, &mut delta, outs, p)
            }
            (DType::F16, true, true) => {
                three::<Wg2F16D128, f16, T>(dev, cfgs, shape, maps, od, lse, &mut delta, outs, p)
            }
            (dtype, _, _) => {
                Err(Error::Unsupported { op: OP, what: format!("{dtype:?} with Wgmma: not in the kernel table") })
            }
        }
    }
}

/// The `Wgmma` dK / dV kernel's arguments: the maps of Q, K, V and dO, lse, delta, dK, dV.
type WgmmaDkDvArgs<T> = (
    DevicePtr<TensorMap>,
    DevicePtr<TensorMap>,
    DevicePtr<TensorMap>,
    DevicePtr<TensorMap>,
    DevicePtr<f32>,
    DevicePtr<f32>,
    DevicePtrMut<T>,
    DevicePtrMut<T>,
    AttentionParams,
);
/// The `Wgmma` dQ kernel's arguments: the maps of Q, K, V and dO, lse, delta, dQ.
type WgmmaDqArgs<T> = (
    DevicePtr<TensorMap>,
    DevicePtr<TensorMap>,
    DevicePtr<TensorMap>,
    DevicePtr<TensorMap>,
    DevicePtr<f32>,
    DevicePtr<f32>,
    DevicePtrMut<T>,
    AttentionParams,
);

/// The three kernels of a tensor-core backward (`MmaSync`, `Wgmma`, `Wgmma2`) for one element
/// type and head dim: delta, then dK / dV, then dQ.
trait ThreePassKernels {
    type Delta: Kernel;
    type DkDv: Kernel;
    type Dq: Kernel;
}

macro_rules! three_pass_kernels {
    ($module:ident; $($name:ident: $delta:ident, $dkdv:ident, $dq:ident;)*) => {$(
        struct $name;
        impl ThreePassKernels for $name {
            type Delta = bwd_mma::$delta;
            type DkDv = $module::$dkdv;
            type Dq = $module::$dq;
        }
    )*};
}

three_pass_kernels! { bwd_wg;
    WgBf16D64: FlashBwdDeltaBf16D64, FlashBwdDkdvWgmmaBf16D64, FlashBwdDqWgmmaBf16D64;
    WgBf16D128: FlashBwdDeltaBf16D128, FlashBwdDkdvWgmmaBf16D128, FlashBwdDqWgmmaBf16D128;
    WgF16D64: FlashBwdDeltaF16D64, FlashBwdDkdvWgmmaF16D64, FlashBwdDqWgmmaF16D64;
    WgF16D128: FlashBwdDeltaF16D128, FlashBwdDkdvWgmmaF16D128, FlashBwdDqWgmmaF16D128;
    Wg2Bf16D64: FlashBwdDeltaBf16D64, FlashBwdDkdvWgmma2Bf16D64, FlashBwdDqWgmma2Bf16D64;
    Wg2Bf16D128: FlashBwdDeltaBf16D128, FlashBwdDkdvWgmma2Bf16D128, FlashBwdDqWgmma2Bf16D128;
    Wg2F16D64: FlashBwdDeltaF16D64, FlashBwdDkdvWgmma2F16D64, FlashBwdDqWgmma2F16D64;
    Wg2F16D128: FlashBwdDeltaF16D128, FlashBwdDkdvWgmma2F16D128, FlashBwdDqWgmma2F16D128;
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

three_pass_kernels! { bwd_mma;
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

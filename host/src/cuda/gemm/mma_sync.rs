//! The `mma.sync` tensor-core GEMM (bf16 / f16 inputs, f32 accumulation, `cp.async` pipeline):
//! its input types, its block-tile choice and its launcher.

use super::check::Checked;
use crate::cuda::{Device, DeviceBuffer, LaunchConfig};
use crate::error::{Error, Result};
use kiln_gpu::kernels::mma_tile::GemmShape;
use kiln_gpu::{DevicePtr, DevicePtrMut, Kernel};

/// Input types of the `mma.sync` tensor-core GEMM: one table row each, with the kernel of each
/// block tile.
pub trait HgemmInput: cudarc::driver::DeviceRepr + Copy + 'static {
    /// The kernel for [`HGEMM_NARROW`](kiln_gpu::kernels::hgemm_mma::HGEMM_NARROW).
    type Narrow: Kernel<Args = HgemmArgs<Self>>;
    /// The kernel for [`HGEMM_WIDE`](kiln_gpu::kernels::hgemm_mma::HGEMM_WIDE).
    type Wide: Kernel<Args = HgemmArgs<Self>>;
}
/// The `mma.sync` kernels' arguments.
pub type HgemmArgs<T> = (DevicePtr<T>, DevicePtr<T>, DevicePtrMut<f32>, GemmShape);
impl HgemmInput for half::bf16 {
    type Narrow = kiln_gpu::kernels::hgemm_mma::HgemmMmaBf16;
    type Wide = kiln_gpu::kernels::hgemm_mma::HgemmMmaBf16Wide;
}
impl HgemmInput for half::f16 {
    type Narrow = kiln_gpu::kernels::hgemm_mma::HgemmMmaF16;
    type Wide = kiln_gpu::kernels::hgemm_mma::HgemmMmaF16Wide;
}

/// The `mma.sync` block tile for `s` on a device of `sms` SMs whose blocks may use `max_smem` bytes
/// of shared memory: the wide tile where it fits and makes at least one block per SM, the narrow
/// one otherwise (where the wide tile would leave SMs idle, or on an sm_80 part without 192 KiB per
/// block).
pub fn hgemm_tile_for(s: GemmShape, max_smem: u32, sms: u32) -> kiln_gpu::kernels::hgemm_mma::HgemmTile {
    use kiln_gpu::kernels::hgemm_mma::{HGEMM_NARROW, HGEMM_WIDE};
    if HGEMM_WIDE.blocks(s) >= sms as u64 && HGEMM_WIDE.smem_bytes() <= max_smem { HGEMM_WIDE } else { HGEMM_NARROW }
}

/// `c = a b^T` on the tensor cores (`mma.sync`, `cp.async` pipeline) with the tile
/// [`hgemm_tile_for`] picks: `a` m x k, `b` n x k (bf16 or f16), `c` m x n f32; `k % 8 == 0`.
pub fn hgemm<T: HgemmInput>(
    dev: &Device,
    a: &DeviceBuffer<T>,
    b: &DeviceBuffer<T>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
) -> Result<()> {
    use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
    let max_smem = dev.attribute(OPTIN)?.max(0) as u32;
    hgemm_with_tile(dev, hgemm_tile_for(s, max_smem, dev.sm_count()? as u32), a, b, c, s)
}

/// As [`hgemm`], with the block tile given: [`HGEMM_NARROW`](kiln_gpu::kernels::hgemm_mma::HGEMM_NARROW)
/// or [`HGEMM_WIDE`](kiln_gpu::kernels::hgemm_mma::HGEMM_WIDE).
pub fn hgemm_with_tile<T: HgemmInput>(
    dev: &Device,
    tile: kiln_gpu::kernels::hgemm_mma::HgemmTile,
    a: &DeviceBuffer<T>,
    b: &DeviceBuffer<T>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
) -> Result<()> {
    use kiln_gpu::kernels::hgemm_mma::{HGEMM_NARROW, HGEMM_THREADS, HGEMM_WIDE};
    let checked = Checked::operands("hgemm", a.len(), b.len(), c.len(), s)?
        .k_multiple_of(8, "rows are copied in 16-byte chunks")?;
    if checked.writes_nothing() {
        return Ok(());
    }
    let blocks = checked.grid_1d(tile.blocks(s), "tiles")?;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (HGEMM_THREADS, 1, 1),
        shared_mem_bytes: tile.smem_bytes(),
    };
    // `c` is written in 8-byte pairs where n is even
    let checked = checked.aligned(&[a.addr(), b.addr(), c.addr()])?;
    let args = (a.ptr(), b.ptr(), c.ptr_mut(), s);
    // SAFETY: sizes checked above; the kernels mask the edges and read `tile`'s shared memory.
    checked.launch(cfg, |cfg| unsafe {
        match tile {
            HGEMM_NARROW => dev.launch(T::Narrow::default(), cfg, args),
            HGEMM_WIDE => dev.launch(T::Wide::default(), cfg, args),
            other => Err(Error::Unsupported {
                op: "hgemm",
                what: format!("the tile {other:?}: use HGEMM_NARROW or HGEMM_WIDE"),
            }),
        }
    })
}

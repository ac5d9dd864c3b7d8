//! Safe, checked launchers for kiln's first kernels. Each checks sizes and shapes, returns a typed
//! error naming the operation and the shapes, and launches through [`Device::launch`].

use super::{Device, DeviceBuffer, LaunchConfig, TensorMapSpec, TmaDtype};
use crate::error::{Error, Result};
use half::{bf16, f16};
use kiln_gpu::kernels::elementwise::VectorAdd;
use kiln_gpu::kernels::mma_tile::{GemmShape, MMA_SMEM_BYTES, MMA_THREADS, MmaTileBf16, MmaTileF16, MmaTileTf32};
use kiln_gpu::kernels::reduce::{REDUCE_THREADS, ReduceSumF32};
use kiln_gpu::kernels::tma_tile::{self, TileTransform, TmaTileTransform};
use kiln_gpu::{DevicePtr, DevicePtrMut, Kernel};

/// Most blocks a grid-stride kernel is launched with (a few waves on any current GPU).
pub const MAX_GRID_STRIDE_BLOCKS: u32 = 4096;

fn len_u32(op: &'static str, n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::shape(op, format!("{n} elements exceed the kernel's u32 index range")))
}

fn grid_stride(n: u32, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(threads).clamp(1, MAX_GRID_STRIDE_BLOCKS), 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `out = a + b`, elementwise.
pub fn vector_add(
    dev: &Device,
    a: &DeviceBuffer<f32>,
    b: &DeviceBuffer<f32>,
    out: &mut DeviceBuffer<f32>,
) -> Result<()> {
    if a.len() != b.len() || a.len() != out.len() {
        return Err(Error::shape(
            "vector_add",
            format!("lengths differ: a {}, b {}, out {}", a.len(), b.len(), out.len()),
        ));
    }
    let n = len_u32("vector_add", a.len())?;
    // SAFETY: all three buffers hold n elements.
    unsafe { dev.launch(VectorAdd, grid_stride(n, 256), (a.ptr(), b.ptr(), out.ptr_mut(), n)) }
}

/// The sum of `x`, reduced on the device in two passes (per-block partials, then one block).
/// Deterministic: the same input gives the same bits.
pub fn sum(dev: &Device, x: &DeviceBuffer<f32>) -> Result<f32> {
    let total = sum_on_device(dev, x)?;
    Ok(dev.download(&total)?[0])
}

/// The sum of `x` as a one-element device buffer (no host round trip).
pub fn sum_on_device(dev: &Device, x: &DeviceBuffer<f32>) -> Result<DeviceBuffer<f32>> {
    let n = len_u32("sum", x.len())?;
    let cfg = grid_stride(n, REDUCE_THREADS);
    let mut partials = dev.zeros::<f32>(cfg.grid_dim.0 as usize)?;
    let mut total = dev.zeros::<f32>(1)?;
    // SAFETY: `partials` has one slot per block; `total` one slot for the single block.
    unsafe {
        dev.launch(ReduceSumF32, cfg, (x.ptr(), partials.ptr_mut(), n, 1.0f32))?;
        let one = LaunchConfig { grid_dim: (1, 1, 1), ..cfg };
        dev.launch(ReduceSumF32, one, (partials.ptr(), total.ptr_mut(), cfg.grid_dim.0, 1.0f32))?;
    }
    Ok(total)
}

/// A row-major f32 matrix in a device buffer, rows `row_pitch` elements apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixLayout {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Elements between the starts of consecutive rows.
    pub row_pitch: usize,
}

/// `dst = t.alpha * src + t.col_scale * column` through the TMA round-trip kernel (sm_90 and newer).
/// Both buffers have `layout`; the padding columns of `dst` beyond `cols` are not written.
pub fn tma_tile_transform(
    dev: &Device,
    src: &DeviceBuffer<f32>,
    dst: &mut DeviceBuffer<f32>,
    layout: MatrixLayout,
    t: TileTransform,
) -> Result<()> {
    let need = layout.rows.saturating_sub(1) * layout.row_pitch + layout.cols;
    if src.len() < need || dst.len() < need {
        return Err(Error::shape(
            "tma_tile_transform",
            format!("{layout:?} needs {need} elements; src has {}, dst {}", src.len(), dst.len()),
        ));
    }
    let spec = TensorMapSpec {
        dtype: TmaDtype::F32,
        rows: layout.rows as u64,
        cols: layout.cols as u64,
        row_pitch: layout.row_pitch as u64,
        box_rows: tma_tile::TMA_BOX_ROWS,
        box_cols: tma_tile::TMA_BOX_COLS,
        swizzle: t.swizzle,
    };
    let src_map = dev.tensor_map(src.addr(), &spec)?;
    let dst_map = dev.tensor_map(dst.addr(), &spec)?;
    let cfg = LaunchConfig {
        grid_dim: (
            len_u32("tma_tile_transform", layout.cols.div_ceil(tma_tile::TMA_BOX_COLS as usize))?,
            len_u32("tma_tile_transform", layout.rows.div_ceil(tma_tile::TMA_BOX_ROWS as usize))?,
            1,
        ),
        block_dim: (tma_tile::TMA_THREADS, 1, 1),
        shared_mem_bytes: tma_tile::TMA_SMEM_BYTES,
    };
    // SAFETY: both maps describe live buffers of `layout` (checked above); they live until the sync.
    unsafe { dev.launch(TmaTileTransform, cfg, (src_map.ptr(), dst_map.ptr(), t))? };
    // The maps are freed on return: wait for the kernel that reads them.
    dev.synchronize()
}

/// Input types of the `mma.sync` tile product: one row of the dispatch table each.
pub trait TileProductInput: cudarc::driver::DeviceRepr + Copy + 'static {
    /// The kernel for this input type.
    type Kernel: Kernel<Args = (DevicePtr<Self>, DevicePtr<Self>, DevicePtrMut<f32>, GemmShape)>;
    /// `k` must be a multiple of this (16-byte rows for `cp.async`).
    const K_MULTIPLE: u32;
}
impl TileProductInput for bf16 {
    type Kernel = MmaTileBf16;
    const K_MULTIPLE: u32 = 8;
}
impl TileProductInput for f16 {
    type Kernel = MmaTileF16;
    const K_MULTIPLE: u32 = 8;
}
impl TileProductInput for f32 {
    type Kernel = MmaTileTf32;
    const K_MULTIPLE: u32 = 4;
}

/// `c[m][n] = sum_k a[m][k] * b[n][k]` (C = A B^T) with `mma.sync`, f32 accumulation.
/// `a` is m x k, `b` is n x k, `c` is m x n, all row-major and dense.
pub fn mma_tile<T: TileProductInput>(
    dev: &Device,
    a: &DeviceBuffer<T>,
    b: &DeviceBuffer<T>,
    c: &mut DeviceBuffer<f32>,
    shape: GemmShape,
) -> Result<()> {
    let op = "mma_tile";
    let (m, n, k) = (shape.m as usize, shape.n as usize, shape.k as usize);
    if shape.m == 0 || shape.n == 0 || shape.k == 0 {
        return Err(Error::shape(op, format!("empty product {m}x{n}x{k}")));
    }
    if !shape.k.is_multiple_of(T::K_MULTIPLE) {
        return Err(Error::shape(
            op,
            format!("k = {k} must be a multiple of {} for {}", T::K_MULTIPLE, std::any::type_name::<T>()),
        ));
    }
    if a.len() != m * k || b.len() != n * k || c.len() != m * n {
        return Err(Error::shape(
            op,
            format!(
                "shape {m}x{n}x{k} needs a: {}, b: {}, c: {}; got {}, {}, {}",
                m * k,
                n * k,
                m * n,
                a.len(),
                b.len(),
                c.len()
            ),
        ));
    }
    let (gx, gy) = shape.tile_grid();
    let cfg = LaunchConfig { grid_dim: (gx, gy, 1), block_dim: (MMA_THREADS, 1, 1), shared_mem_bytes: MMA_SMEM_BYTES };
    // SAFETY: sizes checked above.
    unsafe { dev.launch(T::Kernel::default(), cfg, (a.ptr(), b.ptr(), c.ptr_mut(), shape)) }
}

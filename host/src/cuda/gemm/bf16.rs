//! bf16 products of f32 tensors: pack each operand once (round to bf16, transpose to k-major,
//! pad k), then multiply on the best verified tensor-core kernel this device has.

use super::check::Checked;
use super::layout::Layout;
use super::mma_sync::hgemm;
use super::tcgen05::gemm_tcgen05;
use super::wgmma::WgmmaGemm;
use crate::cuda::{Device, DeviceBuffer, LaunchConfig};
use crate::error::Result;
use kiln_gpu::kernels::mma_tile::GemmShape;

/// `c = op(a) op(b)` for f32 operands on the tensor cores, in bf16 with f32 accumulation (the
/// [`MatmulPrecision::Bf16`](crate::cuda::MatmulPrecision::Bf16) of f32 tensors): each operand is packed
/// once by `pack_bf16` into the k-major rows the tensor-core kernels read (rounded nearest-even,
/// transposed where `layout` stores it the other way, each row zero-padded to a multiple of 8), then
/// multiplied by the persistent `wgmma` kernel on sm_90a and by `mma.sync` ([`hgemm`]) elsewhere
/// ([`TensorCores::Best`]; [`gemm_bf16_on`] chooses). Any m, n and k; `a`, `b` and `c` hold `m k`,
/// `k n` and `m n` f32 values stored as `layout` says. The padding adds zero products, so each output is the tensor-core
/// kernel's sum over the rounded inputs: reproducible, and row i depends only on row i of `op(a)`.
pub fn gemm_bf16(
    dev: &Device,
    a: &DeviceBuffer<f32>,
    b: &DeviceBuffer<f32>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
    layout: Layout,
) -> Result<()> {
    gemm_bf16_on(dev, TensorCores::Best, a, b, c, s, layout)
}

/// Whether [`TensorCores::Best`] may pick [`gemm_tcgen05`] on compute capability 10.x. False until
/// that kernel has passed its GPU test (`gemm_tcgen05_bf16_sm100`) on a Blackwell GPU, which kiln's
/// developers have not had: until then a Blackwell GPU runs the bf16 path on `mma.sync`, and the
/// `tcgen05` kernel only when asked for by name ([`TensorCores::Tcgen05`], `kiln gemm --kernel
/// gemm_tcgen05_bf16`).
pub const TCGEN05_VERIFIED: bool = false;

/// Which tensor-core kernel [`gemm_bf16_on`] multiplies the packed operands with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorCores {
    /// The fastest verified kernel this device has: the persistent `wgmma` kernel on sm_90a,
    /// `tcgen05` on 10.x once [`TCGEN05_VERIFIED`], `mma.sync` otherwise (what [`gemm_bf16`] uses).
    Best,
    /// `mma.sync` ([`hgemm`]), on every supported GPU.
    MmaSync,
    /// The persistent `wgmma` kernel (sm_90a).
    Wgmma,
    /// [`gemm_tcgen05`] (compute capability 10.x).
    Tcgen05,
}

/// [`gemm_bf16`] with the tensor-core kernel chosen (a kernel the device lacks is
/// [`Error::KernelUnavailable`](crate::Error::KernelUnavailable)): so that each path can be tested on one GPU.
pub fn gemm_bf16_on(
    dev: &Device,
    cores: TensorCores,
    a: &DeviceBuffer<f32>,
    b: &DeviceBuffer<f32>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
    layout: Layout,
) -> Result<()> {
    use kiln_gpu::kernels::convert::{PACK_K_MULTIPLE, PACK_ROWS, PACK_TILE_COLS, PACK_TILE_ROWS, PackBf16};
    let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
    let checked = Checked::operands("bf16 gemm", a.len(), b.len(), c.len(), s)?;
    if checked.writes_nothing() {
        return Ok(());
    }
    if k == 0 {
        return dev.zero(c); // an empty sum
    }
    let kp = s.k.next_multiple_of(PACK_K_MULTIPLE);
    let packed = GemmShape { k: kp, ..s };
    Checked::operands("bf16 gemm", m * kp as usize, kp as usize * n, m * n, packed)?;
    // (source rows, source columns, transposed) of each operand, read as op(x) = x or x^T
    let (a_src, b_src) = match layout {
        Layout::NN => ((s.m, s.k, false), (s.k, s.n, true)),
        Layout::NT => ((s.m, s.k, false), (s.n, s.k, false)),
        Layout::TN => ((s.k, s.m, true), (s.k, s.n, true)),
    };
    let pack = |src: &DeviceBuffer<f32>, (rows, cols, t): (u32, u32, bool)| -> Result<DeviceBuffer<half::bf16>> {
        let out_rows = if t { cols } else { rows };
        let dst = dev.alloc_uninit_bf16(out_rows as usize * kp as usize)?;
        // row tiles in slices the grid's y dimension can hold
        let (row_tiles, mut first) = (out_rows.div_ceil(PACK_TILE_ROWS), 0u32);
        while first < row_tiles {
            let slice = (row_tiles - first).min(65535);
            let cfg = LaunchConfig {
                grid_dim: (kp.div_ceil(PACK_TILE_COLS), slice, 1),
                block_dim: (32, PACK_ROWS, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: src holds rows x cols f32 (checked above); dst out_rows x kp 16-bit values
            // (written as pairs: kp is even, allocations 256-byte aligned), and kp is at least the
            // packed rows' live length (cols, or rows when transposed, is k); the kernel masks rows
            // past out_rows.
            unsafe {
                let out = kiln_gpu::DevicePtrMut::<u32>::from_addr(dst.addr());
                dev.launch(PackBf16, cfg, (src.ptr(), out, rows, cols, kp, t as u32, first))?;
            }
            first += slice;
        }
        Ok(dst)
    };
    use kiln_gpu::kernels::{gemm_tcgen05::GemmTcgen05Bf16, gemm_wgmma::GemmWgmmaBf16Persistent};
    let (tcgen05, wgmma) = (dev.supports::<GemmTcgen05Bf16>(), dev.supports::<GemmWgmmaBf16Persistent>());
    let cores = match cores {
        TensorCores::Best if tcgen05 && TCGEN05_VERIFIED => TensorCores::Tcgen05,
        TensorCores::Best if wgmma => TensorCores::Wgmma,
        TensorCores::Best => TensorCores::MmaSync,
        chosen => chosen,
    };
    // a kernel this device lacks is refused before any packing
    match cores {
        TensorCores::Tcgen05 => dev.require::<GemmTcgen05Bf16>()?,
        TensorCores::Wgmma => dev.require::<GemmWgmmaBf16Persistent>()?,
        _ => {}
    }
    let (a16, b16) = (pack(a, a_src)?, pack(b, b_src)?);
    match cores {
        TensorCores::Tcgen05 => gemm_tcgen05(dev, &a16, &b16, c, packed),
        TensorCores::Wgmma => WgmmaGemm::new(dev, &a16, &b16, packed)?.run(c),
        _ => hgemm(dev, &a16, &b16, c, packed),
    }
}

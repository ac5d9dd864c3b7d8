//! The Blackwell `tcgen05` GEMM (sm_100a) on the host. No Blackwell GPU has run it: it is
//! assembled by ptxas and its encodings are host-tested.

use super::check::Checked;
use super::operand_spec;
use crate::cuda::{Device, DeviceBuffer, LaunchConfig};
use crate::error::Result;
use kiln_gpu::kernels::mma_tile::GemmShape;

/// `c = a b^T` on Blackwell's tensor cores (`gemm_tcgen05_bf16`: TMA ring, one thread issuing
/// `tcgen05.mma` into tensor memory, an epilogue warpgroup reading it back; persistent, one block
/// per SM): `a` m x k, `b` n x k bf16, `c` m x n f32, `k % 8 == 0`. Only on compute capability
/// 10.x (the sm_100a module); elsewhere [`Error::KernelUnavailable`](crate::Error::KernelUnavailable). No Blackwell GPU has run it
/// yet: it is assembled by ptxas for sm_100a and its encodings are host-tested.
pub fn gemm_tcgen05(
    dev: &Device,
    a: &DeviceBuffer<half::bf16>,
    b: &DeviceBuffer<half::bf16>,
    c: &mut DeviceBuffer<f32>,
    s: GemmShape,
) -> Result<()> {
    use kiln_gpu::kernels::gemm_tcgen05::{GemmTcgen05Bf16, TC_BM, TC_BN, TC_SMEM_BYTES, TC_THREADS};
    let checked = Checked::operands("tcgen05 gemm", a.len(), b.len(), c.len(), s)?
        .non_empty()?
        .k_multiple_of(8, "TMA needs 16-byte row pitches")?
        .aligned(&[c.addr()])?;
    let a_map = dev.tensor_map_cached(a.addr(), &operand_spec(s.m, s.k, TC_BM))?;
    let b_map = dev.tensor_map_cached(b.addr(), &operand_spec(s.n, s.k, TC_BN))?;
    let tiles = s.m.div_ceil(TC_BM) as u64 * s.n.div_ceil(TC_BN) as u64;
    let blocks = tiles.min(dev.sm_count()? as u64) as u32;
    let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (TC_THREADS, 1, 1), shared_mem_bytes: TC_SMEM_BYTES };
    // SAFETY: the maps describe the borrowed operands with the kernel's boxes (A 128 rows, B 256);
    // c holds m n f32 (checked), 16-byte aligned; stores are masked at m and n.
    checked.launch(cfg, |cfg| unsafe { dev.launch(GemmTcgen05Bf16, cfg, (a_map.ptr(), b_map.ptr(), c.ptr_mut(), s)) })
}

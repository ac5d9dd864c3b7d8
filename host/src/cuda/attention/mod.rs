//! Attention on the GPU: the flash forward kernels' table, their checks and their launcher.
//!
//! ```text
//!   FlashKernel::Simt     rung 1: tiled online softmax on CUDA cores     f32, bf16   D 64, 128
//!   FlashKernel::MmaSync  rung 2: FlashAttention-2 on mma.sync           bf16, f16   D 64, 128
//!   FlashKernel::Wgmma    rung 3: TMA + wgmma, producer warp (sm_90a)    bf16, f16   D 64, 128
//!   FlashKernel::Wgmma2   rung 3, two consumer warpgroups (sm_90a)        bf16, f16   D 64, 128
//!   FlashKernel::WgmmaPingPong  rung 3, setmaxnreg + ping-pong (sm_90a)  bf16, f16   D 64, 128
//! ```
//!
//! The backward ([`flash_backward`]) has its own table, [`FlashBwdKernel`]:
//!
//! ```text
//!   FlashBwdKernel::Simt     rung 1: three passes on CUDA cores            f32, bf16   D 64, 128
//!   FlashBwdKernel::MmaSync  rung 2: FlashAttention-2 on mma.sync          bf16, f16   D 64, 128
//!   FlashBwdKernel::Wgmma    rung 3: TMA + wgmma, producer warp (sm_90a)    bf16, f16   D 64, 128
//!   FlashBwdKernel::Wgmma2   rung 3, two consumer warpgroups (sm_90a)        bf16, f16   D 64, 128
//! ```
//!
//! [`flash_backward`] picks the best one for the dtype, head dim and module
//! ([`flash_backward_kernel`]: `Wgmma2` on sm_90a while [`FLASH_BWD_WGMMA_DISPATCH`] is on);
//! [`flash_backward_with`] runs a chosen one (`Wgmma` and `Wgmma2` only on sm_90a:
//! [`check_backward_arch`]).
//! All are deterministic (no atomics).
//!
//! Every kernel but `Wgmma`, `Wgmma2` and `WgmmaPingPong` runs on every module (sm_80 and newer); those three run
//! only on the sm_90a module (compute capability 9.0) and are refused elsewhere ([`check_arch`]).
//! They read Q, K and V through tensor maps ([`wgmma_qkv_spec`]), made and cached as the wgmma
//! GEMM's are. The forward's best-kernel choice ([`flash_forward_kernel`]) picks `Wgmma2` at head
//! dim 128 and `Wgmma` at 64 on sm_90a ([`FLASH_WGMMA_DISPATCH`]; `WgmmaPingPong` instead once
//! [`FLASH_WGMMA_PP_DISPATCH`] is on) and `MmaSync` elsewhere. `Wgmma` and `Wgmma2` launch
//! persistent grids whose blocks take query tiles from the device's tile counter
//! ([`flash_forward_blocks`]). [`flash_forward`] checks the buffers
//! against the shape, the dtype and head dim against the kernel, the alignment the kernel's
//! 16-byte copies need, the grid and the shared memory, and refuses the rest with an error that
//! says what to change. The layout and the causal mask (bottom-right aligned) are
//! [`crate::attention`]'s.

mod backward;
mod forward;

pub use backward::*;
pub use forward::*;

use crate::dtype::DType;
use half::{bf16, f16};
use kiln_gpu::kernels::attention::AttentionParams;

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

#[cfg(test)]
mod tests;

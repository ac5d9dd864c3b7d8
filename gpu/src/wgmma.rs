//! Hopper warpgroup matrix products (sm_90a): the shared-memory matrix descriptor and the
//! fence / commit / wait protocol around `wgmma.mma_async`.
//!
//! A warpgroup (4 consecutive warps, the first a multiple of 4) issues `wgmma.mma_async`, which reads
//! B (and optionally A) from shared memory through 64-bit descriptors and accumulates into registers.
//! The products themselves and the GEMM kernels that use them arrive with the GEMM ladder; the
//! descriptor encoding is here from the start and tested on the host.

use crate::swizzle::Swizzle;

/// The 2-bit swizzle field of a wgmma shared-memory descriptor (bits 62-63).
pub const fn swizzle_code(s: Swizzle) -> u64 {
    match s {
        Swizzle::None => 0,
        Swizzle::B128 => 1,
        Swizzle::B64 => 2,
        Swizzle::B32 => 3,
    }
}

/// A byte address or offset in the 14-bit, 16-byte-granular form descriptors use.
const fn enc14(x: u32) -> u64 {
    ((x as u64 & 0x3ffff) >> 4) & 0x3fff
}

/// Encodes a wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"):
/// bits 0-13 start address >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension
/// byte offset >> 4, 49-51 base offset, 62-63 swizzle mode.
pub const fn smem_descriptor(
    start: u32,
    leading_byte_offset: u32,
    stride_byte_offset: u32,
    base_offset: u32,
    s: Swizzle,
) -> u64 {
    enc14(start)
        | (enc14(leading_byte_offset) << 16)
        | (enc14(stride_byte_offset) << 32)
        | (((base_offset & 0x7) as u64) << 49)
        | (swizzle_code(s) << 62)
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod device {
    use core::arch::asm;

    /// Orders register accesses to accumulators before the next `wgmma.mma_async`.
    ///
    /// PTX: `wgmma.fence.sync.aligned;`
    #[inline(always)]
    pub fn fence() {
        // SAFETY: ordering only; the warpgroup must be converged.
        unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) };
    }

    /// Closes the group of `wgmma.mma_async` issued since the last commit.
    ///
    /// PTX: `wgmma.commit_group.sync.aligned;`
    #[inline(always)]
    pub fn commit_group() {
        // SAFETY: bookkeeping only.
        unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) };
    }

    /// Waits until at most `N` wgmma groups are pending.
    ///
    /// PTX: `wgmma.wait_group.sync.aligned N;`
    #[inline(always)]
    pub fn wait_group<const N: u32>() {
        // SAFETY: waiting has no preconditions.
        unsafe { asm!("wgmma.wait_group.sync.aligned {n};", n = const N, options(nostack)) };
    }
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub use device::*;

//! Barriers: the whole block, a named subset of it, or a warp.
//!
//! A barrier orders ordinary shared-memory accesses among the threads that reach it. Memory written
//! by ordinary stores that the async proxy (TMA, wgmma) reads next also needs
//! `fence::proxy_async_shared_cta` before the barrier.
//!
//! kiln builds its PTX with `-Zmir-enable-passes=-JumpThreading` so that a barrier after a branch is
//! never duplicated into the branch arms (an upstream hazard); the reduction kernel keeps a barrier
//! after a divergent branch so the GPU tests would catch a regression.

#[cfg(target_arch = "nvptx64")]
mod device {
    use core::arch::asm;

    // The named-barrier and warp-sync wrappers below are asm, which LLVM may duplicate into the
    // arms of a branch just before them (see `sync_threads`). The named barriers therefore use the
    // non-`.aligned` forms, which stay correct when the threads of a warp reach the same barrier
    // id through different instructions.

    /// Waits until every thread of the block arrives (`__syncthreads`).
    ///
    /// PTX: `bar.sync 0;` (emitted by LLVM's `llvm.nvvm.barrier0` intrinsic)
    ///
    /// Every thread of the block must call it, in convergent code. This one barrier is not written
    /// as `asm!`: LLVM cannot mark inline asm *convergent*, and an asm `bar.sync` after
    /// `if tid == 0 { ... }` was tail-duplicated into both arms, so thread 0 and the others waited at
    /// two different barrier instructions and the TMA kernel hung on the H200. The intrinsic is
    /// convergent, so LLVM never duplicates it into divergent paths; `tests/ptx.rs` counts the
    /// barriers in each kernel to keep it that way.
    #[inline(always)]
    pub fn sync_threads() {
        // SAFETY: a barrier has no memory-safety preconditions beyond convergence (a hang, not UB).
        unsafe { core::arch::nvptx::_syncthreads() };
    }

    /// Waits until `count` threads (a multiple of 32) reach named barrier `id` (1..16).
    ///
    /// PTX: `barrier.sync id, count;` (not `bar.sync`, which is `.aligned`: the persistent GEMM's
    /// epilogue, `if thread == 0 { wait } barrier`, had its asm barrier tail-duplicated into both
    /// arms, and with `bar.sync` the warpgroup hung on the H200.)
    ///
    /// # Safety
    /// Exactly `count` threads, whole warps, must reach barrier `id`; `id` 0 is [`sync_threads`]'s.
    #[inline(always)]
    pub unsafe fn named_barrier_sync(id: u32, count: u32) {
        unsafe { asm!("barrier.sync {id}, {count};", id = in(reg32) id, count = in(reg32) count, options(nostack)) };
    }

    /// Arrives at named barrier `id` without waiting (a producer signalling consumers).
    ///
    /// PTX: `barrier.arrive id, count;`
    ///
    /// # Safety
    /// As [`named_barrier_sync`].
    #[inline(always)]
    pub unsafe fn named_barrier_arrive(id: u32, count: u32) {
        unsafe { asm!("barrier.arrive {id}, {count};", id = in(reg32) id, count = in(reg32) count, options(nostack)) };
    }

    /// Synchronizes the lanes in `mask` of the calling warp (`__syncwarp`).
    ///
    /// PTX: `bar.warp.sync mask;`
    #[inline(always)]
    pub fn sync_warp(mask: u32) {
        // SAFETY: every lane named in mask must execute it; a mismatch is a hang, not UB.
        unsafe { asm!("bar.warp.sync {m};", m = in(reg32) mask, options(nostack)) };
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

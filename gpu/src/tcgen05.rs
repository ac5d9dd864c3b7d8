//! Blackwell tensor memory and the fifth-generation tensor cores (sm_100a).
//!
//! Tensor memory (TMEM) is a per-SM 128-lane x 512-column array of 32-bit cells that `tcgen05.mma`
//! accumulates into. A warp allocates columns (a power of two, at least 32), receives the base address
//! in shared memory, and must free them before the block exits. No Blackwell GPU is lent to kiln's
//! developers: this code is assembled by ptxas for sm_100a in CI, its encodings are tested on the
//! host, and its GPU tests skip below compute capability 10.0.

/// Whether `ncols` is a valid TMEM allocation size (a power of two from 32 to 512).
pub const fn valid_alloc_columns(ncols: u32) -> bool {
    ncols >= 32 && ncols <= 512 && ncols.is_power_of_two()
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_100a"))]
mod device {
    use crate::shared::SharedAddr;
    use core::arch::asm;

    /// Allocates `ncols` TMEM columns; the base address is written to shared `dst`. Warp-wide.
    ///
    /// PTX: `tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [dst], ncols;`
    ///
    /// # Safety
    /// One whole warp calls it; `ncols` satisfies [`super::valid_alloc_columns`]; the same warp frees
    /// the columns with [`dealloc`] before the block exits.
    #[inline(always)]
    pub unsafe fn alloc(dst: SharedAddr, ncols: u32) {
        unsafe {
            asm!("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [{d}], {n};", d = in(reg32) dst, n = in(reg32) ncols, options(nostack))
        };
    }

    /// Frees `ncols` columns at TMEM address `taddr`. Warp-wide.
    ///
    /// PTX: `tcgen05.dealloc.cta_group::1.sync.aligned.b32 taddr, ncols;`
    ///
    /// # Safety
    /// `taddr`/`ncols` must be exactly an allocation this warp made; nothing may use it afterwards.
    #[inline(always)]
    pub unsafe fn dealloc(taddr: u32, ncols: u32) {
        unsafe {
            asm!("tcgen05.dealloc.cta_group::1.sync.aligned.b32 {t}, {n};", t = in(reg32) taddr, n = in(reg32) ncols, options(nostack))
        };
    }

    /// Gives up the right to allocate, so other blocks on the SM may.
    ///
    /// PTX: `tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;`
    #[inline(always)]
    pub fn relinquish_alloc_permit() {
        // SAFETY: bookkeeping only.
        unsafe { asm!("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;", options(nostack)) };
    }

    /// Orders prior tcgen05 operations before a following thread barrier.
    ///
    /// PTX: `tcgen05.fence::before_thread_sync;`
    #[inline(always)]
    pub fn fence_before_thread_sync() {
        // SAFETY: ordering only.
        unsafe { asm!("tcgen05.fence::before_thread_sync;", options(nostack)) };
    }

    /// Orders following tcgen05 operations after a preceding thread barrier.
    ///
    /// PTX: `tcgen05.fence::after_thread_sync;`
    #[inline(always)]
    pub fn fence_after_thread_sync() {
        // SAFETY: ordering only.
        unsafe { asm!("tcgen05.fence::after_thread_sync;", options(nostack)) };
    }
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_100a"))]
pub use device::*;

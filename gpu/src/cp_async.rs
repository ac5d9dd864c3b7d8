//! `cp.async` (sm_80): asynchronous copies from global to shared memory that bypass registers.
//!
//! Copies are grouped: `commit_group` closes the group of copies issued since the last commit, and
//! `wait_group` waits until at most `N` groups are still in flight. A pipeline of `S` stages
//! that commits one group per stage waits with `N = S - 2` before computing on the oldest stage. After the wait, a block barrier
//! makes the data visible to the other threads.

#[cfg(target_arch = "nvptx64")]
mod device {
    use crate::shared::SharedAddr;
    use core::arch::asm;

    /// Copies 16 bytes from `src` (global) to `dst` (shared), reading only the first `src_bytes`
    /// (0..=16) and filling the rest with zeros: pass 0 for a row past the edge of a matrix.
    /// Caches in L2 only.
    ///
    /// PTX: `cp.async.cg.shared.global [dst], [src], 16, src_bytes;`
    ///
    /// # Safety
    /// `dst` must be 16-byte aligned in shared memory; `src` 16-byte aligned in global memory, and its
    /// first `src_bytes` readable (`src` is not read when `src_bytes` is 0, but must still be a
    /// global address).
    #[inline(always)]
    pub unsafe fn copy_16_zfill(dst: SharedAddr, src: *const u8, src_bytes: u32) {
        unsafe {
            asm!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};", d = in(reg32) dst, s = in(reg64) src,
                n = in(reg32) src_bytes, options(nostack))
        };
    }

    /// Copies 4 bytes from `src` (global) to `dst` (shared), caching at all levels.
    ///
    /// PTX: `cp.async.ca.shared.global [dst], [src], 4;`
    ///
    /// # Safety
    /// Both addresses 4-byte aligned and valid.
    #[inline(always)]
    pub unsafe fn copy_4(dst: SharedAddr, src: *const u8) {
        unsafe {
            asm!("cp.async.ca.shared.global [{d}], [{s}], 4;", d = in(reg32) dst, s = in(reg64) src, options(nostack))
        };
    }

    /// Closes the group of copies this thread issued since the last commit.
    ///
    /// PTX: `cp.async.commit_group;`
    #[inline(always)]
    pub fn commit_group() {
        // SAFETY: bookkeeping only.
        unsafe { asm!("cp.async.commit_group;", options(nostack)) };
    }

    /// Waits until at most `N` of this thread's committed groups are still in flight.
    ///
    /// PTX: `cp.async.wait_group N;`
    #[inline(always)]
    pub fn wait_group<const N: u32>() {
        // SAFETY: waiting has no preconditions.
        unsafe { asm!("cp.async.wait_group {n};", n = const N, options(nostack)) };
    }

    /// Waits for all of this thread's copies.
    ///
    /// PTX: `cp.async.wait_all;`
    #[inline(always)]
    pub fn wait_all() {
        // SAFETY: waiting has no preconditions.
        unsafe { asm!("cp.async.wait_all;", options(nostack)) };
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

//! The Tensor Memory Accelerator (sm_90): bulk tensor copies between global and shared memory,
//! described by a tensor map the host encodes (`cuTensorMapEncodeTiled`).
//!
//! A load is issued by one thread and completes on an [`mbarrier`](crate::mbarrier) with a transaction
//! count: announce the box's bytes with `arrive_expect_tx`, issue the load, and every consumer waits
//! on the barrier's parity. Elements of the box outside the tensor are filled with zeros, and the
//! full box's bytes are always delivered. A store reads shared memory (written by ordinary stores,
//! then published with `fence.proxy.async.shared::cta` and a barrier) and writes only the part of the
//! box inside the tensor.
//!
//! kiln passes tensor maps in global memory ([`TensorMap`], 128 bytes, 64-byte aligned), by pointer.
//!
//! Observed on the H200 (2026-11-21, kiln's `tma_tile_round_trip_with_edges`): a store whose box
//! crosses the tensor's last column also wrote the row padding that shares that column's 16-byte
//! granule (column 77 of a 77-column f32 matrix with an 80-element pitch). Treat the padding up to
//! the next 16-byte boundary as scratch that a store may overwrite.

/// An encoded tensor map: 128 opaque bytes made by the host driver, read by the copy engine.
/// The same layout as the driver's `CUtensorMap`.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMap {
    /// The driver's encoding.
    pub opaque: [u64; 16],
}

// SAFETY: plain bits, the same on both sides.
unsafe impl crate::KernelParam for TensorMap {}

#[cfg(target_arch = "nvptx64")]
mod device {
    use super::TensorMap;
    use crate::shared::SharedAddr;
    use core::arch::asm;

    /// Prefetches a tensor map into the descriptor cache.
    ///
    /// PTX: `prefetch.tensormap [map];`
    ///
    /// # Safety
    /// `map` must point to a valid tensor map in global memory.
    #[inline(always)]
    pub unsafe fn prefetch(map: *const TensorMap) {
        unsafe { asm!("prefetch.tensormap [{m}];", m = in(reg64) map, options(nostack)) };
    }

    /// Loads the box at element coordinates (`x` innermost, `y`) into shared memory at `dst`,
    /// completing `box bytes` of transactions on the barrier `bar`.
    ///
    /// PTX: `cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [dst], [map, {x, y}], [bar];`
    ///
    /// # Safety
    /// `map` must be a valid tensor map in global memory; `dst` aligned as the map's swizzle needs
    /// (1024 bytes for 128-byte swizzle) with room for the box; `bar` an initialized mbarrier whose
    /// current phase expects these bytes.
    #[inline(always)]
    pub unsafe fn load_2d(dst: SharedAddr, map: *const TensorMap, x: i32, y: i32, bar: SharedAddr) {
        unsafe {
            asm!("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}}}], [{b}];",
                d = in(reg32) dst, m = in(reg64) map, x = in(reg32) x, y = in(reg32) y, b = in(reg32) bar,
                options(nostack))
        };
    }

    /// [`load_2d`] multicast: the box lands at the same shared offset `dst` in every CTA of the
    /// cluster whose rank bit is set in `cta_mask`, and completes its bytes on the barrier at offset
    /// `bar` in each of them (every receiver's barrier must expect them).
    ///
    /// PTX: `cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [dst], [map, {x, y}], [bar], mask;` (sm_90a)
    ///
    /// # Safety
    /// As [`load_2d`], in every receiving CTA; the receivers must be live (their barriers
    /// initialized and published with a cluster barrier).
    #[inline(always)]
    pub unsafe fn load_2d_multicast(
        dst: SharedAddr,
        map: *const TensorMap,
        x: i32,
        y: i32,
        bar: SharedAddr,
        cta_mask: u16,
    ) {
        unsafe {
            asm!("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [{d}], [{m}, {{{x}, {y}}}], [{b}], {k};",
                d = in(reg32) dst, m = in(reg64) map, x = in(reg32) x, y = in(reg32) y, b = in(reg32) bar,
                k = in(reg16) cta_mask, options(nostack))
        };
    }

    /// Stores the box at shared `src` to element coordinates (`x`, `y`); only the part inside the
    /// tensor is written. Completion is tracked by bulk groups ([`commit_group`], [`wait_group_read`]).
    ///
    /// PTX: `cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [map, {x, y}], [src];`
    ///
    /// # Safety
    /// `map` must be a valid tensor map; `src` must hold the box and have been published to the async
    /// proxy (`fence.proxy.async.shared::cta`, then a barrier).
    #[inline(always)]
    pub unsafe fn store_2d(map: *const TensorMap, x: i32, y: i32, src: SharedAddr) {
        unsafe {
            asm!("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [{m}, {{{x}, {y}}}], [{s}];",
                m = in(reg64) map, x = in(reg32) x, y = in(reg32) y, s = in(reg32) src, options(nostack))
        };
    }

    /// Closes the bulk group of stores this thread issued.
    ///
    /// PTX: `cp.async.bulk.commit_group;`
    #[inline(always)]
    pub fn commit_group() {
        // SAFETY: bookkeeping only.
        unsafe { asm!("cp.async.bulk.commit_group;", options(nostack)) };
    }

    /// Waits until at most `N` bulk groups still *read* shared memory (their sources may be reused).
    /// A block must not exit while a store still reads its shared memory.
    ///
    /// PTX: `cp.async.bulk.wait_group.read N;`
    #[inline(always)]
    pub fn wait_group_read<const N: u32>() {
        // SAFETY: waiting has no preconditions.
        unsafe { asm!("cp.async.bulk.wait_group.read {n};", n = const N, options(nostack)) };
    }

    /// Waits until at most `N` bulk groups are incomplete (their writes are done).
    ///
    /// PTX: `cp.async.bulk.wait_group N;`
    #[inline(always)]
    pub fn wait_group<const N: u32>() {
        // SAFETY: waiting has no preconditions.
        unsafe { asm!("cp.async.bulk.wait_group {n};", n = const N, options(nostack)) };
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

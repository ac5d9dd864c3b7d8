//! Thread-block clusters (sm_90): CTAs launched together on neighbouring SMs of one GPC, which can
//! read, write and arrive on each other's shared memory ("distributed shared memory") and receive
//! one TMA load multicast into all of them.
//!
//! A kernel declares its cluster size with `#[kernel(cluster = N)]`: the entry then carries the PTX
//! directive `.reqnctapercluster N, 1, 1`, so an ordinary launch groups blocks `N` at a time along x
//! (the grid's x size must be a multiple of `N`). The host reads the size from the kernel's
//! descriptor (`Kernel::CLUSTER`), the same declaration.
//!
//! Rules the kernels follow:
//! - barriers a peer arrives on (or a multicast completes on) must be initialized, fenced with
//!   `crate::fence::mbarrier_init_release_cluster` and published with `sync` before any peer
//!   uses them;
//! - a CTA must not exit while a peer may still write its shared memory or arrive on its barriers:
//!   end with `sync`.

#[cfg(target_arch = "nvptx64")]
mod device {
    use crate::shared::SharedAddr;
    use core::arch::asm;

    /// The cluster-size marker `#[kernel(cluster = N)]` puts at the top of an entry: a PTX comment
    /// the PTX builder turns into the entry's `.reqnctapercluster N, 1, 1` directive. Emits no
    /// instruction.
    ///
    /// PTX: `// kiln.cluster N`
    #[inline(always)]
    pub fn cluster_marker<const N: u32>() {
        // SAFETY: a comment; not `pure`, so the compiler keeps it.
        unsafe { asm!("// kiln.cluster {n}", n = const N, options(nomem, nostack, preserves_flags)) }
    }

    sreg! {
        /// This CTA's rank within its cluster (0..cluster size).
        cta_rank => "%cluster_ctarank";
        /// CTAs per cluster.
        cta_count => "%cluster_nctarank";
        /// This cluster's index in the grid, x.
        cluster_idx_x => "%clusterid.x";
        /// Clusters in the grid, x.
        cluster_count_x => "%nclusterid.x";
    }

    /// Arrives at the cluster barrier, releasing this thread's prior memory operations to the
    /// cluster. Every thread of every CTA in the cluster arrives once per phase. Not `.aligned`:
    /// threads of a warp may arrive from different branches (a producer thread after its loop, its
    /// warp's idle threads straight away).
    ///
    /// PTX: `barrier.cluster.arrive.release;`
    #[inline(always)]
    pub fn arrive() {
        // SAFETY: a barrier; every thread of the cluster calls it once per phase.
        unsafe { asm!("barrier.cluster.arrive.release;", options(nostack)) };
    }

    /// Waits until every thread of the cluster has arrived, acquiring their released operations.
    ///
    /// PTX: `barrier.cluster.wait.acquire;`
    #[inline(always)]
    pub fn wait() {
        // SAFETY: as [`arrive`].
        unsafe { asm!("barrier.cluster.wait.acquire;", options(nostack)) };
    }

    /// [`arrive`] then [`wait`]: a barrier over every thread of every CTA in the cluster.
    #[inline(always)]
    pub fn sync() {
        arrive();
        wait();
    }

    /// The shared::cluster address of the variable at `addr` in this CTA's shared memory, as seen in
    /// the CTA of rank `rank` (same offset, that CTA's window). Usable by `mbarrier` and the async
    /// proxy with the `.shared::cluster` state space.
    ///
    /// PTX: `mapa.shared::cluster.u32 %r, addr, rank;`
    ///
    /// # Safety
    /// `rank` must be a CTA of this cluster.
    #[inline(always)]
    pub unsafe fn map_shared(addr: SharedAddr, rank: u32) -> u32 {
        let r: u32;
        unsafe {
            asm!("mapa.shared::cluster.u32 {r}, {a}, {k};", r = out(reg32) r, a = in(reg32) addr, k = in(reg32) rank,
                options(nomem, nostack, pure))
        };
        r
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

//! Memory fences.
//!
//! The "async proxy" (TMA, `wgmma`, `tcgen05`) reads and writes shared memory on a different path from
//! ordinary loads and stores: shared memory written by ordinary stores that the async proxy reads next
//! needs `proxy_async_shared_cta` in each writing thread before the barrier that publishes it.

#[cfg(target_arch = "nvptx64")]
mod device {
    use core::arch::asm;

    macro_rules! fence {
        ($($(#[$doc:meta])+ $name:ident => $ptx:literal;)*) => {$(
            $(#[$doc])+
            ///
            #[doc = concat!("PTX: `", $ptx, "`")]
            #[inline(always)]
            pub fn $name() {
                // SAFETY: a fence only orders memory operations.
                unsafe { asm!($ptx, options(nostack)) };
            }
        )*};
    }

    fence! {
        /// Orders this thread's memory accesses as seen by its block (`__threadfence_block`).
        fence_cta => "fence.acq_rel.cta;";
        /// Orders this thread's memory accesses as seen by the whole GPU (`__threadfence`).
        fence_gpu => "fence.acq_rel.gpu;";
        /// Orders across the whole system, host included.
        fence_sys => "fence.acq_rel.sys;";
        /// Makes this thread's generic-proxy writes to shared memory visible to the async proxy
        /// (TMA stores, wgmma operand reads) of its block.
        proxy_async_shared_cta => "fence.proxy.async.shared::cta;";
        /// The same, for every state space.
        proxy_async => "fence.proxy.async;";
        /// Orders this thread's generic-proxy accesses to global memory with async-proxy accesses
        /// (TMA loads from global) on either side of it: a writer runs it after its stores, and a
        /// TMA issuer after it has acquired the data's readiness.
        proxy_async_global => "fence.proxy.async.global;";
        /// Makes `mbarrier.init` visible to the async proxy and to the cluster before first use.
        mbarrier_init_release_cluster => "fence.mbarrier_init.release.cluster;";
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

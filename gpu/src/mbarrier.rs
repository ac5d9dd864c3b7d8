//! `mbarrier`: barriers in shared memory that count arrivals *and* bytes (transaction counts), and
//! complete in phases. TMA loads complete on them; producers and consumers hand pages over with them.
//!
//! A phase completes when the pending arrival count reaches zero *and* the transaction count
//! (bytes announced with `expect_tx`, retired by `complete_tx` from the copy engine) reaches zero.
//! Waiters name the phase by its parity: phase `k` has parity `k & 1`. One missing or extra arrival
//! shifts every later phase: waiters then wait forever, so kiln's waits come with a bounded variant.

/// How long `wait_parity_bounded` waits by default before giving up: one second, far past any
/// legitimate wait inside one kernel (a TMA tile arrives in microseconds).
pub const DEFAULT_WAIT_NS: u64 = 1_000_000_000;

/// At most this many `try_wait`s in `wait_parity_bounded`, whatever the timer says.
pub const MAX_TRIES: u32 = 1 << 22;

/// How many `try_wait`s `wait_parity_or` makes between two questions to its `give_up`.
pub const GIVE_UP_EVERY: u32 = 256;

#[cfg(target_arch = "nvptx64")]
mod device {
    use crate::shared::SharedAddr;
    use core::arch::asm;

    /// Initializes the barrier at `bar` for `count` arrivals per phase.
    ///
    /// PTX: `mbarrier.init.shared::cta.b64 [bar], count;`
    ///
    /// # Safety
    /// `bar` must be an 8-byte-aligned shared address not in use by another barrier; one thread
    /// initializes, then a fence ([`crate::fence::mbarrier_init_release_cluster`]) and a block barrier
    /// publish it before anyone arrives or waits.
    #[inline(always)]
    pub unsafe fn init(bar: SharedAddr, count: u32) {
        unsafe {
            asm!("mbarrier.init.shared::cta.b64 [{b}], {c};", b = in(reg32) bar, c = in(reg32) count, options(nostack))
        };
    }

    /// Invalidates the barrier so its memory can be reused.
    ///
    /// PTX: `mbarrier.inval.shared::cta.b64 [bar];`
    ///
    /// # Safety
    /// No thread may use the barrier afterwards.
    #[inline(always)]
    pub unsafe fn inval(bar: SharedAddr) {
        unsafe { asm!("mbarrier.inval.shared::cta.b64 [{b}];", b = in(reg32) bar, options(nostack)) };
    }

    /// Arrives once; returns the phase state token.
    ///
    /// PTX: `mbarrier.arrive.shared::cta.b64 %rd, [bar];`
    ///
    /// # Safety
    /// `bar` must be an initialized barrier.
    #[inline(always)]
    pub unsafe fn arrive(bar: SharedAddr) -> u64 {
        let state: u64;
        unsafe {
            asm!("mbarrier.arrive.shared::cta.b64 {s}, [{b}];", s = out(reg64) state, b = in(reg32) bar, options(nostack))
        };
        state
    }

    /// Arrives once on a barrier anywhere in the cluster (`bar` from
    /// [`crate::cluster::map_shared`], this CTA's own included): how a consumer hands a page back to
    /// a peer CTA's producer. The PTX default semantics, release at CTA scope: enough when what the
    /// arrival announces is that this thread's reads are complete (a `wgmma.wait_group` before it),
    /// and far cheaper than `.release.cluster`, which fences at cluster scope on every arrival
    /// (measured on the H200: the persistent GEMM ran at half speed with it).
    ///
    /// PTX: `mbarrier.arrive.shared::cluster.b64 _, [bar];`
    ///
    /// # Safety
    /// `bar` must be an initialized barrier of a live CTA of this cluster.
    #[inline(always)]
    pub unsafe fn arrive_cluster(bar: u32) {
        unsafe { asm!("mbarrier.arrive.shared::cluster.b64 _, [{b}];", b = in(reg32) bar, options(nostack)) };
    }

    /// Announces `bytes` more bytes for the current phase and arrives once (the producer's call
    /// before issuing TMA loads that complete on this barrier).
    ///
    /// PTX: `mbarrier.arrive.expect_tx.shared::cta.b64 %rd, [bar], bytes;` (sm_90)
    ///
    /// # Safety
    /// `bar` must be an initialized barrier; exactly `bytes` must then be delivered to it.
    #[inline(always)]
    pub unsafe fn arrive_expect_tx(bar: SharedAddr, bytes: u32) -> u64 {
        let state: u64;
        unsafe {
            asm!("mbarrier.arrive.expect_tx.shared::cta.b64 {s}, [{b}], {n};", s = out(reg64) state,
                b = in(reg32) bar, n = in(reg32) bytes, options(nostack))
        };
        state
    }

    /// Announces `bytes` more bytes for the current phase without arriving.
    ///
    /// PTX: `mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [bar], bytes;` (sm_90)
    ///
    /// # Safety
    /// As [`arrive_expect_tx`].
    #[inline(always)]
    pub unsafe fn expect_tx(bar: SharedAddr, bytes: u32) {
        unsafe {
            asm!("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [{b}], {n};", b = in(reg32) bar,
                n = in(reg32) bytes, options(nostack))
        };
    }

    /// Tests whether the phase with `parity` has completed, letting the hardware suspend the thread
    /// for a while first. Returns true once it has.
    ///
    /// PTX: `mbarrier.try_wait.parity.shared::cta.b64 p, [bar], parity;`
    ///
    /// # Safety
    /// `bar` must be an initialized barrier.
    #[inline(always)]
    pub unsafe fn try_wait_parity(bar: SharedAddr, parity: u32) -> bool {
        let done: u32;
        unsafe {
            asm!("{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {ph}; selp.u32 {d}, 1, 0, p; }}",
                d = out(reg32) done, b = in(reg32) bar, ph = in(reg32) parity, options(nostack))
        };
        done != 0
    }

    /// Waits until the phase with `parity` completes.
    ///
    /// # Safety
    /// As [`try_wait_parity`]; a phase that never completes hangs the kernel (prefer
    /// [`wait_parity_bounded`] where a miscount is possible).
    #[inline(always)]
    pub unsafe fn wait_parity(bar: SharedAddr, parity: u32) {
        while !unsafe { try_wait_parity(bar, parity) } {}
    }

    /// Waits until the phase with `parity` completes, or `timeout_ns` nanoseconds of the global timer
    /// have passed. Returns whether the phase completed; the caller decides how to report a stall
    /// (kiln's kernels trap, so the launch fails instead of hanging).
    ///
    /// # Safety
    /// As [`try_wait_parity`].
    #[inline(always)]
    pub unsafe fn wait_parity_bounded(bar: SharedAddr, parity: u32, timeout_ns: u64) -> bool {
        // The try count backs up the timer, should the timer not advance.
        unsafe { wait_parity_or(bar, parity, timeout_ns, |tries| tries > super::MAX_TRIES) }
    }

    /// [`wait_parity_bounded`] that also stops when `give_up(tries)` says so (asked every
    /// [`GIVE_UP_EVERY`](super::GIVE_UP_EVERY) tries, so that it may be slow: an acquire load of a
    /// global abort flag, for example). Returns whether the phase completed. A phase already
    /// complete returns after one `try_wait`, before the timer is read (on the training
    /// megakernel's large step, no slower than reading it first, and at times faster).
    ///
    /// # Safety
    /// As [`try_wait_parity`].
    #[inline(always)]
    pub unsafe fn wait_parity_or(
        bar: SharedAddr,
        parity: u32,
        timeout_ns: u64,
        mut give_up: impl FnMut(u32) -> bool,
    ) -> bool {
        if unsafe { try_wait_parity(bar, parity) } {
            return true;
        }
        let start = crate::thread::globaltimer_ns();
        let mut tries = 0u32;
        loop {
            if unsafe { try_wait_parity(bar, parity) } {
                return true;
            }
            tries = tries.wrapping_add(1);
            if crate::thread::globaltimer_ns().wrapping_sub(start) > timeout_ns
                || (tries % super::GIVE_UP_EVERY == 0 && give_up(tries))
            {
                return false;
            }
        }
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

/// The parity a waiter passes for the `k`-th use (0-based) of a barrier in a ring of `stages`
/// barriers, where use `k` lands on barrier `k % stages` and is that barrier's phase `k / stages`.
pub const fn ring_parity(k: u32, stages: u32) -> u32 {
    (k / stages) & 1
}

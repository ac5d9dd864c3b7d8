// Included in `mod dev` (see `mod.rs`). How the roles wait on each other inside the block, and
// what a wait that gives up records: bounded waits on the block's mbarriers, the consumers'
// rendezvous, the stall records' roles, and the one-ahead read of the instruction list that every
// role's walk uses.

/// Roles of the stall records ([`role`](crate::megakernel::role)).
const LOADER: u32 = crate::megakernel::role::LOADER;
const CONSUMER: u32 = crate::megakernel::role::CONSUMERS;
const STORER: u32 = crate::megakernel::role::STORER;

/// Waits for the phase of `bar` with `parity`, giving up (false) after the step's wait limit or
/// when another block has aborted. Every lane that calls it waits by itself.
#[inline(always)]
unsafe fn bounded_wait(b: &MegaBuffers, cfg: &MegaConfig, bar: u32, parity: u32) -> bool {
    unsafe { mbarrier::wait_parity_or(bar, parity, cfg.wait_limit_ns as u64, |_| aborted(b, cfg)) }
}

/// Instruction `idx` of the block's list `..hi` (a default one past the end), read one
/// instruction ahead by the loader and the consumers so that the global load's latency hides
/// behind the current instruction's work.
#[inline(always)]
unsafe fn prefetch(b: &MegaBuffers, idx: u32, hi: u32) -> Instruction {
    if idx < hi { unsafe { b.instructions.read(idx as usize) } } else { Instruction::default() }
}

/// Records (lane 0 of the calling warp) that the consumers of instruction `idx` gave up
/// waiting for the bytes of ring use `v`.
#[inline(always)]
unsafe fn record_page_stall(b: &MegaBuffers, cfg: &MegaConfig, idx: u32, v: u32) {
    if thread::lane_id() == 0 {
        let what = PAGE_TAG | PAGE_READY << 16 | page_slot(v);
        unsafe { record_stall(b, cfg, CONSUMER, idx, what, ready_parity(v), v) };
    }
}

/// The consumers' barrier: every consumer thread arrives (so each thread's own shared and global
/// accesses are released by its own arrival), then waits for the phase. False (the same on
/// every lane of the warp) when the step was given up.
#[inline(always)]
unsafe fn rendezvous(b: &MegaBuffers, cfg: &MegaConfig, sm: Smem, phase: &mut u32, idx: u32) -> bool {
    unsafe { rendezvous_or_plant(b, cfg, sm, phase, idx, false) }
}

/// [`rendezvous`], where a `planted` warp (the give-up test's, [`give_up::PUBLISH`]) arrives
/// and then gives up without waiting.
#[inline(always)]
unsafe fn rendezvous_or_plant(
    b: &MegaBuffers,
    cfg: &MegaConfig,
    sm: Smem,
    phase: &mut u32,
    idx: u32,
    planted: bool,
) -> bool {
    unsafe { mbarrier::arrive(sm.rendezvous()) };
    let ok = !planted && unsafe { bounded_wait(b, cfg, sm.rendezvous(), *phase & 1) };
    let ok = warp::all(u32::MAX, ok);
    if !ok && thread::lane_id() == 0 {
        unsafe { record_stall(b, cfg, CONSUMER, idx, PAGE_TAG | RENDEZVOUS << 16, *phase & 1, *phase) };
    }
    *phase += 1;
    ok
}

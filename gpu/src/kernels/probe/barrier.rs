//! mbarrier phases without the copy engine: the arrival-count half of the protocol TMA pipelines use.

use crate::{DevicePtrMut, kernel};
use crate::{fence, mbarrier, shared, sync, thread};

/// Every thread of the block arrives on one mbarrier (initialized for `block_dim` arrivals) in each
/// of `rounds` phases and waits on the phase's parity (`round & 1`); thread 0 then records
/// `out[round] = round + 1`. A miscounted phase would strand the waiters: the wait is bounded and
/// traps instead.
///
/// - Grid: one block of any size up to 1024; dynamic shared memory: 8 bytes; `out`: `rounds` u32.
#[kernel(sm = 90)]
pub unsafe fn mbarrier_phases(out: DevicePtrMut<u32>, rounds: u32) {
    let bar = shared::dynamic_smem_addr();
    let tid = thread::thread_idx_x();
    if tid == 0 {
        unsafe { mbarrier::init(bar, thread::block_dim_x()) };
        fence::mbarrier_init_release_cluster();
    }
    sync::sync_threads();
    let mut round = 0;
    while round < rounds {
        unsafe { mbarrier::arrive(bar) };
        if !unsafe { mbarrier::wait_parity_bounded(bar, round & 1, mbarrier::DEFAULT_WAIT_NS) } {
            thread::trap();
        }
        if tid == 0 {
            unsafe { out.write(round as usize, round + 1) };
        }
        round += 1;
    }
}

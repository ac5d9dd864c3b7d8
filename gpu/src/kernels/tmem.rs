//! Blackwell tensor-memory smoke test (sm_100a only).

use crate::{DevicePtrMut, kernel};
use crate::{shared, sync, tcgen05, thread};

/// TMEM columns [`tmem_alloc_roundtrip`] allocates.
pub const TMEM_COLUMNS: u32 = 32;

/// Allocates [`TMEM_COLUMNS`] tensor-memory columns with warp 0, publishes the base address through
/// shared memory, writes `out[0] = address`, `out[1] = 1`, and frees the columns.
///
/// - Grid: 1 block of 128 threads; dynamic shared memory: 16 bytes.
/// - Built only into the sm_100a module; its GPU test skips below compute capability 10.0.
#[kernel(arch = "sm_100a")]
pub unsafe fn tmem_alloc_roundtrip(out: DevicePtrMut<u32>) {
    let slot = shared::dynamic_smem_addr();
    if thread::warp_id() == 0 {
        unsafe { tcgen05::alloc(slot, TMEM_COLUMNS) };
        tcgen05::relinquish_alloc_permit();
    }
    tcgen05::fence_before_thread_sync();
    sync::sync_threads();
    tcgen05::fence_after_thread_sync();
    let taddr = unsafe { *shared::dynamic_smem::<u32>(0) };
    if thread::thread_idx_x() == 0 {
        unsafe {
            out.write(0, taddr);
            out.write(1, 1);
        }
    }
    tcgen05::fence_before_thread_sync();
    sync::sync_threads();
    tcgen05::fence_after_thread_sync();
    if thread::warp_id() == 0 {
        unsafe { tcgen05::dealloc(taddr, TMEM_COLUMNS) };
    }
}

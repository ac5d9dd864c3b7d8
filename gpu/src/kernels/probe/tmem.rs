//! Blackwell tensor-memory smoke test (sm_100a only).

use crate::{DevicePtrMut, kernel};
use crate::{shared, sync, tcgen05, thread};

/// TMEM columns `tmem_alloc_roundtrip` allocates.
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

/// One `tcgen05.mma` (bf16, 128 x 256 x 16, f32 in tensor memory) on whatever shared memory holds,
/// committed to an mbarrier and waited for (bounded; a stall traps): the smallest complete use of
/// the Blackwell tensor-core path, for the sm_100a module's golden PTX and for the first Blackwell run.
/// Writes `out[0] = 1` when the product completed.
///
/// - Grid: 1 block of 128 threads; dynamic shared memory 16 KB + 16.
/// - Built only into the sm_100a module.
#[kernel(arch = "sm_100a")]
pub unsafe fn tmem_mma_smoke(out: DevicePtrMut<u32>) {
    use crate::tcgen05::{Accum, F16Kind, Layout, Major, instr_desc_f16, smem_desc};
    use crate::{fence, mbarrier};
    let base = shared::dynamic_smem_addr();
    let (slot, bar) = (base + 16384, base + 16392);
    let tid = thread::thread_idx_x();
    if thread::warp_id() == 0 {
        unsafe { tcgen05::alloc(slot, 256) };
        tcgen05::relinquish_alloc_permit();
    }
    if tid == 0 {
        unsafe { mbarrier::init(bar, 1) };
        fence::mbarrier_init_release_cluster();
    }
    tcgen05::fence_before_thread_sync();
    sync::sync_threads();
    tcgen05::fence_after_thread_sync();
    let taddr = unsafe { *shared::dynamic_smem::<u32>(16384) };
    if tid == 0 {
        let idesc = match instr_desc_f16(F16Kind::Bf16, F16Kind::Bf16, Accum::F32, 128, 256, Major::K, Major::K) {
            Some(d) => d,
            None => thread::trap(),
        };
        let a = smem_desc(base, 16, 256, 0, Layout::Interleave);
        let b = smem_desc(base + 4096, 16, 256, 0, Layout::Interleave);
        unsafe {
            tcgen05::mma_f16(taddr, a, b, idesc, false);
            tcgen05::commit(bar);
        }
    }
    if !unsafe { mbarrier::wait_parity_bounded(bar, 0, mbarrier::DEFAULT_WAIT_NS) } {
        thread::trap();
    }
    if tid == 0 {
        unsafe { out.write(0, 1) };
    }
    tcgen05::fence_before_thread_sync();
    sync::sync_threads();
    tcgen05::fence_after_thread_sync();
    if thread::warp_id() == 0 {
        unsafe { tcgen05::dealloc(taddr, 256) };
    }
}

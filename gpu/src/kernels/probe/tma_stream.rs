//! A probe of the copy engine's streaming rate: the megakernel's page protocol without the math.
//! One loader thread fills a ring of shared-memory stages with TMA boxes; the consumer warps wait
//! for each stage, optionally spin for a while (standing in for the math), and free it. Every
//! block reports how long its pages took and how long each waited, so `benches/tma_stream` can
//! compare box shapes, element types, ring depths, wait loops and fences one at a time.

use crate::tma::TensorMap;
use crate::{DevicePtr, DevicePtrMut, KernelParam, kernel};

/// Consumer warps (threads `0..128`); the loader is lane 0 of the warp after them.
pub const STREAM_CONSUMER_WARPS: u32 = 4;
/// Threads per block.
pub const STREAM_THREADS: u32 = 32 * (STREAM_CONSUMER_WARPS + 1);
/// Deepest ring.
pub const STREAM_MAX_STAGES: u32 = 12;
/// Bytes of one stage (its boxes land back to back, each 1024-byte aligned).
pub const STREAM_STAGE_BYTES: u32 = 16 * 1024;
/// Ready barriers, free barriers, then each stage's issue time (u64).
const BARRIERS: u32 = STREAM_STAGE_BYTES * STREAM_MAX_STAGES;
const ISSUED: u32 = BARRIERS + 16 * STREAM_MAX_STAGES;
/// Dynamic shared memory of one block.
pub const STREAM_SMEM_BYTES: u32 = ISSUED + 8 * STREAM_MAX_STAGES;

/// Words of a block's report in the output: see [`report`].
pub const STREAM_REPORT_WORDS: u32 = 8;

/// The report words.
pub mod report {
    /// Global timer (ns) when the block started streaming.
    pub const START_NS: usize = 0;
    /// Global timer (ns) when consumer thread 0 freed its last stage.
    pub const END_NS: usize = 1;
    /// SM clock (cycles) at the start.
    pub const START_CLK: usize = 2;
    /// SM clock at the end.
    pub const END_CLK: usize = 3;
    /// Sum over stages of the cycles from the loader's `arrive.expect_tx` to consumer thread 0
    /// seeing the stage ready.
    pub const ISSUE_TO_READY: usize = 4;
    /// Sum of the cycles consumer thread 0 spent in ready waits.
    pub const CONSUMER_WAIT: usize = 5;
    /// Sum of the cycles the loader spent in free waits.
    pub const LOADER_WAIT: usize = 6;
    /// Stages streamed.
    pub const STAGES: usize = 7;
}

/// Waits: `mbarrier.try_wait` in a bare loop (bounded by a try count).
pub const WAIT_SPIN: u32 = 0;
/// Waits as the megakernel's: the global timer read per try, a global flag every 256th try.
pub const WAIT_BOUNDED: u32 = 1;

/// What `tma_stream` streams. Box `q` (counted over the grid: block `b`'s stage `s` holds boxes
/// `(b * stages_per_block + s) * boxes ..` ) comes from map `q % maps` at the `q`-th box of a
/// row-major walk over a `cols x rows` grid of `box_cols x box_rows` boxes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamConfig {
    /// Stages each block fills and drains.
    pub stages_per_block: u32,
    /// Ring depth, `1..=STREAM_MAX_STAGES`.
    pub ring: u32,
    /// Boxes per stage (each `box_bytes`, together at most [`STREAM_STAGE_BYTES`]).
    pub boxes: u32,
    /// Bytes of one box (a multiple of 1024).
    pub box_bytes: u32,
    /// Box extent in elements, innermost first.
    pub box_cols: u32,
    /// Box extent in rows.
    pub box_rows: u32,
    /// Tensor extent in elements (only whole boxes are read).
    pub cols: u32,
    /// Tensor extent in rows (only whole boxes are read).
    pub rows: u32,
    /// Maps to rotate over (`1..`).
    pub maps: u32,
    /// [`WAIT_SPIN`] or [`WAIT_BOUNDED`].
    pub wait: u32,
    /// Cycles each consumer warp spins on a ready stage before freeing it.
    pub work_cycles: u32,
    /// The loader runs `fence.proxy.async.global` before every `fence_every`-th stage (0: never).
    pub fence_every: u32,
    /// Nonzero: the loader prefetches every map into the descriptor cache first.
    pub prefetch: u32,
}
// SAFETY: repr(C), u32 fields.
unsafe impl KernelParam for StreamConfig {}

/// Streams `cfg.stages_per_block` stages of TMA boxes through a ring per block (see the module
/// docs).
///
/// - Parameters: `maps` (`cfg.maps` tensor maps in global memory, each with `cfg.box_cols x
///   cfg.box_rows` boxes of `cfg.box_bytes`, 128-byte swizzled or not); `flag` (a global word
///   the bounded wait polls, zero); `out` ([`STREAM_REPORT_WORDS`] u64 per block).
/// - Grid: any number of blocks (one per SM resident with this shared memory); block
///   [`STREAM_THREADS`]; dynamic shared memory [`STREAM_SMEM_BYTES`].
/// - Thread mapping: lane 0 of warp [`STREAM_CONSUMER_WARPS`] loads, waiting for a stage's free
///   barrier (4 arrivals) from its second lap on; every consumer warp waits for the ready barrier,
///   spins, and its lane 0 frees the stage. A wait that gives up (a second, or 2^30 tries) traps.
#[kernel(sm = 90)]
pub unsafe fn tma_stream(maps: DevicePtr<TensorMap>, flag: DevicePtr<u32>, cfg: StreamConfig, out: DevicePtrMut<u64>) {
    unsafe { dev::run(maps, flag, &cfg, out) }
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
mod dev {
    use super::{BARRIERS, ISSUED, STREAM_CONSUMER_WARPS, STREAM_REPORT_WORDS, STREAM_STAGE_BYTES, StreamConfig};
    use super::{STREAM_MAX_STAGES, WAIT_BOUNDED, report};
    use crate::tma::TensorMap;
    use crate::{DevicePtr, DevicePtrMut};
    use crate::{atomic, fence, mbarrier, shared, sync, thread, tma};

    const LIMIT_NS: u64 = 1_000_000_000;

    #[inline(always)]
    unsafe fn wait(cfg: &StreamConfig, flag: DevicePtr<u32>, bar: u32, parity: u32) {
        let ok = if cfg.wait == WAIT_BOUNDED {
            unsafe { mbarrier::wait_parity_or(bar, parity, LIMIT_NS, |_| atomic::load_relaxed_gpu(flag.as_ptr()) != 0) }
        } else {
            let mut tries = 0u32;
            loop {
                if unsafe { mbarrier::try_wait_parity(bar, parity) } {
                    break true;
                }
                tries += 1;
                if tries >= 1 << 30 {
                    break false;
                }
            }
        };
        if !ok {
            thread::trap();
        }
    }

    pub(super) unsafe fn run(
        maps: DevicePtr<TensorMap>,
        flag: DevicePtr<u32>,
        cfg: &StreamConfig,
        out: DevicePtrMut<u64>,
    ) {
        let base = shared::dynamic_smem_addr();
        let ready = |s: u32| base + BARRIERS + 8 * s;
        let free = |s: u32| base + BARRIERS + 8 * (STREAM_MAX_STAGES + s);
        let issued = shared::dynamic_smem::<u64>(ISSUED as usize);
        let t = thread::thread_idx_x();
        if base % 1024 != 0
            || cfg.ring == 0
            || cfg.ring > STREAM_MAX_STAGES
            || cfg.boxes * cfg.box_bytes > STREAM_STAGE_BYTES
        {
            thread::trap();
        }
        if t == 0 {
            let mut s = 0;
            while s < cfg.ring {
                unsafe {
                    mbarrier::init(ready(s), 1);
                    mbarrier::init(free(s), STREAM_CONSUMER_WARPS);
                }
                s += 1;
            }
            fence::mbarrier_init_release_cluster();
        }
        sync::sync_threads();
        let (t0, c0) = (thread::globaltimer_ns(), thread::clock64());
        let blk = thread::block_idx_x();
        let n = cfg.stages_per_block;
        let (nx, ny) = (cfg.cols / cfg.box_cols, cfg.rows / cfg.box_rows);
        if thread::warp_id() == STREAM_CONSUMER_WARPS {
            if thread::lane_id() != 0 {
                return;
            }
            if cfg.prefetch != 0 {
                let mut m = 0;
                while m < cfg.maps {
                    unsafe { tma::prefetch(maps.as_ptr().add(m as usize)) };
                    m += 1;
                }
            }
            let mut waited = 0u64;
            let mut u = 0;
            while u < n {
                let s = u % cfg.ring;
                if u >= cfg.ring {
                    let w0 = thread::clock64();
                    unsafe { wait(cfg, flag, free(s), (u / cfg.ring + 1) & 1) };
                    waited += thread::clock64() - w0;
                }
                if cfg.fence_every != 0 && u % cfg.fence_every == 0 {
                    fence::proxy_async_global();
                }
                unsafe { *issued.add(s as usize) = thread::clock64() };
                unsafe { mbarrier::arrive_expect_tx(ready(s), cfg.boxes * cfg.box_bytes) };
                let mut j = 0;
                while j < cfg.boxes {
                    let q = (blk * n + u) * cfg.boxes + j;
                    let (x, y) = ((q % nx) * cfg.box_cols, ((q / nx) % ny) * cfg.box_rows);
                    let map = unsafe { maps.as_ptr().add((q % cfg.maps) as usize) };
                    let dst = base + s * STREAM_STAGE_BYTES + j * cfg.box_bytes;
                    unsafe { tma::load_2d(dst, map, x as i32, y as i32, ready(s)) };
                    j += 1;
                }
                u += 1;
            }
            unsafe { out.write((blk * STREAM_REPORT_WORDS) as usize + report::LOADER_WAIT, waited) };
            return;
        }
        let (mut lat, mut waited) = (0u64, 0u64);
        let mut u = 0;
        while u < n {
            let s = u % cfg.ring;
            let w0 = thread::clock64();
            unsafe { wait(cfg, flag, ready(s), (u / cfg.ring) & 1) };
            let w1 = thread::clock64();
            if t == 0 {
                waited += w1 - w0;
                lat += w1 - unsafe { *issued.add(s as usize) };
            }
            while thread::clock64() - w1 < cfg.work_cycles as u64 {}
            sync::sync_warp(u32::MAX);
            if thread::lane_id() == 0 {
                unsafe { mbarrier::arrive(free(s)) };
            }
            u += 1;
        }
        if t == 0 {
            let at = (blk * STREAM_REPORT_WORDS) as usize;
            let (t1, c1) = (thread::globaltimer_ns(), thread::clock64());
            unsafe {
                out.write(at + report::START_NS, t0);
                out.write(at + report::END_NS, t1);
                out.write(at + report::START_CLK, c0);
                out.write(at + report::END_CLK, c1);
                out.write(at + report::ISSUE_TO_READY, lat);
                out.write(at + report::CONSUMER_WAIT, waited);
                out.write(at + report::STAGES, n as u64);
            }
        }
    }
}

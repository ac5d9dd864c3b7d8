//! Reductions with warp shuffles.

use crate::{DevicePtr, DevicePtrMut, kernel, shared_array};
use crate::{sync, thread, warp};

/// Threads per block of `reduce_sum_f32` (any multiple of 32 up to 1024 works; the host uses this).
pub const REDUCE_THREADS: u32 = 256;

shared_array!(fn warp_sums() -> [f32; 32], align 16);

/// Partial sums: `partials[block] = scale * (sum of x[i])` over the indices a grid-stride loop gives
/// the block.
///
/// - Parameters: `x` (`n` f32), `partials` (one f32 per block), `scale` (1 for a plain sum; `1 / n`
///   with one block gives a mean in one launch).
/// - Mapping: each thread accumulates a grid-stride slice sequentially; each warp combines its 32
///   values with a butterfly of `shfl.sync.bfly`; lane 0 of each warp writes its sum to static shared
///   memory; after a block barrier (reached after a divergent branch, on purpose), warp 0 combines
///   the warp sums the same way. No atomics: for a fixed grid the result is bit-reproducible.
/// - The host runs it twice: once over `x`, then with one block over the partials.
#[kernel]
pub unsafe fn reduce_sum_f32(x: DevicePtr<f32>, partials: DevicePtrMut<f32>, n: u32, scale: f32) {
    let mut acc = 0.0f32;
    let mut i = thread::global_idx_x() as usize;
    let stride = thread::grid_stride_x() as usize;
    while i < n as usize {
        acc += unsafe { x.read(i) };
        i += stride;
    }
    let acc = warp::reduce_sum_f32(acc);
    let (lane, w) = (thread::lane_id(), thread::warp_id());
    let sums = warp_sums();
    if lane == 0 {
        unsafe { (*sums)[w as usize] = acc };
    }
    sync::sync_threads();
    if w == 0 {
        let warps = thread::block_dim_x() / warp::WARP_SIZE;
        let v = if lane < warps { unsafe { (*sums)[lane as usize] } } else { 0.0 };
        let total = warp::reduce_sum_f32(v);
        if lane == 0 {
            unsafe { partials.write(thread::block_idx_x() as usize, total * scale) };
        }
    }
}

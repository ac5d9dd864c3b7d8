//! A TMA round trip: load a tile with the copy engine, transform it in shared memory, store it back.

use crate::swizzle::{self, Swizzle};
use crate::tma::TensorMap;
use crate::{DevicePtr, KernelParam, kernel};
use crate::{fence, mbarrier, shared, sync, thread, tma};

/// Box width in elements (f32): 32 x 4 bytes = 128 bytes, the 128-byte-swizzle span.
pub const TMA_BOX_COLS: u32 = 32;
/// Box height in rows.
pub const TMA_BOX_ROWS: u32 = 64;
/// Threads per block.
pub const TMA_THREADS: u32 = 128;
/// Bytes of one box.
pub const TMA_TILE_BYTES: u32 = TMA_BOX_COLS * TMA_BOX_ROWS * 4;
/// Dynamic shared memory per block: the tile, then its mbarrier (8 bytes).
pub const TMA_SMEM_BYTES: u32 = TMA_TILE_BYTES + 8;

/// What `tma_tile_transform` does to each element: `y = alpha * x + col_scale * column`.
/// The column term makes a wrong swizzle visible: a value read from the wrong place lands in the
/// wrong column.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TileTransform {
    /// Scale applied to every element.
    pub alpha: f32,
    /// Added per global column index.
    pub col_scale: f32,
    /// The swizzle both tensor maps were encoded with (`None` or `B128`: the box rows are 128 bytes).
    pub swizzle: Swizzle,
}
// SAFETY: repr(C), two f32.
unsafe impl KernelParam for TileTransform {}

/// `dst = alpha * src + col_scale * col`, one [`TMA_BOX_ROWS`] x [`TMA_BOX_COLS`] f32 box per block.
///
/// - Parameters: tensor maps (in global memory) of two f32 matrices of the same shape, both with
///   box `TMA_BOX_COLS` x `TMA_BOX_ROWS` and the swizzle named in the transform (passed by value).
/// - Grid: (ceil(cols / 32), ceil(rows / 64)); block: [`TMA_THREADS`] threads;
///   dynamic shared memory [`TMA_SMEM_BYTES`].
/// - Thread 0 initializes the mbarrier, announces the box's bytes and issues the TMA load (boxes past
///   the edge arrive zero-filled); every thread waits on phase 0 (bounded: a stall traps), transforms
///   elements `tid, tid + 128, ...` at their swizzled addresses, fences its writes to the async proxy;
///   after a barrier thread 0 issues the TMA store (clipped to the tensor) and waits until it has read
///   shared memory.
#[kernel(sm = 90)]
pub unsafe fn tma_tile_transform(src: DevicePtr<TensorMap>, dst: DevicePtr<TensorMap>, t: TileTransform) {
    let tile = shared::dynamic_smem_addr();
    let bar = tile + TMA_TILE_BYTES;
    let tid = thread::thread_idx_x();
    let (x0, y0) = (thread::block_idx_x() * TMA_BOX_COLS, thread::block_idx_y() * TMA_BOX_ROWS);
    if tid == 0 {
        unsafe {
            tma::prefetch(src.as_ptr());
            mbarrier::init(bar, 1);
        }
        fence::mbarrier_init_release_cluster();
    }
    sync::sync_threads();
    if tid == 0 {
        unsafe {
            mbarrier::arrive_expect_tx(bar, TMA_TILE_BYTES);
            tma::load_2d(tile, src.as_ptr(), x0 as i32, y0 as i32, bar);
        }
    }
    if !unsafe { mbarrier::wait_parity_bounded(bar, 0, mbarrier::DEFAULT_WAIT_NS) } {
        thread::trap();
    }
    let base: *mut u8 = shared::dynamic_smem(0);
    let mut e = tid;
    while e < TMA_BOX_COLS * TMA_BOX_ROWS {
        let (r, c) = (e / TMA_BOX_COLS, e % TMA_BOX_COLS);
        let off = swizzle::tile_offset(t.swizzle, r, c, TMA_BOX_COLS * 4, 4) as usize;
        unsafe {
            let p = base.add(off) as *mut f32;
            *p = t.alpha * *p + t.col_scale * (x0 + c) as f32;
        }
        e += TMA_THREADS;
    }
    fence::proxy_async_shared_cta();
    sync::sync_threads();
    if tid == 0 {
        unsafe { tma::store_2d(dst.as_ptr(), x0 as i32, y0 as i32, tile) };
        tma::commit_group();
        tma::wait_group_read::<0>();
    }
}

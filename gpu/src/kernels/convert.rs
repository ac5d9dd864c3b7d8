//! Conversions between f32 and the 16-bit float formats on the device: for the deterministic typed
//! tier (bf16 / f16 products are the f32 tier's FMA chains on the exactly widened inputs, rounded
//! once, nearest-even, to the storage type), and `pack_bf16`, which turns f32 operands into the
//! bf16 k-major rows the tensor-core GEMMs read (the bf16 matmul precision of f32 tensors).

use crate::{DevicePtr, DevicePtrMut, convert, kernel, shared_array, sync, thread};

/// Which 16-bit format a conversion kernel reads or writes.
pub mod format {
    /// bfloat16.
    pub const BF16: u32 = 0;
    /// IEEE half.
    pub const F16: u32 = 1;
}

/// `out[i] = f32(src[i])`, exact, for `n` 16-bit values of `format` ([`format`]). Grid-stride.
#[kernel]
pub unsafe fn widen_b16_f32(src: DevicePtr<u16>, out: DevicePtrMut<f32>, n: u32, format: u32) {
    let mut i = thread::global_idx_x();
    while i < n {
        let h = unsafe { src.read(i as usize) };
        let v = if format == format::F16 { convert::f16_bits_to_f32(h) } else { convert::bf16_bits_to_f32(h) };
        unsafe { out.write(i as usize, v) };
        i += thread::grid_stride_x();
    }
}

/// `out[i] = round_to_nearest_even(src[i])` in `format` ([`format`]), for `n` values. Grid-stride.
#[kernel]
pub unsafe fn narrow_f32_b16(src: DevicePtr<f32>, out: DevicePtrMut<u16>, n: u32, format: u32) {
    let mut i = thread::global_idx_x();
    while i < n {
        let v = unsafe { src.read(i as usize) };
        let h = if format == format::F16 {
            (convert::pack_f16x2(v, 0.0) & 0xffff) as u16
        } else {
            convert::f32_to_bf16_bits(v)
        };
        unsafe { out.write(i as usize, h) };
        i += thread::grid_stride_x();
    }
}

/// Output rows a `pack_bf16` block writes.
pub const PACK_TILE_ROWS: u32 = 32;
/// Output columns a `pack_bf16` block writes (two per thread of a 32-wide row).
pub const PACK_TILE_COLS: u32 = 64;
/// Threads per `pack_bf16` block along y (x is 32).
pub const PACK_ROWS: u32 = 8;
/// Row multiple of `pack_bf16`'s output (`ld`): the tensor-core GEMMs copy and TMA-load rows in
/// 16-byte pieces, 8 bf16 values.
pub const PACK_K_MULTIPLE: u32 = 8;

// A transposed block's source tile: 64 source rows of 32 values, each row padded by one word.
#[cfg_attr(not(target_arch = "nvptx64"), allow(dead_code))]
const PACK_PITCH: u32 = 33;
shared_array!(fn pack_tile() -> [f32; (PACK_TILE_COLS * PACK_PITCH) as usize], align 16);

/// Packs an f32 matrix into the bf16 operand rows of the tensor-core GEMMs (`C = A B^T` with A and
/// B both k-major), transposing on the way when asked, and zero-padding each output row to `ld`.
///
/// - Parameters: `src` is `rows x cols`, row-major f32. With `transpose == 0` the output is `rows`
///   rows of `ld >= cols` bf16 values: `dst[r ld + c] = bf16(src[r cols + c])` for `c < cols`, 0
///   for `cols <= c < ld`. With `transpose == 1` it is `cols` rows of `ld >= rows`:
///   `dst[c ld + r] = bf16(src[r cols + c])` for `r < rows`, 0 beyond. Rounding: nearest-even.
///   `ld` is a multiple of [`PACK_K_MULTIPLE`]; `dst` is 4-byte aligned and written as bf16 pairs.
///   (A k x m operand stored row-major becomes m rows of k: the `A^T` of `dW = dY^T X`.)
/// - Tiling: a block writes one `PACK_TILE_ROWS x PACK_TILE_COLS` (32 x 64) tile of the output:
///   column tile `blockIdx.x`, row tile `first_row_tile + blockIdx.y`. Grid
///   `(ceil(ld / 64), row tiles)`, block `(32, 8)`; the grid's y stops at 65535, so the host
///   launches operands of more than 2 million rows in slices of 65535 row tiles (`first_row_tile`).
/// - Mapping: thread `(x, y)` writes the pairs at columns `2x, 2x + 1` of tile rows `y + 8 j`,
///   `j < 4`, one 4-byte store each (a warp stores 128 contiguous bytes). Untransposed, it reads the
///   two source values of each pair directly. Transposed, the block first reads the 64 x 32 source
///   tile (source rows `col0 + y + 8 j`, `j < 8`, column `row0 + x`: coalesced along source rows)
///   into shared memory, and after a block barrier takes each pair from two consecutive tile rows.
#[kernel]
pub unsafe fn pack_bf16(
    src: DevicePtr<f32>,
    dst: DevicePtrMut<u32>,
    rows: u32,
    cols: u32,
    ld: u32,
    transpose: u32,
    first_row_tile: u32,
) {
    let (x, y) = (thread::thread_idx_x(), thread::thread_idx_y());
    let col0 = thread::block_idx_x() * PACK_TILE_COLS;
    let row0 = (first_row_tile + thread::block_idx_y()) * PACK_TILE_ROWS;
    let c = col0 + 2 * x;
    let out_rows = if transpose != 0 { cols } else { rows };
    let load = |r: u32, c: u32| {
        if r < rows && c < cols { unsafe { src.read(r as usize * cols as usize + c as usize) } } else { 0.0 }
    };
    // the pair (r, c), (r, c + 1): c is even and ld even, so both or neither are in the row
    let store = |r: u32, c: u32, lo: f32, hi: f32| {
        if r < out_rows && c < ld {
            unsafe { dst.write((r as usize * ld as usize + c as usize) / 2, convert::pack_bf16x2(lo, hi)) };
        }
    };
    if transpose == 0 {
        let mut j = 0;
        while j < PACK_TILE_ROWS {
            let r = row0 + y + j;
            store(r, c, load(r, c), load(r, c + 1));
            j += PACK_ROWS;
        }
        return;
    }
    // The output tile (row0.., col0..) is the transpose of source rows col0.., columns row0...
    let tile = pack_tile() as *mut f32;
    let at = |r: u32, c: u32| (r * PACK_PITCH + c) as usize;
    let mut j = 0;
    while j < PACK_TILE_COLS {
        unsafe { *tile.add(at(y + j, x)) = load(col0 + y + j, row0 + x) };
        j += PACK_ROWS;
    }
    sync::sync_threads();
    let mut j = 0;
    while j < PACK_TILE_ROWS {
        let (lo, hi) = unsafe { (*tile.add(at(2 * x, y + j)), *tile.add(at(2 * x + 1, y + j))) };
        store(row0 + y + j, c, lo, hi);
        j += PACK_ROWS;
    }
}

//! Elementwise kernels.

use crate::thread;
use crate::{DevicePtr, DevicePtrMut, kernel};

/// `out[i] = a[i] + b[i]` for `i < n`.
///
/// - Parameters: two inputs and one output of `n` f32 each (`out` may alias neither input).
/// - Mapping: 1-D grid-stride loop; any grid and block size cover any `n` (the host uses 256
///   threads per block and enough blocks for one element per thread, up to a cap).
#[kernel]
pub unsafe fn vector_add(a: DevicePtr<f32>, b: DevicePtr<f32>, out: DevicePtrMut<f32>, n: u32) {
    let mut i = thread::global_idx_x() as usize;
    let stride = thread::grid_stride_x() as usize;
    while i < n as usize {
        unsafe { out.write(i, a.read(i) + b.read(i)) };
        i += stride;
    }
}

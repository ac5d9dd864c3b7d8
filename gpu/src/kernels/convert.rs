//! Conversions between f32 and the 16-bit float formats on the device, for the deterministic typed
//! tier: bf16 / f16 products are the f32 tier's FMA chains on the exactly widened inputs, rounded
//! once (nearest-even) to the storage type.

use crate::{DevicePtr, DevicePtrMut, convert, kernel, thread};

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

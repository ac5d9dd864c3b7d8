//! bf16 / f16 / tf32 conversion and packing.
//!
//! Two 16-bit values share a 32-bit register as the tensor cores expect: the element with the lower
//! index in the low half. On the host, [`bf16_bits_to_f32`] and the packing helpers give the same
//! bit patterns, so tests can build fragments without a GPU.

/// Packs two 16-bit patterns into one register: `lo` in bits 0-15, `hi` in bits 16-31.
pub const fn pack_b16x2(lo: u16, hi: u16) -> u32 {
    (lo as u32) | ((hi as u32) << 16)
}

/// The low and high 16-bit halves of a packed register.
pub const fn unpack_b16x2(v: u32) -> (u16, u16) {
    (v as u16, (v >> 16) as u16)
}

/// Widens a bf16 bit pattern to f32 (exact: bf16 is the top half of an f32).
pub const fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

#[cfg(target_arch = "nvptx64")]
mod device {
    use core::arch::asm;

    /// Rounds two f32 to bf16 (nearest-even) and packs them, `lo` in the low half.
    ///
    /// PTX: `cvt.rn.bf16x2.f32 %r, hi, lo;`
    #[inline(always)]
    pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
        let r: u32;
        // SAFETY: register-only.
        unsafe {
            asm!("cvt.rn.bf16x2.f32 {r}, {h}, {l};", r = out(reg32) r, h = in(reg32) hi, l = in(reg32) lo, options(nomem, nostack, pure))
        };
        r
    }

    /// Rounds two f32 to f16 (nearest-even) and packs them, `lo` in the low half.
    ///
    /// PTX: `cvt.rn.f16x2.f32 %r, hi, lo;`
    #[inline(always)]
    pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
        let r: u32;
        // SAFETY: register-only.
        unsafe {
            asm!("cvt.rn.f16x2.f32 {r}, {h}, {l};", r = out(reg32) r, h = in(reg32) hi, l = in(reg32) lo, options(nomem, nostack, pure))
        };
        r
    }

    /// Rounds an f32 to bf16 (nearest-even).
    ///
    /// PTX: `cvt.rn.bf16.f32 %h, x;`
    #[inline(always)]
    pub fn f32_to_bf16_bits(x: f32) -> u16 {
        let r: u16;
        // SAFETY: register-only.
        unsafe { asm!("cvt.rn.bf16.f32 {r}, {x};", r = out(reg16) r, x = in(reg32) x, options(nomem, nostack, pure)) };
        r
    }

    /// Widens an f16 bit pattern to f32 (exact).
    ///
    /// PTX: `cvt.f32.f16 %f, h;`
    #[inline(always)]
    pub fn f16_bits_to_f32(h: u16) -> f32 {
        let r: f32;
        // SAFETY: register-only.
        unsafe { asm!("cvt.f32.f16 {r}, {h};", r = out(reg32) r, h = in(reg16) h, options(nomem, nostack, pure)) };
        r
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

/// Rounds an f32 to tf32 (10 mantissa bits, to nearest), as the bit pattern `mma.sync ... tf32`
/// reads (the 13 low bits zero); infinities pass unchanged. The host model keeps a NaN a NaN
/// (quieted); what the device instructions make of a NaN input was not measured (only finite values
/// and ties were checked on the GPU).
///
/// - sm_90 and newer: `cvt.rn.tf32.f32` (ties to even), one instruction, then the low bits
///   cleared so that a 3xTF32 split (`x - head`) sees exactly the value the tensor core does.
/// - sm_80: `cvt.rna.tf32.f32` (ties away from zero), the only tf32 rounding sm_80 has.
/// - Host: the sm_90 rounding in integer arithmetic ([`tf32_round_host`]).
///
/// Why not `cvt.rna` everywhere: on sm_90 ptxas expands it into a compare that sets a predicate
/// and an add under it, and a run of them queues on the one predicate register at about 14 cycles
/// each; the megakernel converts 64 values per page and warp, and `cvt.rn` takes about a quarter
/// off its medium model's step on tf32 and a third on 3xTF32 (`benches/results/mlp_step.md`).
///
/// PTX: `cvt.rn.tf32.f32 %r, x; and.b32 %r, %r, 0xffffe000;` (sm_80: `cvt.rna.tf32.f32 %r, x;`)
#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90"))]
#[inline(always)]
pub fn f32_to_tf32(x: f32) -> u32 {
    let r: u32;
    // SAFETY: register-only.
    unsafe {
        core::arch::asm!("cvt.rn.tf32.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(nomem, nostack, pure))
    };
    r & 0xffff_e000
}

/// See the sm_90 version.
#[cfg(all(target_arch = "nvptx64", not(target_feature = "sm_90")))]
#[inline(always)]
pub fn f32_to_tf32(x: f32) -> u32 {
    let r: u32;
    // SAFETY: register-only.
    unsafe {
        core::arch::asm!("cvt.rna.tf32.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(nomem, nostack, pure))
    };
    r
}

/// See the sm_90 version: on the host, the same rounding (nearest, ties to even).
#[cfg(not(target_arch = "nvptx64"))]
#[inline(always)]
pub const fn f32_to_tf32(x: f32) -> u32 {
    let b = x.to_bits();
    if (b & 0x7f80_0000) == 0x7f80_0000 {
        // infinity as is; a NaN keeps its sign and top payload bits, quieted so that it stays a
        // NaN once the low bits are gone
        return if (b & 0x007f_ffff) == 0 { b } else { (b & 0xffff_e000) | 0x0040_0000 };
    }
    // add just under half a tf32 ulp, plus one when the kept part is odd, and drop the low bits
    b.wrapping_add(0x0fff + ((b >> 13) & 1)) & 0xffff_e000
}

/// [`f32_to_tf32`]'s rounding on the host, as an f32 (the value a tf32 product sees on sm_90).
#[cfg(not(target_arch = "nvptx64"))]
pub const fn tf32_round_host(x: f32) -> f32 {
    f32::from_bits(f32_to_tf32(x))
}

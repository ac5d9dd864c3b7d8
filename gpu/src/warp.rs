//! Warp shuffles, votes and reductions.
//!
//! All functions take the participating lanes as `mask` (use [`FULL_MASK`] when the whole warp is
//! converged); every lane in the mask must execute the same call.
//!
//! Warp-collective `asm!` is never marked `pure`: LLVM has no "convergent" attribute for inline
//! asm, and a pure block whose result one branch uses may be sunk into that branch, where only some
//! lanes execute it. (kiln's reduction hit exactly this: the second butterfly was sunk into
//! `if lane == 0`.) A non-pure block counts as a side effect and stays where it is written.

/// Threads per warp.
pub const WARP_SIZE: u32 = 32;
/// Every lane of a warp.
pub const FULL_MASK: u32 = 0xffff_ffff;

#[cfg(target_arch = "nvptx64")]
mod device {
    use core::arch::asm;

    macro_rules! shfl {
        ($($(#[$doc:meta])+ $name:ident => $mode:literal, $clamp:literal;)*) => {$(
            $(#[$doc])+
            ///
            #[doc = concat!("PTX: `shfl.sync.", $mode, ".b32 %r, value, lane_arg, ", $clamp, ", mask;`")]
            #[inline(always)]
            pub fn $name(mask: u32, value: u32, lane_arg: u32) -> u32 {
                let r: u32;
                // SAFETY: a register exchange within the warp; no memory is touched.
                unsafe {
                    asm!(concat!("shfl.sync.", $mode, ".b32 {r}, {v}, {l}, ", $clamp, ", {m};"),
                        r = out(reg32) r, v = in(reg32) value, l = in(reg32) lane_arg, m = in(reg32) mask,
                        options(nomem, nostack))
                };
                r
            }
        )*};
    }

    shfl! {
        /// Reads `value` from lane `lane_id + delta` (unchanged when that lane is out of range).
        shfl_down_u32 => "down", "0x1f";
        /// Reads `value` from lane `lane_id - delta` (unchanged when that lane is out of range).
        shfl_up_u32 => "up", "0";
        /// Reads `value` from lane `lane_id ^ lane_mask`.
        shfl_xor_u32 => "bfly", "0x1f";
        /// Reads `value` from lane `src_lane`.
        shfl_idx_u32 => "idx", "0x1f";
    }

    /// [`shfl_down_u32`] for `f32`.
    #[inline(always)]
    pub fn shfl_down_f32(mask: u32, value: f32, delta: u32) -> f32 {
        f32::from_bits(shfl_down_u32(mask, value.to_bits(), delta))
    }

    /// [`shfl_xor_u32`] for `f32`.
    #[inline(always)]
    pub fn shfl_xor_f32(mask: u32, value: f32, lane_mask: u32) -> f32 {
        f32::from_bits(shfl_xor_u32(mask, value.to_bits(), lane_mask))
    }

    /// [`shfl_idx_u32`] for `f32`.
    #[inline(always)]
    pub fn shfl_idx_f32(mask: u32, value: f32, src_lane: u32) -> f32 {
        f32::from_bits(shfl_idx_u32(mask, value.to_bits(), src_lane))
    }

    /// One bit per lane in `mask`: set where `pred` is true.
    ///
    /// PTX: `setp.ne.u32 p, pred, 0; vote.sync.ballot.b32 %r, p, mask;`
    #[inline(always)]
    pub fn ballot(mask: u32, pred: bool) -> u32 {
        let r: u32;
        // SAFETY: a register vote within the warp.
        unsafe {
            asm!("{{ .reg .pred p; setp.ne.u32 p, {x}, 0; vote.sync.ballot.b32 {r}, p, {m}; }}",
                r = out(reg32) r, x = in(reg32) pred as u32, m = in(reg32) mask, options(nomem, nostack))
        };
        r
    }

    macro_rules! vote {
        ($($(#[$doc:meta])+ $name:ident => $mode:literal;)*) => {$(
            $(#[$doc])+
            ///
            #[doc = concat!("PTX: `vote.sync.", $mode, ".pred q, p, mask;`")]
            #[inline(always)]
            pub fn $name(mask: u32, pred: bool) -> bool {
                let r: u32;
                // SAFETY: a register vote within the warp.
                unsafe {
                    asm!(concat!("{{ .reg .pred p, q; setp.ne.u32 p, {x}, 0; vote.sync.", $mode,
                                 ".pred q, p, {m}; selp.u32 {r}, 1, 0, q; }}"),
                        r = out(reg32) r, x = in(reg32) pred as u32, m = in(reg32) mask,
                        options(nomem, nostack))
                };
                r != 0
            }
        )*};
    }

    vote! {
        /// True when `pred` holds on every lane in `mask`.
        all => "all";
        /// True when `pred` holds on any lane in `mask`.
        any => "any";
    }

    /// The mask of lanes currently executing together.
    ///
    /// PTX: `activemask.b32 %r;`
    #[inline(always)]
    pub fn active_mask() -> u32 {
        let r: u32;
        // SAFETY: reads the convergence state.
        unsafe { asm!("activemask.b32 {r};", r = out(reg32) r, options(nomem, nostack)) };
        r
    }

    /// Sum over the full warp by a butterfly (`shfl.sync.bfly`): every lane gets the same total.
    /// The association is fixed (lanes pair at distance 16, 8, 4, 2, 1), so the result is
    /// bit-reproducible.
    #[inline(always)]
    pub fn reduce_sum_f32(mut v: f32) -> f32 {
        let mut offset = super::WARP_SIZE / 2;
        while offset > 0 {
            v += shfl_xor_f32(super::FULL_MASK, v, offset);
            offset /= 2;
        }
        v
    }

    /// Maximum over the full warp by a butterfly; every lane gets the result.
    #[inline(always)]
    pub fn reduce_max_f32(mut v: f32) -> f32 {
        let mut offset = super::WARP_SIZE / 2;
        while offset > 0 {
            v = v.max(shfl_xor_f32(super::FULL_MASK, v, offset));
            offset /= 2;
        }
        v
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

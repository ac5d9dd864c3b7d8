//! Warp-level tensor-core products, `mma.sync` (sm_80 and newer), and their fragment layouts.
//!
//! A warp computes `D = A B + C` for one small tile: `m16n8k16` for bf16 and f16 inputs, `m16n8k8`
//! for tf32, accumulating in f32. Each lane holds pieces ("fragments") of A, B and C in registers; the
//! layout functions below say which element each register holds, and are tested on the host.
//! In all of them `group = lane / 4` and `t = lane % 4`.
//!
//! Like every warp-collective wrapper, the `mma` blocks are not `pure` (see [`crate::warp`]): they
//! must not be moved into a branch that only some lanes take.

/// Where element `i` of a lane's fragment lives: `(row, col)` of the tile.
pub type RowCol = (u32, u32);

/// A fragment of `m16n8k16` (16-bit inputs): A is 16x16 row-major, 8 elements per lane in 4 registers
/// (two per register, the lower index in the low half).
pub const fn m16n8k16_a(lane: u32, i: u32) -> RowCol {
    let (group, t) = (lane / 4, lane % 4);
    let row = group + 8 * ((i / 2) % 2);
    let col = t * 2 + (i % 2) + 8 * (i / 4);
    (row, col)
}

/// B fragment of `m16n8k16`: B is 16 (k) x 8 (n), 4 elements per lane in 2 registers. Returns (k, n).
pub const fn m16n8k16_b(lane: u32, i: u32) -> RowCol {
    let (group, t) = (lane / 4, lane % 4);
    (t * 2 + (i % 2) + 8 * (i / 2), group)
}

/// C/D fragment of `m16n8k16` and `m16n8k8`: 16x8 f32, 4 elements per lane.
pub const fn m16n8_c(lane: u32, i: u32) -> RowCol {
    let (group, t) = (lane / 4, lane % 4);
    (group + 8 * (i / 2), t * 2 + (i % 2))
}

/// A fragment of `m16n8k8` tf32: A is 16x8, 4 elements per lane (one per register).
pub const fn m16n8k8_tf32_a(lane: u32, i: u32) -> RowCol {
    let (group, t) = (lane / 4, lane % 4);
    (group + 8 * (i % 2), t + 4 * (i / 2))
}

/// B fragment of `m16n8k8` tf32: B is 8 (k) x 8 (n), 2 elements per lane. Returns (k, n).
pub const fn m16n8k8_tf32_b(lane: u32, i: u32) -> RowCol {
    let (group, t) = (lane / 4, lane % 4);
    (t + 4 * i, group)
}

#[cfg(target_arch = "nvptx64")]
mod device {
    use core::arch::asm;

    macro_rules! mma_16bit {
        ($($(#[$doc:meta])+ $name:ident => $ty:literal;)*) => {$(
            $(#[$doc])+
            ///
            #[doc = concat!("PTX: `mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32 {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3};`")]
            ///
            /// Every lane of the warp must call it, converged.
            #[inline(always)]
            pub fn $name(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
                let (d0, d1, d2, d3): (f32, f32, f32, f32);
                // SAFETY: register-only; the caller keeps the warp converged.
                unsafe {
                    asm!(concat!("mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty,
                        ".f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};"),
                        d0 = out(reg32) d0, d1 = out(reg32) d1, d2 = out(reg32) d2, d3 = out(reg32) d3,
                        a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                        b0 = in(reg32) b[0], b1 = in(reg32) b[1],
                        c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
                        options(nomem, nostack))
                };
                [d0, d1, d2, d3]
            }
        )*};
    }

    mma_16bit! {
        /// `D = A B + C` on a 16x8x16 tile, bf16 inputs (two per register), f32 accumulators.
        mma_m16n8k16_bf16 => "bf16";
        /// `D = A B + C` on a 16x8x16 tile, f16 inputs (two per register), f32 accumulators.
        mma_m16n8k16_f16 => "f16";
    }

    /// `D = A B + C` on a 16x8x8 tile, tf32 inputs (one per register, made by
    /// [`crate::convert::f32_to_tf32`]), f32 accumulators.
    ///
    /// PTX: `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {d0..d3}, {a0..a3}, {b0, b1}, {c0..c3};`
    #[inline(always)]
    pub fn mma_m16n8k8_tf32(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
        let (d0, d1, d2, d3): (f32, f32, f32, f32);
        // SAFETY: register-only; the caller keeps the warp converged.
        unsafe {
            asm!("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{c0}, {c1}, {c2}, {c3}}};",
                d0 = out(reg32) d0, d1 = out(reg32) d1, d2 = out(reg32) d2, d3 = out(reg32) d3,
                a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                b0 = in(reg32) b[0], b1 = in(reg32) b[1],
                c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
                options(nomem, nostack))
        };
        [d0, d1, d2, d3]
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

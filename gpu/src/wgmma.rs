//! Hopper warpgroup matrix products (sm_90a): the shared-memory matrix descriptor and the
//! fence / commit / wait protocol around `wgmma.mma_async`.
//!
//! A warpgroup (4 consecutive warps, the first a multiple of 4) issues `wgmma.mma_async`, which reads
//! B (and optionally A) from shared memory through 64-bit descriptors and accumulates into registers.
//! The products themselves and the GEMM kernels that use them arrive with the GEMM ladder; the
//! descriptor encoding is here from the start and tested on the host.

use crate::swizzle::Swizzle;

/// The 2-bit swizzle field of a wgmma shared-memory descriptor (bits 62-63).
pub const fn swizzle_code(s: Swizzle) -> u64 {
    match s {
        Swizzle::None => 0,
        Swizzle::B128 => 1,
        Swizzle::B64 => 2,
        Swizzle::B32 => 3,
    }
}

/// A byte address or offset in the 14-bit, 16-byte-granular form descriptors use.
pub(crate) const fn enc14(x: u32) -> u64 {
    ((x as u64 & 0x3ffff) >> 4) & 0x3fff
}

/// Encodes a wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"):
/// bits 0-13 start address >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension
/// byte offset >> 4, 49-51 base offset, 62-63 swizzle mode.
pub const fn smem_descriptor(
    start: u32,
    leading_byte_offset: u32,
    stride_byte_offset: u32,
    base_offset: u32,
    s: Swizzle,
) -> u64 {
    enc14(start)
        | (enc14(leading_byte_offset) << 16)
        | (enc14(stride_byte_offset) << 32)
        | (((base_offset & 0x7) as u64) << 49)
        | (swizzle_code(s) << 62)
}

/// Where element `i` (0..64) of a thread's `m64n128` f32 accumulator lives in the 64 x 128 tile,
/// for thread `t` (0..128) of the warpgroup: warp `t / 32` owns rows 16w..16w+16, and within it the
/// `mma.m16n8` C layout repeats across the 16 column blocks of 8.
pub const fn acc_m64n128(t: u32, i: u32) -> (u32, u32) {
    let (w, lane) = (t / 32, t % 32);
    let (g, q) = (lane / 4, lane % 4);
    let (block, e) = (i / 4, i % 4);
    (w * 16 + g + 8 * (e / 2), block * 8 + 2 * q + (e % 2))
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod device {
    use core::arch::asm;

    /// Orders register accesses to accumulators before the next `wgmma.mma_async`.
    ///
    /// PTX: `wgmma.fence.sync.aligned;`
    #[inline(always)]
    pub fn fence() {
        // SAFETY: ordering only; the warpgroup must be converged.
        unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) };
    }

    /// Closes the group of `wgmma.mma_async` issued since the last commit.
    ///
    /// PTX: `wgmma.commit_group.sync.aligned;`
    #[inline(always)]
    pub fn commit_group() {
        // SAFETY: bookkeeping only.
        unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) };
    }

    /// Waits until at most `N` wgmma groups are pending.
    ///
    /// PTX: `wgmma.wait_group.sync.aligned N;`
    #[inline(always)]
    pub fn wait_group<const N: u32>() {
        // SAFETY: waiting has no preconditions.
        unsafe { asm!("wgmma.wait_group.sync.aligned {n};", n = const N, options(nostack)) };
    }

    /// One warpgroup-wide `D (+)= A B` on a 64 x 128 x 16 tile, bf16 inputs from shared memory
    /// through descriptors (both K-major), f32 accumulators in registers (64 per thread, laid out as
    /// [`super::acc_m64n128`] says). `accumulate = false` overwrites D.
    ///
    /// PTX: `wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {d0..d63}, a_desc, b_desc, p, 1, 1, 0, 0;`
    ///
    /// # Safety
    /// The whole warpgroup calls it, converged, after [`fence`]; the descriptors describe tiles
    /// the async proxy may read; results are valid only after [`commit_group`] and [`wait_group`].
    #[inline(always)]
    pub unsafe fn mma_m64n128k16_bf16(d: &mut [f32; 64], a_desc: u64, b_desc: u64, accumulate: bool) {
        unsafe {
            asm!(
                "{{ .reg .pred p; setp.ne.b32 p, {acc}, 0;",
                "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{{d0}, {d1}, {d2}, {d3}, {d4}, {d5}, {d6}, {d7}, {d8}, {d9}, {d10}, {d11}, {d12}, {d13}, {d14}, {d15}, {d16}, {d17}, {d18}, {d19}, {d20}, {d21}, {d22}, {d23}, {d24}, {d25}, {d26}, {d27}, {d28}, {d29}, {d30}, {d31}, {d32}, {d33}, {d34}, {d35}, {d36}, {d37}, {d38}, {d39}, {d40}, {d41}, {d42}, {d43}, {d44}, {d45}, {d46}, {d47}, {d48}, {d49}, {d50}, {d51}, {d52}, {d53}, {d54}, {d55}, {d56}, {d57}, {d58}, {d59}, {d60}, {d61}, {d62}, {d63}}}, {a}, {b}, p, 1, 1, 0, 0; }}",
                d0 = inout(reg32) d[0],
                d1 = inout(reg32) d[1],
                d2 = inout(reg32) d[2],
                d3 = inout(reg32) d[3],
                d4 = inout(reg32) d[4],
                d5 = inout(reg32) d[5],
                d6 = inout(reg32) d[6],
                d7 = inout(reg32) d[7],
                d8 = inout(reg32) d[8],
                d9 = inout(reg32) d[9],
                d10 = inout(reg32) d[10],
                d11 = inout(reg32) d[11],
                d12 = inout(reg32) d[12],
                d13 = inout(reg32) d[13],
                d14 = inout(reg32) d[14],
                d15 = inout(reg32) d[15],
                d16 = inout(reg32) d[16],
                d17 = inout(reg32) d[17],
                d18 = inout(reg32) d[18],
                d19 = inout(reg32) d[19],
                d20 = inout(reg32) d[20],
                d21 = inout(reg32) d[21],
                d22 = inout(reg32) d[22],
                d23 = inout(reg32) d[23],
                d24 = inout(reg32) d[24],
                d25 = inout(reg32) d[25],
                d26 = inout(reg32) d[26],
                d27 = inout(reg32) d[27],
                d28 = inout(reg32) d[28],
                d29 = inout(reg32) d[29],
                d30 = inout(reg32) d[30],
                d31 = inout(reg32) d[31],
                d32 = inout(reg32) d[32],
                d33 = inout(reg32) d[33],
                d34 = inout(reg32) d[34],
                d35 = inout(reg32) d[35],
                d36 = inout(reg32) d[36],
                d37 = inout(reg32) d[37],
                d38 = inout(reg32) d[38],
                d39 = inout(reg32) d[39],
                d40 = inout(reg32) d[40],
                d41 = inout(reg32) d[41],
                d42 = inout(reg32) d[42],
                d43 = inout(reg32) d[43],
                d44 = inout(reg32) d[44],
                d45 = inout(reg32) d[45],
                d46 = inout(reg32) d[46],
                d47 = inout(reg32) d[47],
                d48 = inout(reg32) d[48],
                d49 = inout(reg32) d[49],
                d50 = inout(reg32) d[50],
                d51 = inout(reg32) d[51],
                d52 = inout(reg32) d[52],
                d53 = inout(reg32) d[53],
                d54 = inout(reg32) d[54],
                d55 = inout(reg32) d[55],
                d56 = inout(reg32) d[56],
                d57 = inout(reg32) d[57],
                d58 = inout(reg32) d[58],
                d59 = inout(reg32) d[59],
                d60 = inout(reg32) d[60],
                d61 = inout(reg32) d[61],
                d62 = inout(reg32) d[62],
                d63 = inout(reg32) d[63],
                a = in(reg64) a_desc,
                b = in(reg64) b_desc,
                acc = in(reg32) accumulate as u32,
                options(nostack)
            )
        };
    }
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub use device::*;

//! Blackwell tensor memory and the fifth-generation tensor cores (sm_100a).
//!
//! Tensor memory (TMEM) is a per-SM 128-lane x 512-column array of 32-bit cells that `tcgen05.mma`
//! accumulates into. A warp allocates columns (a power of two, at least 32), receives the base address
//! in shared memory, and must free them before the block exits. No Blackwell GPU is lent to kiln's
//! developers: this code is assembled by ptxas for sm_100a in CI, its encodings are tested on the
//! host, and its GPU tests skip below compute capability 10.0.

/// The element types `tcgen05.mma.kind::f16` multiplies (the 3-bit A/B format fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum F16Kind {
    /// IEEE half (code 0).
    F16 = 0,
    /// bfloat16 (code 1).
    Bf16 = 1,
}

/// Accumulator types (the 2-bit D format field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accum {
    /// f16 accumulators (code 0).
    F16 = 0,
    /// f32 accumulators (code 1).
    F32 = 1,
}

/// Which dimension of an operand is contiguous in shared memory (the 1-bit major fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Major {
    /// K contiguous (code 0).
    K = 0,
    /// M (for A) or N (for B) contiguous (code 1).
    MN = 1,
}

/// The 32-bit instruction descriptor of a dense `tcgen05.mma.cta_group::1.kind::f16`, or `None` for
/// a shape the instruction does not have (M 64 with N a multiple of 8 up to 256; M 128 with N a
/// multiple of 16 up to 256).
///
/// Fields (PTX ISA, "Instruction descriptor" for .kind::f16/tf32; the same table CUTLASS's
/// `UMMA::InstrDescriptor` encodes): bits 0-1 sparsity selector, 2 sparsity, 3 saturate, 4-5 D
/// format, 7-9 A format, 10-12 B format, 13/14 negate A/B, 15/16 A/B major, 17-22 N >> 3,
/// 24-28 M >> 4, 30-31 maximum shift (weight-stationary only).
pub const fn instr_desc_f16(
    a: F16Kind,
    b: F16Kind,
    d: Accum,
    m: u32,
    n: u32,
    a_major: Major,
    b_major: Major,
) -> Option<u32> {
    let n_ok = match m {
        64 => n >= 8 && n <= 256 && n.is_multiple_of(8),
        128 => n >= 16 && n <= 256 && n.is_multiple_of(16),
        _ => false,
    };
    if !n_ok {
        return None;
    }
    Some(
        ((d as u32) << 4)
            | ((a as u32) << 7)
            | ((b as u32) << 10)
            | ((a_major as u32) << 15)
            | ((b_major as u32) << 16)
            | ((n >> 3) << 17)
            | ((m >> 4) << 24),
    )
}

/// Shared-memory layouts of a tcgen05 matrix descriptor (the 3-bit field at bits 61-63; note the
/// codes differ from wgmma's 2-bit field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// No swizzle (0).
    Interleave = 0,
    /// 128-byte swizzle with 32-byte atoms (1).
    Swizzle128B32B = 1,
    /// 128-byte swizzle (2).
    Swizzle128B = 2,
    /// 64-byte swizzle (4).
    Swizzle64B = 4,
    /// 32-byte swizzle (6).
    Swizzle32B = 6,
}

/// The 64-bit shared-memory matrix descriptor `tcgen05.mma` reads A and B through: bits 0-13 start
/// address >> 4, 16-29 leading-dimension byte offset >> 4, 32-45 stride-dimension byte offset >> 4,
/// 46-48 the fixed value 0b001 (descriptor version 1), 49-51 base offset, 52 leading-offset mode (0:
/// relative), 61-63 layout.
pub const fn smem_desc(
    start: u32,
    leading_byte_offset: u32,
    stride_byte_offset: u32,
    base_offset: u32,
    layout: Layout,
) -> u64 {
    use crate::wgmma::enc14;
    enc14(start)
        | (enc14(leading_byte_offset) << 16)
        | (enc14(stride_byte_offset) << 32)
        | (1u64 << 46)
        | (((base_offset & 7) as u64) << 49)
        | ((layout as u64) << 61)
}

/// Whether `ncols` is a valid TMEM allocation size (a power of two from 32 to 512).
pub const fn valid_alloc_columns(ncols: u32) -> bool {
    ncols >= 32 && ncols <= 512 && ncols.is_power_of_two()
}

/// The TMEM address of `lane`, column `col` relative to an allocation at `base`: lanes in bits
/// 16-31, columns in bits 0-15 (PTX ISA, "Tensor Memory addressing").
pub const fn tmem_addr(base: u32, lane: u32, col: u32) -> u32 {
    base + (lane << 16) + col
}

/// The first TMEM lane warp `warp` of a block may access with `tcgen05.ld`: warp `w` reaches lanes
/// `32 (w % 4) .. 32 (w % 4) + 32` (one quarter of the 128 lanes per warp of a warpgroup).
pub const fn warp_lane_base(warp: u32) -> u32 {
    32 * (warp % 4)
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_100a"))]
mod device {
    use crate::shared::SharedAddr;
    use core::arch::asm;

    /// Allocates `ncols` TMEM columns; the base address is written to shared `dst`. Warp-wide.
    ///
    /// PTX: `tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [dst], ncols;`
    ///
    /// # Safety
    /// One whole warp calls it; `ncols` satisfies [`super::valid_alloc_columns`]; the same warp frees
    /// the columns with [`dealloc`] before the block exits.
    #[inline(always)]
    pub unsafe fn alloc(dst: SharedAddr, ncols: u32) {
        unsafe {
            asm!("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [{d}], {n};", d = in(reg32) dst, n = in(reg32) ncols, options(nostack))
        };
    }

    /// Frees `ncols` columns at TMEM address `taddr`. Warp-wide.
    ///
    /// PTX: `tcgen05.dealloc.cta_group::1.sync.aligned.b32 taddr, ncols;`
    ///
    /// # Safety
    /// `taddr`/`ncols` must be exactly an allocation this warp made; nothing may use it afterwards.
    #[inline(always)]
    pub unsafe fn dealloc(taddr: u32, ncols: u32) {
        unsafe {
            asm!("tcgen05.dealloc.cta_group::1.sync.aligned.b32 {t}, {n};", t = in(reg32) taddr, n = in(reg32) ncols, options(nostack))
        };
    }

    /// Gives up the right to allocate, so other blocks on the SM may.
    ///
    /// PTX: `tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;`
    #[inline(always)]
    pub fn relinquish_alloc_permit() {
        // SAFETY: bookkeeping only.
        unsafe { asm!("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;", options(nostack)) };
    }

    /// `D (+)= A B` on the tensor cores into tensor memory at `d_tmem`, A and B read from shared
    /// memory through descriptors ([`super::smem_desc`]), shape and types from `idesc`
    /// ([`super::instr_desc_f16`]). One thread issues it.
    ///
    /// PTX: `tcgen05.mma.cta_group::1.kind::f16 [d_tmem], a_desc, b_desc, idesc, p;`
    ///
    /// # Safety
    /// `d_tmem` is an allocation of this CTA large enough for the tile; the descriptors describe
    /// shared memory published to the async proxy; completion is observed through [`commit`].
    #[inline(always)]
    pub unsafe fn mma_f16(d_tmem: u32, a_desc: u64, b_desc: u64, idesc: u32, accumulate: bool) {
        unsafe {
            asm!(
                "{{ .reg .pred p; setp.ne.b32 p, {acc}, 0;",
                "tcgen05.mma.cta_group::1.kind::f16 [{d}], {a}, {b}, {i}, p; }}",
                d = in(reg32) d_tmem, a = in(reg64) a_desc, b = in(reg64) b_desc, i = in(reg32) idesc,
                acc = in(reg32) accumulate as u32, options(nostack)
            )
        };
    }

    /// Makes the mbarrier at `bar` track completion of this thread's prior tcgen05 operations
    /// (one arrival when they complete).
    ///
    /// PTX: `tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [bar];`
    ///
    /// # Safety
    /// `bar` is an initialized mbarrier expecting this arrival.
    #[inline(always)]
    pub unsafe fn commit(bar: SharedAddr) {
        unsafe {
            asm!("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [{b}];", b = in(reg32) bar, options(nostack))
        };
    }

    /// Loads 32 consecutive 32-bit columns of one TMEM lane per thread and waits for them: lane `l`
    /// of the warp reads lane `lane0 + l` (the address's lane field is the warp's first lane,
    /// [`super::warp_lane_base`]), columns `col .. col + 32`, into `v[0..32]`. Warp-wide. The load
    /// and its wait are one asm block, so no use of `v` can be scheduled before the wait.
    ///
    /// PTX: `tcgen05.ld.sync.aligned.32x32b.x32.b32 {v0, ..., v31}, [taddr]; tcgen05.wait::ld.sync.aligned;`
    ///
    /// # Safety
    /// The whole warp calls it, converged, with the same `taddr`, inside this CTA's allocation and
    /// in the warp's own lane quarter; the accumulator's producing `tcgen05.mma` has completed
    /// (observed through its commit barrier, then [`fence_after_thread_sync`]).
    #[inline(always)]
    pub unsafe fn ld_32x32b_x32(taddr: u32) -> [u32; 32] {
        let mut v = [0u32; 32];
        macro_rules! ld {
            ($($i:literal),+) => {
                asm!(
                    concat!(
                        "tcgen05.ld.sync.aligned.32x32b.x32.b32 {{{0}", $(", {", stringify!($i), "}",)+ "}}, [{t}];\n",
                        "tcgen05.wait::ld.sync.aligned;"
                    ),
                    out(reg32) v[0],
                    $(out(reg32) v[$i],)+
                    t = in(reg32) taddr,
                    options(nostack)
                )
            };
        }
        unsafe {
            ld!(
                1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28,
                29, 30, 31
            )
        };
        v
    }

    /// Orders prior tcgen05 operations before a following thread barrier.
    ///
    /// PTX: `tcgen05.fence::before_thread_sync;`
    #[inline(always)]
    pub fn fence_before_thread_sync() {
        // SAFETY: ordering only.
        unsafe { asm!("tcgen05.fence::before_thread_sync;", options(nostack)) };
    }

    /// Orders following tcgen05 operations after a preceding thread barrier.
    ///
    /// PTX: `tcgen05.fence::after_thread_sync;`
    #[inline(always)]
    pub fn fence_after_thread_sync() {
        // SAFETY: ordering only.
        unsafe { asm!("tcgen05.fence::after_thread_sync;", options(nostack)) };
    }
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_100a"))]
pub use device::*;

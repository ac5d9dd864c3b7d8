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

/// Where element `i` of a thread's `m64nN` f32 accumulator (`N / 2` elements) lives in the 64 x N
/// tile, for thread `t` (0..128) of the warpgroup: warp `t / 32` owns rows 16w..16w+16, and within
/// it the `mma.m16n8` C layout repeats across the N / 8 column blocks of 8. The same for every N.
pub const fn acc_m64(t: u32, i: u32) -> (u32, u32) {
    let (w, lane) = (t / 32, t % 32);
    let (g, q) = (lane / 4, lane % 4);
    let (block, e) = (i / 4, i % 4);
    (w * 16 + g + 8 * (e / 2), block * 8 + 2 * q + (e % 2))
}

/// [`acc_m64`] for the `m64n128` tile (64 elements per thread).
pub const fn acc_m64n128(t: u32, i: u32) -> (u32, u32) {
    acc_m64(t, i)
}

/// Whether a block of one producer warpgroup and `consumers` consumer warpgroups, allocated
/// `entry` registers per thread at launch, can run its producer on `producer` and its consumers on
/// `consumer` (`setmaxnreg`): `setmaxnreg.inc` blocks until the block's own pool holds the
/// registers it asks for, and the pool holds only what the producer's `setmaxnreg.dec` released.
pub const fn setmaxnreg_split_fits(entry: u32, producer: u32, consumer: u32, consumers: u32) -> bool {
    producer <= entry && (consumer <= entry || consumers * (consumer - entry) <= entry - producer)
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

    /// One `wgmma.mma_async ... .f32.bf16.bf16` with the accumulator registers `$d[0..]` listed by
    /// index, descriptors `$a` / `$b`, and the scale-d predicate from `$acc` (0: overwrite D).
    macro_rules! wgmma_f32_bf16 {
        ($shape:literal, $d:ident, $a:ident, $b:ident, $acc:ident; $($i:literal),+) => {
            asm!(
                concat!(
                    "{{ .reg .pred p; setp.ne.b32 p, {acc}, 0;\n",
                    "wgmma.mma_async.sync.aligned.", $shape, ".f32.bf16.bf16 {{{0}",
                    $(", {", stringify!($i), "}",)+
                    "}}, {a}, {b}, p, 1, 1, 0, 0; }}"
                ),
                inout(reg32) $d[0],
                $(inout(reg32) $d[$i],)+
                a = in(reg64) $a,
                b = in(reg64) $b,
                acc = in(reg32) $acc as u32,
                options(nostack)
            )
        };
    }

    /// [`wgmma_f32_bf16`] with the transpose flags `$ta`, `$tb` (0: K-major, 1: MN-major) as
    /// `const` operands.
    macro_rules! wgmma_f32_bf16_t {
        ($shape:literal, $d:ident, $a:ident, $b:ident, $acc:ident, $ta:expr, $tb:expr; $($i:literal),+) => {
            asm!(
                concat!(
                    "{{ .reg .pred p; setp.ne.b32 p, {acc}, 0;\n",
                    "wgmma.mma_async.sync.aligned.", $shape, ".f32.bf16.bf16 {{{0}",
                    $(", {", stringify!($i), "}",)+
                    "}}, {a}, {b}, p, 1, 1, {ta}, {tb}; }}"
                ),
                inout(reg32) $d[0],
                $(inout(reg32) $d[$i],)+
                a = in(reg64) $a,
                b = in(reg64) $b,
                acc = in(reg32) $acc as u32,
                ta = const $ta,
                tb = const $tb,
                options(nostack)
            )
        };
    }

    /// One warpgroup-wide `D (+)= A B` on a 64 x 128 x 16 tile, bf16 inputs from shared memory
    /// through descriptors (both K-major), f32 accumulators in registers (64 per thread, laid out as
    /// [`super::acc_m64`] says). `accumulate = false` overwrites D.
    ///
    /// PTX: `wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {d0..d63}, a_desc, b_desc, p, 1, 1, 0, 0;`
    ///
    /// # Safety
    /// The whole warpgroup calls it, converged, after [`fence`]; the descriptors describe tiles
    /// the async proxy may read; results are valid only after [`commit_group`] and [`wait_group`].
    #[inline(always)]
    pub unsafe fn mma_m64n128k16_bf16(d: &mut [f32; 64], a_desc: u64, b_desc: u64, accumulate: bool) {
        unsafe {
            wgmma_f32_bf16!("m64n128k16", d, a_desc, b_desc, accumulate; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63)
        };
    }

    /// The 64 x 256 x 16 form of [`mma_m64n128k16_bf16`]: 128 f32 accumulators per thread (the
    /// widest wgmma tile; B is 256 rows of N, K-major).
    ///
    /// PTX: `wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {d0..d127}, a_desc, b_desc, p, 1, 1, 0, 0;`
    ///
    /// # Safety
    /// As [`mma_m64n128k16_bf16`].
    #[inline(always)]
    pub unsafe fn mma_m64n256k16_bf16(d: &mut [f32; 128], a_desc: u64, b_desc: u64, accumulate: bool) {
        unsafe {
            wgmma_f32_bf16!("m64n256k16", d, a_desc, b_desc, accumulate; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127)
        };
    }

    /// [`mma_m64n256k16_bf16`] with each operand read K-major (`TA` / `TB` = 0) or transposed,
    /// MN-major (1): an MN-major operand's descriptor describes 64-element chunks of M (or N), each
    /// a column of 128-byte rows of K, the chunks the leading byte offset apart (the wgmma GEMM's
    /// `mn_descriptor`). bf16 is one of the two input types whose wgmma takes the transpose flags.
    ///
    /// PTX: `wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {d0..d127}, a_desc, b_desc, p, 1, 1, TA, TB;`
    ///
    /// # Safety
    /// As [`mma_m64n128k16_bf16`].
    #[inline(always)]
    pub unsafe fn mma_m64n256k16_bf16_t<const TA: u32, const TB: u32>(
        d: &mut [f32; 128],
        a_desc: u64,
        b_desc: u64,
        accumulate: bool,
    ) {
        const { assert!(TA <= 1 && TB <= 1) };
        unsafe {
            wgmma_f32_bf16_t!("m64n256k16", d, a_desc, b_desc, accumulate, TA, TB; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127)
        };
    }

    /// The accumulator operands `{0}`..`{31}` of an m64n64 f32 `wgmma`, as the brace list the
    /// instruction takes.
    macro_rules! acc_m64n64 {
        () => {
            "{{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}, {16}, {17}, {18}, {19}, {20}, {21}, {22}, {23}, {24}, {25}, {26}, {27}, {28}, {29}, {30}, {31}}}"
        };
    }

    /// One `wgmma.mma_async.m64n64k8.f32.tf32.tf32` line: accumulators [`acc_m64n64`], the
    /// descriptor operands named by `$a` and `$b`, scale-d from predicate `p`.
    macro_rules! wgmma_m64n64k8_tf32_line {
        ($a:expr, $b:expr) => {
            concat!(
                "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 ",
                acc_m64n64!(),
                ", {",
                $a,
                "}, {",
                $b,
                "}, p, 1, 1;\n"
            )
        };
    }

    /// One `wgmma.mma_async.m64n64k16.f32.bf16.bf16` line, both operands K-major (no transpose):
    /// accumulators [`acc_m64n64`], the descriptor operands named by `$a` and `$b`, scale-d from
    /// predicate `p`.
    macro_rules! wgmma_m64n64k16_bf16_line {
        ($a:expr, $b:expr) => {
            concat!(
                "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 ",
                acc_m64n64!(),
                ", {",
                $a,
                "}, {",
                $b,
                "}, p, 1, 1, 0, 0;\n"
            )
        };
    }

    /// `wgmma.fence`, one m64n64 product per `(a, b)` descriptor pair (each a `$line`, in order,
    /// all accumulating into `$d`) and the commit of their group: one `asm` block naming every
    /// accumulator, as [`wait_group_m64n64`] does. Nothing in Rust's `asm!` guarantees that the
    /// compiler leaves the registers alone between the two blocks; ptxas checks that in-flight
    /// accumulators are not touched before the wait (it serializes the products, with a
    /// warning, where they are), and reports nothing for the kernels that use these.
    macro_rules! wgmma_m64n64_chain {
        ($line:ident, $d:ident; $($a:ident = $av:expr, $b:ident = $bv:expr);+) => {
            asm!(
                concat!(
                    "{{ .reg .pred p; setp.eq.u32 p, 1, 1;\n",
                    "wgmma.fence.sync.aligned;\n",
                    $($line!(stringify!($a), stringify!($b)),)+
                    "wgmma.commit_group.sync.aligned; }}"
                ),
                inout(reg32) $d[0], inout(reg32) $d[1], inout(reg32) $d[2], inout(reg32) $d[3],
                inout(reg32) $d[4], inout(reg32) $d[5], inout(reg32) $d[6], inout(reg32) $d[7],
                inout(reg32) $d[8], inout(reg32) $d[9], inout(reg32) $d[10], inout(reg32) $d[11],
                inout(reg32) $d[12], inout(reg32) $d[13], inout(reg32) $d[14], inout(reg32) $d[15],
                inout(reg32) $d[16], inout(reg32) $d[17], inout(reg32) $d[18], inout(reg32) $d[19],
                inout(reg32) $d[20], inout(reg32) $d[21], inout(reg32) $d[22], inout(reg32) $d[23],
                inout(reg32) $d[24], inout(reg32) $d[25], inout(reg32) $d[26], inout(reg32) $d[27],
                inout(reg32) $d[28], inout(reg32) $d[29], inout(reg32) $d[30], inout(reg32) $d[31],
                $($a = in(reg64) $av, $b = in(reg64) $bv,)+
                options(nostack)
            )
        };
    }

    /// Four warpgroup-wide `D += A B` k steps on a 64 x 64 tile (k = 4 x 8: one 32-deep page),
    /// tf32 inputs from shared memory through descriptors (both K-major: tf32 has no transposed
    /// form), f32 accumulators in registers (32 per thread, laid out as [`super::acc_m64`] says),
    /// committed as one group and left in flight: [`wait_group_m64n64`] waits for them. The
    /// hardware reads the top 19 bits of each f32 operand, so the operands should already be tf32
    /// values.
    ///
    /// PTX: `wgmma.fence.sync.aligned;`, four times
    /// `wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 {d0..d31}, a_desc[k], b_desc[k], p, 1, 1;`
    /// (`p` true: accumulate), `wgmma.commit_group.sync.aligned;`
    ///
    /// # Safety
    /// The whole warpgroup calls it, converged; the descriptors describe tiles the async proxy
    /// may read (their writes complete, as an mbarrier wait on TMA bytes ensures) and that stay
    /// unchanged until the group is waited for; `d` is neither read nor written by other code
    /// until [`wait_group_m64n64`] has waited for this group.
    #[inline(always)]
    pub unsafe fn mma_m64n64k8x4_tf32(d: &mut [f32; 32], a: [u64; 4], b: [u64; 4]) {
        unsafe {
            wgmma_m64n64_chain!(wgmma_m64n64k8_tf32_line, d; a0 = a[0], b0 = b[0]; a1 = a[1], b1 = b[1]; a2 = a[2], b2 = b[2]; a3 = a[3], b3 = b[3])
        };
    }

    /// [`mma_m64n64k8x4_tf32`] for bf16 inputs: four warpgroup-wide `D += A B` k steps on a
    /// 64 x 64 tile (k = 4 x 16: one 64-deep page of bf16, 128 bytes a row as the tf32 page),
    /// both operands K-major, f32 accumulators (32 per thread, [`super::acc_m64`]), committed as
    /// one group and left in flight.
    ///
    /// PTX: `wgmma.fence.sync.aligned;`, four times
    /// `wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {d0..d31}, a_desc[k], b_desc[k], p, 1, 1, 0, 0;`
    /// (`p` true: accumulate), `wgmma.commit_group.sync.aligned;`
    ///
    /// # Safety
    /// As [`mma_m64n64k8x4_tf32`].
    #[inline(always)]
    pub unsafe fn mma_m64n64k16x4_bf16(d: &mut [f32; 32], a: [u64; 4], b: [u64; 4]) {
        unsafe {
            wgmma_m64n64_chain!(wgmma_m64n64k16_bf16_line, d; a0 = a[0], b0 = b[0]; a1 = a[1], b1 = b[1]; a2 = a[2], b2 = b[2]; a3 = a[3], b3 = b[3])
        };
    }

    /// [`wait_group`] for the products of [`mma_m64n64k8x4_tf32`] / [`mma_m64n64k16x4_bf16`]:
    /// waits until at most `N` of this warpgroup's groups are in flight, naming the 32
    /// accumulators as operands it writes, so that no read of them is scheduled before it (what
    /// CUTLASS's `warpgroup_fence_operand` is for; see [`wgmma_m64n64_chain`] for what keeps
    /// them in place).
    /// With `N = 1` a page's products overlap the wait for the next page and the issue of its
    /// products.
    ///
    /// PTX: `wgmma.wait_group.sync.aligned N;`
    ///
    /// # Safety
    /// The whole warpgroup calls it, converged.
    #[inline(always)]
    pub unsafe fn wait_group_m64n64<const N: u32>(d: &mut [f32; 32]) {
        unsafe {
            asm!(
                // the accumulators are named in a comment: operands the instruction does not take
                concat!("wgmma.wait_group.sync.aligned {n}; // ", acc_m64n64!()),
                inout(reg32) d[0], inout(reg32) d[1], inout(reg32) d[2], inout(reg32) d[3],
                inout(reg32) d[4], inout(reg32) d[5], inout(reg32) d[6], inout(reg32) d[7],
                inout(reg32) d[8], inout(reg32) d[9], inout(reg32) d[10], inout(reg32) d[11],
                inout(reg32) d[12], inout(reg32) d[13], inout(reg32) d[14], inout(reg32) d[15],
                inout(reg32) d[16], inout(reg32) d[17], inout(reg32) d[18], inout(reg32) d[19],
                inout(reg32) d[20], inout(reg32) d[21], inout(reg32) d[22], inout(reg32) d[23],
                inout(reg32) d[24], inout(reg32) d[25], inout(reg32) d[26], inout(reg32) d[27],
                inout(reg32) d[28], inout(reg32) d[29], inout(reg32) d[30], inout(reg32) d[31],
                n = const N,
                options(nostack)
            )
        };
    }

    /// The accumulator operands `{0}`..`{63}` of an m64n128 f32 `wgmma`, as the brace list the
    /// instruction takes.
    macro_rules! acc_m64n128 {
        () => {
            "{{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}, {16}, {17}, {18}, {19}, {20}, {21}, {22}, {23}, {24}, {25}, {26}, {27}, {28}, {29}, {30}, {31}, {32}, {33}, {34}, {35}, {36}, {37}, {38}, {39}, {40}, {41}, {42}, {43}, {44}, {45}, {46}, {47}, {48}, {49}, {50}, {51}, {52}, {53}, {54}, {55}, {56}, {57}, {58}, {59}, {60}, {61}, {62}, {63}}}"
        };
    }

    /// One `wgmma.mma_async.m64n128k16.f32.bf16.bf16` line: accumulators [`acc_m64n128`], the
    /// descriptor operands named by `$a` and `$b`, scale-d from predicate `p`, and the transpose
    /// flags from the `const` operands `ta` and `tb` (0: K-major, 1: MN-major).
    macro_rules! wgmma_m64n128k16_bf16_line {
        ($a:expr, $b:expr) => {
            concat!(
                "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 ",
                acc_m64n128!(),
                ", {",
                $a,
                "}, {",
                $b,
                "}, p, 1, 1, {ta}, {tb};\n"
            )
        };
    }

    /// [`wgmma_m64n64_chain`] for the 64 accumulators of m64n128 products, with the transpose
    /// flags `$ta`, `$tb` as the `const` operands `ta`, `tb`.
    macro_rules! wgmma_m64n128_chain {
        ($line:ident, $d:ident, $ta:expr, $tb:expr; $($a:ident = $av:expr, $b:ident = $bv:expr);+) => {
            asm!(
                concat!(
                    "{{ .reg .pred p; setp.eq.u32 p, 1, 1;\n",
                    "wgmma.fence.sync.aligned;\n",
                    $($line!(stringify!($a), stringify!($b)),)+
                    "wgmma.commit_group.sync.aligned; }}"
                ),
                inout(reg32) $d[0], inout(reg32) $d[1], inout(reg32) $d[2], inout(reg32) $d[3],
                inout(reg32) $d[4], inout(reg32) $d[5], inout(reg32) $d[6], inout(reg32) $d[7],
                inout(reg32) $d[8], inout(reg32) $d[9], inout(reg32) $d[10], inout(reg32) $d[11],
                inout(reg32) $d[12], inout(reg32) $d[13], inout(reg32) $d[14], inout(reg32) $d[15],
                inout(reg32) $d[16], inout(reg32) $d[17], inout(reg32) $d[18], inout(reg32) $d[19],
                inout(reg32) $d[20], inout(reg32) $d[21], inout(reg32) $d[22], inout(reg32) $d[23],
                inout(reg32) $d[24], inout(reg32) $d[25], inout(reg32) $d[26], inout(reg32) $d[27],
                inout(reg32) $d[28], inout(reg32) $d[29], inout(reg32) $d[30], inout(reg32) $d[31],
                inout(reg32) $d[32], inout(reg32) $d[33], inout(reg32) $d[34], inout(reg32) $d[35],
                inout(reg32) $d[36], inout(reg32) $d[37], inout(reg32) $d[38], inout(reg32) $d[39],
                inout(reg32) $d[40], inout(reg32) $d[41], inout(reg32) $d[42], inout(reg32) $d[43],
                inout(reg32) $d[44], inout(reg32) $d[45], inout(reg32) $d[46], inout(reg32) $d[47],
                inout(reg32) $d[48], inout(reg32) $d[49], inout(reg32) $d[50], inout(reg32) $d[51],
                inout(reg32) $d[52], inout(reg32) $d[53], inout(reg32) $d[54], inout(reg32) $d[55],
                inout(reg32) $d[56], inout(reg32) $d[57], inout(reg32) $d[58], inout(reg32) $d[59],
                inout(reg32) $d[60], inout(reg32) $d[61], inout(reg32) $d[62], inout(reg32) $d[63],
                $($a = in(reg64) $av, $b = in(reg64) $bv,)+
                ta = const $ta,
                tb = const $tb,
                options(nostack)
            )
        };
    }

    /// [`mma_m64n64k16x4_bf16`] on a 64 x 128 tile: four warpgroup-wide `D += A B` k steps (k =
    /// 4 x 16: one 64-deep page of bf16), A 64 rows (M) and B 128 rows (N), f32 accumulators (64
    /// per thread, [`super::acc_m64`]), committed as one group and left in flight:
    /// [`wait_group_m64n128`] waits for them. `TA` / `TB` (0 or 1) say whether A / B is read
    /// transposed, MN-major (each descriptor then describes that layout, see
    /// [`super::smem_descriptor`]), rather than K-major.
    ///
    /// PTX: `wgmma.fence.sync.aligned;`, four times
    /// `wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {d0..d63}, a_desc[k], b_desc[k], p, 1, 1, TA, TB;`
    /// (`p` true: accumulate), `wgmma.commit_group.sync.aligned;`
    ///
    /// # Safety
    /// As [`mma_m64n64k8x4_tf32`], with `d` waited for by [`wait_group_m64n128`].
    #[inline(always)]
    pub unsafe fn mma_m64n128k16x4_bf16<const TA: u32, const TB: u32>(d: &mut [f32; 64], a: [u64; 4], b: [u64; 4]) {
        const { assert!(TA <= 1 && TB <= 1) };
        unsafe {
            wgmma_m64n128_chain!(wgmma_m64n128k16_bf16_line, d, TA, TB; a0 = a[0], b0 = b[0]; a1 = a[1], b1 = b[1]; a2 = a[2], b2 = b[2]; a3 = a[3], b3 = b[3])
        };
    }

    /// [`wait_group_m64n64`] for the products of [`mma_m64n128k16x4_bf16`]: waits until at most
    /// `N` of this warpgroup's groups are in flight, naming the 64 accumulators as operands it
    /// writes.
    ///
    /// PTX: `wgmma.wait_group.sync.aligned N;`
    ///
    /// # Safety
    /// The whole warpgroup calls it, converged.
    #[inline(always)]
    pub unsafe fn wait_group_m64n128<const N: u32>(d: &mut [f32; 64]) {
        unsafe {
            asm!(
                // the accumulators are named in a comment: operands the instruction does not take
                concat!("wgmma.wait_group.sync.aligned {n}; // ", acc_m64n128!()),
                inout(reg32) d[0], inout(reg32) d[1], inout(reg32) d[2], inout(reg32) d[3],
                inout(reg32) d[4], inout(reg32) d[5], inout(reg32) d[6], inout(reg32) d[7],
                inout(reg32) d[8], inout(reg32) d[9], inout(reg32) d[10], inout(reg32) d[11],
                inout(reg32) d[12], inout(reg32) d[13], inout(reg32) d[14], inout(reg32) d[15],
                inout(reg32) d[16], inout(reg32) d[17], inout(reg32) d[18], inout(reg32) d[19],
                inout(reg32) d[20], inout(reg32) d[21], inout(reg32) d[22], inout(reg32) d[23],
                inout(reg32) d[24], inout(reg32) d[25], inout(reg32) d[26], inout(reg32) d[27],
                inout(reg32) d[28], inout(reg32) d[29], inout(reg32) d[30], inout(reg32) d[31],
                inout(reg32) d[32], inout(reg32) d[33], inout(reg32) d[34], inout(reg32) d[35],
                inout(reg32) d[36], inout(reg32) d[37], inout(reg32) d[38], inout(reg32) d[39],
                inout(reg32) d[40], inout(reg32) d[41], inout(reg32) d[42], inout(reg32) d[43],
                inout(reg32) d[44], inout(reg32) d[45], inout(reg32) d[46], inout(reg32) d[47],
                inout(reg32) d[48], inout(reg32) d[49], inout(reg32) d[50], inout(reg32) d[51],
                inout(reg32) d[52], inout(reg32) d[53], inout(reg32) d[54], inout(reg32) d[55],
                inout(reg32) d[56], inout(reg32) d[57], inout(reg32) d[58], inout(reg32) d[59],
                inout(reg32) d[60], inout(reg32) d[61], inout(reg32) d[62], inout(reg32) d[63],
                n = const N,
                options(nostack)
            )
        };
    }

    /// One `wgmma.mma_async` with both operands from shared memory, K-major (no transpose), element
    /// type `$ty` (`"bf16"` or `"f16"`): accumulators `$d[0..]` listed by index, scale-d from `$acc`.
    macro_rules! wgmma_ss_typed {
        ($ty:literal, $shape:literal, $d:ident, $a:ident, $b:ident, $acc:ident; $($i:literal),+) => {
            asm!(
                concat!(
                    "{{ .reg .pred p; setp.ne.b32 p, {acc}, 0;\n",
                    "wgmma.mma_async.sync.aligned.", $shape, ".f32.", $ty, ".", $ty, " {{{0}",
                    $(", {", stringify!($i), "}",)+
                    "}}, {a}, {b}, p, 1, 1, 0, 0; }}"
                ),
                inout(reg32) $d[0],
                $(inout(reg32) $d[$i],)+
                a = in(reg64) $a,
                b = in(reg64) $b,
                acc = in(reg32) $acc as u32,
                options(nostack)
            )
        };
    }

    /// One `wgmma.mma_async` with A from registers (`$a`, four 32-bit words of packed pairs, the
    /// `mma.m16n8k16` A fragment of the warp's 16 rows) and B from shared memory read MN-major
    /// (transpose bit set), element type `$ty`; always accumulates.
    macro_rules! wgmma_rs_typed_tb {
        ($ty:literal, $shape:literal, $d:ident, $a:ident, $b:ident; $($i:literal),+) => {
            asm!(
                concat!(
                    "{{ .reg .pred p; setp.eq.u32 p, 1, 1;\n",
                    "wgmma.mma_async.sync.aligned.", $shape, ".f32.", $ty, ".", $ty, " {{{0}",
                    $(", {", stringify!($i), "}",)+
                    "}}, {{{a0}, {a1}, {a2}, {a3}}}, {b}, p, 1, 1, 1; }}"
                ),
                inout(reg32) $d[0],
                $(inout(reg32) $d[$i],)+
                a0 = in(reg32) $a[0],
                a1 = in(reg32) $a[1],
                a2 = in(reg32) $a[2],
                a3 = in(reg32) $a[3],
                b = in(reg64) $b,
                options(nostack)
            )
        };
    }

    /// One warpgroup-wide `D (+)= A B` on a 64 x 64 x 16 tile, A and B from shared memory through
    /// descriptors, both K-major, bf16 (`F16 = false`) or f16 (`F16 = true`) inputs, f32
    /// accumulators (32 per thread, [`super::acc_m64`]). `accumulate = false` overwrites D.
    ///
    /// PTX: `wgmma.mma_async.sync.aligned.m64n64k16.f32.{bf16,f16}.{bf16,f16} {d0..d31}, a_desc, b_desc, p, 1, 1, 0, 0;`
    ///
    /// # Safety
    /// As [`mma_m64n128k16_bf16`]: the whole warpgroup, converged, after [`fence`]; results valid
    /// after [`commit_group`] and [`wait_group_m64n64`].
    #[inline(always)]
    pub unsafe fn mma_m64n64k16_ss<const F16: bool>(d: &mut [f32; 32], a_desc: u64, b_desc: u64, accumulate: bool) {
        if F16 {
            unsafe {
                wgmma_ss_typed!("f16", "m64n64k16", d, a_desc, b_desc, accumulate; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)
            };
        } else {
            unsafe {
                wgmma_ss_typed!("bf16", "m64n64k16", d, a_desc, b_desc, accumulate; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)
            };
        }
    }

    /// The 64 x 128 x 16 form of [`mma_m64n64k16_ss`] (64 accumulators per thread, B 128 rows of
    /// N, K-major).
    ///
    /// PTX: `wgmma.mma_async.sync.aligned.m64n128k16.f32.{bf16,f16}.{bf16,f16} {d0..d63}, a_desc, b_desc, p, 1, 1, 0, 0;`
    ///
    /// # Safety
    /// As [`mma_m64n64k16_ss`]; results valid after [`wait_group_m64n128`].
    #[inline(always)]
    pub unsafe fn mma_m64n128k16_ss<const F16: bool>(d: &mut [f32; 64], a_desc: u64, b_desc: u64, accumulate: bool) {
        if F16 {
            unsafe {
                wgmma_ss_typed!("f16", "m64n128k16", d, a_desc, b_desc, accumulate; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63)
            };
        } else {
            unsafe {
                wgmma_ss_typed!("bf16", "m64n128k16", d, a_desc, b_desc, accumulate; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63)
            };
        }
    }

    /// `D += A B` on a 64 x 64 x 16 tile with A from registers (`a`: the thread's four words of
    /// packed bf16 / f16 pairs, laid out as the `mma.m16n8k16` A fragment of its warp's 16 rows)
    /// and B from shared memory, MN-major (the transpose bit set: B stored k rows of n), f32
    /// accumulators (32 per thread).
    ///
    /// PTX: `wgmma.mma_async.sync.aligned.m64n64k16.f32.{bf16,f16}.{bf16,f16} {d0..d31}, {a0, a1, a2, a3}, b_desc, p, 1, 1, 1;`
    ///
    /// # Safety
    /// As [`mma_m64n64k16_ss`]; `a` must not be changed until the group is waited for.
    #[inline(always)]
    pub unsafe fn mma_m64n64k16_rs_tb<const F16: bool>(d: &mut [f32; 32], a: [u32; 4], b_desc: u64) {
        if F16 {
            unsafe {
                wgmma_rs_typed_tb!("f16", "m64n64k16", d, a, b_desc; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)
            };
        } else {
            unsafe {
                wgmma_rs_typed_tb!("bf16", "m64n64k16", d, a, b_desc; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31)
            };
        }
    }

    /// The 64 x 128 x 16 form of [`mma_m64n64k16_rs_tb`] (64 accumulators per thread).
    ///
    /// PTX: `wgmma.mma_async.sync.aligned.m64n128k16.f32.{bf16,f16}.{bf16,f16} {d0..d63}, {a0, a1, a2, a3}, b_desc, p, 1, 1, 1;`
    ///
    /// # Safety
    /// As [`mma_m64n64k16_rs_tb`]; results valid after [`wait_group_m64n128`].
    #[inline(always)]
    pub unsafe fn mma_m64n128k16_rs_tb<const F16: bool>(d: &mut [f32; 64], a: [u32; 4], b_desc: u64) {
        if F16 {
            unsafe {
                wgmma_rs_typed_tb!("f16", "m64n128k16", d, a, b_desc; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63)
            };
        } else {
            unsafe {
                wgmma_rs_typed_tb!("bf16", "m64n128k16", d, a, b_desc; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63)
            };
        }
    }

    /// Raises this warpgroup's per-thread register budget to `N` (24..=256, a multiple of 8),
    /// waiting until the registers are free: consumer warpgroups take what producers released.
    ///
    /// PTX: `setmaxnreg.inc.sync.aligned.u32 N;`
    ///
    /// # Safety
    /// The whole warpgroup calls it, converged; the block's total budget must allow it (the
    /// kernel's launch bound sets the starting budget).
    #[inline(always)]
    pub unsafe fn setmaxnreg_inc<const N: u32>() {
        unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N, options(nostack)) };
    }

    /// Lowers this warpgroup's per-thread register budget to `N` (24..=256, a multiple of 8),
    /// releasing registers for [`setmaxnreg_inc`] in other warpgroups.
    ///
    /// PTX: `setmaxnreg.dec.sync.aligned.u32 N;`
    ///
    /// # Safety
    /// The whole warpgroup calls it, converged, and needs no more than `N` registers afterwards.
    #[inline(always)]
    pub unsafe fn setmaxnreg_dec<const N: u32>() {
        unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N, options(nostack)) };
    }
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub use device::*;

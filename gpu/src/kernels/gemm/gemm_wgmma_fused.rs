//! Fused layers on the persistent Hopper GEMM (sm_90a): the persistent kernel's schedule (2-CTA
//! clusters sharing B by multicast, a TMA ring running on across tiles, `wgmma m64n256k16`) with
//! a wider epilogue and operands read in either layout.
//!
//! - Epilogue ([`FusedEpilogue`]), per output `(row, col)` in this order:
//!   `c = act(acc + bias[col]) + residual[row][col] + table[row % period][col]`, in f32 from the
//!   f32 accumulator, then rounded once to C's format (f32, bf16 or f16, nearest-even). The bias
//!   and activation come first so that a transformer block's `x + act(x W^T + b)` is one product
//!   with `x` as the residual, and the table comes last so that `tok + pos` (a `[period, n]`
//!   position table added to every `period`-row sequence) rides the product that makes `tok`.
//!   The residual and the table have C's format.
//! - Layouts ([`layout`]): each operand is read K-major (the reduction index contiguous: A stored
//!   m x k, B stored n x k) or MN-major (A stored k x m, B stored k x n), the transpose flags of
//!   bf16 `wgmma`. An MN-major operand's tile arrives as boxes of 64 k rows by 64 columns of M (or
//!   N), 128 bytes a row, 128-byte swizzled, one box after another ([`mn_descriptor`]); its tensor
//!   map is over the k x m (k x n) matrix with a 64 x 64 box. So the backward products of
//!   `y = x W^T` need no transposed copies: `dX = dY W` is [`layout::AB`] (A = dY K-major,
//!   B = W read MN-major) and `dW = dY^T X` is [`layout::ATB`] (both MN-major).
//! - Stores: through shared-memory staging boxes and TMA stores where C's rows are a multiple of
//!   16 bytes (the persistent kernel's staged epilogue, for f32, bf16 and f16 C); otherwise from
//!   registers, two adjacent columns per store where n is even and the buffers are aligned for
//!   it, masked at the edges.
//!
//! The reduction over k of every output is the persistent kernel's: the same sequence of k16
//! steps, so with layout [`layout::ABT`] the accumulators have that kernel's bits.

use super::gemm::GemmShape;
use super::gemm_wgmma::{ACT_NONE, Epilogue, WG_BK, WG_TILE_BYTES, WP_B_SHARE, WP_CLUSTER};
use crate::tma::TensorMap;
use crate::{DevicePtr, DevicePtrMut, kernel};

/// Operand layouts of `gemm_wgmma_bf16_fused` (`C[m][n] = sum_k A(m, k) B(n, k)`).
pub mod layout {
    /// A stored m x k, B stored n x k: `C = A B^T` (a linear layer's forward, `y = x W^T`).
    pub const ABT: u32 = 0;
    /// A stored m x k, B stored k x n (read MN-major): `C = A B` (the input gradient `dX = dY W`).
    pub const AB: u32 = 1;
    /// A stored k x m, B stored k x n (both MN-major): `C = A^T B` (the weight gradient
    /// `dW = dY^T X`).
    pub const ATB: u32 = 2;

    /// Whether A is read MN-major in `layout`.
    pub const fn a_mn(layout: u32) -> bool {
        layout == ATB
    }
    /// Whether B is read MN-major in `layout`.
    pub const fn b_mn(layout: u32) -> bool {
        layout == AB || layout == ATB
    }
}

/// Element formats of C, the residual and the table (`convert::format` codes for the 16-bit ones,
/// which are 0 and 1).
pub mod format {
    /// f32.
    pub const F32: u32 = 2;
    /// bf16 (`convert::format::BF16`).
    pub const BF16: u32 = crate::kernels::convert::format::BF16;
    /// f16 (`convert::format::F16`).
    pub const F16: u32 = crate::kernels::convert::format::F16;
}

/// Columns of M or N in one box of an MN-major operand (128 bytes of bf16: the swizzle span).
pub const MN_BOX: u32 = 64;
/// Bytes of one MN-major box: [`WG_BK`] k rows of 128 bytes.
pub const MN_BOX_BYTES: u32 = WG_BK * 2 * MN_BOX;

/// The descriptor of k step `kk` (16 bf16) of an MN-major tile at shared address `tile`: boxes of
/// [`WG_BK`] k rows by [`MN_BOX`] columns, each row 128 bytes, 128-byte swizzled, one after another.
/// In the descriptor's MN-major terms: 64-column chunks of M or N are a box apart (the leading byte
/// offset), 8-row groups of k 1024 bytes apart (the stride byte offset), and a k step of 16 rows
/// starts 2048 bytes on. (The megakernel's `mn_page_descriptor`, verified on the GPU, for these
/// boxes.)
pub const fn mn_descriptor(tile: u32, kk: u32) -> u64 {
    crate::wgmma::smem_descriptor(tile + kk * 16 * 128, MN_BOX_BYTES, 8 * 128, 0, crate::swizzle::Swizzle::B128)
}

/// The bytes a stage of `gemm_wgmma_bf16_fused` receives in the CTA whose tile starts at (`m0`,
/// `n0`): each box of its A tile and of the cluster's B tile that starts inside the matrix (K-major:
/// one box of 128 rows per A tile and per B share; MN-major: one box per 64 rows). Boxes wholly
/// outside are not loaded (their outputs are never stored). Both CTAs of a cluster compute the same
/// B boxes.
pub const fn fused_stage_bytes(m0: u32, n0: u32, s: GemmShape, layout: u32) -> u32 {
    let mut bytes = 0;
    if layout::a_mn(layout) {
        let mut j = 0;
        while j < super::gemm_wgmma::WG_BM / MN_BOX {
            if m0 + j * MN_BOX < s.m {
                bytes += MN_BOX_BYTES;
            }
            j += 1;
        }
    } else if m0 < s.m {
        bytes += WG_TILE_BYTES;
    }
    let mut share = 0;
    while share < WP_CLUSTER {
        let row = n0 + share * WP_B_SHARE;
        if layout::b_mn(layout) {
            let mut j = 0;
            while j < WP_B_SHARE / MN_BOX {
                if row + j * MN_BOX < s.n {
                    bytes += MN_BOX_BYTES;
                }
                j += 1;
            }
        } else if row < s.n {
            bytes += super::gemm_wgmma::WP_B_SHARE_BYTES;
        }
        share += 1;
    }
    bytes
}

/// The epilogue of `gemm_wgmma_bf16_fused`: `c = act(acc + bias[col]) + residual[row][col] +
/// table[row % period][col]`, rounded once to `format`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FusedEpilogue {
    /// `n` f32 biases (read when `has_bias != 0`).
    pub bias: DevicePtr<f32>,
    /// The m x n residual in `format` (read when `has_residual != 0`), row-major, pitch n.
    pub residual: DevicePtr<u8>,
    /// The `period` x n table in `format` (read when `period != 0`), row-major, pitch n.
    pub table: DevicePtr<u8>,
    /// Nonzero: add `bias[col]`.
    pub has_bias: u32,
    /// [`ACT_NONE`], or a `tensor_ops::unary` code (`RELU`, `GELU`).
    pub act: u32,
    /// Nonzero: add the residual.
    pub has_residual: u32,
    /// Rows of the table (0: no table).
    pub period: u32,
    /// The [`format`] of C, the residual and the table.
    pub format: u32,
    /// Padding (keeps the struct's size a multiple of 8 on both sides).
    pub pad: u32,
}
const _: () = assert!(format::F32 != format::BF16 && format::F32 != format::F16 && format::BF16 != format::F16);
// SAFETY: repr(C): three pointers and six u32, the same on both sides.
unsafe impl crate::KernelParam for FusedEpilogue {}

impl FusedEpilogue {
    /// Nothing fused: `c = acc`, f32.
    pub const NONE: FusedEpilogue = FusedEpilogue {
        bias: DevicePtr::from_addr(0),
        residual: DevicePtr::from_addr(0),
        table: DevicePtr::from_addr(0),
        has_bias: 0,
        act: ACT_NONE,
        has_residual: 0,
        period: 0,
        format: format::F32,
        pad: 0,
    };

    /// Bytes per element of `format`.
    pub const fn elem_bytes(format: u32) -> u32 {
        if format == format::F32 { 4 } else { 2 }
    }
}

/// Loads and stores of C, the residual and the table in their [`format`], in f32.
#[cfg(target_arch = "nvptx64")]
mod elem {
    use super::format;
    use crate::convert;
    use crate::{DevicePtr, DevicePtrMut};

    /// Element `i` of the `format` buffer at `base`, widened to f32 (exact).
    #[inline(always)]
    pub(crate) fn load(format: u32, base: u64, i: usize) -> f32 {
        if format == format::F32 {
            unsafe { *(base as usize as *const f32).add(i) }
        } else {
            let h = unsafe { *(base as usize as *const u16).add(i) };
            if format == format::BF16 { convert::bf16_bits_to_f32(h) } else { convert::f16_bits_to_f32(h) }
        }
    }

    /// Elements `i, i + 1` of the `format` buffer at `base` in one load (`i` even, the buffer
    /// aligned to a pair), widened to f32.
    #[inline(always)]
    #[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
    pub(crate) fn load2(format: u32, base: u64, i: usize) -> [f32; 2] {
        if format == format::F32 {
            unsafe { DevicePtr::<f32>::from_addr(base).read2(i) }
        } else {
            let w = unsafe { *(base as usize as *const u32).add(i / 2) };
            let (lo, hi) = (w as u16, (w >> 16) as u16);
            if format == format::BF16 {
                [convert::bf16_bits_to_f32(lo), convert::bf16_bits_to_f32(hi)]
            } else {
                [convert::f16_bits_to_f32(lo), convert::f16_bits_to_f32(hi)]
            }
        }
    }

    /// Stores `v` (rounded once, nearest-even) as element `i` of the `format` buffer at `base`.
    #[inline(always)]
    #[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
    pub(crate) fn store(format: u32, base: u64, i: usize, v: f32) {
        if format == format::F32 {
            unsafe { *(base as usize as *mut f32).add(i) = v };
        } else {
            // the low half of the packed pair is `v` rounded
            let bits = if format == format::BF16 { convert::pack_bf16x2(v, 0.0) } else { convert::pack_f16x2(v, 0.0) };
            unsafe { *(base as usize as *mut u16).add(i) = bits as u16 };
        }
    }

    /// Stores `v` as elements `i, i + 1` of the `format` buffer at `base` in one store (`i` even,
    /// the buffer aligned to a pair).
    #[inline(always)]
    #[cfg_attr(not(target_feature = "sm_90a"), allow(dead_code))]
    pub(crate) fn store2(format: u32, base: u64, i: usize, v: [f32; 2]) {
        if format == format::F32 {
            unsafe { DevicePtrMut::<f32>::from_addr(base).write2(i, v) };
        } else {
            let w =
                if format == format::BF16 { convert::pack_bf16x2(v[0], v[1]) } else { convert::pack_f16x2(v[0], v[1]) };
            unsafe { *(base as usize as *mut u32).add(i / 2) = w };
        }
    }
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod dev {
    use super::*;
    use crate::kernels::gemm_wgmma::{
        Ring, WG_CONSUMERS, WG_STAGES, WP_B_SHARE_BYTES, WP_BM, WP_EMPTY_ARRIVALS, WW_BN, WW_CONSUMER_REGS,
        WW_PRODUCER_REGS, WW_STAGE_BYTES, empty_parity, persistent_tile, split_k_range, tile_descriptor,
    };
    use crate::{cluster, mbarrier, shared, thread, tma, wgmma};
    use elem::{load, load2, store, store2};

    impl FusedEpilogue {
        /// Whether the epilogue is at most a bias and ReLU: the case inlined at every accumulator
        /// pair. The rest (another activation, a residual, a table) runs out of line
        /// ([`epilogue_one`], [`epilogue_pair`]): the epilogue is unrolled over the 128
        /// accumulators of a thread, and inlining every case there made the kernel's code several
        /// times the instruction cache, so that each tile's epilogue ran on instruction fetches.
        #[inline(always)]
        fn is_inline(self) -> bool {
            use crate::kernels::tensor_ops::unary;
            self.has_residual == 0 && self.period == 0 && (self.act == ACT_NONE || self.act == unary::RELU)
        }

        /// The epilogue of output `(row, col)` of accumulator value `v`, in f32 (before rounding).
        #[inline(always)]
        fn apply(self, v: f32, row: u32, col: u32, n: u32) -> f32 {
            if self.is_inline() {
                let x = if self.has_bias != 0 { v + unsafe { self.bias.read(col as usize) } } else { v };
                if self.act == ACT_NONE { x } else { x.max(0.0) }
            } else {
                epilogue_one(&self, v, row, col, n)
            }
        }

        /// [`Self::apply`] on two adjacent columns `col, col + 1` (both in bounds), with pair loads
        /// of the bias, residual and table where `pairs` ([`Self::pairs`]; then `col` is even).
        #[inline(always)]
        fn apply2(self, v: [f32; 2], row: u32, col: u32, n: u32, pairs: bool) -> [f32; 2] {
            if self.is_inline() {
                let mut x = v;
                if self.has_bias != 0 {
                    let b = if pairs {
                        unsafe { self.bias.read2(col as usize) }
                    } else {
                        unsafe { [self.bias.read(col as usize), self.bias.read(col as usize + 1)] }
                    };
                    x = [x[0] + b[0], x[1] + b[1]];
                }
                if self.act == ACT_NONE { x } else { [x[0].max(0.0), x[1].max(0.0)] }
            } else {
                epilogue_pair(&self, v, row, col, n, pairs)
            }
        }

        /// Whether every buffer the epilogue touches takes pair accesses: an even n and bases
        /// aligned to two elements (8 bytes for f32, 4 for 16-bit formats; the bias: 8).
        #[inline(always)]
        fn pairs(self, c: u64, n: u32) -> bool {
            let pair = 2 * FusedEpilogue::elem_bytes(self.format) as u64;
            n % 2 == 0
                && c % pair == 0
                && (self.has_bias == 0 || self.bias.addr() % 8 == 0)
                && (self.has_residual == 0 || self.residual.addr() % pair == 0)
                && (self.period == 0 || self.table.addr() % pair == 0)
        }
    }

    /// The whole epilogue of output `(row, col)`, out of line ([`FusedEpilogue::is_inline`]).
    #[inline(never)]
    fn epilogue_one(e: &FusedEpilogue, v: f32, row: u32, col: u32, n: u32) -> f32 {
        let base = Epilogue { bias: e.bias, has_bias: e.has_bias, act: e.act };
        let mut x = if e.has_bias != 0 { v + unsafe { e.bias.read(col as usize) } } else { v };
        x = base.activate(x);
        if e.has_residual != 0 {
            x += load(e.format, e.residual.addr(), (row * n + col) as usize);
        }
        if e.period != 0 {
            x += load(e.format, e.table.addr(), ((row % e.period) * n + col) as usize);
        }
        x
    }

    /// The whole epilogue of outputs `(row, col)` and `(row, col + 1)`, out of line, with pair
    /// loads where `pairs` (as [`FusedEpilogue::apply2`]).
    #[inline(never)]
    fn epilogue_pair(e: &FusedEpilogue, v: [f32; 2], row: u32, col: u32, n: u32, pairs: bool) -> [f32; 2] {
        if !pairs {
            return [epilogue_one(e, v[0], row, col, n), epilogue_one(e, v[1], row, col + 1, n)];
        }
        let base = Epilogue { bias: e.bias, has_bias: e.has_bias, act: e.act };
        let mut x = v;
        if e.has_bias != 0 {
            let b = unsafe { e.bias.read2(col as usize) };
            x = [x[0] + b[0], x[1] + b[1]];
        }
        x = [base.activate(x[0]), base.activate(x[1])];
        if e.has_residual != 0 {
            let r = load2(e.format, e.residual.addr(), (row * n + col) as usize);
            x = [x[0] + r[0], x[1] + r[1]];
        }
        if e.period != 0 {
            let t = load2(e.format, e.table.addr(), ((row % e.period) * n + col) as usize);
            x = [x[0] + t[0], x[1] + t[1]];
        }
        x
    }

    /// Stores a consumer warpgroup's `m64n256` accumulators (thread `ct`) into the 64 x 256 block of
    /// C at (`row0`, `n0`) through the epilogue, masked at the edges.
    #[inline(always)]
    pub(super) fn store_m64n256(acc: &[f32; 128], ct: u32, row0: u32, n0: u32, c: u64, s: GemmShape, e: FusedEpilogue) {
        let pairs = e.pairs(c, s.n);
        #[inline(always)]
        fn one(i: u32, v: [f32; 2], ct: u32, row0: u32, n0: u32, c: u64, s: GemmShape, e: FusedEpilogue, pairs: bool) {
            let (r, col) = wgmma::acc_m64(ct, i);
            let (row, col) = (row0 + r, n0 + col);
            if row < s.m {
                let at = (row * s.n + col) as usize;
                if col + 1 < s.n {
                    let x = e.apply2(v, row, col, s.n, pairs);
                    if pairs {
                        store2(e.format, c, at, x);
                    } else {
                        store(e.format, c, at, x[0]);
                        store(e.format, c, at + 1, x[1]);
                    }
                } else if col < s.n {
                    store(e.format, c, at, e.apply(v[0], row, col, s.n));
                }
            }
        }
        // constant indices keep the accumulators in registers
        macro_rules! pairs {
            ($($i:literal),*) => { $( one($i, [acc[$i], acc[$i + 1]], ct, row0, n0, c, s, e, pairs); )* };
        }
        pairs!(
            0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54,
            56, 58, 60, 62, 64, 66, 68, 70, 72, 74, 76, 78, 80, 82, 84, 86, 88, 90, 92, 94, 96, 98, 100, 102, 104, 106,
            108, 110, 112, 114, 116, 118, 120, 122, 124, 126
        );
    }

    /// One consumer warpgroup's staged epilogue for one tile (thread `ct` of warpgroup `cons`,
    /// whose 64 x 256 block of C starts at (`row0`, `n0`); `staging` is its first staging box):
    /// the persistent kernel's `StagedStore` for any [`format`]. For each subtile of 128 bytes of
    /// columns (32 f32 or 64 bf16 / f16: 8 or 4 subtiles a tile), every thread writes its outputs
    /// after the epilogue to a 128-byte-swizzled box of 64 rows (8-byte pair stores for f32, 4-byte
    /// packed pairs for 16-bit C; either way the 8 rows a warp writes at once fall on 8 different
    /// 16-byte chunks), fences them to the async proxy, and after a warpgroup barrier one thread
    /// issues the box's TMA store (which clips rows and columns outside C). The two boxes
    /// alternate (an even count of subtiles per tile keeps the alternation across tiles); thread
    /// 0 waits until earlier stores have read their boxes before the barrier. The residual, table
    /// and bias are read only inside C.
    #[derive(Clone, Copy)]
    pub(super) struct Staged {
        pub(super) ct: u32,
        pub(super) cons: u32,
        pub(super) row0: u32,
        pub(super) n0: u32,
        pub(super) c_map: DevicePtr<TensorMap>,
        pub(super) s: GemmShape,
        pub(super) epi: FusedEpilogue,
        pub(super) staging: u32,
        /// Whether the epilogue's buffers take pair loads ([`FusedEpilogue::pairs`]).
        pub(super) pairs: bool,
    }

    impl Staged {
        /// Stores the warpgroup's `m64n256` accumulators through the staging boxes. A block wholly
        /// inside C whose epilogue is at most a bias and ReLU (with pair accesses) takes a lean
        /// path made for its C format, bias and activation ([`Self::store_with`] with `LEAN`: no
        /// bounds checks, no runtime choices per element); the rest the general one. The epilogue
        /// is unrolled over the accumulators, so its length per element is what each tile pays
        /// in instruction fetches.
        #[inline(always)]
        pub(super) fn store(self, acc: &[f32; 128]) {
            use crate::kernels::tensor_ops::unary::RELU;
            let e = self.epi;
            if self.row0 >= self.s.m || self.n0 >= self.s.n {
                // no output of this block is inside C: nothing to store
                return;
            }
            let lean = self.pairs && e.has_residual == 0 && e.period == 0 && (e.act == ACT_NONE || e.act == RELU);
            let inside = self.row0 + 64 <= self.s.m && self.n0 + WW_BN <= self.s.n;
            macro_rules! lean {
                ($fmt:expr, $check:literal) => {
                    match (e.has_bias != 0, e.act == RELU) {
                        (false, false) => self.store_with::<{ $fmt }, false, false, true, $check>(acc),
                        (true, false) => self.store_with::<{ $fmt }, true, false, true, $check>(acc),
                        (false, true) => self.store_with::<{ $fmt }, false, true, true, $check>(acc),
                        (true, true) => self.store_with::<{ $fmt }, true, true, true, $check>(acc),
                    }
                };
            }
            if lean {
                match (e.format, inside) {
                    (format::BF16, true) => lean!(format::BF16, false),
                    (format::BF16, false) => lean!(format::BF16, true),
                    (format::F16, true) => lean!(format::F16, false),
                    (format::F16, false) => lean!(format::F16, true),
                    (_, true) => lean!(format::F32, false),
                    (_, false) => lean!(format::F32, true),
                }
            } else if e.format == format::F32 {
                self.store_with::<{ format::F32 }, false, false, false, true>(acc)
            } else {
                // the general path packs by the runtime format
                self.store_with::<{ format::BF16 }, false, false, false, true>(acc)
            }
        }

        /// The accumulators through the staging boxes: subtile `j` holds accumulator elements
        /// `W j .. W j + W` (`W` = 16 for f32 C, 32 for 16-bit C: 128 bytes of columns either way),
        /// listed pair by pair with constant indices so that the accumulators stay in registers.
        /// `LEAN`: [`Self::put_lean`] with C in format `FMT`, the bias if `BIAS`, ReLU if `RELU`,
        /// bounds checked if `CHECK`; otherwise [`Self::put`] (only `FMT`'s width is used).
        #[inline(always)]
        fn store_with<const FMT: u32, const BIAS: bool, const RELU: bool, const LEAN: bool, const CHECK: bool>(
            self,
            acc: &[f32; 128],
        ) {
            macro_rules! sub {
                ($half:literal, $j:literal; $($i:literal),*) => {{
                    $(
                        if LEAN {
                            self.put_lean::<FMT, BIAS, RELU, CHECK>($j, $i, [acc[$i], acc[$i + 1]]);
                        } else {
                            self.put::<$half>($j, $i, [acc[$i], acc[$i + 1]]);
                        }
                    )*
                    self.flush::<$half>($j);
                }};
            }
            if FMT == format::F32 {
                sub!(false, 0; 0, 2, 4, 6, 8, 10, 12, 14);
                sub!(false, 1; 16, 18, 20, 22, 24, 26, 28, 30);
                sub!(false, 2; 32, 34, 36, 38, 40, 42, 44, 46);
                sub!(false, 3; 48, 50, 52, 54, 56, 58, 60, 62);
                sub!(false, 4; 64, 66, 68, 70, 72, 74, 76, 78);
                sub!(false, 5; 80, 82, 84, 86, 88, 90, 92, 94);
                sub!(false, 6; 96, 98, 100, 102, 104, 106, 108, 110);
                sub!(false, 7; 112, 114, 116, 118, 120, 122, 124, 126);
            } else {
                sub!(true, 0; 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
                sub!(true, 1; 32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62);
                sub!(true, 2; 64, 66, 68, 70, 72, 74, 76, 78, 80, 82, 84, 86, 88, 90, 92, 94);
                sub!(true, 3; 96, 98, 100, 102, 104, 106, 108, 110, 112, 114, 116, 118, 120, 122, 124, 126);
            }
        }

        /// [`Self::put`] with pair accesses and at most a bias and ReLU: the bias (pair load) and
        /// ReLU as `BIAS` and `RELU` say, C in format `FMT`, outputs outside C zero (and their
        /// bias unread) where `CHECK` (a block wholly inside C needs no check). The same
        /// operations in the same order as the general path, so the same bits.
        #[inline(always)]
        fn put_lean<const FMT: u32, const BIAS: bool, const RELU: bool, const CHECK: bool>(
            self,
            j: u32,
            i: u32,
            v: [f32; 2],
        ) {
            use crate::kernels::gemm_wgmma::{WG_SWIZZLE, WP_EPI_BOX_BYTES, WP_EPI_BUFFERS};
            use crate::swizzle::tile_offset;
            let (cols, elem) = if FMT == format::F32 { (32, 4) } else { (64, 2) };
            let buf = self.staging + (j % WP_EPI_BUFFERS) * WP_EPI_BOX_BYTES;
            let (r, col) = wgmma::acc_m64(self.ct, i);
            // n is a multiple of 4 (f32) or 8 (16-bit) here, so col + 1 < n when col < n
            let inside = !CHECK || (self.row0 + r < self.s.m && self.n0 + col < self.s.n);
            let mut x = v;
            if BIAS && inside {
                let b = unsafe { self.epi.bias.read2((self.n0 + col) as usize) };
                x = [x[0] + b[0], x[1] + b[1]];
            }
            if RELU {
                x = [x[0].max(0.0), x[1].max(0.0)];
            }
            if !inside {
                x = [0.0, 0.0];
            }
            let at = buf + tile_offset(WG_SWIZZLE, r, col - cols * j, 128, elem);
            unsafe {
                if FMT == format::F32 {
                    shared::st_shared_v2(at, [x[0].to_bits(), x[1].to_bits()]);
                } else if FMT == format::BF16 {
                    shared::st_shared_b32(at, crate::convert::pack_bf16x2(x[0], x[1]));
                } else {
                    shared::st_shared_b32(at, crate::convert::pack_f16x2(x[0], x[1]));
                }
            }
        }

        /// Accumulator elements `i, i + 1` (one row, two adjacent columns) of subtile `j` through
        /// the epilogue into the subtile's staging box.
        #[inline(always)]
        fn put<const HALF: bool>(self, j: u32, i: u32, v: [f32; 2]) {
            use crate::kernels::gemm_wgmma::{WG_SWIZZLE, WP_EPI_BOX_BYTES, WP_EPI_BUFFERS};
            use crate::swizzle::tile_offset;
            let (cols, elem) = if HALF { (64, 2) } else { (32, 4) };
            let (e, s) = (self.epi, self.s);
            let buf = self.staging + (j % WP_EPI_BUFFERS) * WP_EPI_BOX_BYTES;
            let (r, col) = wgmma::acc_m64(self.ct, i);
            let (row, gcol) = (self.row0 + r, self.n0 + col);
            // n is a multiple of 4 (f32) or 8 (16-bit) here, so col + 1 < n when col < n
            let x = if row >= s.m || gcol >= s.n { [0.0, 0.0] } else { e.apply2(v, row, gcol, s.n, self.pairs) };
            let at = buf + tile_offset(WG_SWIZZLE, r, col - cols * j, 128, elem);
            unsafe {
                if !HALF {
                    shared::st_shared_v2(at, [x[0].to_bits(), x[1].to_bits()]);
                } else if e.format == format::BF16 {
                    shared::st_shared_b32(at, crate::convert::pack_bf16x2(x[0], x[1]));
                } else {
                    shared::st_shared_b32(at, crate::convert::pack_f16x2(x[0], x[1]));
                }
            }
        }

        /// Subtile `j`'s box is written: fence, warpgroup barrier, one thread's TMA store.
        #[inline(always)]
        fn flush<const HALF: bool>(self, j: u32) {
            use crate::kernels::gemm_wgmma::{WP_EPI_BARRIER, WP_EPI_BOX_BYTES, WP_EPI_BUFFERS};
            use crate::{fence, sync};
            let cols = if HALF { 64 } else { 32 };
            let buf = self.staging + (j % WP_EPI_BUFFERS) * WP_EPI_BOX_BYTES;
            fence::proxy_async_shared_cta();
            if self.ct == 0 {
                // every earlier store has read its box, so the next subtile may refill the other one
                tma::wait_group_read::<0>();
            }
            unsafe { sync::named_barrier_sync(WP_EPI_BARRIER + self.cons, 128) };
            if self.ct == 0 {
                let col = self.n0 + cols * j;
                if self.row0 < self.s.m && col < self.s.n {
                    unsafe { tma::store_2d(self.c_map.as_ptr(), col as i32, self.row0 as i32, buf) };
                }
                tma::commit_group();
            }
        }
    }

    /// Consumer warpgroup `cons`'s products on the stage of k tile `t` in `layout` (as the
    /// persistent kernel's `mma_m64n256`, one wgmma group left in flight).
    #[inline(always)]
    pub(super) fn mma(ring: Ring, t: u32, cons: u32, acc: &mut [f32; 128], accumulate: bool, layout: u32) {
        let st = t % WG_STAGES;
        ring.wait_full(t);
        // the consumer's 64 rows of A: K-major, 8 row groups of 1024 bytes; MN-major, its own box
        // (8 KiB either way)
        let a_tile = ring.stage(st) + cons * 64 * 128;
        let b_tile = ring.stage(st) + WG_TILE_BYTES;
        wgmma::fence();
        let mut kk = 0;
        while kk < WG_BK / 16 {
            let acc_on = accumulate || kk > 0;
            // one asm site per layout, the branch uniform across the warpgroup
            unsafe {
                match layout {
                    layout::AB => wgmma::mma_m64n256k16_bf16_t::<0, 1>(
                        acc,
                        tile_descriptor(a_tile, kk),
                        mn_descriptor(b_tile, kk),
                        acc_on,
                    ),
                    layout::ATB => wgmma::mma_m64n256k16_bf16_t::<1, 1>(
                        acc,
                        mn_descriptor(a_tile, kk),
                        mn_descriptor(b_tile, kk),
                        acc_on,
                    ),
                    _ => wgmma::mma_m64n256k16_bf16_t::<0, 0>(
                        acc,
                        tile_descriptor(a_tile, kk),
                        tile_descriptor(b_tile, kk),
                        acc_on,
                    ),
                }
            };
            kk += 1;
        }
        wgmma::commit_group();
        wgmma::wait_group::<1>();
    }

    /// The producer thread's loads for k tile `kt` of the tile at (`m0`, `n0`) into the stage at
    /// `dst`, completing on `bar`, in `layout` (see [`fused_stage_bytes`]).
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn load_stage(
        a_map: DevicePtr<TensorMap>,
        b_map: DevicePtr<TensorMap>,
        dst: u32,
        bar: u32,
        (kt, m0, n0): (u32, u32, u32),
        s: GemmShape,
        layout: u32,
        multicast: bool,
        rank: u32,
    ) {
        let k0 = (kt * WG_BK) as i32;
        unsafe {
            if layout::a_mn(layout) {
                let mut j = 0;
                while j < crate::kernels::gemm_wgmma::WG_BM / MN_BOX {
                    let row = m0 + j * MN_BOX;
                    if row < s.m {
                        tma::load_2d(dst + j * MN_BOX_BYTES, a_map.as_ptr(), row as i32, k0, bar);
                    }
                    j += 1;
                }
            } else if m0 < s.m {
                tma::load_2d(dst, a_map.as_ptr(), k0, m0 as i32, bar);
            }
            let mut share = 0;
            while share < WP_CLUSTER {
                let (row, sdst) = (n0 + share * WP_B_SHARE, dst + WG_TILE_BYTES + share * WP_B_SHARE_BYTES);
                // this CTA loads every share unicast, or its own share for both CTAs
                if !multicast || share == rank {
                    if layout::b_mn(layout) {
                        let mut j = 0;
                        while j < WP_B_SHARE / MN_BOX {
                            let col = row + j * MN_BOX;
                            if col < s.n {
                                let at = sdst + j * MN_BOX_BYTES;
                                if multicast {
                                    tma::load_2d_multicast(at, b_map.as_ptr(), col as i32, k0, bar, 0b11);
                                } else {
                                    tma::load_2d(at, b_map.as_ptr(), col as i32, k0, bar);
                                }
                            }
                            j += 1;
                        }
                    } else if row < s.n {
                        if multicast {
                            tma::load_2d_multicast(sdst, b_map.as_ptr(), k0, row as i32, bar, 0b11);
                        } else {
                            tma::load_2d(sdst, b_map.as_ptr(), k0, row as i32, bar);
                        }
                    }
                }
                share += 1;
            }
        }
    }

    /// The body of `gemm_split_k_reduce_fused`.
    #[inline(always)]
    pub(super) unsafe fn reduce_parts(ws: DevicePtr<f32>, c: u64, s: GemmShape, splits: u32, epi: FusedEpilogue) {
        let len = s.m * s.n;
        let stride = thread::grid_dim_x() * thread::block_dim_x();
        let mut i = thread::block_idx_x() * thread::block_dim_x() + thread::thread_idx_x();
        while i < len {
            let mut v = unsafe { ws.read(i as usize) };
            let mut sp = 1;
            while sp < splits {
                v += unsafe { ws.read(sp as usize * len as usize + i as usize) };
                sp += 1;
            }
            store(epi.format, c, i as usize, epi.apply(v, i / s.n, i % s.n, s.n));
            i += stride;
        }
    }

    /// The body of `gemm_wgmma_bf16_fused` (`splits` 1) and `gemm_wgmma_bf16_fused_split`.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn fused_body(
        a_map: DevicePtr<TensorMap>,
        b_map: DevicePtr<TensorMap>,
        c: u64,
        s: GemmShape,
        epi: FusedEpilogue,
        multicast: bool,
        layout: u32,
        c_map: DevicePtr<TensorMap>,
        splits: u32,
    ) {
        let tid = thread::thread_idx_x();
        let wg = tid / 128;
        let rank = cluster::cta_rank();
        let (cid, clusters) = (cluster::cluster_idx_x(), cluster::cluster_count_x());
        let (tiles_m, tiles_n) = (s.m.div_ceil(WP_BM), s.n.div_ceil(WW_BN));
        let k_tiles = s.k.div_ceil(WG_BK);
        let ring = Ring { base: shared::dynamic_smem_addr(), stage_bytes: WW_STAGE_BYTES };
        ring.init(if multicast { WP_EMPTY_ARRIVALS } else { WG_CONSUMERS });
        // the peer's barriers exist before anything multicasts into it or arrives on them
        cluster::sync();

        if wg == 0 {
            unsafe { wgmma::setmaxnreg_dec::<WW_PRODUCER_REGS>() };
            if tid == 0 {
                unsafe {
                    tma::prefetch(a_map.as_ptr());
                    tma::prefetch(b_map.as_ptr());
                }
                let mut t = 0;
                let mut i = 0;
                while let Some((_, tm, tn, sp)) = persistent_tile(cid, clusters, i, tiles_m, tiles_n, splits, 1) {
                    let (m0, n0) = (tm * WP_BM + rank * super::super::gemm_wgmma::WG_BM, tn * WW_BN);
                    let (first, count) = split_k_range(k_tiles, splits, sp);
                    let mut kt = first;
                    while kt < first + count {
                        let st = t % WG_STAGES;
                        if t >= WG_STAGES
                            && !unsafe {
                                mbarrier::wait_parity_bounded(
                                    ring.empty(st),
                                    empty_parity(t),
                                    mbarrier::DEFAULT_WAIT_NS,
                                )
                            }
                        {
                            thread::trap();
                        }
                        unsafe {
                            mbarrier::arrive_expect_tx(ring.full(st), fused_stage_bytes(m0, n0, s, layout));
                            load_stage(
                                a_map,
                                b_map,
                                ring.stage(st),
                                ring.full(st),
                                (kt, m0, n0),
                                s,
                                layout,
                                multicast,
                                rank,
                            );
                        }
                        t += 1;
                        kt += 1;
                    }
                    i += 1;
                }
            }
        } else {
            unsafe { wgmma::setmaxnreg_inc::<WW_CONSUMER_REGS>() };
            let cons = wg - 1;
            let ct = tid - 128 * wg;
            // hands stage `t % STAGES` back to both producers (each wrote part of it)
            let release = |t: u32| {
                if ct == 0 {
                    let bar = ring.empty(t % WG_STAGES);
                    if multicast {
                        let mut r = 0;
                        while r < WP_CLUSTER {
                            unsafe { mbarrier::arrive_cluster(cluster::map_shared(bar, r)) };
                            r += 1;
                        }
                    } else {
                        unsafe { mbarrier::arrive(bar) };
                    }
                }
            };
            let staged = c_map.addr() != 0;
            let staging = ring.base
                + crate::kernels::gemm_wgmma::WP_EPI_OFFSET
                + cons * crate::kernels::gemm_wgmma::WP_EPI_BUFFERS * crate::kernels::gemm_wgmma::WP_EPI_BOX_BYTES;
            let pairs = epi.pairs(c, s.n);
            let mut acc = [0.0f32; 128];
            let mut t = 0;
            let mut i = 0;
            while let Some((_, tm, tn, sp)) = persistent_tile(cid, clusters, i, tiles_m, tiles_n, splits, 1) {
                let (m0, n0) = (tm * WP_BM + rank * super::super::gemm_wgmma::WG_BM, tn * WW_BN);
                let (first, count) = split_k_range(k_tiles, splits, sp);
                let mut kt = first;
                while kt < first + count {
                    mma(ring, t, cons, &mut acc, kt > first, layout);
                    // tile kt - 1's products are done: its stage can be refilled while kt's run
                    if kt > first {
                        release(t - 1);
                    }
                    t += 1;
                    kt += 1;
                }
                wgmma::wait_group::<0>();
                release(t - 1);
                // the thread index laundered per tile: the epilogue's per-pair offsets are then
                // recomputed here instead of hoisted out of the tile loop (and spilled)
                let lt = crate::hint::launder(ct);
                if splits > 1 {
                    // a k part goes unchanged (f32) to its partial; the reduction applies the epilogue
                    let part = c + sp as u64 * s.m as u64 * s.n as u64 * 4;
                    store_m64n256(&acc, lt, m0 + cons * 64, n0, part, s, FusedEpilogue::NONE);
                } else if staged {
                    Staged { ct: lt, cons, row0: m0 + cons * 64, n0, c_map, s, epi, staging, pairs }.store(&acc);
                } else {
                    store_m64n256(&acc, lt, m0 + cons * 64, n0, c, s, epi);
                }
                i += 1;
            }
            if staged && ct == 0 {
                // the last stores have written C (and stopped reading shared memory) before the exit
                tma::wait_group::<0>();
            }
        }
        // no CTA leaves while its peer may still multicast into it or arrive on its barriers
        cluster::sync();
    }
}

/// `C = act(A B^T + bias) + residual + table[row % period]` (and the other operand layouts): the
/// persistent kernel's schedule with the fused epilogue of the module docs.
///
/// - Grid: [`WP_CLUSTER`]-CTA clusters, as many as fit at once; cluster `c` computes cluster tiles
///   `c, c + clusters, ...` of the grouped order (`persistent_tile`, no k split, one product). A
///   cluster tile is 256 x 256; CTA rank `r` computes its rows `128 r..128 r + 128`.
/// - Block: 384 threads, warpgroup 0 the producer (one thread issues the TMA loads,
///   `setmaxnreg.dec` to 40), warpgroups 1 and 2 the consumers (`setmaxnreg.inc` to 232), each
///   64 x 256 of the CTA's tile with `wgmma m64n256k16`, 128 f32 accumulators per thread.
/// - Loads: per k tile, each CTA's A tile (K-major: one 64 x 128 box; MN-major: two 64 x 64 boxes)
///   and the cluster's B tile, whose two 128-row shares each CTA loads itself (`multicast` zero) or
///   loads its own and multicasts it to both (`multicast` nonzero); K-major B shares are one box,
///   MN-major ones two. Stages as the persistent kernel's (4 x 48 KiB, 128-byte swizzle).
/// - Epilogue: [`FusedEpilogue`]. With a C tensor map (`c_map` not null: C's format, box 64 rows
///   by 128 bytes of columns, 128-byte swizzle; needs [`staged_store_fits`]) the outputs go through
///   swizzled staging boxes in shared memory and TMA stores that overlap the next tile's products
///   (the persistent kernel's staged epilogue, for every format); without one, each thread stores
///   its outputs from registers, masked.
///
/// Parameters: `a_map`, `b_map` (bf16 tensor maps: K-major over the m x k (n x k) matrix with box
/// 64 x 128; MN-major over the k x m (k x n) matrix with box 64 x 64; 128-byte swizzle), `c` (m x n
/// in `epi.format`), the shape, the epilogue, `multicast`, `layout` ([`layout`]), `c_map` (or
/// null). Dynamic shared memory `WP_SMEM_BYTES` (the persistent kernel's ring and staging boxes);
/// grid x a multiple of 2.
#[kernel(arch = "sm_90a", max_threads = 384, cluster = 2)]
pub unsafe fn gemm_wgmma_bf16_fused(
    a_map: DevicePtr<TensorMap>,
    b_map: DevicePtr<TensorMap>,
    c: DevicePtrMut<u8>,
    s: GemmShape,
    epi: FusedEpilogue,
    multicast: u32,
    layout: u32,
    c_map: DevicePtr<TensorMap>,
) {
    unsafe { dev::fused_body(a_map, b_map, c.addr(), s, epi, multicast != 0, layout, c_map, 1) }
}

/// The k-split products of `gemm_wgmma_bf16_fused` (any [`layout`]): the same schedule, loads
/// and products, with each work unit one k part of a cluster tile (`persistent_tile` with
/// `splits`; the part's k tiles by `split_k_range`, all non-empty: `split_k_fits`). A part's
/// 256 x 256 f32 sums go unchanged, from registers and masked, to the partial
/// `ws + split * m * n` (row-major, pitch n); [`gemm_split_k_reduce_fused`] then adds the parts in
/// order and applies the epilogue. For long-k products with few output tiles (weight gradients).
///
/// - Grid: [`WP_CLUSTER`]-CTA clusters, at most as many as fit at once (a multiple of 2 CTAs);
///   cluster `c` takes units `c, c + clusters, ...` of the `tiles * splits` units.
/// - Block: 384 threads, as `gemm_wgmma_bf16_fused` (producer warpgroup 0, consumers 1 and 2).
///
/// Parameters: `a_map`, `b_map` (as `gemm_wgmma_bf16_fused`'s, for `layout`), `ws` (`splits * m * n`
/// f32), the shape, `multicast`, `layout`, `splits` (at least 1). Dynamic shared memory
/// `WP_SMEM_BYTES`.
#[kernel(arch = "sm_90a", max_threads = 384, cluster = 2)]
pub unsafe fn gemm_wgmma_bf16_fused_split(
    a_map: DevicePtr<TensorMap>,
    b_map: DevicePtr<TensorMap>,
    ws: DevicePtrMut<f32>,
    s: GemmShape,
    multicast: u32,
    layout: u32,
    splits: u32,
) {
    let null = DevicePtr::from_addr(0);
    unsafe { dev::fused_body(a_map, b_map, ws.addr(), s, FusedEpilogue::NONE, multicast != 0, layout, null, splits) }
}

/// `c[i] = epi(sum over s of ws[s * m * n + i])` for the `m * n` outputs, the sum in the order
/// `s = 0, 1, ..` in f32, then `epi` ([`FusedEpilogue`]: bias, activation, residual, table) and one
/// rounding to `epi.format`: the fixed-order reduction of [`gemm_wgmma_bf16_fused_split`]'s parts
/// (the same bits on every run of a shape and split). Grid-stride over the outputs, one thread an
/// output; any grid; block 256.
#[kernel(arch = "sm_90a")]
pub unsafe fn gemm_split_k_reduce_fused(
    ws: DevicePtr<f32>,
    c: DevicePtrMut<u8>,
    s: GemmShape,
    splits: u32,
    epi: FusedEpilogue,
) {
    unsafe { dev::reduce_parts(ws, c.addr(), s, splits, epi) }
}

/// Columns of C in one staging box of the fused kernel's staged epilogue: 128 bytes of `format`.
pub const fn staged_box_cols(format: u32) -> u32 {
    128 / FusedEpilogue::elem_bytes(format)
}

/// Whether C (n columns of `format` at `c_addr`) can take the fused kernel's staged TMA stores: a
/// row pitch that is a multiple of 16 bytes and a 16-byte-aligned address.
pub const fn staged_store_fits(n: u32, format: u32, c_addr: u64) -> bool {
    (n * FusedEpilogue::elem_bytes(format)).is_multiple_of(16) && c_addr.is_multiple_of(16)
}

/// Threads per block of `gemm_column_sums`: 32 columns by [`COLSUM_ROW_LANES`] row lanes.
pub const COLSUM_THREADS: u32 = 32 * COLSUM_ROW_LANES;
/// Row lanes per block of `gemm_column_sums`.
pub const COLSUM_ROW_LANES: u32 = 16;
/// Dynamic shared memory of `gemm_column_sums`: one f32 partial per thread.
pub const COLSUM_SMEM_BYTES: u32 = COLSUM_THREADS * 4;

/// Column sums of row chunks: `out[chunk][col] = sum over rows r of chunk of x[r][col]` for the m x n
/// matrix `x` in `format`, chunk `c` being rows `c * rows_per_chunk ..` (at most `rows_per_chunk`
/// of them), f32 sums in a fixed order. One chunk gives the column sums (the bias gradient of
/// `y = x W^T + b`: the column sums of dY); with several, a second launch over the f32 partials
/// (m = chunks, one chunk) adds them in order, so the bits are fixed for a given shape.
///
/// - Grid `(ceil(n / 32), chunks)`, block [`COLSUM_THREADS`] = 32 x [`COLSUM_ROW_LANES`]: thread
///   `(lane, y)` of block `(b, c)` sums column `32 b + lane` over rows `y, y + 16, ...` of chunk `c`
///   in order (a warp reads 32 adjacent columns of one row), writes its partial to shared memory,
///   and after a block barrier lane row 0 adds the 16 partials in order.
/// - Parameters: `x` (m x n elements of `format`, row-major), `out` (chunks x n f32), `m`, `n`,
///   `format` (`gemm_wgmma_fused::format`), `rows_per_chunk` (at least 1). Dynamic shared memory
///   [`COLSUM_SMEM_BYTES`].
#[kernel]
pub unsafe fn gemm_column_sums(
    x: DevicePtr<u8>,
    out: DevicePtrMut<f32>,
    m: u32,
    n: u32,
    format: u32,
    rows_per_chunk: u32,
) {
    use crate::{shared, sync, thread};
    let tid = thread::thread_idx_x();
    let (lane, y) = (tid % 32, tid / 32);
    let col = thread::block_idx_x() * 32 + lane;
    let chunk = thread::block_idx_y();
    let r0 = chunk * rows_per_chunk;
    let r1 = if m - r0.min(m) < rows_per_chunk { m } else { r0 + rows_per_chunk };
    let mut acc = 0.0f32;
    if col < n {
        let mut r = r0 + y;
        while r < r1 {
            acc += elem::load(format, x.addr(), r as usize * n as usize + col as usize);
            r += COLSUM_ROW_LANES;
        }
    }
    let partials: *mut f32 = shared::dynamic_smem(0);
    unsafe { *partials.add(tid as usize) = acc };
    sync::sync_threads();
    if y == 0 && col < n {
        let mut sum = 0.0f32;
        let mut l = 0;
        while l < COLSUM_ROW_LANES {
            sum += unsafe { *partials.add((l * 32 + lane) as usize) };
            l += 1;
        }
        unsafe { out.write(chunk as usize * n as usize + col as usize, sum) };
    }
}

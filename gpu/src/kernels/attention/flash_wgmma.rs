//! Flash attention, rung 3 (sm_90a): the forward on TMA + `wgmma` with a producer warp, in the
//! FlashAttention-3 style (simplified: one or two consumer warpgroups, no ping-pong; that is
//! [`super::flash_wgmma_pp`]). bf16 or f16 in and out, f32 accumulation, head dim 64 or 128.
//!
//! ```text
//!   global Q [B*H*q_len, D]   K, V [B*H*kv_len, D]          (2-D tensor maps, box 64 x 64, 128B swizzle)
//!        |                      |
//!        | TMA, once per tile   | TMA, producer warp (warp 4, lane 0), 2-stage ring
//!        v                      v
//!   smem Q tile 64 x D     smem stage s: K tile 64 x D | V tile 64 x D    full[s] / empty[s] mbarriers
//!        \                    /                 |
//!         wgmma m64n64k16 (A = Q smem, B = K smem, both K-major)
//!                 |  S 64 x 64 f32 in registers (32 per thread)
//!                 v
//!         mask, online softmax (row max / sum over the 4 lanes of a quad)
//!                 |  P packed to bf16 / f16 in registers (the A fragment)
//!                 v
//!         wgmma m64nDk16 (A = P registers, B = V smem, MN-major: transpose bit)  -> O 64 x D f32
//!                 |
//!                 v  O / l, rounded, 4-byte stores (rows < q_len); LSE f32 per row
//!   global O [B*H*q_len, D], LSE [B*H*q_len]
//! ```
//!
//! - **Block.** [`FLASH_WGMMA_THREADS`] threads: warps 0-3 are the consumer warpgroup, warp 4 the
//!   producer (its lane 0 issues every TMA copy). A query tile is (batch * head, [`FLASH_WGMMA_BQ`]
//!   query rows), numbered head by head, a head's last rows first ([`flash_wgmma_tiles`]). Block
//!   `b` of a grid of `n` runs tile `b`, then takes tiles from the tile counter `sched` (tile `n
//!   +` the count drawn) until none is left; the host launches as many blocks as the GPU holds at
//!   once (at most one per tile).
//! - **Persistent blocks.** The Q buffers (`q_full[b]` / `q_empty[b]`, `QB` of them) and the K/V
//!   ring carry on from one tile to the next: use `u` of Q buffer `u % QB` is its phase `u / QB`,
//!   and the ring counts K/V tiles over all the block's query tiles. With two Q buffers the
//!   producer loads the next tile's Q, and its first K/V stages as they free up, while the
//!   consumers finish the current tile and store its output: a block's start-up (Q and the first
//!   K/V tile from memory) and its epilogue are hidden behind another tile's products.
//! - **Tiles.** Q 64 x D, K and V [`FLASH_WGMMA_BKV`] x D, each stored as `D / 64` boxes of 64 rows
//!   of 128 bytes, 128-byte swizzled (the swizzle span is 64 elements). Two stages of K and V.
//! - **Ring.** Every wait is bounded and traps on a stall. `full[s]`: one arrival (the producer's
//!   `arrive.expect_tx` of the stage's bytes) plus
//!   the TMA bytes; `empty[s]`: 128 arrivals (every consumer thread, after the stage's products
//!   have been waited for). Use `j` of stage `j % 2` is phase `j / 2`.
//! - **Edges.** The maps are 2-D over all heads' rows, so a tile that crosses `kv_len` reads the
//!   next head's rows (zeros past the tensor's end): every score at a key `>= kv_len` is masked to
//!   `-inf`, so those rows get P = 0 and add nothing (the inputs must be finite). Query rows past
//!   `q_len` are computed from the next head's rows and not stored. Causal: tiles wholly above the
//!   diagonal are never loaded, the diagonal ones masked.
//! - **S = Q K^T.** `D / 16` wgmma `m64n64k16`, descriptors advanced 32 bytes per k step inside a
//!   128-byte swizzle atom (the GEMM's `tile_descriptor`).
//! - **Softmax.** As rung 2 (`flash_mma`): the wgmma accumulator of warp `w` is the `mma.m16n8`
//!   C layout of rows `16 w .. 16 w + 16`, a thread holds rows `g` and `g + 8`.
//! - **O += P V.** 4 wgmma `m64nDk16` with P from registers (two n8 blocks of S are one k16 A
//!   fragment) and V read MN-major (the GEMM's `mn_descriptor`: 64-column boxes 8192 bytes apart).
//!
//! - **Two consumers** (`flash_fwd_wgmma2_*`): warps 0-7 are two consumer warpgroups, each with its
//!   own 64-row Q tile, both reading every K/V stage (`empty[s]` counts 256 arrivals); warpgroup
//!   2 produces (thread 256 issues the copies) after giving its registers to the consumers
//!   (`setmaxnreg`: 40 per thread left, 232 for each consumer thread). A tile is 128 query
//!   rows, so each K/V tile loaded serves twice the rows. Its K/V tiles hold [`FLASH_WGMMA2_BKV`]
//!   = 128 keys: K as two 64-row boxes per 64-column box, one after the other, so `S = Q K^T` is
//!   one `m64n128k16` per k step (64 x 128 scores, 64 per thread) and each Q read from shared
//!   memory feeds twice the products; V as two 64-key tiles, `P V` 8 k steps, 4 on each. Two Q
//!   buffers; one block per multiprocessor.
//!
//! Shared memory: [`flash_wgmma_smem_bytes`] (Q, two stages of K and V, six mbarriers and the Q
//! buffer's tile number: 56 bytes), or [`flash_wgmma2_smem_bytes`] (two buffers of two Q tiles, two
//! stages of 128-key K and V: 192 KiB + 80 bytes at D = 128).

use super::attention::AttentionParams;
use crate::tma::TensorMap;
use crate::{DevicePtr, DevicePtrMut, kernel};
use half::{bf16, f16};

/// Query rows per block (the consumer warpgroup's 64).
pub const FLASH_WGMMA_BQ: u32 = 64;
/// Keys per K/V tile (one box of 64 rows).
pub const FLASH_WGMMA_BKV: u32 = 64;
/// Threads per block: one consumer warpgroup and one producer warp.
pub const FLASH_WGMMA_THREADS: u32 = 160;
/// Ring depth (K/V stages).
pub const FLASH_WGMMA_STAGES: u32 = 2;
/// Rows of a TMA box (every tile is loaded in boxes of 64 rows by 64 columns).
pub const FLASH_WGMMA_BOX_ROWS: u32 = 64;
/// Columns of a TMA box: 64 16-bit elements, the 128-byte swizzle span.
pub const FLASH_WGMMA_BOX_COLS: u32 = 64;

/// Bytes of one 64 x D tile (Q, K or V) at head dim `d`.
pub const fn flash_wgmma_tile_bytes(d: u32) -> u32 {
    64 * d * 2
}

/// Q buffers of the one-consumer kernels (two or three blocks share an SM, and overlap each
/// other's start-up).
pub const FLASH_WGMMA_QBUF: u32 = 1;
/// Q buffers of the two-consumer kernels: a persistent block loads the next tile's Q while its
/// consumers finish the current one.
pub const FLASH_WGMMA2_QBUF: u32 = 2;

/// Bytes of the mbarriers of a kernel with `qbuf` Q buffers (`q_full[qbuf]`, `full[2]`,
/// `empty[2]`, `q_empty[qbuf]`) and of the query tile each Q buffer holds (8 bytes each).
const fn flash_wgmma_barrier_bytes(qbuf: u32) -> u32 {
    (3 * qbuf + 2 * FLASH_WGMMA_STAGES) * 8
}

/// Dynamic shared memory of the rung-3 kernel at head dim `d`: Q, two stages of K and V, and the
/// barriers.
pub const fn flash_wgmma_smem_bytes(d: u32) -> u32 {
    (FLASH_WGMMA_QBUF + 2 * FLASH_WGMMA_STAGES) * flash_wgmma_tile_bytes(d)
        + flash_wgmma_barrier_bytes(FLASH_WGMMA_QBUF)
}

/// Query rows per block of the two-consumer kernels (`flash_fwd_wgmma2_*`): 64 per warpgroup.
pub const FLASH_WGMMA2_BQ: u32 = 128;
/// Threads per block of the two-consumer kernels: two consumer warpgroups and a producer
/// warpgroup (a whole one, so that `setmaxnreg` can move its registers to the consumers).
pub const FLASH_WGMMA2_THREADS: u32 = 384;
/// Registers per thread the two-consumer kernels' producer warpgroup keeps (`setmaxnreg.dec`).
pub const FLASH_WGMMA2_PRODUCER_REGS: u32 = 40;
/// Registers per thread their consumer warpgroups take (`setmaxnreg.inc`): 64 scores, the 64 x D
/// output's accumulators and P's fragments; `128 (40 + 2 x 232) = 64512` of the SM's 65536.
pub const FLASH_WGMMA2_CONSUMER_REGS: u32 = 232;

/// Registers per thread ptxas allocates the two-consumer kernels at entry (384 threads, one block
/// per SM: 65 536 / 384 rounded down to a multiple of 8).
pub const FLASH_WGMMA2_ENTRY_REGS: u32 = 168;

const _: () = assert!(crate::wgmma::setmaxnreg_split_fits(
    FLASH_WGMMA2_ENTRY_REGS,
    FLASH_WGMMA2_PRODUCER_REGS,
    FLASH_WGMMA2_CONSUMER_REGS,
    2
));

/// Keys per K/V tile of the two-consumer kernels: two boxes of 64 rows, so that `S = Q K^T` is one
/// `m64n128k16` per k step (half the shared-memory reads of Q per product of the 64-key form).
pub const FLASH_WGMMA2_BKV: u32 = 128;

/// Dynamic shared memory of the two-consumer kernels at head dim `d`: two buffers of two Q tiles
/// (one per consumer), two stages of 128-key K and V tiles, and the barriers and tile numbers (192
/// KiB + 80 bytes at D = 128).
pub const fn flash_wgmma2_smem_bytes(d: u32) -> u32 {
    (2 * FLASH_WGMMA2_QBUF + 2 * FLASH_WGMMA_STAGES * (FLASH_WGMMA2_BKV / 64)) * flash_wgmma_tile_bytes(d)
        + flash_wgmma_barrier_bytes(FLASH_WGMMA2_QBUF)
}

/// Query tiles of a forward with `rows` query rows per block: `ceil(q_len / rows)` per head. The
/// kernels take tile `t` as head `t / n` (for `n` tiles per head) and query block `n - 1 - t % n`:
/// a head's tiles one after the other, its last rows (under the causal mask, the most keys) first.
pub const fn flash_wgmma_tiles(p: AttentionParams, rows: u32) -> u32 {
    p.q_len.div_ceil(rows) * p.heads_total()
}

/// u32 words of the forwards' tile counter (`sched`): the next tile to hand out (less the grid)
/// and the blocks that have finished. Both must be 0 at a launch; the last block to finish sets
/// them back to 0, so one counter serves every launch of a stream.
pub const FLASH_WGMMA_SCHED_WORDS: usize = 2;

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
pub(crate) mod device {
    use super::*;
    use crate::kernels::flash_mma::pack;
    use crate::kernels::gemm_wgmma::tile_descriptor;
    use crate::kernels::gemm_wgmma_fused::mn_descriptor;
    use crate::{atomic, fence, math, mbarrier, shared, sync, thread, tma, warp, wgmma};

    const BQ: u32 = FLASH_WGMMA_BQ;
    const ST: u32 = FLASH_WGMMA_STAGES;

    /// 128 bytes of one 64-column box row, 64 rows per box.
    const BOX_BYTES: u32 = FLASH_WGMMA_BOX_ROWS * FLASH_WGMMA_BOX_COLS * 2;

    /// Shared memory of a block with `cons` consumer warpgroups and `qbuf` Q buffers: `qbuf`
    /// buffers of `cons` Q tiles (64 x D each), then K and V of each stage (`cons` 64-row tiles
    /// each: 64 keys per consumer), then the barriers (`q_full[qbuf]`, `full[ST]`, `empty[ST]`,
    /// `q_empty[qbuf]`).
    #[derive(Clone, Copy)]
    struct Layout {
        base: u32,
        tile: u32,
        cons: u32,
        qbuf: u32,
    }

    impl Layout {
        /// Consumer `c`'s Q tile in buffer `b`.
        fn q(self, b: u32, c: u32) -> u32 {
            self.base + (b * self.cons + c) * self.tile
        }
        /// K of stage `st`: per 64-column box, `64 cons` rows of 128 bytes.
        fn k(self, st: u32) -> u32 {
            self.base + (self.qbuf * self.cons + 2 * self.cons * st) * self.tile
        }
        /// V of stage `st`: `cons` 64-key tiles, one after the other.
        fn v(self, st: u32) -> u32 {
            self.k(st) + self.cons * self.tile
        }
        fn bars(self) -> u32 {
            self.base + (self.qbuf * self.cons + 2 * self.cons * ST) * self.tile
        }
        fn q_full(self, b: u32) -> u32 {
            self.bars() + 8 * b
        }
        fn full(self, st: u32) -> u32 {
            self.bars() + 8 * (self.qbuf + st)
        }
        fn empty(self, st: u32) -> u32 {
            self.bars() + 8 * (self.qbuf + ST + st)
        }
        fn q_empty(self, b: u32) -> u32 {
            self.bars() + 8 * (self.qbuf + 2 * ST + b)
        }
        /// The query tile of Q buffer `b` (written by the producer before it arrives on
        /// `q_full[b]`; `tiles` or more: none, the block is done).
        fn tile_id(self, b: u32) -> u32 {
            self.bars() + 8 * (2 * self.qbuf + 2 * ST + b)
        }
    }

    /// The online softmax of one score tile in the `wgmma` accumulator layout: for rows `g`
    /// (`h = 0`) and `g + 8` (`h = 1`) of the thread's quad, the new running maximum `m` (base 2,
    /// scaled), `S` replaced by `P = 2^(scale_log2 S - m)`, the running sum `l` and the output
    /// accumulators `acc` rescaled by `2^(m_old - m)`. A row that has seen only masked keys keeps
    /// `m = -inf` and gets `P = 0`.
    #[inline(always)]
    pub(crate) fn softmax_rows<const NS: usize, const NO: usize>(
        s: &mut [f32; NS],
        (m, l): (&mut [f32; 2], &mut [f32; 2]),
        acc: &mut [f32; NO],
        scale_log2: f32,
    ) {
        let mut h = 0;
        while h < 2 {
            let mut mx = f32::NEG_INFINITY;
            let mut nt = 0;
            while nt < NS / 4 {
                mx = mx.max(s[4 * nt + 2 * h]).max(s[4 * nt + 2 * h + 1]);
                nt += 1;
            }
            mx = mx.max(warp::shfl_xor_f32(warp::FULL_MASK, mx, 1));
            mx = mx.max(warp::shfl_xor_f32(warp::FULL_MASK, mx, 2));
            let m_new = m[h].max(mx * scale_log2);
            let m_use = if m_new == f32::NEG_INFINITY { 0.0 } else { m_new };
            let alpha = math::exp2_fast(m[h] - m_use);
            let mut sum = 0.0f32;
            let mut nt = 0;
            while nt < NS / 4 {
                let e0 = math::exp2_fast(math::fma(s[4 * nt + 2 * h], scale_log2, -m_use));
                let e1 = math::exp2_fast(math::fma(s[4 * nt + 2 * h + 1], scale_log2, -m_use));
                s[4 * nt + 2 * h] = e0;
                s[4 * nt + 2 * h + 1] = e1;
                sum += e0 + e1;
                nt += 1;
            }
            l[h] = l[h] * alpha + sum;
            m[h] = m_new;
            let mut n = 0;
            while n < NO / 4 {
                acc[4 * n + 2 * h] *= alpha;
                acc[4 * n + 2 * h + 1] *= alpha;
                n += 1;
            }
            h += 1;
        }
    }

    /// Masks the scores of a tile (keys `k0 .. k0 + bkv`, the thread's rows `rows` of the
    /// consumer's block starting at `r0`) to `-inf` where a row does not see the key (past `kv_len`,
    /// or above the causal diagonal); a tile no row needs masked is left alone.
    #[inline(always)]
    pub(crate) fn mask_scores<const NS: usize>(
        s: &mut [f32; NS],
        p: AttentionParams,
        (r0, rows): (u32, [u32; 2]),
        (k0, bkv): (u32, u32),
        tq: u32,
    ) {
        if p.tile_needs_mask(r0, k0, bkv) {
            let vis = [p.visible_keys(rows[0]), p.visible_keys(rows[1])];
            let mut i = 0;
            while i < NS {
                // element i: row g + 8 ((i % 4) / 2), column 8 (i / 4) + 2 tq + i % 2
                let c = k0 + 8 * (i as u32 / 4) + 2 * tq + (i as u32 % 2);
                if c >= vis[(i % 4) / 2] {
                    s[i] = f32::NEG_INFINITY;
                }
                i += 1;
            }
        }
    }

    /// P (the softmax's output in `s`) packed to bf16 / f16 as the A fragments of `O += P V`: n8
    /// blocks `2 kk` and `2 kk + 1` of the scores are k step `kk` (16 keys); `NK >= NS / 8` slots,
    /// the first `NS / 8` filled.
    #[inline(always)]
    pub(crate) fn p_fragments<const F16: bool, const NS: usize, const NK: usize>(s: &[f32; NS]) -> [[u32; 4]; NK] {
        let mut pa = [[0u32; 4]; NK];
        let mut kk = 0;
        while kk < NS / 8 {
            let b = 8 * kk;
            pa[kk] = [
                pack::<F16>(s[b], s[b + 1]),
                pack::<F16>(s[b + 2], s[b + 3]),
                pack::<F16>(s[b + 4], s[b + 5]),
                pack::<F16>(s[b + 6], s[b + 7]),
            ];
            kk += 1;
        }
        pa
    }

    /// The epilogue of a forward tile: rows `rows` (the thread's `g` and `g + 8`) of O as
    /// `acc / l`, rounded, in 4-byte stores (rows below `q_len` only) of head `bh` (of rows
    /// `bh q_len ..`), and their log-sum-exps (natural log; `-inf` for a
    /// row that saw no key) by the quad's first lane (`tq == 0`).
    ///
    /// # Safety
    /// `o` must hold the head's rows (`D` elements each) and `lse` one f32 per row.
    #[inline(always)]
    pub(crate) unsafe fn store_rows<const F16: bool, const D: u32, const NO: usize>(
        o: *mut u16,
        lse: DevicePtrMut<f32>,
        acc: &[f32; NO],
        (m, l): ([f32; 2], [f32; 2]),
        (bh, rows, q_len): (u32, [u32; 2], u32),
        tq: u32,
    ) {
        let mut h = 0;
        while h < 2 {
            let mut lt = l[h];
            lt += warp::shfl_xor_f32(warp::FULL_MASK, lt, 1);
            lt += warp::shfl_xor_f32(warp::FULL_MASK, lt, 2);
            let inv = if lt > 0.0 { 1.0 / lt } else { 0.0 };
            if rows[h] < q_len {
                let orow = (bh as usize * q_len as usize + rows[h] as usize) * D as usize;
                let mut n = 0;
                while n < NO / 4 {
                    let col = n as u32 * 8 + 2 * tq;
                    let word = pack::<F16>(acc[4 * n + 2 * h] * inv, acc[4 * n + 2 * h + 1] * inv);
                    unsafe { (o.add(orow + col as usize) as *mut u32).write(word) };
                    n += 1;
                }
                if tq == 0 {
                    let v = if lt > 0.0 {
                        (m[h] + math::ln(lt) * core::f32::consts::LOG2_E) * core::f32::consts::LN_2
                    } else {
                        f32::NEG_INFINITY
                    };
                    unsafe { lse.write(bh as usize * q_len as usize + rows[h] as usize, v) };
                }
            }
            h += 1;
        }
    }

    /// Query tile `t` of [`flash_wgmma_tiles`]: its head and its first query row.
    #[inline(always)]
    fn tile_of(p: AttentionParams, t: u32, rows: u32) -> (u32, u32) {
        let n = p.q_len.div_ceil(rows);
        (t / n, (n - 1 - t % n) * rows)
    }

    // `wait`, `load_tile` and `kmajor` serve every Hopper attention kernel (this one, the
    // ping-pong forward, the backward).

    /// Waits for the phase of `bar` with `parity`; a phase that does not complete within
    /// [`mbarrier::DEFAULT_WAIT_NS`] traps, so a miscounted ring fails the launch instead of hanging.
    ///
    /// # Safety
    /// `bar` must be an initialized mbarrier in this block's shared memory.
    #[inline(always)]
    pub(crate) unsafe fn wait(bar: u32, parity: u32) {
        if !unsafe { mbarrier::wait_parity_bounded(bar, parity, mbarrier::DEFAULT_WAIT_NS) } {
            thread::trap();
        }
    }

    /// Loads a 64 x D tile starting at global row `row` as `D / 64` boxes, completing on `bar`.
    ///
    /// # Safety
    /// As [`tma::load_2d`] for each box (`dst` 1024-byte aligned with room for the tile).
    #[inline(always)]
    pub(crate) unsafe fn load_tile<const D: u32>(dst: u32, map: *const TensorMap, row: u32, bar: u32) {
        let mut c = 0;
        while c < D / 64 {
            unsafe { tma::load_2d(dst + c * BOX_BYTES, map, (c * 64) as i32, row as i32, bar) };
            c += 1;
        }
    }

    /// The K-major descriptor of k step `ks` (16 elements) of a 64 x D tile stored as 64-column
    /// boxes.
    #[inline(always)]
    pub(crate) fn kmajor(tile: u32, ks: u32) -> u64 {
        tile_descriptor(tile + (ks / 4) * BOX_BYTES, ks % 4)
    }

    /// Loads K of `bk` keys (64 or 128) from global row `row`: per 64-column box `c`, `bk / 64`
    /// boxes of 64 rows one after the other (`bk` rows of 128 bytes, the K-major layout of an
    /// `n = bk` operand), completing on `bar`. Boxes past the tensor's end are filled with zeros:
    /// with 128 keys the second box of the last head's last tile can lie wholly past it
    /// (`kv_len % 128` in 1..=64), and its copy is still issued and counted in full. That relies
    /// on the copy engine completing a box with nothing in bounds (it does on the H200: lengths 1
    /// and 17 in `gpu::flash_fwd_wgmma2_*`); the Q tiles, by contrast, skip such boxes.
    #[inline(always)]
    unsafe fn load_k<const D: u32>(dst: u32, map: *const TensorMap, row: u32, bar: u32, bk: u32) {
        let mut c = 0;
        while c < D / 64 {
            let mut r = 0;
            while r < bk / 64 {
                let at = dst + c * (bk / 64) * BOX_BYTES + r * BOX_BYTES;
                unsafe { tma::load_2d(at, map, (c * 64) as i32, (row + 64 * r) as i32, bar) };
                r += 1;
            }
            c += 1;
        }
    }

    /// The K-major descriptor of k step `ks` of a `bk`-key K tile ([`load_k`]).
    #[inline(always)]
    fn kmajor_k(tile: u32, ks: u32, bk: u32) -> u64 {
        tile_descriptor(tile + (ks / 4) * (bk / 64) * BOX_BYTES, ks % 4)
    }

    /// The forward with `CONS` consumer warpgroups, K/V tiles of `64 CONS` keys (`NS = 32 CONS`
    /// score accumulators per thread) and `QB` Q buffers. Block `b` runs query tile `b` of
    /// [`flash_wgmma_tiles`], then takes the next from the counter `sched` (`grid +` the count so
    /// far) until none is left: one tile when the grid covers them all, a persistent block
    /// otherwise, tiles handed out in order as blocks free up. The K/V ring and the Q buffers carry
    /// on from one tile to the next, so the producer loads the next tile's Q and first K/V stages
    /// while the consumers finish the current tile and store its output.
    #[inline(always)]
    pub(super) unsafe fn flash_wgmma<
        const F16: bool,
        const D: u32,
        const NO: usize,
        const CONS: u32,
        const NS: usize,
        const QB: u32,
    >(
        q_map: *const TensorMap,
        k_map: *const TensorMap,
        v_map: *const TensorMap,
        o: *mut u16,
        lse: DevicePtrMut<f32>,
        sched: *mut u32,
        p: AttentionParams,
    ) {
        const {
            assert!(
                NO as u32 == D / 2
                    && (D == 64 || D == 128)
                    && (CONS == 1 || CONS == 2)
                    && NS as u32 == 32 * CONS
                    && (QB == 1 || QB == 2)
            )
        };
        // keys per K/V tile, query rows per block
        let (bkv, bq) = (64 * CONS, BQ * CONS);
        let tid = thread::thread_idx_x();
        let (first, step, tiles) = (thread::block_idx_x(), thread::grid_dim_x(), flash_wgmma_tiles(p, bq));
        let (q_len, kv_len) = (p.q_len, p.kv_len);
        let tile = flash_wgmma_tile_bytes(D);
        let lay = Layout { base: shared::dynamic_smem_addr(), tile, cons: CONS, qbuf: QB };
        if lay.base % 1024 != 0 {
            thread::trap();
        }
        if tid == 0 {
            unsafe {
                let mut b = 0;
                while b < QB {
                    mbarrier::init(lay.q_full(b), 1);
                    mbarrier::init(lay.q_empty(b), 128 * CONS);
                    b += 1;
                }
                let mut st = 0;
                while st < ST {
                    mbarrier::init(lay.full(st), 1);
                    mbarrier::init(lay.empty(st), 128 * CONS);
                    st += 1;
                }
            }
            fence::mbarrier_init_release_cluster();
        }
        sync::sync_threads();

        if tid >= 128 * CONS {
            // the producer: thread 128 CONS issues every copy (with two consumers, its warpgroup
            // first gives its registers away)
            if CONS == 2 {
                unsafe { wgmma::setmaxnreg_dec::<FLASH_WGMMA2_PRODUCER_REGS>() };
            }
            if tid == 128 * CONS {
                unsafe {
                    tma::prefetch(q_map);
                    tma::prefetch(k_map);
                    tma::prefetch(v_map);
                }
                // `it`: the block's tiles so far; `j`: its K/V tiles so far (the ring's position)
                let (mut t, mut it, mut j) = (first, 0, 0);
                loop {
                    let (b, use_) = (it % QB, it / QB);
                    if it >= QB {
                        // the consumers are done with this buffer's previous tile
                        unsafe { wait(lay.q_empty(b), (use_ + 1) & 1) };
                    }
                    // the tile's number for the consumers, published by the arrival on q_full[b]
                    unsafe { shared::st_shared_b32(lay.tile_id(b), t) };
                    if t >= tiles {
                        unsafe { mbarrier::arrive(lay.q_full(b)) };
                        break;
                    }
                    let (bh, q0) = tile_of(p, t, bq);
                    // a consumer's Q tile that starts past the last head's rows is not loaded (its
                    // rows are never stored): only boxes that start inside the tensor are counted
                    let q_rows = p.heads_total() * q_len;
                    let mut loads = 0;
                    let mut c = 0;
                    while c < CONS {
                        if bh * q_len + q0 + c * BQ < q_rows {
                            loads += 1;
                        }
                        c += 1;
                    }
                    unsafe {
                        mbarrier::arrive_expect_tx(lay.q_full(b), loads * tile);
                        let mut c = 0;
                        while c < loads {
                            load_tile::<D>(lay.q(b, c), q_map, bh * q_len + q0 + c * BQ, lay.q_full(b));
                            c += 1;
                        }
                    }
                    let n_tiles = p.keys_for_rows(q0, bq).div_ceil(bkv);
                    let mut jt = 0;
                    while jt < n_tiles {
                        let st = j % ST;
                        if j >= ST {
                            unsafe { wait(lay.empty(st), ((j / ST) + 1) & 1) };
                        }
                        let row = bh * kv_len + jt * bkv;
                        unsafe {
                            mbarrier::arrive_expect_tx(lay.full(st), 2 * CONS * tile);
                            load_k::<D>(lay.k(st), k_map, row, lay.full(st), bkv);
                            let mut h = 0;
                            while h < CONS {
                                load_tile::<D>(lay.v(st) + h * tile, v_map, row + 64 * h, lay.full(st));
                                h += 1;
                            }
                        }
                        jt += 1;
                        j += 1;
                    }
                    it += 1;
                    t = step + unsafe { atomic::atomic_add_u32(sched, 1) };
                }
                // the last block out sets the counter back to 0 for the next launch (its count of
                // finished blocks is ordered after its last draw by the fence)
                fence::fence_gpu();
                if unsafe { atomic::atomic_add_u32(sched.add(1), 1) } == step - 1 {
                    // (and its stores after every other block's draws)
                    fence::fence_gpu();
                    unsafe {
                        sched.write_volatile(0);
                        sched.add(1).write_volatile(0);
                    }
                }
            }
            return;
        }

        // consumer warpgroup `cw`: rows q0 + 64 cw .. + 64 of each tile, warp w of it rows 16 w ..
        // 16 w + 16
        if CONS == 2 {
            unsafe { wgmma::setmaxnreg_inc::<FLASH_WGMMA2_CONSUMER_REGS>() };
        }
        let cw = tid / 128;
        let (lane, w) = (tid % 32, (tid % 128) / 32);
        let (g, tq) = (lane / 4, lane % 4);
        let wrow = w * 16;
        let scale_log2 = p.scale * core::f32::consts::LOG2_E;
        let (mut it, mut j) = (0, 0);
        loop {
            let b = it % QB;
            unsafe { wait(lay.q_full(b), (it / QB) & 1) };
            let t = unsafe { shared::ld_shared_b32(lay.tile_id(b)) };
            if t >= tiles {
                break;
            }
            let (bh, q0) = tile_of(p, t, bq);
            let r0 = q0 + cw * BQ;
            let rows = [r0 + wrow + g, r0 + wrow + g + 8];
            let n_tiles = p.keys_for_rows(q0, bq).div_ceil(bkv);
            let q_tile = lay.q(b, cw);
            let mut m = [f32::NEG_INFINITY; 2];
            let mut l = [0.0f32; 2];
            let mut acc = [0.0f32; NO];

            let mut jt = 0;
            while jt < n_tiles {
                let st = j % ST;
                unsafe { wait(lay.full(st), (j / ST) & 1) };
                let k0 = jt * bkv;

                // S = Q K^T (64 x 64 CONS)
                let mut s = [0.0f32; NS];
                wgmma::fence();
                let mut ks = 0;
                while ks < D / 16 {
                    let (a, bd) = (kmajor(q_tile, ks), kmajor_k(lay.k(st), ks, bkv));
                    if CONS == 2 {
                        let d = unsafe { &mut *(s.as_mut_ptr() as *mut [f32; 64]) };
                        unsafe { wgmma::mma_m64n128k16_ss::<F16>(d, a, bd, ks > 0) };
                    } else {
                        let d = unsafe { &mut *(s.as_mut_ptr() as *mut [f32; 32]) };
                        unsafe { wgmma::mma_m64n64k16_ss::<F16>(d, a, bd, ks > 0) };
                    }
                    ks += 1;
                }
                wgmma::commit_group();
                if CONS == 2 {
                    unsafe { wgmma::wait_group_m64n128::<0>(&mut *(s.as_mut_ptr() as *mut [f32; 64])) };
                } else {
                    unsafe { wgmma::wait_group_m64n64::<0>(&mut *(s.as_mut_ptr() as *mut [f32; 32])) };
                }

                // (with two consumers and the causal mask, the first one's last tiles may be wholly
                // masked: its rows keep their state, P = 0)
                mask_scores(&mut s, p, (r0, rows), (k0, bkv), tq);

                softmax_rows(&mut s, (&mut m, &mut l), &mut acc, scale_log2);

                // O += P V: n8 blocks 2 kk and 2 kk + 1 of S are the A fragment of k step kk (keys
                // 16 kk ..; V's 64-key tile kk / 4)
                let pa = p_fragments::<F16, NS, 8>(&s);
                wgmma::fence();
                let mut kk = 0;
                while kk < NS / 8 {
                    let bd = mn_descriptor(lay.v(st) + (kk as u32 / 4) * tile, kk as u32 % 4);
                    if D == 128 {
                        let a = unsafe { &mut *(acc.as_mut_ptr() as *mut [f32; 64]) };
                        unsafe { wgmma::mma_m64n128k16_rs_tb::<F16>(a, pa[kk], bd) };
                    } else {
                        let a = unsafe { &mut *(acc.as_mut_ptr() as *mut [f32; 32]) };
                        unsafe { wgmma::mma_m64n64k16_rs_tb::<F16>(a, pa[kk], bd) };
                    }
                    kk += 1;
                }
                wgmma::commit_group();
                if D == 128 {
                    unsafe { wgmma::wait_group_m64n128::<0>(&mut *(acc.as_mut_ptr() as *mut [f32; 64])) };
                } else {
                    unsafe { wgmma::wait_group_m64n64::<0>(&mut *(acc.as_mut_ptr() as *mut [f32; 32])) };
                }
                // this thread is done reading the stage
                unsafe { mbarrier::arrive(lay.empty(st)) };
                jt += 1;
                j += 1;
            }
            // and with the tile's Q: the producer may load a later tile's into the buffer
            unsafe { mbarrier::arrive(lay.q_empty(b)) };

            unsafe { store_rows::<F16, D, NO>(o, lse, &acc, (m, l), (bh, rows, q_len), tq) };
            it += 1;
        }
    }
}

macro_rules! flash_wgmma_kernels {
    ($($(#[$doc:meta])+ $name:ident: $ty:ty, $f16:literal, $d:literal, $cons:literal, $qbuf:literal, $threads:literal;)*) => {$(
        $(#[$doc])+
        ///
        /// Parameters: `q_map`, `k_map`, `v_map` (tensor maps in global memory over Q as
        /// `[batch * heads * q_len, head_dim]` and K, V as `[batch * heads * kv_len, head_dim]`, box
        /// 64 x 64, 128-byte swizzle), `o` (output, the shape of Q, 4-byte aligned), `lse`
        /// (`batch * heads * q_len` f32), `sched` ([`FLASH_WGMMA_SCHED_WORDS`] u32, zero at the
        /// launch and zero again after it), `p` (the problem). Grid `(n, 1)` for any `n >= 1`:
        /// block `b` runs query tile `b` of `flash_wgmma_tiles(p, 64 C)` for `C` consumer
        /// warpgroups, then takes tiles from `sched` until none is left (one each when `n` is
        /// their number; persistent when fewer); block [`FLASH_WGMMA_THREADS`] (C = 1: warps 0-3
        /// consume, warp 4 produces) or [`FLASH_WGMMA2_THREADS`] (C = 2: warpgroups 0 and 1
        /// consume, 64 query rows each, warpgroup 2 produces); dynamic shared memory
        /// `flash_wgmma_smem_bytes(head_dim)` (C = 1) or `flash_wgmma2_smem_bytes(head_dim)` (C =
        /// 2). Tiling and thread mapping: the module docs.
        #[kernel(arch = "sm_90a", max_threads = $threads)]
        pub unsafe fn $name(
            q_map: DevicePtr<TensorMap>,
            k_map: DevicePtr<TensorMap>,
            v_map: DevicePtr<TensorMap>,
            o: DevicePtrMut<$ty>,
            lse: DevicePtrMut<f32>,
            sched: DevicePtrMut<u32>,
            p: AttentionParams,
        ) {
            unsafe {
                device::flash_wgmma::<$f16, $d, { $d / 2 }, $cons, { 32 * $cons }, $qbuf>(
                    q_map.as_ptr(),
                    k_map.as_ptr(),
                    v_map.as_ptr(),
                    o.as_mut_ptr() as *mut u16,
                    lse,
                    sched.as_mut_ptr(),
                    p,
                )
            }
        }
    )*};
}

flash_wgmma_kernels! {
    /// FlashAttention-3-style forward on TMA + `wgmma` (sm_90a), bf16 in and out, head dim 64; one
    /// consumer warpgroup.
    flash_fwd_wgmma_bf16_d64: bf16, false, 64, 1, 1, 160;
    /// FlashAttention-3-style forward on TMA + `wgmma` (sm_90a), bf16 in and out, head dim 128; one
    /// consumer warpgroup.
    flash_fwd_wgmma_bf16_d128: bf16, false, 128, 1, 1, 160;
    /// FlashAttention-3-style forward on TMA + `wgmma` (sm_90a), f16 in and out, head dim 64; one
    /// consumer warpgroup.
    flash_fwd_wgmma_f16_d64: f16, true, 64, 1, 1, 160;
    /// FlashAttention-3-style forward on TMA + `wgmma` (sm_90a), f16 in and out, head dim 128; one
    /// consumer warpgroup.
    flash_fwd_wgmma_f16_d128: f16, true, 128, 1, 1, 160;
    /// The two-consumer form (128 query rows per block, K/V tiles shared by both warpgroups), bf16,
    /// head dim 64.
    flash_fwd_wgmma2_bf16_d64: bf16, false, 64, 2, 2, 384;
    /// The two-consumer form, bf16, head dim 128.
    flash_fwd_wgmma2_bf16_d128: bf16, false, 128, 2, 2, 384;
    /// The two-consumer form, f16, head dim 64.
    flash_fwd_wgmma2_f16_d64: f16, true, 64, 2, 2, 384;
    /// The two-consumer form, f16, head dim 128.
    flash_fwd_wgmma2_f16_d128: f16, true, 128, 2, 2, 384;
}

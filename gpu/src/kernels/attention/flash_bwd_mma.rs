//! Flash attention backward, rung 2: FlashAttention-2's backward on `mma.sync` (bf16 or f16 in and
//! out, f32 accumulation), `ldmatrix` fragments, `cp.async` double-buffered tiles, swizzled shared
//! memory (the forward's [`flash_chunk_offset`]). Deterministic: no atomics; every gradient element
//! is owned by one lane of one block and summed in a fixed order, so the same inputs give the same
//! bits.
//!
//! The probabilities are recomputed from the forward's log-sum-exp, `P_ij = e^(scale q_i . k_j -
//! lse_i)`; with `delta_i = dO_i . O_i`:
//!
//! ```text
//! dV_j = sum_i P_ij dO_i      dP_ij = dO_i . V_j      dS_ij = P_ij (dP_ij - delta_i)
//! dQ_i = scale sum_j dS_ij K_j      dK_j = scale sum_i dS_ij Q_i
//! ```
//!
//! Three kernels, launched in this order on one stream:
//!
//! 1. **delta** (`flash_bwd_delta_*`): `delta_i = sum_c dO_ic O_ic` in f32, one warp per query row
//!    (lanes take element pairs, a butterfly sum). Grid `(ceil(q_len / 64), batch * heads)`, block
//!    [`FLASH_BWD_MMA_THREADS`] (4 warps, 16 rows each).
//! 2. **dK, dV** (`flash_bwd_dkdv_mma_*`): a block owns [`FLASH_BWD_MMA_BKV`] key rows; warp `w`
//!    owns keys `16 w .. 16 w + 16` and keeps their dK and dV (16 x D each, f32) in registers. K and
//!    V are copied once; the block walks the query blocks of [`FLASH_BWD_MMA_BQ`] rows that see its
//!    keys (with the causal mask it starts at the first row that sees its first key), Q and dO
//!    double-buffered by `cp.async`. Per query block a warp computes, on `mma.m16n8k16`,
//!    `S^T = K Q^T` and `dP^T = V dO^T` (16 x 64: its K / V rows are the A operand, the Q / dO rows
//!    the B operand "n x k", both by `ldmatrix`), then `P^T` and `dS^T` per element (zero where
//!    masked: queries past `q_len`, keys a query does not see), then `dV += P^T dO` and
//!    `dK += dS^T Q` with `P^T` and `dS^T` packed from the accumulators into A fragments (the
//!    forward's register trick) and dO / Q as the B operand "k x n" (`ldmatrix.trans`).
//!    Grid `(ceil(kv_len / 64), batch * heads)`.
//! 3. **dQ** (`flash_bwd_dq_mma_*`): a block owns [`FLASH_BWD_MMA_BQ`] query rows, warp `w` rows
//!    `16 w .. 16 w + 16` (dQ 16 x D f32 in registers), and walks the key tiles its rows see (K
//!    and V double-buffered): `S = Q K^T`, `dP = dO V^T`, `dS` per element, `dQ += dS K` (K by
//!    `ldmatrix.trans`). Grid `(ceil(q_len / 64), batch * heads)`, the query blocks last first.
//!
//! A lane holds rows `g = lane / 4` and `g + 8` of its warp's 16-row slice and columns `2 t, 2 t +
//! 1` (`t = lane % 4`) of each n8 tile ([`crate::mma::m16n8_c`]). Results are rounded, staged
//! through the warp's own rows of a shared tile it alone read, and stored 16 bytes per lane.
//! Shared memory: [`flash_bwd_mma_smem_bytes`] (96 KiB at D = 128, 48 KiB at D = 64: both
//! kernels hold two 64-row tiles and two stages of two 64-row tiles).

use super::attention::AttentionParams;
use super::flash_mma::flash_chunk_offset;
#[cfg(target_arch = "nvptx64")]
use super::flash_mma::{U32x4, copy_tile, mma16, pack};
use crate::{DevicePtr, DevicePtrMut, kernel};
use crate::{convert, cp_async, math, matrix, mma, shared, sync, thread, warp};
use half::{bf16, f16};

/// Query rows per block (dQ, delta) and per query tile (dK / dV).
pub const FLASH_BWD_MMA_BQ: u32 = 64;
/// Key rows per block (dK / dV) and per key tile (dQ).
pub const FLASH_BWD_MMA_BKV: u32 = 64;
/// Threads per block (4 warps) of every kernel of this rung.
pub const FLASH_BWD_MMA_THREADS: u32 = 128;

/// Dynamic shared memory of the dK / dV and dQ kernels at head dim `d` (the delta kernel uses
/// none): two owned 64-row tiles and two stages of two 64-row tiles, 16-bit elements.
pub const fn flash_bwd_mma_smem_bytes(d: u32) -> u32 {
    (2 * FLASH_BWD_MMA_BKV + 4 * FLASH_BWD_MMA_BQ) * d * 2
}

/// The first query block (of [`FLASH_BWD_MMA_BQ`] rows) that sees key `k0` and the number of
/// query blocks the dK / dV block starting at key `k0` walks (pure: host-tested). Without the mask
/// every block; with it from the block of the first row that sees `k0` (`i >= k0 + q_len -
/// kv_len`).
pub const fn flash_bwd_query_blocks(p: AttentionParams, k0: u32) -> (u32, u32) {
    let end = p.q_len.div_ceil(FLASH_BWD_MMA_BQ);
    let first = if p.causal == 0 {
        0
    } else {
        let f = k0 as i64 + p.q_len as i64 - p.kv_len as i64;
        if f <= 0 {
            0
        } else if f >= p.q_len as i64 {
            p.q_len
        } else {
            f as u32
        }
    };
    let begin = first / FLASH_BWD_MMA_BQ;
    (begin, end.saturating_sub(begin))
}

/// `16 x 8 NS` scores `A[a0 .. a0 + 16] B[0 .. 8 NS]^T` of two swizzled `[rows, D]` tiles (rows of
/// `row_bytes`), A rows by `ldmatrix.x4`, B rows as the "n x k" operand by `ldmatrix.x4`.
///
/// # Safety
/// `a` and `b` must be shared tiles of at least `a0 + 16` and `8 NS` rows, their copies complete.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn rows_dot_rows<const F16: bool, const KS: usize, const NS: usize>(
    a: shared::SharedAddr,
    a0: u32,
    b: shared::SharedAddr,
    row_bytes: u32,
    lane: u32,
) -> [[f32; 4]; NS] {
    let mut s = [[0.0f32; 4]; NS];
    let mut ks = 0;
    while ks < KS {
        let af = unsafe {
            matrix::ldmatrix_x4(a + flash_chunk_offset(row_bytes, a0 + lane % 16, 2 * ks as u32 + lane / 16))
        };
        let mut np = 0;
        while np < NS / 2 {
            let row = np as u32 * 16 + lane % 8 + (lane / 16) * 8;
            let bf =
                unsafe { matrix::ldmatrix_x4(b + flash_chunk_offset(row_bytes, row, 2 * ks as u32 + (lane / 8) % 2)) };
            s[2 * np] = mma16::<F16>(af, [bf[0], bf[1]], s[2 * np]);
            s[2 * np + 1] = mma16::<F16>(af, [bf[2], bf[3]], s[2 * np + 1]);
            np += 1;
        }
        ks += 1;
    }
    s
}

/// `acc (16 x D) += W (16 x 8 NS) B[0 .. 8 NS]`: the weights `w` in accumulator layout, packed two
/// n8 tiles to one A fragment; the tile `b` (rows of `row_bytes`) as the "k x n" operand by
/// `ldmatrix.x4.trans`.
///
/// # Safety
/// `b` must be a shared tile of at least `8 NS` rows, its copies complete.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn weights_times_rows<const F16: bool, const NS: usize, const NO: usize>(
    w: &[[f32; 4]; NS],
    b: shared::SharedAddr,
    row_bytes: u32,
    lane: u32,
    acc: &mut [[f32; 4]; NO],
) {
    let mut kk = 0;
    while kk < NS / 2 {
        let (s0, s1) = (w[2 * kk], w[2 * kk + 1]);
        let pa = [
            pack::<F16>(s0[0], s0[1]),
            pack::<F16>(s0[2], s0[3]),
            pack::<F16>(s1[0], s1[1]),
            pack::<F16>(s1[2], s1[3]),
        ];
        let row = kk as u32 * 16 + lane % 8 + ((lane / 8) % 2) * 8;
        let mut dp = 0;
        while dp < NO / 2 {
            let bf =
                unsafe { matrix::ldmatrix_x4_trans(b + flash_chunk_offset(row_bytes, row, 2 * dp as u32 + lane / 16)) };
            acc[2 * dp] = mma16::<F16>(pa, [bf[0], bf[1]], acc[2 * dp]);
            acc[2 * dp + 1] = mma16::<F16>(pa, [bf[2], bf[3]], acc[2 * dp + 1]);
            dp += 1;
        }
        kk += 1;
    }
}

/// Rounds the warp's `16 x D` accumulator times `mul` into rows `wrow .. wrow + 16` of the shared
/// tile `tile` (which only this warp reads), then stores the rows `row0 + wrow + r < rows` to the
/// `[rows, D]` matrix at `dst`, 16 bytes per lane.
///
/// # Safety
/// `tile` must hold `wrow + 16` rows no other warp touches now; `dst` must be 16-byte aligned and
/// hold `rows` rows of `D`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn store_rows<const F16: bool, const D: u32, const NO: usize>(
    acc: &[[f32; 4]; NO],
    mul: f32,
    tile: shared::SharedAddr,
    wrow: u32,
    dst: *mut u16,
    row0: u32,
    rows: u32,
    lane: u32,
) {
    let row_bytes = D * 2;
    let (g, tq) = (lane / 4, lane % 4);
    sync::sync_warp(warp::FULL_MASK);
    let mut h = 0;
    while h < 2 {
        let r = wrow + g + 8 * h as u32;
        let mut n = 0;
        while n < NO {
            let col = n as u32 * 8 + 2 * tq;
            let word = pack::<F16>(acc[n][2 * h] * mul, acc[n][2 * h + 1] * mul);
            unsafe { shared::st_shared_b32(tile + flash_chunk_offset(row_bytes, r, col / 8) + (col % 8) * 2, word) };
            n += 1;
        }
        h += 1;
    }
    sync::sync_warp(warp::FULL_MASK);
    let per_row = D / 8;
    let mut e = lane;
    while e < 16 * per_row {
        let (r, c) = (e / per_row, e % per_row);
        let row = row0 + wrow + r;
        if row < rows {
            let x = unsafe { shared::ld_shared_v4(tile + flash_chunk_offset(row_bytes, wrow + r, c)) };
            unsafe { (dst.add((row * D + c * 8) as usize) as *mut U32x4).write(U32x4(x)) };
        }
        e += 32;
    }
}

/// A 16-bit element as f32.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn widen<const F16: bool>(bits: u16) -> f32 {
    if F16 { convert::f16_bits_to_f32(bits) } else { convert::bf16_bits_to_f32(bits) }
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn delta_rows<const F16: bool>(o: *const u16, d_o: *const u16, delta: *mut f32, p: AttentionParams) {
    let (lane, w) = (thread::lane_id(), thread::warp_id());
    let bh = thread::block_idx_y() as usize;
    let d = p.head_dim;
    let mut r = 0;
    while r < 16 {
        let row = thread::block_idx_x() * FLASH_BWD_MMA_BQ + w * 16 + r;
        if row < p.q_len {
            let base = (bh * p.q_len as usize + row as usize) * d as usize;
            let (op, dp) = unsafe { (o.add(base) as *const u32, d_o.add(base) as *const u32) };
            let mut sum = 0.0f32;
            let mut e = lane;
            while e < d / 2 {
                let (a, b) = unsafe { (*op.add(e as usize), *dp.add(e as usize)) };
                sum = math::fma(widen::<F16>(a as u16), widen::<F16>(b as u16), sum);
                sum = math::fma(widen::<F16>((a >> 16) as u16), widen::<F16>((b >> 16) as u16), sum);
                e += 32;
            }
            let sum = warp::reduce_sum_f32(sum);
            if lane == 0 {
                unsafe { *delta.add(bh * p.q_len as usize + row as usize) = sum };
            }
        }
        r += 1;
    }
}

/// The pointers of the dK / dV and dQ kernels, as 16-bit words.
#[cfg(target_arch = "nvptx64")]
#[derive(Clone, Copy)]
struct Ptrs {
    q: *const u16,
    k: *const u16,
    v: *const u16,
    d_o: *const u16,
    lse: *const f32,
    delta: *const f32,
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn dkdv_body<const F16: bool, const D: u32, const KS: usize, const NO: usize>(
    ptr: Ptrs,
    dk: *mut u16,
    dv: *mut u16,
    p: AttentionParams,
) {
    const BQ: u32 = FLASH_BWD_MMA_BQ;
    const BKV: u32 = FLASH_BWD_MMA_BKV;
    const NS: usize = (FLASH_BWD_MMA_BQ / 8) as usize;
    const { assert!(KS as u32 == D / 16 && NO as u32 == D / 8 && (D == 64 || D == 128)) };
    let row_bytes = D * 2;
    let tile_bytes = BQ * row_bytes;
    let (t, lane, w) = (thread::thread_idx_x(), thread::lane_id(), thread::warp_id());
    let bh = thread::block_idx_y() as usize;
    // the first key blocks see the most query blocks under the mask: they start first
    let k0 = thread::block_idx_x() * BKV;
    let (q_len, kv_len) = (p.q_len, p.kv_len);
    let (qb, kb, lb) = (bh * q_len as usize * D as usize, bh * kv_len as usize * D as usize, bh * q_len as usize);
    let smem = shared::dynamic_smem_addr();
    let (k_tile, v_tile) = (smem, smem + tile_bytes);
    let stage = |j: u32| smem + 2 * tile_bytes + (j % 2) * 2 * tile_bytes;
    let (qp, kp, vp, dop) = unsafe { (ptr.q.add(qb), ptr.k.add(kb), ptr.v.add(kb), ptr.d_o.add(qb)) };
    let (lse, delta) = unsafe { (ptr.lse.add(lb), ptr.delta.add(lb)) };
    let (i0, n_blocks) = flash_bwd_query_blocks(p, k0);

    unsafe {
        copy_tile::<D, BKV>(kp, kv_len, k0, k_tile, t);
        copy_tile::<D, BKV>(vp, kv_len, k0, v_tile, t);
    }
    if n_blocks > 0 {
        unsafe {
            copy_tile::<D, BQ>(qp, q_len, i0 * BQ, stage(0), t);
            copy_tile::<D, BQ>(dop, q_len, i0 * BQ, stage(0) + tile_bytes, t);
        }
    }
    cp_async::commit_group();

    let wrow = w * 16;
    let g = lane / 4;
    let scale_log2 = p.scale * core::f32::consts::LOG2_E;
    let keys = [k0 + wrow + g, k0 + wrow + g + 8];
    let mut dk_acc = [[0.0f32; 4]; NO];
    let mut dv_acc = [[0.0f32; 4]; NO];

    let mut j = 0;
    while j < n_blocks {
        if j + 1 < n_blocks {
            let next = stage(j + 1);
            unsafe {
                copy_tile::<D, BQ>(qp, q_len, (i0 + j + 1) * BQ, next, t);
                copy_tile::<D, BQ>(dop, q_len, (i0 + j + 1) * BQ, next + tile_bytes, t);
            }
        }
        cp_async::commit_group();
        cp_async::wait_group::<1>();
        sync::sync_threads();
        let (qt, dot) = (stage(j), stage(j) + tile_bytes);
        let q0 = (i0 + j) * BQ;

        // S^T = K Q^T and dP^T = V dO^T: 16 keys x 64 queries per warp
        let mut s = unsafe { rows_dot_rows::<F16, KS, NS>(k_tile, wrow, qt, row_bytes, lane) };
        let mut dp = unsafe { rows_dot_rows::<F16, KS, NS>(v_tile, wrow, dot, row_bytes, lane) };
        // P^T and dS^T (zero where masked: queries past q_len, keys a query does not see)
        let masked = q0 + BQ > q_len || k0 + BKV > kv_len || (p.causal != 0 && k0 + BKV > p.visible_keys(q0));
        let mut nt = 0;
        while nt < NS {
            let mut i = 0;
            while i < 4 {
                let (_, c) = mma::m16n8_c(lane, i as u32);
                let query = q0 + nt as u32 * 8 + c;
                let seen = !masked || (query < q_len && keys[i / 2] < p.visible_keys(query));
                let (pv, ds) = if seen {
                    let l = unsafe { *lse.add(query as usize) };
                    let pv = math::exp2_fast(math::fma(s[nt][i], scale_log2, -l * core::f32::consts::LOG2_E));
                    (pv, pv * (dp[nt][i] - unsafe { *delta.add(query as usize) }))
                } else {
                    (0.0, 0.0)
                };
                s[nt][i] = pv;
                dp[nt][i] = ds;
                i += 1;
            }
            nt += 1;
        }
        // dV += P^T dO, dK += dS^T Q
        unsafe {
            weights_times_rows::<F16, NS, NO>(&s, dot, row_bytes, lane, &mut dv_acc);
            weights_times_rows::<F16, NS, NO>(&dp, qt, row_bytes, lane, &mut dk_acc);
        }
        // every warp is done with this stage before the next iteration refills it
        sync::sync_threads();
        j += 1;
    }
    cp_async::wait_all();
    // every thread's copies have landed before a warp reuses its rows of the owned tile (a tile
    // that sees no keys skips the loop and its barriers)
    sync::sync_threads();
    // the K and V tiles' rows wrow.. were read by this warp alone
    unsafe {
        store_rows::<F16, D, NO>(&dk_acc, p.scale, k_tile, wrow, dk.add(kb), k0, kv_len, lane);
        store_rows::<F16, D, NO>(&dv_acc, 1.0, v_tile, wrow, dv.add(kb), k0, kv_len, lane);
    }
}

#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn dq_body<const F16: bool, const D: u32, const KS: usize, const NO: usize>(
    ptr: Ptrs,
    dq: *mut u16,
    p: AttentionParams,
) {
    const BQ: u32 = FLASH_BWD_MMA_BQ;
    const BKV: u32 = FLASH_BWD_MMA_BKV;
    const NS: usize = (FLASH_BWD_MMA_BKV / 8) as usize;
    const { assert!(KS as u32 == D / 16 && NO as u32 == D / 8 && (D == 64 || D == 128)) };
    let row_bytes = D * 2;
    let tile_bytes = BKV * row_bytes;
    let (t, lane, w) = (thread::thread_idx_x(), thread::lane_id(), thread::warp_id());
    let g = lane / 4;
    let bh = thread::block_idx_y() as usize;
    let q0 = (thread::grid_dim_x() - 1 - thread::block_idx_x()) * BQ;
    let (q_len, kv_len) = (p.q_len, p.kv_len);
    let (qb, kb, lb) = (bh * q_len as usize * D as usize, bh * kv_len as usize * D as usize, bh * q_len as usize);
    let smem = shared::dynamic_smem_addr();
    let (q_tile, do_tile) = (smem, smem + BQ * row_bytes);
    let stage = |j: u32| smem + 2 * BQ * row_bytes + (j % 2) * 2 * tile_bytes;
    let (qp, kp, vp, dop) = unsafe { (ptr.q.add(qb), ptr.k.add(kb), ptr.v.add(kb), ptr.d_o.add(qb)) };
    let n_keys = p.keys_for_rows(q0, BQ);
    let n_tiles = n_keys.div_ceil(BKV);

    unsafe {
        copy_tile::<D, BQ>(qp, q_len, q0, q_tile, t);
        copy_tile::<D, BQ>(dop, q_len, q0, do_tile, t);
    }
    if n_tiles > 0 {
        unsafe {
            copy_tile::<D, BKV>(kp, kv_len, 0, stage(0), t);
            copy_tile::<D, BKV>(vp, kv_len, 0, stage(0) + tile_bytes, t);
        }
    }
    cp_async::commit_group();

    let wrow = w * 16;
    let scale_log2 = p.scale * core::f32::consts::LOG2_E;
    let rows = [q0 + wrow + g, q0 + wrow + g + 8];
    // per row: the log-sum-exp in log2 units (-inf: the row sees nothing or is past q_len),
    // delta, and the keys it sees
    let mut lse2 = [f32::NEG_INFINITY; 2];
    let mut dl = [0.0f32; 2];
    let mut vis = [0u32; 2];
    let mut h = 0;
    while h < 2 {
        if rows[h] < q_len {
            lse2[h] = unsafe { *ptr.lse.add(lb + rows[h] as usize) } * core::f32::consts::LOG2_E;
            dl[h] = unsafe { *ptr.delta.add(lb + rows[h] as usize) };
            vis[h] = if lse2[h] == f32::NEG_INFINITY { 0 } else { p.visible_keys(rows[h]) };
        }
        h += 1;
    }
    let mut dq_acc = [[0.0f32; 4]; NO];

    let mut j = 0;
    while j < n_tiles {
        if j + 1 < n_tiles {
            let next = stage(j + 1);
            unsafe {
                copy_tile::<D, BKV>(kp, kv_len, (j + 1) * BKV, next, t);
                copy_tile::<D, BKV>(vp, kv_len, (j + 1) * BKV, next + tile_bytes, t);
            }
        }
        cp_async::commit_group();
        cp_async::wait_group::<1>();
        sync::sync_threads();
        let (kt, vt) = (stage(j), stage(j) + tile_bytes);
        let k0 = j * BKV;

        // S = Q K^T and dP = dO V^T: 16 rows x 64 keys per warp
        let mut s = unsafe { rows_dot_rows::<F16, KS, NS>(q_tile, wrow, kt, row_bytes, lane) };
        let dp = unsafe { rows_dot_rows::<F16, KS, NS>(do_tile, wrow, vt, row_bytes, lane) };
        // dS (zero where masked), into s
        let mut nt = 0;
        while nt < NS {
            let mut i = 0;
            while i < 4 {
                let (_, c) = mma::m16n8_c(lane, i as u32);
                let h = i / 2;
                s[nt][i] = if k0 + nt as u32 * 8 + c < vis[h] {
                    let pv = math::exp2_fast(math::fma(s[nt][i], scale_log2, -lse2[h]));
                    pv * (dp[nt][i] - dl[h])
                } else {
                    0.0
                };
                i += 1;
            }
            nt += 1;
        }
        // dQ += dS K
        unsafe { weights_times_rows::<F16, NS, NO>(&s, kt, row_bytes, lane, &mut dq_acc) };
        sync::sync_threads();
        j += 1;
    }
    cp_async::wait_all();
    // every thread's copies have landed before a warp reuses its rows of the owned tile (a tile
    // that sees no keys skips the loop and its barriers)
    sync::sync_threads();
    // the Q tile's rows wrow.. were read by this warp alone
    unsafe { store_rows::<F16, D, NO>(&dq_acc, p.scale, q_tile, wrow, dq.add(qb), q0, q_len, lane) };
}

macro_rules! flash_bwd_mma_kernels {
    ($($(#[$doc:meta])+ $delta:ident, $dkdv:ident, $dq:ident: $ty:ty, $f16:literal, $d:literal;)*) => {$(
        $(#[$doc])+
        /// The delta pass: `delta_i = dO_i . O_i` (f32).
        ///
        /// Parameters: `o`, `d_o` (the forward's output and its gradient, `[batch, heads, q_len,
        /// head_dim]`), `delta` (`batch * heads * q_len` f32, written), `p`. Grid
        /// `(ceil(q_len / FLASH_BWD_MMA_BQ), batch * heads)`; block [`FLASH_BWD_MMA_THREADS`], one
        /// warp per row, 16 rows per warp; no shared memory.
        #[kernel(max_threads = 128)]
        pub unsafe fn $delta(o: DevicePtr<$ty>, d_o: DevicePtr<$ty>, delta: DevicePtrMut<f32>, p: AttentionParams) {
            unsafe { delta_rows::<$f16>(o.as_ptr() as *const u16, d_o.as_ptr() as *const u16, delta.as_mut_ptr(), p) }
        }

        $(#[$doc])+
        /// The dK / dV pass.
        ///
        /// Parameters: `q`, `k`, `v`, `d_o` (16-byte aligned), `lse` (the forward's), `delta` (the
        /// delta pass's), `dk`, `dv` (written, the shape of `k`, 16-byte aligned), `p`. Grid
        /// `(ceil(kv_len / FLASH_BWD_MMA_BKV), batch * heads)`; block [`FLASH_BWD_MMA_THREADS`];
        /// dynamic shared memory `flash_bwd_mma_smem_bytes(head_dim)`. Tiling and thread mapping:
        /// the module docs.
        #[kernel(max_threads = 128)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $dkdv(
            q: DevicePtr<$ty>,
            k: DevicePtr<$ty>,
            v: DevicePtr<$ty>,
            d_o: DevicePtr<$ty>,
            lse: DevicePtr<f32>,
            delta: DevicePtr<f32>,
            dk: DevicePtrMut<$ty>,
            dv: DevicePtrMut<$ty>,
            p: AttentionParams,
        ) {
            let ptr = Ptrs {
                q: q.as_ptr() as *const u16,
                k: k.as_ptr() as *const u16,
                v: v.as_ptr() as *const u16,
                d_o: d_o.as_ptr() as *const u16,
                lse: lse.as_ptr(),
                delta: delta.as_ptr(),
            };
            unsafe {
                dkdv_body::<$f16, $d, { $d / 16 }, { $d / 8 }>(ptr, dk.as_mut_ptr() as *mut u16, dv.as_mut_ptr() as *mut u16, p)
            }
        }

        $(#[$doc])+
        /// The dQ pass.
        ///
        /// Parameters: `q`, `k`, `v`, `d_o` (16-byte aligned), `lse`, `delta`, `dq` (written, the
        /// shape of `q`, 16-byte aligned), `p`. Grid `(ceil(q_len / FLASH_BWD_MMA_BQ), batch *
        /// heads)`; block [`FLASH_BWD_MMA_THREADS`]; dynamic shared memory
        /// `flash_bwd_mma_smem_bytes(head_dim)`. Tiling and thread mapping: the module docs.
        #[kernel(max_threads = 128)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn $dq(
            q: DevicePtr<$ty>,
            k: DevicePtr<$ty>,
            v: DevicePtr<$ty>,
            d_o: DevicePtr<$ty>,
            lse: DevicePtr<f32>,
            delta: DevicePtr<f32>,
            dq: DevicePtrMut<$ty>,
            p: AttentionParams,
        ) {
            let ptr = Ptrs {
                q: q.as_ptr() as *const u16,
                k: k.as_ptr() as *const u16,
                v: v.as_ptr() as *const u16,
                d_o: d_o.as_ptr() as *const u16,
                lse: lse.as_ptr(),
                delta: delta.as_ptr(),
            };
            unsafe { dq_body::<$f16, $d, { $d / 16 }, { $d / 8 }>(ptr, dq.as_mut_ptr() as *mut u16, p) }
        }
    )*};
}

flash_bwd_mma_kernels! {
    /// FlashAttention-2 backward on `mma.sync`, bf16 in and out (f32 accumulation), head dim 64.
    flash_bwd_delta_bf16_d64, flash_bwd_dkdv_mma_bf16_d64, flash_bwd_dq_mma_bf16_d64: bf16, false, 64;
    /// FlashAttention-2 backward on `mma.sync`, bf16 in and out (f32 accumulation), head dim 128.
    flash_bwd_delta_bf16_d128, flash_bwd_dkdv_mma_bf16_d128, flash_bwd_dq_mma_bf16_d128: bf16, false, 128;
    /// FlashAttention-2 backward on `mma.sync`, f16 in and out (f32 accumulation), head dim 64.
    flash_bwd_delta_f16_d64, flash_bwd_dkdv_mma_f16_d64, flash_bwd_dq_mma_f16_d64: f16, true, 64;
    /// FlashAttention-2 backward on `mma.sync`, f16 in and out (f32 accumulation), head dim 128.
    flash_bwd_delta_f16_d128, flash_bwd_dkdv_mma_f16_d128, flash_bwd_dq_mma_f16_d128: f16, true, 128;
}

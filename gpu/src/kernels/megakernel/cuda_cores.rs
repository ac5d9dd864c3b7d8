//! The training megakernel, version 1: one persistent block per SM walks its instruction list
//! (built by the host, `kiln::megakernel`), waiting on and signalling global counters. Each
//! instruction is one `tile x tile` output tile (`tile` 16, 32 or 64, chosen per model: small models
//! take small tiles so that their few rows still spread over many SMs).
//!
//! - Products (`LINEAR_FWD`, `LINEAR_BWD_INPUT`, `LINEAR_BWD_WEIGHT`) stage K slabs of both
//!   operands in shared memory with coalesced loads (each operand described by its two strides, so
//!   `A B^T`, `A B` and `A^T B` share one loader), then each thread of the 16 x 16 block computes a
//!   `tile/16 x tile/16` register block with CUDA-core FMAs. Every output is one FMA chain in
//!   ascending k, the CPU interpreter's order, so the products match it bit for bit.
//! - The cross-entropy gradient finds each row's maximum and sum of exponentials once per tile (a
//!   warp per row) instead of once per element.
//! - Waits: thread 0 polls the counter with `ld.relaxed.gpu` (and a fence once it is met),
//!   bounded by the global timer from the counter's last change; a stall (or another block's
//!   abort) writes the block's record (instruction index, counter, value seen, value wanted: the
//!   first stall's), sets the abort flag and returns; every waiting block does the same, and the
//!   host reports all records as an error instead of hanging. A block barrier then lets the whole
//!   block read what the producers wrote.
//! - Signals: after a block barrier, thread 0 issues `fence.acq_rel.gpu` and adds 1 to each signal
//!   counter.
//! - Grid: one block per SM (all co-resident), 256 threads.
//!
//! This version keeps every product an FMA chain in the CPU interpreter's order, so its results are
//! the interpreter's bit for bit (the reference the schedule is tested with). The design's data path
//! (TMA pages, tensor cores, loads overlapping math) is version 2,
//! [`megakernel_tc`](super::megakernel_tc), which shares this version's counters between blocks
//! (the waits, signals, stall records and trace words below) and its SGD update. Speed against
//! PyTorch is in `benches/results/mlp_step.md`.

use crate::megakernel::{
    Instruction, MegaBuffers, MegaConfig, NO_COUNTER, SLAB, TILES, loss, opcode, pitch, record_offset, trace,
};
use crate::{atomic, fence, kernel, math, shared_array, sync, thread, warp};

/// Threads per block.
pub const MEGA_THREADS: u32 = 256;

shared_array!(fn mk_flag() -> [u32; 4], align 16);

/// Reads a `u32` written by another block (acquire, GPU scope).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) unsafe fn acquire(p: crate::DevicePtrMut<u32>, i: u32) -> u32 {
    unsafe { atomic::load_acquire_gpu(p.as_mut_ptr().add(i as usize)) }
}

/// Gives up the step: writes this block's stall record for `role` (see [`record_offset`]): 1 +
/// instruction index, what was waited on, the value seen, the value wanted; then raises the abort
/// flag (after the counters). The first stall of a role takes its record whole (a compare-and-swap
/// on the first word) and later ones leave it: they are usually the first one's consequences
/// (waits given up on its abort), and four words written by two warps at once would mix. The
/// record comes before the flag (a GPU fence between), so a waiter that gives up on this stall's
/// abort cannot take the record first.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) unsafe fn record_stall(
    b: &MegaBuffers,
    cfg: &MegaConfig,
    role: u32,
    idx: u32,
    what: u32,
    seen: u32,
    want: u32,
) {
    unsafe {
        let rec = record_offset(cfg.counters, thread::block_idx_x(), role) as usize;
        if atomic::atomic_cas_u32(b.counters.as_mut_ptr().add(rec), 0, idx + 1) == 0 {
            b.counters.write(rec + 1, what);
            b.counters.write(rec + 2, seen);
            b.counters.write(rec + 3, want);
        }
        fence::fence_gpu();
        atomic::atomic_cas_u32(b.counters.as_mut_ptr().add(cfg.counters as usize), 0, 1);
    }
}

/// Whether some block has given up the step.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) unsafe fn aborted(b: &MegaBuffers, cfg: &MegaConfig) -> bool {
    unsafe { acquire(b.counters, cfg.counters) != 0 }
}

/// One thread waits until `counters[c] >= v` (or an abort); returns false when the block must
/// stop, after writing its stall record for `role`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) unsafe fn wait(b: &MegaBuffers, cfg: &MegaConfig, c: u32, v: u32, idx: u32, role: u32) -> bool {
    if c == NO_COUNTER {
        return true;
    }
    let mut start = thread::globaltimer_ns();
    let mut last = u32::MAX;
    let mut polls = 0u32;
    loop {
        // Poll relaxed, acquire once: an acquire load (a load and an L1 invalidation) per poll
        // would invalidate the SM's L1 every time. The abort flag is asked only every
        // `GIVE_UP_EVERY` polls, for the same reason (it orders nothing).
        let seen = unsafe { atomic::load_relaxed_gpu(b.counters.as_mut_ptr().add(c as usize)) };
        if seen >= v {
            fence::fence_gpu();
            return true;
        }
        if seen != last {
            // progress: the limit counts from the last change, so a long but moving wait is fine
            (last, start) = (seen, thread::globaltimer_ns());
        }
        polls = polls.wrapping_add(1);
        if (polls % crate::mbarrier::GIVE_UP_EVERY == 0 && unsafe { aborted(b, cfg) })
            || thread::globaltimer_ns().wrapping_sub(start) > cfg.wait_limit_ns as u64
        {
            unsafe { record_stall(b, cfg, role, idx, c, seen, v) };
            return false;
        }
    }
}

/// Records timestamp `what` ([`trace`](crate::megakernel::trace)) of instruction `idx` when the
/// step is traced (one thread); an untraced step reads no timer.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) unsafe fn stamp(b: &MegaBuffers, idx: u32, what: u32) {
    if b.trace.addr() != 0 {
        unsafe { record(b, idx, what, thread::globaltimer_ns()) };
    }
}

/// Writes `value` as trace word `what` of instruction `idx` if the step is traced (one thread).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) unsafe fn record(b: &MegaBuffers, idx: u32, what: u32, value: u64) {
    if b.trace.addr() != 0 {
        let at = crate::megakernel::trace::WORDS * idx + what;
        unsafe { b.trace.write(at as usize, value) };
    }
}

/// After a block's tile is written and published to it: adds 1 to the instruction's signal
/// counters, behind a GPU-scope fence (one thread).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) unsafe fn signal(b: &MegaBuffers, ins: &Instruction) {
    fence::fence_gpu();
    let p = b.counters.as_mut_ptr();
    for c in [ins.signal, ins.signal2] {
        if c != NO_COUNTER {
            unsafe { atomic::atomic_add_u32(p.add(c as usize), 1) };
        }
    }
}

/// One operand of a tile product: element `(m, k)` is `p[base + m * sm + k * sk]`, live for
/// `m < lim` (the K range is the product's).
#[cfg(target_arch = "nvptx64")]
#[derive(Clone, Copy)]
struct Operand {
    p: crate::DevicePtr<f32>,
    base: u32,
    sm: u32,
    sk: u32,
    lim: u32,
}

// Shared-memory slabs of the two operands, `[k][m]` with a row stride of `tile + 4`: rows stay
// 16-byte aligned, so each thread reads its `R` consecutive values with one vector load.
#[cfg(target_arch = "nvptx64")]
const SLAB_WORDS: usize = (SLAB + 4 * SLAB / TILES[0]) as usize;
#[cfg(target_arch = "nvptx64")]
const fn row_stride(tile: u32) -> usize {
    tile as usize + 4
}
shared_array!(fn mk_slab_a() -> [f32; SLAB_WORDS], align 16);
shared_array!(fn mk_slab_b() -> [f32; SLAB_WORDS], align 16);
// Row maximum and sum of exponentials for the loss gradient's rows.
shared_array!(fn mk_stats() -> [f32; 2 * MAX_TILE], align 16);
#[cfg(target_arch = "nvptx64")]
const MAX_TILE: usize = TILES[TILES.len() - 1] as usize;

/// Elements of one slab each thread loads.
#[cfg(target_arch = "nvptx64")]
const PER_THREAD: usize = (SLAB / MEGA_THREADS) as usize;

/// The `(m, k)` position in a slab of the `j`-th element thread `t` moves: threads walk the
/// operand's contiguous dimension, so the global loads coalesce.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn slab_pos<const R: usize>(op: &Operand, t: u32, j: usize) -> (u32, u32) {
    let tile = 16 * R as u32;
    let ks = SLAB / tile;
    let idx = t + j as u32 * MEGA_THREADS;
    if op.sk == 1 { (idx / ks, idx % ks) } else { (idx % tile, idx / tile) }
}

/// This thread's elements of the `tile x kn` block of `op` at `(m0, k0)`, zero outside the live
/// rows and `kn`. All loads are independent, so they are in flight together.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn fetch_slab<const R: usize>(op: Operand, m0: u32, k0: u32, kn: u32) -> [f32; PER_THREAD] {
    let t = thread::thread_idx_x();
    core::array::from_fn(|j| {
        let (m, k) = slab_pos::<R>(&op, t, j);
        if m0 + m < op.lim && k < kn {
            unsafe { op.p.read((op.base + (m0 + m) * op.sm + (k0 + k) * op.sk) as usize) }
        } else {
            0.0
        }
    })
}

/// Stores what [`fetch_slab`] loaded into `slab` as `[k][m]` (row stride `tile + 4`).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn store_slab<const R: usize>(slab: *mut [f32; SLAB_WORDS], op: &Operand, v: &[f32; PER_THREAD]) {
    let tile = 16 * R as u32;
    let t = thread::thread_idx_x();
    let p = slab as *mut f32;
    for (j, &x) in v.iter().enumerate() {
        let (m, k) = slab_pos::<R>(op, t, j);
        unsafe { *p.add(k as usize * row_stride(tile) + m as usize) = x };
    }
}

/// `R` consecutive shared-memory floats at `p` (16-byte aligned for `R = 4`, 8 for `R = 2`) in one
/// vector load.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn read_r<const R: usize>(p: *const f32) -> [f32; R] {
    if R == 4 {
        let v = unsafe { *(p as *const crate::F32x4) };
        core::array::from_fn(|i| v.0[i])
    } else if R == 2 {
        let v = unsafe { *(p as *const crate::F32x2) };
        core::array::from_fn(|i| v.0[i])
    } else {
        core::array::from_fn(|i| unsafe { *p.add(i) })
    }
}

/// `C[m][n] = sum_k A(m0 + m, k) B(n0 + n, k)` over a `16R x 16R` tile: thread `(ty, tx)` of the
/// 16 x 16 block holds `C[R ty + i][R tx + j]` for `i, j < R`, and reads its `R` values of each
/// operand per k with one vector load. K goes through shared memory in slabs of `SLAB / tile`;
/// every output is one FMA chain in ascending k (as the CPU interpreter's), with no FMA past `kdim`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn tile_product<const R: usize>(a: Operand, b: Operand, m0: u32, n0: u32, kdim: u32) -> [[f32; R]; R] {
    let tile = 16 * R as u32;
    let ks = SLAB / tile;
    let (sa, sb) = (mk_slab_a(), mk_slab_b());
    let t = thread::thread_idx_x();
    let (ty, tx) = ((t / 16) as usize, (t % 16) as usize);
    let mut acc = [[0.0f32; R]; R];
    let kn_at = |k0: u32| if kdim - k0 < ks { kdim - k0 } else { ks };
    // Register double buffering: the next slab's loads are issued before this slab's math and
    // stored to shared memory after it.
    let (mut va, mut vb) = if kdim > 0 {
        unsafe { (fetch_slab::<R>(a, m0, 0, kn_at(0)), fetch_slab::<R>(b, n0, 0, kn_at(0))) }
    } else {
        ([0.0; PER_THREAD], [0.0; PER_THREAD])
    };
    let mut k0 = 0;
    while k0 < kdim {
        let kn = kn_at(k0);
        unsafe {
            store_slab::<R>(sa, &a, &va);
            store_slab::<R>(sb, &b, &vb);
        }
        sync::sync_threads();
        if k0 + ks < kdim {
            let next = k0 + ks;
            unsafe {
                (va, vb) = (fetch_slab::<R>(a, m0, next, kn_at(next)), fetch_slab::<R>(b, n0, next, kn_at(next)))
            };
        }
        // Rows of both slabs at k (`kn <= ks`, so within the arrays: no bounds checks in the loop).
        let (pa, pb) = (sa as *const f32, sb as *const f32);
        let step = |k: usize, acc: &mut [[f32; R]; R]| {
            let row = k * row_stride(tile);
            let av: [f32; R] = unsafe { read_r::<R>(pa.add(row + R * ty)) };
            let bv: [f32; R] = unsafe { read_r::<R>(pb.add(row + R * tx)) };
            for i in 0..R {
                for j in 0..R {
                    acc[i][j] = math::fma(av[i], bv[j], acc[i][j]);
                }
            }
        };
        let mut k = 0;
        while k + 4 <= kn as usize {
            for u in 0..4 {
                step(k + u, &mut acc);
            }
            k += 4;
        }
        while k < kn as usize {
            step(k, &mut acc);
            k += 1;
        }
        sync::sync_threads();
        k0 += ks;
    }
    acc
}

/// Calls `f(row, col, value)` for each live output of this thread's part of a tile product.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn for_each_output<const R: usize>(
    acc: &[[f32; R]; R],
    m0: u32,
    n0: u32,
    rows: u32,
    cols: u32,
    mut f: impl FnMut(u32, u32, f32),
) {
    let t = thread::thread_idx_x();
    for (i, acc_row) in acc.iter().enumerate() {
        for (j, &v) in acc_row.iter().enumerate() {
            let (r, c) = (m0 + (t / 16) * R as u32 + i as u32, n0 + (t % 16) * R as u32 + j as u32);
            if r < rows && c < cols {
                f(r, c, v);
            }
        }
    }
}

/// Computes one instruction's `16R x 16R` tile (see the module docs for each opcode's product).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn run<const R: usize>(b: &MegaBuffers, cfg: &MegaConfig, i: &Instruction) {
    let tile = 16 * R as u32;
    let l = i.layer;
    let rd = |p: crate::DevicePtr<u32>, k: u32| unsafe { p.read(k as usize) };
    let din = rd(b.dims, l);
    let dout = rd(b.dims, l + 1);
    let (pin, pout) = (pitch(din), pitch(dout));
    let (w, a_in, a_out) = (rd(b.w_off, l), rd(b.a_off, l), rd(b.a_off, l + 1));
    let (m0, n0) = (i.tile_row * tile, i.tile_col * tile);
    let f = |p: crate::DevicePtrMut<f32>, k: u32| unsafe { p.as_const().read(k as usize) };
    let (act, grad, weights) = (b.act.as_const(), b.grad.as_const(), b.weights.as_const());
    match i.opcode {
        opcode::LINEAR_FWD => {
            // act[l+1][r][o] = f(sum_k act[l][r][k] W[l][o][k])
            let x = Operand { p: act, base: a_in, sm: pin, sk: 1, lim: cfg.batch };
            let wt = Operand { p: weights, base: w, sm: pin, sk: 1, lim: dout };
            let acc = unsafe { tile_product::<R>(x, wt, m0, n0, din) };
            let hidden = l + 1 < cfg.layers;
            for_each_output(&acc, m0, n0, cfg.batch, dout, |r, c, v| unsafe {
                b.act.write((a_out + r * pout + c) as usize, if hidden { v.max(0.0) } else { v })
            });
        }
        opcode::LINEAR_BWD_INPUT => {
            // grad[l][r][k] = relu'(act[l][r][k]) sum_o grad[l+1][r][o] W[l][o][k]
            let g = Operand { p: grad, base: a_out, sm: pout, sk: 1, lim: cfg.batch };
            let wt = Operand { p: weights, base: w, sm: 1, sk: pin, lim: din };
            let acc = unsafe { tile_product::<R>(g, wt, m0, n0, dout) };
            for_each_output(&acc, m0, n0, cfg.batch, din, |r, c, v| unsafe {
                let j = a_in + r * pin + c;
                b.grad.write(j as usize, if f(b.act, j) > 0.0 { v } else { 0.0 })
            });
        }
        opcode::LINEAR_BWD_WEIGHT | opcode::LINEAR_BWD_WEIGHT_SGD => {
            // dW[l][o][k] = sum_r grad[l+1][r][o] act[l][r][k]
            let g = Operand { p: grad, base: a_out, sm: 1, sk: pout, lim: dout };
            let x = Operand { p: act, base: a_in, sm: 1, sk: pin, lim: din };
            let acc = unsafe { tile_product::<R>(g, x, m0, n0, cfg.batch) };
            for_each_output(&acc, m0, n0, dout, din, |o, k, v| unsafe { b.dw.write((w + o * pin + k) as usize, v) });
            if i.opcode == opcode::LINEAR_BWD_WEIGHT_SGD {
                // the update of the same tile, from the dW the block just wrote (the same
                // arithmetic as a separate SGD_UPDATE, so the results stay the interpreter's)
                sync::sync_threads();
                unsafe { sgd_update(b, cfg, i, tile, MEGA_THREADS, thread::thread_idx_x(), |_, _, _| {}) }
            }
        }
        opcode::LOSS_GRAD => unsafe {
            let t = thread::thread_idx_x();
            let stats = mk_stats() as *mut f32;
            if cfg.loss != loss::MSE {
                loss_row_stats(b, cfg, i, tile, stats, MEGA_THREADS, t);
                sync::sync_threads();
            }
            loss_grad(b, cfg, i, tile, stats, MEGA_THREADS, t);
        },
        opcode::SGD_UPDATE => unsafe {
            sgd_update(b, cfg, i, tile, MEGA_THREADS, thread::thread_idx_x(), |_, _, _| {})
        },
        _ => {}
    }
}

/// `W[l] -= lr dW[l]` (with momentum when enabled) on one tile: thread `t` of `threads` takes
/// elements `t, t + threads, ...`. `then(o, k, w)` runs after each new weight `w` (row `o`, column
/// `k` of `W[l]`) is stored: the tensor-core path writes its copies of the weights there.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) unsafe fn sgd_update(
    b: &MegaBuffers,
    cfg: &MegaConfig,
    i: &Instruction,
    tile: u32,
    threads: u32,
    t: u32,
    mut then: impl FnMut(u32, u32, f32),
) {
    let f = |p: crate::DevicePtrMut<f32>, k: u32| unsafe { p.as_const().read(k as usize) };
    let (din, dout) = unsafe { (b.dims.read(i.layer as usize), b.dims.read(i.layer as usize + 1)) };
    let w = unsafe { b.w_off.read(i.layer as usize) };
    let (m0, n0) = (i.tile_row * tile, i.tile_col * tile);
    // Element `e` of the tile (row, column, offset), or None outside the matrix.
    let at = |e: u32| {
        let (o, k) = (m0 + e / tile, n0 + e % tile);
        (e < tile * tile && o < dout && k < din).then_some((o, k, w + o * pitch(din) + k))
    };
    // Eight elements per thread per round, all loads issued before any arithmetic: the loop is
    // bound by global-memory latency, not by its few flops (eight per round take about half the
    // time of two).
    const U: u32 = 8;
    let mut e = t;
    while e < tile * tile {
        let js: [Option<(u32, u32, u32)>; U as usize] = core::array::from_fn(|u| at(e + u as u32 * threads));
        let g: [f32; U as usize] = core::array::from_fn(|u| js[u].map_or(0.0, |(_, _, j)| f(b.dw, j)));
        let wv: [f32; U as usize] = core::array::from_fn(|u| js[u].map_or(0.0, |(_, _, j)| f(b.weights, j)));
        let step: [f32; U as usize] = if cfg.momentum != 0.0 {
            let v: [f32; U as usize] = core::array::from_fn(|u| js[u].map_or(0.0, |(_, _, j)| f(b.velocity, j)));
            core::array::from_fn(|u| cfg.momentum * v[u] + g[u])
        } else {
            g
        };
        for u in 0..U as usize {
            if let Some((o, k, j)) = js[u] {
                if cfg.momentum != 0.0 {
                    unsafe { b.velocity.write(j as usize, step[u]) };
                }
                let nw = wv[u] - cfg.lr * step[u];
                unsafe { b.weights.write(j as usize, nw) };
                then(o, k, nw);
            }
        }
        e += U * threads;
    }
}

/// Row elements each lane of [`loss_grad`] loads at once: a warp reads 32 x 16 = 512 columns of a
/// row per round trip to memory. (32 kept the arrays in local memory.)
#[cfg(target_arch = "nvptx64")]
const ROW_CHUNK: usize = 16;
/// Elements of the loss tile each thread loads before it stores any.
#[cfg(target_arch = "nvptx64")]
const GRAD_GROUP: usize = 8;

/// The cross-entropy statistics of a loss tile's rows: each row's maximum and sum of
/// `exp(x - max)` over the whole row, into `stats` (`2 * tile` floats of shared memory: the
/// maxima, then the sums), by `threads` threads (`t` is this one's index, `threads / 32` whole
/// warps). One warp per row: lane `l` takes columns `l, l + 32, ...`, [`ROW_CHUNK`] loads in
/// flight, and adds its terms in ascending column order; then a shuffle tree: the CPU
/// interpreter's order, with [`math::exp`], so the CUDA-core kernel matches it bit for bit. (The
/// tensor-core kernel combines partials from its forward instead, see
/// [`loss_partials`](crate::megakernel::loss_partials).)
///
/// What it costs: the statistics are instruction-bound, not load-bound. With one warp per
/// scheduler, `math::exp`'s chain of ~40 dependent instructions issues at about one per 5
/// cycles; the rendezvous is a negligible part, and so is the number of dependent rounds of
/// loads a row is read in (`exp_fast` would take well under half the time).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub(crate) unsafe fn loss_row_stats(
    b: &MegaBuffers,
    cfg: &MegaConfig,
    i: &Instruction,
    tile: u32,
    stats: *mut f32,
    threads: u32,
    t: u32,
) {
    let f = |p: crate::DevicePtrMut<f32>, k: u32| unsafe { p.as_const().read(k as usize) };
    let dout = unsafe { b.dims.read(i.layer as usize + 1) };
    let a_out = unsafe { b.a_off.read(i.layer as usize + 1) };
    let pout = pitch(dout);
    let m0 = i.tile_row * tile;
    let (lane, warp) = (t % 32, t / 32);
    const SPAN: u32 = 32 * ROW_CHUNK as u32;
    let mut r = warp;
    while r < tile {
        if m0 + r < cfg.batch {
            let row = a_out + (m0 + r) * pout;
            // columns k0 + lane + 32 j of the row (-inf past its end)
            let chunk = |k0: u32| -> [f32; ROW_CHUNK] {
                let mut v = [f32::NEG_INFINITY; ROW_CHUNK];
                for (j, v) in v.iter_mut().enumerate() {
                    let k = k0 + lane + 32 * j as u32;
                    if k < dout {
                        *v = f(b.act, row + k);
                    }
                }
                v
            };
            let first = chunk(0);
            let mut m = f32::NEG_INFINITY;
            for &v in first.iter() {
                m = m.max(v);
            }
            let mut k0 = SPAN;
            while k0 < dout {
                for &v in chunk(k0).iter() {
                    m = m.max(v);
                }
                k0 += SPAN;
            }
            let m = warp::reduce_max_f32(m);
            let mut z = 0.0f32;
            // (a select, not a branch, so that the exps of a chunk overlap)
            for (j, &v) in first.iter().enumerate() {
                let e = math::exp(v - m);
                z += if lane + 32 * (j as u32) < dout { e } else { 0.0 };
            }
            k0 = SPAN;
            while k0 < dout {
                for (j, &v) in chunk(k0).iter().enumerate() {
                    let e = math::exp(v - m);
                    z += if k0 + lane + 32 * (j as u32) < dout { e } else { 0.0 };
                }
                k0 += SPAN;
            }
            let z = warp::reduce_sum_f32(z);
            if lane == 0 {
                unsafe {
                    *stats.add(r as usize) = m;
                    *stats.add((tile + r) as usize) = z;
                }
            }
        }
        r += threads / 32;
    }
}

/// `grad[L] = dLoss / d act[L]` on one tile, by `threads` threads (`t` is this one's index): every
/// thread takes elements `t, t + threads, ...`, [`GRAD_GROUP`] loads before their stores.
/// Cross-entropy reads its rows' statistics from `stats` (filled by the caller, behind a barrier:
/// [`loss_row_stats`]). [`math::exp`] and true divisions, bit-identical to the interpreter. (The
/// tensor-core kernel has its own, `LossTile`: `exp` on the special-function unit, reciprocals,
/// and all of a tile's loads at once.)
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn loss_grad(
    b: &MegaBuffers,
    cfg: &MegaConfig,
    i: &Instruction,
    tile: u32,
    stats: *const f32,
    threads: u32,
    t: u32,
) {
    let f = |p: crate::DevicePtrMut<f32>, k: u32| unsafe { p.as_const().read(k as usize) };
    let dout = unsafe { b.dims.read(i.layer as usize + 1) };
    let a_out = unsafe { b.a_off.read(i.layer as usize + 1) };
    let pout = pitch(dout);
    let (m0, n0) = (i.tile_row * tile, i.tile_col * tile);
    let ce = cfg.loss != loss::MSE;
    let mut e0 = t;
    while e0 < tile * tile {
        // element g of the group: its tile row, global row and column, and whether it is live
        let at = |g: usize| {
            let e = e0 + (g as u32) * threads;
            let (r, c) = (e / tile, e % tile);
            (r, m0 + r, n0 + c, e < tile * tile && m0 + r < cfg.batch && n0 + c < dout)
        };
        // every load of the group (the logit and the class or target) before any store
        let (mut v, mut other) = ([0.0f32; GRAD_GROUP], [0.0f32; GRAD_GROUP]);
        for g in 0..GRAD_GROUP {
            let (_, tr, tc, live) = at(g);
            if live {
                v[g] = f(b.act, a_out + tr * pout + tc);
                other[g] = if ce {
                    (unsafe { b.classes.read(tr as usize) } == tc) as u32 as f32
                } else {
                    unsafe { b.y.read((tr * dout + tc) as usize) }
                };
            }
        }
        // the gradients, computed for every element of the group (no branch, so they overlap)
        let grad: [f32; GRAD_GROUP] = core::array::from_fn(|g| {
            let (r, _, _, _) = at(g);
            if ce {
                let r = r.min(tile - 1) as usize;
                let (m, z) = unsafe { (*stats.add(r), *stats.add(tile as usize + r)) };
                (math::exp(v[g] - m) / z - other[g]) / cfg.batch as f32
            } else {
                2.0 * (v[g] - other[g]) / (cfg.batch * dout) as f32
            }
        });
        for (g, &grad) in grad.iter().enumerate() {
            let (_, tr, tc, live) = at(g);
            if live {
                unsafe { b.grad.write((a_out + tr * pout + tc) as usize, grad) };
            }
        }
        e0 += GRAD_GROUP as u32 * threads;
    }
}

/// One training step (see the module docs). Grid: one block per SM; block [`MEGA_THREADS`].
#[kernel]
pub unsafe fn megakernel_step(b: MegaBuffers, cfg: MegaConfig) {
    let block = thread::block_idx_x();
    let (lo, hi) = unsafe { (b.sm_offsets.read(block as usize), b.sm_offsets.read(block as usize + 1)) };
    let go = mk_flag();
    let mut idx = lo;
    while idx < hi {
        let ins = unsafe { b.instructions.read(idx as usize) };
        let t0 = thread::thread_idx_x() == 0;
        if t0 {
            unsafe { stamp(&b, idx, trace::START) };
            let ok = unsafe {
                wait(&b, &cfg, ins.wait, ins.wait_value, idx, 0) && wait(&b, &cfg, ins.wait2, ins.wait2_value, idx, 0)
            };
            if ok {
                unsafe { stamp(&b, idx, trace::FIRST) };
            }
            unsafe { (*go)[0] = ok as u32 };
        }
        sync::sync_threads();
        let ok = unsafe { (*go)[0] } != 0;
        sync::sync_threads();
        if !ok {
            return;
        }
        match cfg.tile {
            16 => unsafe { run::<1>(&b, &cfg, &ins) },
            32 => unsafe { run::<2>(&b, &cfg, &ins) },
            _ => unsafe { run::<4>(&b, &cfg, &ins) },
        }
        sync::sync_threads();
        if t0 {
            unsafe { stamp(&b, idx, trace::STORED) };
            unsafe { signal(&b, &ins) };
            unsafe { stamp(&b, idx, trace::SIGNALED) };
        }
        idx += 1;
    }
}

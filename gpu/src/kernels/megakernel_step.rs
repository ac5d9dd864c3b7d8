//! The training megakernel, version 0: one persistent block per SM walks its instruction list
//! (built by the host, `kiln::megakernel`), waiting on and signalling global counters, and computes
//! each 64 x 64 tile with CUDA cores — the same FMA chains as the CPU interpreter. No TMA pages or
//! tensor cores yet: this version fixes the protocol and its hang-proofing.
//!
//! - Waits: thread 0 spins with `ld.acquire.gpu` on the counter, bounded by the global timer from the
//!   counter's last change; a stall (or another block's abort) sets the abort flag, writes the block's
//!   record (instruction index, counter, value seen, value wanted) and returns — every waiting block
//!   does the same, and the host reports all records as an error instead of hanging. A block barrier then lets the whole block read what the producers wrote.
//! - Signals: after a block barrier, thread 0 issues `fence.acq_rel.gpu` and adds 1 to each signal
//!   counter.
//! - Grid: one block per SM (all co-resident), 256 threads.
//!
//! Status: passes its GPU tests on the H200 (matches the CPU interpreter; a wrong arrival count is
//! reported as a stall); slow, 40-60x PyTorch's CUDA-graph step (`benches/results/mlp_step.md`).

use crate::megakernel::{Instruction, MegaBuffers, MegaConfig, NO_COUNTER, TILE, loss, opcode};
use crate::{atomic, fence, kernel, math, shared_array, sync, thread};

/// Threads per block.
pub const MEGA_THREADS: u32 = 256;

shared_array!(fn mk_flag() -> [u32; 4], align 16);

/// Reads a `u32` written by another block (acquire, GPU scope).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn acquire(p: crate::DevicePtrMut<u32>, i: u32) -> u32 {
    unsafe { atomic::load_acquire_gpu(p.as_mut_ptr().add(i as usize)) }
}

/// Thread 0 waits until `counters[c] >= v` (or an abort); returns false when the block must stop.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn wait(b: &MegaBuffers, cfg: &MegaConfig, c: u32, v: u32, idx: u32) -> bool {
    if c == NO_COUNTER {
        return true;
    }
    let abort = cfg.counters;
    let mut start = thread::globaltimer_ns();
    let mut last = u32::MAX;
    loop {
        let seen = unsafe { acquire(b.counters, c) };
        if seen >= v {
            return true;
        }
        if seen != last {
            // progress: the limit counts from the last change, so a long but moving wait is fine
            (last, start) = (seen, thread::globaltimer_ns());
        }
        let stop = unsafe { acquire(b.counters, abort) } != 0
            || thread::globaltimer_ns().wrapping_sub(start) > cfg.wait_limit_ns as u64;
        if stop {
            unsafe {
                let p = b.counters.as_mut_ptr();
                atomic::atomic_cas_u32(p.add(abort as usize), 0, 1);
                // this block's record: 1 + instruction index, counter, value seen, value wanted
                let rec = (abort + 1 + 4 * thread::block_idx_x()) as usize;
                b.counters.write(rec, idx + 1);
                b.counters.write(rec + 1, c);
                b.counters.write(rec + 2, seen);
                b.counters.write(rec + 3, v);
            }
            return false;
        }
    }
}

/// Computes one instruction's tile; every thread of the block takes outputs `t, t + 256, ...`.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn run(b: &MegaBuffers, cfg: &MegaConfig, i: &Instruction) {
    let l = i.layer;
    let rd = |p: crate::DevicePtr<u32>, k: u32| unsafe { p.read(k as usize) };
    let din = rd(b.dims, l);
    let dout = rd(b.dims, l + 1);
    let (w, a_in, a_out) = (rd(b.w_off, l), rd(b.a_off, l), rd(b.a_off, l + 1));
    let t = thread::thread_idx_x();
    let f = |p: crate::DevicePtrMut<f32>, k: u32| unsafe { p.as_const().read(k as usize) };
    let mut e = t;
    while e < TILE * TILE {
        let (tr, tc) = (i.tile_row * TILE + e / TILE, i.tile_col * TILE + e % TILE);
        match i.opcode {
            opcode::LINEAR_FWD if tr < cfg.batch && tc < dout => {
                let mut acc = 0.0f32;
                let mut k = 0;
                while k < din {
                    acc = math::fma(f(b.act, a_in + tr * din + k), f(b.weights, w + tc * din + k), acc);
                    k += 1;
                }
                let v = if l + 1 < cfg.layers { acc.max(0.0) } else { acc };
                unsafe { b.act.write((a_out + tr * dout + tc) as usize, v) };
            }
            opcode::LOSS_GRAD if tr < cfg.batch && tc < dout => {
                let row = a_out + tr * dout;
                let v = f(b.act, row + tc);
                let g = if cfg.loss == loss::MSE {
                    2.0 * (v - unsafe { b.y.read((tr * dout + tc) as usize) }) / (cfg.batch * dout) as f32
                } else {
                    let mut m = f32::NEG_INFINITY;
                    let mut k = 0;
                    while k < dout {
                        m = m.max(f(b.act, row + k));
                        k += 1;
                    }
                    let mut z = 0.0f32;
                    k = 0;
                    while k < dout {
                        z += math::exp(f(b.act, row + k) - m);
                        k += 1;
                    }
                    let onehot = if unsafe { b.classes.read(tr as usize) } == tc { 1.0 } else { 0.0 };
                    (math::exp(v - m) / z - onehot) / cfg.batch as f32
                };
                unsafe { b.grad.write((row + tc) as usize, g) };
            }
            opcode::LINEAR_BWD_WEIGHT if tr < dout && tc < din => {
                let mut acc = 0.0f32;
                let mut r = 0;
                while r < cfg.batch {
                    acc = math::fma(f(b.grad, a_out + r * dout + tr), f(b.act, a_in + r * din + tc), acc);
                    r += 1;
                }
                unsafe { b.dw.write((w + tr * din + tc) as usize, acc) };
            }
            opcode::LINEAR_BWD_INPUT if tr < cfg.batch && tc < din => {
                let mut acc = 0.0f32;
                let mut o = 0;
                while o < dout {
                    acc = math::fma(f(b.grad, a_out + tr * dout + o), f(b.weights, w + o * din + tc), acc);
                    o += 1;
                }
                let v = if f(b.act, a_in + tr * din + tc) > 0.0 { acc } else { 0.0 };
                unsafe { b.grad.write((a_in + tr * din + tc) as usize, v) };
            }
            opcode::SGD_UPDATE if tr < dout && tc < din => {
                let j = w + tr * din + tc;
                let g = f(b.dw, j);
                let step = if cfg.momentum != 0.0 {
                    let v = cfg.momentum * f(b.velocity, j) + g;
                    unsafe { b.velocity.write(j as usize, v) };
                    v
                } else {
                    g
                };
                unsafe { b.weights.write(j as usize, f(b.weights, j) - cfg.lr * step) };
            }
            _ => {}
        }
        e += MEGA_THREADS;
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
        if thread::thread_idx_x() == 0 {
            let ok = unsafe {
                wait(&b, &cfg, ins.wait, ins.wait_value, idx) && wait(&b, &cfg, ins.wait2, ins.wait2_value, idx)
            };
            unsafe { (*go)[0] = ok as u32 };
        }
        sync::sync_threads();
        let ok = unsafe { (*go)[0] } != 0;
        sync::sync_threads();
        if !ok {
            return;
        }
        unsafe { run(&b, &cfg, &ins) };
        sync::sync_threads();
        if thread::thread_idx_x() == 0 {
            fence::fence_gpu();
            let p = b.counters.as_mut_ptr();
            if ins.signal != NO_COUNTER {
                unsafe { atomic::atomic_add_u32(p.add(ins.signal as usize), 1) };
            }
            if ins.signal2 != NO_COUNTER {
                unsafe { atomic::atomic_add_u32(p.add(ins.signal2 as usize), 1) };
            }
        }
        idx += 1;
    }
}

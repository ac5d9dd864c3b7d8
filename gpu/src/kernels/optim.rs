//! Multi-tensor optimizer kernels: one launch updates every parameter of an optimizer (SGD with
//! momentum, Nesterov and weight decay; Adam and AdamW with bias correction), optionally writing a
//! bf16 or f16 compute copy of each updated f32 master weight, and one launch measures the global
//! L2 norm of all gradients for clipping.
//!
//! ## The table
//! The host uploads two arrays once per set of parameters (not per step):
//! - one [`OptimTensor`] per parameter: the addresses of its f32 master weights, its gradient, its
//!   optimizer state (velocity, or Adam's first and second moments), its optional 16-bit compute
//!   copy, and its length;
//! - one [`OptimChunk`] per [`OPTIM_CHUNK`] elements of each parameter (a parameter of 1 element
//!   is one chunk; an empty one has none): the parameter's index and the chunk's first element.
//!
//! Gradients are the one address that changes from step to step (autograd makes new gradient
//! tensors). The host compares them with what the table holds and sends the ones that moved in
//! the launch itself, as a [`GradPatch`] kernel parameter: every block uses the patch's address
//! for a patched parameter, and block 0 writes the patch into the table for the next launches. So
//! a step whose gradients moved is still one launch, and a step captured in a CUDA graph carries
//! its gradients' addresses in the graph (no copy from the host). More than [`GRAD_PATCH`] moved
//! gradients take `multi_patch_grads` launches first, [`GRAD_PATCH`] at a time.
//!
//! ## Thread mapping
//! Blocks of [`OPTIM_THREADS`] threads; block `b` takes chunks `b, b + gridDim.x, ...` (the host
//! launches `min(chunks, MAX_OPTIM_BLOCKS)` blocks, so every block has at least one). Within a
//! chunk, thread `t` takes the 16-byte quads `t, t + 256, ...` (a warp reads 512 contiguous bytes
//! of each array) when every address of the parameter is 16-byte aligned (8-byte for the 16-bit
//! copy; chunks start at multiples of 4 elements, so the alignment holds in every chunk), then the
//! last `len % 4` elements one each; otherwise element by element with the same stride. A
//! parameter without a gradient (address 0) is skipped.
//!
//! ## Arithmetic
//! The per-element updates are the expressions of the per-tensor kernels `sgd_step_f32` and
//! `adam_step_f32` in the same order, so without clipping both give the same bits (but for a
//! first SGD step on a gradient of exactly -0.0, which gives +0.0 here). With clipping,
//! the gradient is multiplied by the clip scale first (before weight decay), the scale read from
//! the [`ClipState`] that `multi_grad_norm_f32` wrote. SGD's velocity starts at zero, so the first
//! step's `momentum * 0 + g` is PyTorch's "the first buffer is the gradient".

use crate::{DevicePtr, DevicePtrMut, KernelParam, kernel, shared_array};
use crate::{atomic, convert, fence, math, sync, thread, warp};

/// Threads per block of the multi-tensor kernels.
pub const OPTIM_THREADS: u32 = 256;
/// Elements per chunk: a multiple of `4 * OPTIM_THREADS`, so a chunk is whole quads for every
/// thread, and chunk starts keep 16-byte alignment.
pub const OPTIM_CHUNK: u32 = 16384;
/// Most blocks a multi-tensor launch uses (the length of the norm's partial-sum buffer).
pub const MAX_OPTIM_BLOCKS: u32 = 1024;
/// Gradient addresses one launch can carry in its [`GradPatch`].
pub const GRAD_PATCH: usize = 32;
/// Added to the norm in the clip scale `min(1, max_norm / (norm + CLIP_EPS))` (PyTorch's 1e-6).
pub const CLIP_EPS: f32 = 1e-6;

/// [`OptimTensor::flags`]: the compute copy is f16 (else bf16).
pub const COPY_F16: u32 = 1;
/// [`OptimTensor::flags`]: the parameter takes no weight decay (AdamW's parameter groups: biases,
/// norms and embeddings).
pub const NO_DECAY: u32 = 2;

/// One parameter of the table. Addresses are device addresses; 0 means "none".
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OptimTensor {
    /// The f32 master weights (updated in place).
    pub param: u64,
    /// The f32 gradient (0: the parameter has no gradient this step and is skipped).
    pub grad: u64,
    /// First state array, f32: SGD's velocity, Adam's first moment (0: none).
    pub state1: u64,
    /// Second state array, f32: Adam's second moment (0: none).
    pub state2: u64,
    /// The 16-bit compute copy written from each updated weight, rounded to nearest-even
    /// (0: none); its format in [`OptimTensor::flags`].
    pub copy: u64,
    /// Elements.
    pub len: u32,
    /// [`COPY_F16`] or 0.
    pub flags: u32,
}
// SAFETY: repr(C), u64 and u32 fields only, no padding (48 bytes, align 8 on both sides).
unsafe impl KernelParam for OptimTensor {}

impl OptimTensor {
    /// The table entry as the six u64 words the host uploads (the struct's exact layout).
    pub const fn to_words(&self) -> [u64; 6] {
        [self.param, self.grad, self.state1, self.state2, self.copy, self.len as u64 | ((self.flags as u64) << 32)]
    }
}

/// One chunk: elements `start .. min(start + OPTIM_CHUNK, len)` of parameter `tensor`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OptimChunk {
    /// Index of the parameter in the table.
    pub tensor: u32,
    /// First element (a multiple of [`OPTIM_CHUNK`]).
    pub start: u32,
}
// SAFETY: repr(C), u32 fields only.
unsafe impl KernelParam for OptimChunk {}

impl OptimChunk {
    /// The chunk as the u64 word the host uploads (`tensor` in the low half: the struct's layout).
    pub const fn to_word(&self) -> u64 {
        self.tensor as u64 | ((self.start as u64) << 32)
    }
}

/// Elements of the chunk starting at `start` of a parameter of `len` elements.
#[inline(always)]
pub const fn chunk_len(len: u32, start: u32) -> u32 {
    let left = len - start;
    if left < OPTIM_CHUNK { left } else { OPTIM_CHUNK }
}

/// Gradient addresses that moved since the table was written: parameter `tensor[j]` now has its
/// gradient at `grad[j]`, for `j < n`. Indices are distinct.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GradPatch {
    /// Entries used.
    pub n: u32,
    /// Parameter indices.
    pub tensor: [u32; GRAD_PATCH],
    /// Their gradients' addresses (0: no gradient).
    pub grad: [u64; GRAD_PATCH],
}
// SAFETY: repr(C), u32 and u64 fields only; the same layout on both sides.
unsafe impl KernelParam for GradPatch {}

impl Default for GradPatch {
    fn default() -> Self {
        GradPatch { n: 0, tensor: [0; GRAD_PATCH], grad: [0; GRAD_PATCH] }
    }
}

/// Runs `$body` with `$j` bound to each literal slot index `0 .. GRAD_PATCH` in turn: the kernels
/// read a [`GradPatch`] parameter only at constant offsets, so it stays in the parameter space
/// (indexing it with a register would copy all of it into every thread's local memory first).
macro_rules! each_slot {
    ($j:ident => $body:block) => {
        each_slot!(@ $j $body; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31)
    };
    (@ $j:ident $body:block; $($n:literal)*) => {
        $({
            let $j: usize = $n;
            $body
        })*
    };
}
const _: () = assert!(GRAD_PATCH == 32, "each_slot! lists the slots 0..32");

impl GradPatch {
    /// The gradient address of parameter `t`: the patch's when it has one, else `table_grad`.
    #[inline(always)]
    pub fn grad_of(&self, t: u32, table_grad: u64) -> u64 {
        let mut g = table_grad;
        each_slot!(j => {
            if (j as u32) < self.n && self.tensor[j] == t {
                g = self.grad[j];
            }
        });
        g
    }
}

/// The global gradient norm and the clip scale derived from it, on the device.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ClipState {
    /// `sqrt(sum of g^2)` over every gradient of the table.
    pub norm: f32,
    /// `min(1, max_norm / (norm + CLIP_EPS))` (1 when that is NaN).
    pub scale: f32,
    /// Blocks of the running norm launch that have written their partial sum (0 between
    /// launches: the last block resets it).
    pub ticket: u32,
    /// Unused (16-byte size).
    pub pad: u32,
}
// SAFETY: repr(C), 4-byte fields only.
unsafe impl KernelParam for ClipState {}

/// The clip scale for a norm (the kernel's expression; host-tested against the CPU reference).
#[inline(always)]
pub fn clip_scale(norm: f32, max_norm: f32) -> f32 {
    let coef = max_norm / (norm + CLIP_EPS);
    if coef < 1.0 { coef } else { 1.0 }
}

/// SGD's scalars for one step.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MultiSgd {
    /// Chunks in the table.
    pub chunks: u32,
    /// Learning rate.
    pub lr: f32,
    /// Momentum (0: none; the velocity is neither read nor written).
    pub momentum: f32,
    /// Weight decay (added to the gradient).
    pub weight_decay: f32,
    /// 1: Nesterov.
    pub nesterov: u32,
}
// SAFETY: repr(C), 4-byte fields only.
unsafe impl KernelParam for MultiSgd {}

/// Adam's scalars for one step, with the bias corrections precomputed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MultiAdam {
    /// Chunks in the table.
    pub chunks: u32,
    /// Learning rate.
    pub lr: f32,
    /// First-moment decay.
    pub beta1: f32,
    /// Second-moment decay.
    pub beta2: f32,
    /// Denominator epsilon.
    pub eps: f32,
    /// Weight decay.
    pub weight_decay: f32,
    /// 1 - beta1^t.
    pub c1: f32,
    /// 1 - beta2^t.
    pub c2: f32,
    /// 1: AdamW (decoupled decay), 0: Adam (decay added to the gradient).
    pub decoupled: u32,
}
// SAFETY: repr(C), 4-byte fields only.
unsafe impl KernelParam for MultiAdam {}

/// The norm launch's scalars.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GradNorm {
    /// Chunks in the table.
    pub chunks: u32,
    /// The norm the gradients are clipped to.
    pub max_norm: f32,
}
// SAFETY: repr(C), 4-byte fields only.
unsafe impl KernelParam for GradNorm {}

shared_array!(fn optim_red() -> [f32; 32], align 16);
shared_array!(fn optim_last() -> [u32; 4], align 16);

/// Block 0 writes the patch's gradient addresses into the table (one thread per entry).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn write_patch(tensors: DevicePtrMut<OptimTensor>, patch: &GradPatch) {
    let t = thread::thread_idx_x() as usize;
    if thread::block_idx_x() != 0 || t >= GRAD_PATCH || t as u32 >= patch.n {
        return;
    }
    each_slot!(j => {
        if t == j {
            unsafe { (*tensors.as_mut_ptr().add(patch.tensor[j] as usize)).grad = patch.grad[j] };
        }
    });
}

/// Sum of one value per thread over the block (fixed order: warp butterflies, then warp 0 over the
/// warp sums); every thread gets it. All threads of the block must call it.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn block_sum(v: f32) -> f32 {
    let (lane, w) = (thread::lane_id(), thread::warp_id());
    let warps = thread::block_dim_x() / warp::WARP_SIZE;
    let r = warp::reduce_sum_f32(v);
    let sh = optim_red();
    if lane == 0 {
        unsafe { (*sh)[w as usize] = r };
    }
    sync::sync_threads();
    let x = if lane < warps { unsafe { (*sh)[lane as usize] } } else { 0.0 };
    let total = warp::reduce_sum_f32(x);
    sync::sync_threads(); // the shared slots are reused by the next call
    total
}

/// Whether every array of `e` (with gradient `grad`) allows 16-byte quads.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn quads_aligned(e: &OptimTensor, grad: u64) -> bool {
    (e.param | grad | e.state1 | e.state2) & 15 == 0 && e.copy & 7 == 0
}

/// Rounds four weights to the copy's format and packs them into one 8-byte word.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn pack4(w: [f32; 4], f16: bool) -> u64 {
    let (lo, hi) = if f16 {
        (convert::pack_f16x2(w[0], w[1]), convert::pack_f16x2(w[2], w[3]))
    } else {
        (convert::pack_bf16x2(w[0], w[1]), convert::pack_bf16x2(w[2], w[3]))
    };
    lo as u64 | ((hi as u64) << 32)
}

/// One weight rounded to the copy's format.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn pack1(w: f32, f16: bool) -> u16 {
    if f16 { (convert::pack_f16x2(w, 0.0) & 0xffff) as u16 } else { convert::f32_to_bf16_bits(w) }
}

/// Applies `f(w, g, s1, s2) -> (w, s1, s2)` to every element of every chunk this block owns, reading
/// and writing `states` (0, 1 or 2) state arrays, with the gradient scaled by the clip scale when
/// `clip` is not null; writes the compute copies.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
unsafe fn update_chunks(
    tensors: DevicePtrMut<OptimTensor>,
    chunks: DevicePtr<OptimChunk>,
    n_chunks: u32,
    clip: DevicePtr<ClipState>,
    patch: &GradPatch,
    states: u32,
    f: impl Fn(f32, f32, f32, f32, f32) -> (f32, f32, f32),
) {
    unsafe { write_patch(tensors, patch) };
    let clipped = clip.addr() != 0;
    let scale = if clipped { unsafe { clip.read(0).scale } } else { 1.0 };
    let g_of = |g: f32| if clipped { g * scale } else { g };
    let tid = thread::thread_idx_x() as usize;
    let threads = thread::block_dim_x() as usize;
    let mut c = thread::block_idx_x();
    while c < n_chunks {
        let ch = unsafe { chunks.read(c as usize) };
        let e = unsafe { tensors.as_const().read(ch.tensor as usize) };
        let grad = patch.grad_of(ch.tensor, e.grad);
        c += thread::grid_dim_x();
        if grad == 0 {
            continue;
        }
        let start = ch.start as usize;
        let len = chunk_len(e.len, ch.start) as usize;
        let p = DevicePtrMut::<f32>::from_addr(e.param).offset(start);
        let g = DevicePtr::<f32>::from_addr(grad).offset(start);
        let s1 = DevicePtrMut::<f32>::from_addr(e.state1).offset(start);
        let s2 = DevicePtrMut::<f32>::from_addr(e.state2).offset(start);
        let copy = DevicePtrMut::<u16>::from_addr(e.copy).offset(start);
        let f16 = e.flags & COPY_F16 != 0;
        // The weight-decay factor: 0 for a parameter flagged NO_DECAY, else 1.
        let decay = if e.flags & NO_DECAY != 0 { 0.0 } else { 1.0 };
        let mut first_single = 0;
        if quads_aligned(&e, grad) {
            let n4 = len / 4;
            let mut q = tid;
            while q < n4 {
                unsafe {
                    let w = p.as_const().read4(q);
                    let gv = g.read4(q);
                    let a = if states >= 1 { s1.as_const().read4(q) } else { [0.0; 4] };
                    let b = if states >= 2 { s2.as_const().read4(q) } else { [0.0; 4] };
                    let mut nw = [0.0f32; 4];
                    let mut na = [0.0f32; 4];
                    let mut nb = [0.0f32; 4];
                    let mut k = 0;
                    while k < 4 {
                        (nw[k], na[k], nb[k]) = f(w[k], g_of(gv[k]), a[k], b[k], decay);
                        k += 1;
                    }
                    p.write4(q, nw);
                    if states >= 1 {
                        s1.write4(q, na);
                    }
                    if states >= 2 {
                        s2.write4(q, nb);
                    }
                    if e.copy != 0 {
                        copy.cast::<u64>().write(q, pack4(nw, f16));
                    }
                }
                q += threads;
            }
            first_single = n4 * 4;
        }
        let mut i = first_single + tid;
        while i < len {
            unsafe {
                let a = if states >= 1 { s1.as_const().read(i) } else { 0.0 };
                let b = if states >= 2 { s2.as_const().read(i) } else { 0.0 };
                let (nw, na, nb) = f(p.as_const().read(i), g_of(g.read(i)), a, b, decay);
                p.write(i, nw);
                if states >= 1 {
                    s1.write(i, na);
                }
                if states >= 2 {
                    s2.write(i, nb);
                }
                if e.copy != 0 {
                    copy.write(i, pack1(nw, f16));
                }
            }
            i += threads;
        }
    }
}

/// One SGD step (momentum, Nesterov, weight decay) of every parameter in the table.
///
/// - Parameters: `tensors` / `chunks`: the table (module docs); `clip`: a [`ClipState`] whose
///   `scale` multiplies every gradient, or null for none; `h`: the step's scalars; `patch`: the
///   gradients that moved (written into the table by block 0).
/// - Per element (`weight_decay` is 0 for a parameter flagged [`NO_DECAY`]): `g = g * scale + weight_decay * w`; with momentum, `v = momentum * v + g` and
///   `g = g + momentum * v` (Nesterov) or `g = v`; `w = w - lr * g`; the copy gets `round(w)`.
/// - Launch: `min(chunks, MAX_OPTIM_BLOCKS)` blocks of [`OPTIM_THREADS`]; mapping in the module docs.
#[kernel]
pub unsafe fn multi_sgd_f32(
    tensors: DevicePtrMut<OptimTensor>,
    chunks: DevicePtr<OptimChunk>,
    clip: DevicePtr<ClipState>,
    h: MultiSgd,
    patch: GradPatch,
) {
    let states = if h.momentum != 0.0 { 1 } else { 0 };
    unsafe {
        update_chunks(tensors, chunks, h.chunks, clip, &patch, states, |w, g, vel, _, decay| {
            sgd_element(&h, h.lr, w, g, vel, decay)
        })
    }
}

/// One element of SGD ([`multi_sgd_f32`]'s expressions, in their order) at learning rate `lr`:
/// returns the new weight and velocity (and 0 for the unused second state).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
fn sgd_element(h: &MultiSgd, lr: f32, w: f32, g: f32, vel: f32, decay: f32) -> (f32, f32, f32) {
    let mut gi = g + decay * h.weight_decay * w;
    let mut v = vel;
    if h.momentum != 0.0 {
        v = h.momentum * vel + gi;
        gi = if h.nesterov != 0 { gi + h.momentum * v } else { v };
    }
    (w - lr * gi, v, 0.0)
}

/// One Adam or AdamW step (bias-corrected) of every parameter in the table.
///
/// - Parameters: as [`multi_sgd_f32`], with `h` Adam's scalars; `state1` is the first moment `m`,
///   `state2` the second moment `v`.
/// - Per element (`weight_decay` is 0 for a parameter flagged [`NO_DECAY`]): `g = g * scale`; Adam adds `weight_decay * w` to `g`; `m = b1 m + (1 - b1) g`,
///   `v = b2 v + (1 - b2) g^2`; AdamW first takes `w -= lr * weight_decay * w`; then
///   `w -= lr * (m / c1) / (sqrt(v / c2) + eps)`; the copy gets `round(w)`.
/// - Launch: `min(chunks, MAX_OPTIM_BLOCKS)` blocks of [`OPTIM_THREADS`]; mapping in the module docs.
#[kernel]
pub unsafe fn multi_adam_f32(
    tensors: DevicePtrMut<OptimTensor>,
    chunks: DevicePtr<OptimChunk>,
    clip: DevicePtr<ClipState>,
    h: MultiAdam,
    patch: GradPatch,
) {
    unsafe {
        update_chunks(tensors, chunks, h.chunks, clip, &patch, 2, |w, g, m, v, decay| {
            adam_element(&h, h.lr, h.c1, h.c2, w, g, m, v, decay)
        })
    }
}

/// One element of Adam / AdamW ([`multi_adam_f32`]'s expressions, in their order) at learning
/// rate `lr` with bias corrections `c1`, `c2`: returns the new weight, first and second moment.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn adam_element(
    h: &MultiAdam,
    lr: f32,
    c1: f32,
    c2: f32,
    w: f32,
    g: f32,
    m: f32,
    v: f32,
    decay: f32,
) -> (f32, f32, f32) {
    let mut w = w;
    let mut gi = g;
    let wd = decay * h.weight_decay;
    if h.decoupled == 0 {
        gi += wd * w;
    }
    let mi = h.beta1 * m + (1.0 - h.beta1) * gi;
    let vi = h.beta2 * v + (1.0 - h.beta2) * gi * gi;
    if h.decoupled != 0 {
        w -= lr * wd * w;
    }
    w -= lr * (mi / c1) / (math::sqrt(vi / c2) + h.eps);
    (w, mi, vi)
}

/// The global L2 norm of every gradient in the table, and the clip scale, in one launch without
/// float atomics (the same gradients give the same bits).
///
/// - Parameters: the table and `patch` as [`multi_sgd_f32`]; `partials`: [`MAX_OPTIM_BLOCKS`]
///   floats of scratch; `state`: the [`ClipState`] written (its `ticket` 0 on entry, as the last
///   launch left it); `h`: the chunk count and `max_norm`.
/// - Mapping: each thread sums the squares of its elements of the block's chunks in order (quads
///   as in the update kernels, then the tail); the block combines them ([`block_sum`]) into
///   `partials[block]`. Each block then takes a ticket (an integer `atom.add` after a GPU-scope
///   fence); the block that draws the last one, after a fence, sums `partials[0 .. gridDim.x]`
///   (GPU-scope relaxed loads, past its L1) in a fixed order (thread `t` takes `t, t + 256, ...`,
///   then the block sum), writes `norm = sqrt(total)` and
///   `scale = min(1, max_norm / (norm + 1e-6))`, and resets the ticket.
/// - Launch: `min(chunks, MAX_OPTIM_BLOCKS)` blocks of [`OPTIM_THREADS`].
#[kernel]
pub unsafe fn multi_grad_norm_f32(
    tensors: DevicePtrMut<OptimTensor>,
    chunks: DevicePtr<OptimChunk>,
    partials: DevicePtrMut<f32>,
    state: DevicePtrMut<ClipState>,
    h: GradNorm,
    patch: GradPatch,
) {
    unsafe { write_patch(tensors, &patch) };
    let tid = thread::thread_idx_x() as usize;
    let threads = thread::block_dim_x() as usize;
    let mut acc = 0.0f32;
    let mut c = thread::block_idx_x();
    while c < h.chunks {
        let ch = unsafe { chunks.read(c as usize) };
        let e = unsafe { tensors.as_const().read(ch.tensor as usize) };
        let grad = patch.grad_of(ch.tensor, e.grad);
        c += thread::grid_dim_x();
        if grad == 0 {
            continue;
        }
        let len = chunk_len(e.len, ch.start) as usize;
        let g = DevicePtr::<f32>::from_addr(grad).offset(ch.start as usize);
        let mut first_single = 0;
        if grad & 15 == 0 {
            let n4 = len / 4;
            let mut q = tid;
            while q < n4 {
                let v = unsafe { g.read4(q) };
                acc += v[0] * v[0];
                acc += v[1] * v[1];
                acc += v[2] * v[2];
                acc += v[3] * v[3];
                q += threads;
            }
            first_single = n4 * 4;
        }
        let mut i = first_single + tid;
        while i < len {
            let v = unsafe { g.read(i) };
            acc += v * v;
            i += threads;
        }
    }
    let total = block_sum(acc);
    let last = optim_last();
    if tid == 0 {
        unsafe { partials.write(thread::block_idx_x() as usize, total) };
        fence::fence_gpu();
        let ticket = unsafe { atomic::atomic_add_u32(&raw mut (*state.as_mut_ptr()).ticket, 1) };
        unsafe { (*last)[0] = (ticket + 1 == thread::grid_dim_x()) as u32 };
    }
    sync::sync_threads();
    if unsafe { (*last)[0] } == 0 {
        return;
    }
    fence::fence_gpu();
    let blocks = thread::grid_dim_x() as usize;
    let mut acc = 0.0f32;
    let mut b = tid;
    while b < blocks {
        // other blocks' sums: read at GPU scope, past this SM's L1
        acc += f32::from_bits(unsafe { atomic::load_relaxed_gpu(partials.as_const().as_ptr().add(b).cast::<u32>()) });
        b += threads;
    }
    let total = block_sum(acc);
    if tid == 0 {
        let norm = math::sqrt(total);
        unsafe {
            state.write(0, ClipState { norm, scale: clip_scale(norm, h.max_norm), ticket: 0, pad: 0 });
        }
    }
}

/// Writes a [`GradPatch`] into the table and nothing else: the surplus when more than
/// [`GRAD_PATCH`] gradients moved at once. Launch: one block of [`GRAD_PATCH`] threads (or more).
#[kernel]
pub unsafe fn multi_patch_grads(tensors: DevicePtrMut<OptimTensor>, patch: GradPatch) {
    unsafe { write_patch(tensors, &patch) };
}

// ---------------------------------------------------------------------------------------------
// Steps whose per-step scalars live on the device (capturable in a CUDA graph).

/// An optimizer's per-step scalars on the device, so that its update can be replayed in a CUDA
/// graph: the learning rate (written by the host before each step or replay) and the step count
/// (Adam: advanced on the device by the update launch itself, `multi_adam_scalars_f32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepScalars {
    /// Learning rate of the step (first: the host rewrites this word alone).
    pub lr: f32,
    /// Steps taken.
    pub t: u32,
    /// Blocks of the running Adam launch that finished (0 between launches: the last block
    /// resets it).
    pub ticket: u32,
    /// Unused (16-byte size).
    pub pad: u32,
}
// SAFETY: repr(C), 4-byte fields only.
unsafe impl KernelParam for StepScalars {}

impl StepScalars {
    /// The four 32-bit words the device holds.
    pub fn to_words(self) -> [u32; 4] {
        [self.lr.to_bits(), self.t, self.ticket, self.pad]
    }
    /// The scalars from the device's four words.
    pub fn from_words(w: [u32; 4]) -> StepScalars {
        StepScalars { lr: f32::from_bits(w[0]), t: w[1], ticket: w[2], pad: w[3] }
    }
}

/// `a^b` by binary powering, in the order of compiler-rt's `__powidf2` (what `f64::powi` calls on
/// the host): the same bits on the device as the host's `powi`, for any `b`.
#[inline(always)]
pub fn powi_f64(a: f64, b: u32) -> f64 {
    let (mut a, mut b, mut r) = (a, b, 1.0f64);
    loop {
        if b & 1 != 0 {
            r *= a;
        }
        b >>= 1;
        if b == 0 {
            break;
        }
        a *= a;
    }
    r
}

/// Adam's bias correction `1 - beta^t`, computed in f64 and rounded once to f32: the host's
/// `(1.0 - beta.powi(t)) as f32`.
#[inline(always)]
pub fn bias_correction(beta: f64, t: u32) -> f32 {
    (1.0 - powi_f64(beta, t)) as f32
}

/// Adam's step count alone: `t += 1` in `s` (for a table without elements, whose update launches
/// nothing). Launch: one thread (others return).
#[kernel]
pub unsafe fn optim_adam_tick(s: DevicePtrMut<StepScalars>) {
    if thread::global_idx_x() != 0 {
        return;
    }
    unsafe { (*s.as_mut_ptr()).t += 1 };
}

/// [`multi_sgd_f32`] with the learning rate read from the device's [`StepScalars`] (`h.lr` is
/// ignored): the update a CUDA graph replays with the rate the host wrote before the replay.
/// Parameters, per-element arithmetic and launch as [`multi_sgd_f32`], plus `scalars`.
#[kernel]
pub unsafe fn multi_sgd_scalars_f32(
    tensors: DevicePtrMut<OptimTensor>,
    chunks: DevicePtr<OptimChunk>,
    clip: DevicePtr<ClipState>,
    h: MultiSgd,
    patch: GradPatch,
    scalars: DevicePtr<StepScalars>,
) {
    let states = if h.momentum != 0.0 { 1 } else { 0 };
    let lr = unsafe { (*scalars.as_ptr()).lr };
    unsafe {
        update_chunks(tensors, chunks, h.chunks, clip, &patch, states, |w, g, vel, _, decay| {
            sgd_element(&h, lr, w, g, vel, decay)
        })
    }
}

/// [`multi_adam_f32`] with its step count on the device: the step is `t + 1` for the `t` and the
/// learning rate read from `scalars` (`h.lr`, `h.c1` and `h.c2` are ignored), with the bias
/// corrections `c1 = 1 - beta1^(t+1)`, `c2 = 1 - beta2^(t+1)` ([`bias_correction`]: f64, rounded
/// once; every thread computes them); the launch leaves `t + 1` behind. No host data: a CUDA
/// graph replays it, each replay one more step.
///
/// - Parameters: as [`multi_adam_f32`], plus `scalars` (its `ticket` 0 on entry, as the last
///   launch left it) and Adam's betas in f64 (`h.beta1`, `h.beta2` are their f32 roundings).
/// - Per element: [`multi_adam_f32`]'s arithmetic.
/// - The count: every thread reads `t` first; after its updates each block takes a ticket (an
///   integer `atom.add` after a GPU-scope fence, once every thread of the block is past its
///   read); the block that draws the last one writes `t + 1` and resets the ticket, so no block
///   can read the new count.
/// - Launch: `min(chunks, MAX_OPTIM_BLOCKS)` blocks of [`OPTIM_THREADS`] (at least one chunk:
///   an empty table takes [`optim_adam_tick`]).
#[kernel]
pub unsafe fn multi_adam_scalars_f32(
    tensors: DevicePtrMut<OptimTensor>,
    chunks: DevicePtr<OptimChunk>,
    clip: DevicePtr<ClipState>,
    h: MultiAdam,
    patch: GradPatch,
    scalars: DevicePtrMut<StepScalars>,
    beta1: f64,
    beta2: f64,
) {
    let sp = scalars.as_mut_ptr();
    let (lr, t) = unsafe { ((*sp).lr, (*sp).t + 1) };
    let (c1, c2) = (bias_correction(beta1, t), bias_correction(beta2, t));
    unsafe {
        update_chunks(tensors, chunks, h.chunks, clip, &patch, 2, |w, g, m, v, decay| {
            adam_element(&h, lr, c1, c2, w, g, m, v, decay)
        })
    }
    // every thread of this block has read the count (at its start)
    sync::sync_threads();
    if thread::thread_idx_x() == 0 {
        fence::fence_gpu();
        let ticket = unsafe { atomic::atomic_add_u32(&raw mut (*sp).ticket, 1) };
        if ticket + 1 == thread::grid_dim_x() {
            // the last block: every block has read the count
            unsafe {
                (*sp).t = t;
                (*sp).ticket = 0;
            }
        }
    }
}

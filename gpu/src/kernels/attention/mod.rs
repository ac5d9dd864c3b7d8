//! The attention kernels (the files in `attention/`): FlashAttention's forward pass, rung by rung.
//! The modules are `kernels::flash_simt` and `kernels::flash_mma` (see [`crate::kernels`]),
//! re-exported here; this module holds what they share with the host: the parameter struct and
//! the causal mask's arithmetic.
//!
//! - [`flash_simt`]: tiled online softmax on CUDA cores, f32 or bf16 in and out, f32 math.
//! - [`flash_mma`]: FlashAttention-2 on `mma.sync` (bf16 / f16), `cp.async` double-buffered K/V
//!   tiles, swizzled shared memory, P kept in registers.
//! - [`flash_wgmma`]: the Hopper rung (sm_90a): TMA K/V ring with mbarriers, a producer warp, `wgmma`
//!   for `Q K^T` (shared operands) and `P V` (P from registers).
//! - [`flash_wgmma_pp`]: the Hopper rung with warp specialization: a producer warpgroup that gives
//!   its registers to two consumer warpgroups (`setmaxnreg`), which take turns on the tensor cores
//!   (named-barrier ping-pong) so one's softmax overlaps the other's products; 3-stage K/V ring.
//! - [`flash_bwd_simt`]: the backward (dQ, dK, dV from the saved log-sum-exp) on CUDA cores,
//!   deterministic.
//! - [`flash_bwd_mma`]: the backward on `mma.sync` (bf16 / f16): delta, dK / dV, dQ kernels,
//!   deterministic (no atomics).
//! - [`flash_bwd_wgmma`]: the backward on TMA + `wgmma` (sm_90a, bf16 / f16): the delta kernel of
//!   [`flash_bwd_mma`], then dK / dV and dQ kernels with a producer warp, deterministic (a separate
//!   dQ pass, no atomics).
//!
//! Layout: Q and O are `[batch, heads, q_len, head_dim]`, K and V `[batch, heads, kv_len,
//! head_dim]`, all row-major and dense; the log-sum-exp is `[batch, heads, q_len]` f32 (natural
//! log of `sum_j exp(scale q_i . k_j)`, `-inf` for a row that sees no key).
//!
//! The causal mask is aligned at the bottom right (FlashAttention 2.1 and later, PyTorch's
//! `causal_lower_right`): query row `i` sees keys `j <= i + kv_len - q_len`. With equal lengths
//! that is `j <= i`. When `q_len > kv_len` the first `q_len - kv_len` rows see no key: their output
//! is 0 and their log-sum-exp `-inf`.

use crate::KernelParam;

pub use super::{flash_bwd_mma, flash_bwd_simt, flash_bwd_wgmma, flash_mma, flash_simt, flash_wgmma, flash_wgmma_pp};

/// The problem an attention kernel solves, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    /// Batch size.
    pub batch: u32,
    /// Heads (Q, K and V have the same number).
    pub heads: u32,
    /// Query rows per head.
    pub q_len: u32,
    /// Key / value rows per head.
    pub kv_len: u32,
    /// Elements per row of Q, K, V and O.
    pub head_dim: u32,
    /// The factor on `q . k` before the softmax (positive; usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// 1 for the causal mask, 0 for none.
    pub causal: u32,
}
// SAFETY: repr(C), five u32, an f32 and a u32.
unsafe impl KernelParam for AttentionParams {}

impl AttentionParams {
    /// `batch * heads`: the grid's y extent.
    pub const fn heads_total(self) -> u32 {
        self.batch * self.heads
    }

    /// The keys query row `row` sees are `0..visible_keys(row)` (all `kv_len` without the mask).
    pub const fn visible_keys(self, row: u32) -> u32 {
        if self.causal == 0 {
            return self.kv_len;
        }
        let lim = row as i64 + 1 + self.kv_len as i64 - self.q_len as i64;
        if lim <= 0 {
            0
        } else if lim >= self.kv_len as i64 {
            self.kv_len
        } else {
            lim as u32
        }
    }

    /// The keys a block of query rows `row0..row0 + rows` needs: those its last row sees (rows past
    /// `q_len` need none).
    pub const fn keys_for_rows(self, row0: u32, rows: u32) -> u32 {
        let end = if row0 + rows < self.q_len { row0 + rows } else { self.q_len };
        if end == 0 || row0 >= self.q_len { 0 } else { self.visible_keys(end - 1) }
    }

    /// Whether the key tile `k0..k0 + tile` needs masking for query rows `row0..row0 + rows`:
    /// it crosses `kv_len`, or (causal) some row does not see all of it.
    pub const fn tile_needs_mask(self, row0: u32, k0: u32, tile: u32) -> bool {
        k0 + tile > self.kv_len || (self.causal != 0 && k0 + tile > self.visible_keys(row0))
    }

    /// Multiply-adds of the forward pass counted as FLOPs the usual way: `4 B H Sq Skv D`
    /// (two products), halved with the causal mask.
    pub fn forward_flops(self) -> f64 {
        let f =
            4.0 * self.batch as f64 * self.heads as f64 * self.q_len as f64 * self.kv_len as f64 * self.head_dim as f64;
        if self.causal != 0 { f / 2.0 } else { f }
    }
}

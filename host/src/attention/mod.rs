//! Attention on the CPU, in f64: the reference every attention kernel is checked against, forward
//! (`O`, the log-sum-exp) and backward (`dQ`, `dK`, `dV`). A leaf: it knows nothing of devices or
//! tensors, and everything above may use it.
//!
//! Buffers are `[batch, heads, seq, head_dim]` row-major, with `q_len` query rows and `kv_len`
//! key/value rows per head; the problem is a [`AttentionParams`] (the struct the kernels take).
//! The causal mask is bottom-right aligned: query row `i` sees keys `j <= i + kv_len - q_len`
//! (FlashAttention 2.1 and later, PyTorch's `causal_lower_right`; PyTorch's `is_causal=True` is
//! the top-left mask `j <= i`, which is the same only when the lengths are equal). A row that sees
//! no key has output 0, log-sum-exp `-inf` and zero gradients.

pub mod reference;

pub use kiln_gpu::kernels::attention::AttentionParams;
pub use reference::{AttentionGrads, AttentionOut, backward, forward, forward_row};

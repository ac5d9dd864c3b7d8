//! The checks every GEMM entry point makes before it launches, written once: operand sizes against
//! the shape, the kernels' 32-bit indexing, k's multiple, 16-byte alignment, empty products, and the
//! grid's y limit at launch.

use crate::cuda::LaunchConfig;
use crate::error::{Error, Result};
use kiln_gpu::kernels::mma_tile::GemmShape;

/// The kernels index in u32: every operand must hold fewer than 2^31 elements.
pub const MAX_OPERAND_ELEMENTS: usize = (1 << 31) - 1;

/// A product whose operands passed the checks of one entry point (`op` names it in errors); its
/// [`Checked::launch`] is the one way a GEMM kernel is launched.
#[derive(Clone, Copy, Debug)]
pub(super) struct Checked {
    op: &'static str,
    s: GemmShape,
}

impl Checked {
    /// Checks that `a` (m x k), `b` (k x n or n x k: both k n elements) and `c` (m x n) fit `s`, and
    /// that each operand is within the kernels' 32-bit indexing.
    pub(super) fn operands(op: &'static str, a: usize, b: usize, c: usize, s: GemmShape) -> Result<Checked> {
        let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
        if a != m * k || b != k * n || c != m * n {
            return Err(Error::shape(
                op,
                format!("{m}x{n}x{k} needs a: {}, b: {}, c: {}; got {a}, {b}, {c}", m * k, k * n, m * n),
            ));
        }
        Checked::indexable(op, s)
    }

    /// Checks only that one product of shape `s` is within the kernels' 32-bit indexing (for
    /// operands whose sizes are checked elsewhere, such as strided batches).
    pub(super) fn indexable(op: &'static str, s: GemmShape) -> Result<Checked> {
        let (m, n, k) = (s.m as usize, s.n as usize, s.k as usize);
        if [m * k, k * n, m * n].iter().any(|&x| x > MAX_OPERAND_ELEMENTS) {
            return Err(Error::Unsupported {
                op,
                what: format!(
                    "{m}x{n}x{k}: an operand over {MAX_OPERAND_ELEMENTS} elements (the kernels index in 32 bits); split the product"
                ),
            });
        }
        Ok(Checked { op, s })
    }

    /// The shape checked.
    pub(super) fn shape(&self) -> GemmShape {
        self.s
    }

    /// Whether the product writes nothing (m or n is 0).
    pub(super) fn writes_nothing(&self) -> bool {
        self.s.m == 0 || self.s.n == 0
    }

    /// Refuses a product with m, n or k 0 (for kernels that cannot run one).
    pub(super) fn non_empty(self) -> Result<Checked> {
        let s = self.s;
        if s.m == 0 || s.n == 0 || s.k == 0 {
            return Err(Error::shape(self.op, format!("empty product {}x{}x{}", s.m, s.n, s.k)));
        }
        Ok(self)
    }

    /// Refuses k not a multiple of `multiple`; `why` says what needs it.
    pub(super) fn k_multiple_of(self, multiple: u32, why: &str) -> Result<Checked> {
        if !self.s.k.is_multiple_of(multiple) {
            return Err(Error::Unsupported {
                op: self.op,
                what: format!("k = {}: {why}, so k must be a multiple of {multiple}", self.s.k),
            });
        }
        Ok(self)
    }

    /// Refuses operands not 16-byte aligned (16-byte loads: `cp.async`, vector loads and stores).
    pub(super) fn aligned(self, addrs: &[u64]) -> Result<Checked> {
        if let Some(a) = addrs.iter().find(|a| *a % 16 != 0) {
            return Err(Error::Unsupported {
                op: self.op,
                what: format!("an operand at {a:#x}: 16-byte loads need 16-byte-aligned buffers"),
            });
        }
        Ok(self)
    }

    /// A 1-D grid of `blocks` blocks (`what`: what they are, for the error).
    pub(super) fn grid_1d(&self, blocks: u64, what: &str) -> Result<u32> {
        u32::try_from(blocks)
            .map_err(|_| Error::shape(self.op, format!("{blocks} {what} exceed the 1-D grid; split the product")))
    }

    /// Checks `cfg`'s grid (at most 65535 blocks in y) and calls `go` to launch with it.
    pub(super) fn launch(&self, cfg: LaunchConfig, go: impl FnOnce(LaunchConfig) -> Result<()>) -> Result<()> {
        if cfg.grid_dim.1 > 65535 {
            return Err(Error::Unsupported {
                op: self.op,
                what: format!("a grid of {} blocks in y (at most 65535): split the product", cfg.grid_dim.1),
            });
        }
        go(cfg)
    }
}

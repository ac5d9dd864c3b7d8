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

    /// Checks a fused epilogue's buffers against the checked shape (m x n): C holds `c` elements
    /// (m n), the bias `n`, the residual m n, the periodic table `period * n` with `period >= 1`;
    /// every buffer aligned to its element (`elem` bytes; the bias 4), addresses given beside
    /// the lengths. Lengths are `(len, addr)`.
    pub(super) fn epilogue(
        self,
        elem: u64,
        c: (usize, u64),
        bias: Option<(usize, u64)>,
        residual: Option<(usize, u64)>,
        periodic: Option<((usize, u64), u32)>,
    ) -> Result<Checked> {
        let (m, n) = (self.s.m as usize, self.s.n as usize);
        let op = self.op;
        if c.0 != m * n {
            return Err(Error::shape(op, format!("c needs m n = {} elements ({m} x {n}), has {}", m * n, c.0)));
        }
        if let Some((len, _)) = bias
            && len != n
        {
            return Err(Error::shape(op, format!("the bias needs n = {n} elements, has {len}")));
        }
        if let Some((len, _)) = residual
            && len != m * n
        {
            return Err(Error::shape(
                op,
                format!("the residual needs m n = {} elements ({m} x {n}, like c), has {len}", m * n),
            ));
        }
        if let Some(((len, _), period)) = periodic {
            if period == 0 {
                return Err(Error::shape(op, "a periodic table of period 0: the period must be at least 1"));
            }
            if (len as u64) != period as u64 * n as u64 {
                return Err(Error::shape(
                    op,
                    format!(
                        "the periodic table needs period x n = {period} x {n} = {} elements, has {len}",
                        period as u64 * n as u64
                    ),
                ));
            }
        }
        let addrs = [Some(c), residual, periodic.map(|p| p.0)];
        if let Some(a) = addrs.iter().flatten().map(|x| x.1).find(|a| !a.is_multiple_of(elem)) {
            return Err(Error::Unsupported {
                op,
                what: format!("a buffer at {a:#x} not aligned to its {elem}-byte elements"),
            });
        }
        if let Some((_, a)) = bias
            && !a.is_multiple_of(4)
        {
            return Err(Error::Unsupported { op, what: format!("a bias at {a:#x} not aligned to 4 bytes") });
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

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(m: u32, n: u32) -> Checked {
        Checked::indexable("fused gemm", GemmShape { m, n, k: 8 }).unwrap()
    }

    fn is_shape(r: Result<Checked>) -> bool {
        matches!(r, Err(Error::Shape { op: "fused gemm", .. }))
    }

    #[test]
    fn fused_epilogue_sizes_are_checked() {
        let (m, n) = (5usize, 7usize);
        let c = checked(m as u32, n as u32);
        let ok = |x: usize| (x, 256u64);
        // everything right, the table's period not dividing m
        assert!(c.epilogue(2, ok(m * n), Some(ok(n)), Some(ok(m * n)), Some((ok(3 * n), 3))).is_ok());
        assert!(c.epilogue(4, ok(m * n), None, None, Some((ok(n), 1))).is_ok());
        assert!(c.epilogue(4, ok(m * n), None, None, Some((ok(m * n), m as u32))).is_ok());
        // wrong C, bias, residual, table, period 0
        assert!(is_shape(c.epilogue(4, ok(m * n - 1), None, None, None)));
        assert!(is_shape(c.epilogue(4, ok(m * n), Some(ok(n + 1)), None, None)));
        assert!(is_shape(c.epilogue(4, ok(m * n), None, Some(ok(n * (m + 1))), None)));
        assert!(is_shape(c.epilogue(4, ok(m * n), None, None, Some((ok(7 * n - 1), 7)))));
        assert!(is_shape(c.epilogue(4, ok(m * n), None, None, Some((ok(0), 0)))));
        // misaligned buffers are refused, not read
        let r = c.epilogue(4, ok(m * n), None, Some((m * n, 258)), None);
        assert!(matches!(r, Err(Error::Unsupported { op: "fused gemm", .. })), "{r:?}");
        let r = c.epilogue(2, (m * n, 257), None, None, None);
        assert!(matches!(r, Err(Error::Unsupported { op: "fused gemm", .. })), "{r:?}");
    }

    #[test]
    fn error_messages_name_the_sizes() {
        let c = checked(4, 6);
        let e = c.epilogue(4, (24, 0), None, None, Some(((17, 0), 3))).unwrap_err().to_string();
        assert!(e.contains("3 x 6 = 18") && e.contains("17"), "{e}");
    }
}

//! How a product's operands are stored ([`Layout`]) and how the FP32 chooser classes its size
//! ([`SizeClass`]): the keys of the tuned table, with no dependency on the kernels' tables.

use kiln_gpu::kernels::mma_tile::GemmShape;

/// How a product's operands are stored (row-major): `C = op(A) op(B)` with `C` m x n.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `C = A B`: A m x k, B k x n.
    NN,
    /// `C = A B^T`: A m x k, B stored n x k (`Y = X W^T`).
    NT,
    /// `C = A^T B`: A stored k x m, B k x n (`dW = dY^T X`).
    TN,
}

impl Layout {
    /// Whether the layout's rungs take `s`: 16-byte loads of every stored row and 16-byte stores
    /// of C (the innermost dimension of each stored operand, and n, a multiple of 4), and k a
    /// multiple of 4 as their NN twins need (the rungs are those twins with other loaders, so a TN
    /// product with k = 6 has no rung even though its stored rows are aligned).
    pub fn rows_aligned(self, s: GemmShape) -> bool {
        let inner_a = if self == Layout::TN { s.m } else { s.k };
        let inner_b = if self == Layout::NT { s.k } else { s.n };
        inner_a.is_multiple_of(4) && inner_b.is_multiple_of(4) && s.n.is_multiple_of(4) && s.k.is_multiple_of(4)
    }
}

/// Size classes of the FP32 chooser: how many 128 x 128 tiles C has, against the H200's 132 SMs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SizeClass {
    /// Fewer than 66 tiles: under half a wave of 128 x 128 tiles.
    Small,
    /// 66 to 131 tiles.
    Medium,
    /// 132 to 527 tiles: one to four waves.
    Large,
    /// 528 tiles and more.
    Huge,
}

impl SizeClass {
    /// Every class, smallest first.
    pub const ALL: [SizeClass; 4] = [SizeClass::Small, SizeClass::Medium, SizeClass::Large, SizeClass::Huge];

    /// The class of `s`.
    pub fn of(s: GemmShape) -> SizeClass {
        let tiles = s.m.div_ceil(128) as u64 * s.n.div_ceil(128) as u64;
        match tiles {
            0..66 => SizeClass::Small,
            66..132 => SizeClass::Medium,
            132..528 => SizeClass::Large,
            _ => SizeClass::Huge,
        }
    }

    /// The shapes (m, n, k, all multiples of 4) the tuning run measures for this class: squares,
    /// and the tall, wide and long-k products of linear layers.
    pub const fn shapes(self) -> &'static [(u32, u32, u32)] {
        match self {
            SizeClass::Small => &[(1024, 1024, 1024), (512, 1024, 4096), (4096, 256, 1024)],
            SizeClass::Medium => &[(1280, 1280, 1280), (1024, 2048, 2048), (4096, 384, 2048)],
            SizeClass::Large => &[(2048, 2048, 2048), (4096, 1024, 4096), (1024, 4096, 1024)],
            SizeClass::Huge => &[(4096, 4096, 4096), (8192, 2048, 2048), (2048, 8192, 1024)],
        }
    }
}

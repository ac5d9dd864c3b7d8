//! Shared-memory swizzles: the XOR patterns TMA and wgmma apply to tiles so that a warp reading a
//! column of 16-byte chunks hits eight different bank groups.
//!
//! With 128-byte swizzling, a tile is made of 1024-byte atoms of 8 rows x 128 bytes. Inside an atom,
//! 16-byte chunk `c` of row `r` is stored at chunk `c ^ (r % 8)`. 64- and 32-byte swizzles do the same
//! on 4 and 2 chunks. All functions map a byte offset within a tile (as if unswizzled, rows of
//! `span` bytes packed) to the byte offset where the hardware keeps it. They are involutions.

/// The swizzle modes of TMA tensor maps and wgmma descriptors.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Swizzle {
    /// No swizzling.
    None,
    /// 32-byte span: address bit 4 ^= bit 7 (CuTe's `Swizzle<1,4,3>`).
    B32,
    /// 64-byte span: address bits 4-5 ^= bits 7-8 (`Swizzle<2,4,3>`).
    B64,
    /// 128-byte span: address bits 4-6 ^= bits 7-9 (`Swizzle<3,4,3>`, 1024-byte atoms).
    B128,
}

impl Swizzle {
    /// Bytes in one swizzled row (the largest inner box extent in bytes TMA accepts with this mode).
    pub const fn span(self) -> u32 {
        match self {
            Swizzle::None => 16,
            Swizzle::B32 => 32,
            Swizzle::B64 => 64,
            Swizzle::B128 => 128,
        }
    }

    /// Where byte `offset` of an unswizzled tile (rows of `span()` bytes) is stored.
    pub const fn apply(self, offset: u32) -> u32 {
        let bits = match self {
            Swizzle::None => return offset,
            Swizzle::B32 => 1,
            Swizzle::B64 => 2,
            Swizzle::B128 => 3,
        };
        let mask = (1u32 << bits) - 1;
        // chunk index lives in bits 4.., the row within the atom in bits 7.. (rows of 128-byte pitch
        // for every mode, as the hardware computes it from the address).
        offset ^ (((offset >> 7) & mask) << 4)
    }
}

/// The byte offset of element `(row, col)` of a tile of `elem_bytes`-sized elements whose rows are
/// `row_bytes` long, stored with swizzle `s`. `row_bytes` must equal `s.span()` for a swizzled tile.
pub const fn tile_offset(s: Swizzle, row: u32, col: u32, row_bytes: u32, elem_bytes: u32) -> u32 {
    s.apply(row * row_bytes + col * elem_bytes)
}

// SAFETY: a fieldless repr(u32) enum; the host only passes its variants.
unsafe impl crate::KernelParam for Swizzle {}

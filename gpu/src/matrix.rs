//! `ldmatrix` / `stmatrix`: a warp moves 8x8 tiles of 16-bit elements between shared memory and the
//! register fragments `mma.sync` uses.
//!
//! For `.x4`, lanes 0-7 give the row addresses of matrix 0, lanes 8-15 of matrix 1, 16-23 of matrix 2
//! and 24-31 of matrix 3 (each row: 16 contiguous bytes). Register `i` of every lane then holds
//! matrix `i`, with lane `l` holding row `l / 4`, columns `2 (l % 4)` and `2 (l % 4) + 1`: exactly
//! the fragment of [`mma`](crate::mma). `.trans` delivers the transposed matrices.

#[cfg(target_arch = "nvptx64")]
mod device {
    use crate::shared::SharedAddr;
    use core::arch::asm;

    /// Loads four 8x8 b16 matrices; `row_addr` is this lane's row address (see the module docs).
    ///
    /// PTX: `ldmatrix.sync.aligned.m8n8.x4.shared.b16 {r0, r1, r2, r3}, [row_addr];`
    ///
    /// # Safety
    /// Every lane must call it (converged) with a 16-byte-aligned shared address of a readable row.
    #[inline(always)]
    pub unsafe fn ldmatrix_x4(row_addr: SharedAddr) -> [u32; 4] {
        let (a, b, c, d): (u32, u32, u32, u32);
        unsafe {
            asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];", a = out(reg32) a,
                b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) row_addr, options(nostack, readonly))
        };
        [a, b, c, d]
    }

    /// Loads four 8x8 b16 matrices, transposed.
    ///
    /// PTX: `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {r0, r1, r2, r3}, [row_addr];`
    ///
    /// # Safety
    /// As [`ldmatrix_x4`].
    #[inline(always)]
    pub unsafe fn ldmatrix_x4_trans(row_addr: SharedAddr) -> [u32; 4] {
        let (a, b, c, d): (u32, u32, u32, u32);
        unsafe {
            asm!("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{a}, {b}, {c}, {d}}}, [{p}];", a = out(reg32) a,
                b = out(reg32) b, c = out(reg32) c, d = out(reg32) d, p = in(reg32) row_addr, options(nostack, readonly))
        };
        [a, b, c, d]
    }

    /// Loads two 8x8 b16 matrices (lanes 0-15 give addresses; the others' are ignored but must be valid).
    ///
    /// PTX: `ldmatrix.sync.aligned.m8n8.x2.shared.b16 {r0, r1}, [row_addr];`
    ///
    /// # Safety
    /// As [`ldmatrix_x4`].
    #[inline(always)]
    pub unsafe fn ldmatrix_x2(row_addr: SharedAddr) -> [u32; 2] {
        let (a, b): (u32, u32);
        unsafe {
            asm!("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{{a}, {b}}}, [{p}];", a = out(reg32) a,
                b = out(reg32) b, p = in(reg32) row_addr, options(nostack, readonly))
        };
        [a, b]
    }

    /// Stores four 8x8 b16 matrices from fragments (sm_90); lane addresses as for [`ldmatrix_x4`].
    ///
    /// PTX: `stmatrix.sync.aligned.m8n8.x4.shared.b16 [row_addr], {r0, r1, r2, r3};`
    ///
    /// # Safety
    /// Every lane must call it with a 16-byte-aligned shared address of a writable row.
    #[inline(always)]
    pub unsafe fn stmatrix_x4(row_addr: SharedAddr, r: [u32; 4]) {
        unsafe {
            asm!("stmatrix.sync.aligned.m8n8.x4.shared.b16 [{p}], {{{a}, {b}, {c}, {d}}};", p = in(reg32) row_addr,
                a = in(reg32) r[0], b = in(reg32) r[1], c = in(reg32) r[2], d = in(reg32) r[3], options(nostack))
        };
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

/// For an `ldmatrix.x4` loading a 16x16 tile stored row by row: the (row, column) whose address
/// lane `lane` supplies so that the registers come out as the `mma.m16n8k16` A fragment
/// (matrix 0: rows 0-7 / cols 0-7, 1: rows 8-15 / cols 0-7, 2: rows 0-7 / cols 8-15, 3: rows 8-15 / cols 8-15).
pub const fn ldmatrix_x4_a_row_col(lane: u32) -> (u32, u32) {
    (lane % 16, (lane / 16) * 8)
}

/// For an `ldmatrix.x2` loading an 8 (n) x 16 (k) tile stored n by n: the (n, k) whose address lane
/// `lane` supplies so that the registers come out as the `mma.m16n8k16` B fragment.
pub const fn ldmatrix_x2_b_row_col(lane: u32) -> (u32, u32) {
    (lane % 8, ((lane / 8) % 2) * 8)
}

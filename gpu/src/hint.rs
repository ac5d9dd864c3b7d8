//! Hints to the compiler, like `core::hint`.

/// Returns `x`, through an instruction the compiler cannot see into or move out of a loop.
///
/// LLVM hoists every loop-invariant address out of a kernel's main loop: in a GEMM that is one
/// register per (fragment, k step) pair, enough to make ptxas spill. Laundering the lane index
/// once per iteration makes those addresses cheap recomputations inside the loop instead.
///
/// PTX: `mov.u32 %r, x;` (an `asm!` block without `pure`, so it is neither hoisted nor merged).
#[inline(always)]
pub fn launder(x: u32) -> u32 {
    #[cfg(target_arch = "nvptx64")]
    {
        let y: u32;
        // SAFETY: a register move.
        unsafe { core::arch::asm!("mov.u32 {y}, {x};", y = out(reg32) y, x = in(reg32) x, options(nomem, nostack)) };
        y
    }
    #[cfg(not(target_arch = "nvptx64"))]
    x
}

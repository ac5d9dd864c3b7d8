//! Thread, block and grid indices (the PTX special registers), and `trap`.
//!
//! Each function reads one special register with `mov.u32 %r, %sreg;`. On the host these functions
//! do not exist; kernels only run on the device.

#[cfg(target_arch = "nvptx64")]
mod device {
    use core::arch::asm;

    sreg! {
        /// Thread index within the block, x.
        thread_idx_x => "%tid.x";
        /// Thread index within the block, y.
        thread_idx_y => "%tid.y";
        /// Thread index within the block, z.
        thread_idx_z => "%tid.z";
        /// Block dimension, x.
        block_dim_x => "%ntid.x";
        /// Block dimension, y.
        block_dim_y => "%ntid.y";
        /// Block dimension, z.
        block_dim_z => "%ntid.z";
        /// Block index within the grid, x.
        block_idx_x => "%ctaid.x";
        /// Block index within the grid, y.
        block_idx_y => "%ctaid.y";
        /// Block index within the grid, z.
        block_idx_z => "%ctaid.z";
        /// Grid dimension in blocks, x.
        grid_dim_x => "%nctaid.x";
        /// Grid dimension in blocks, y.
        grid_dim_y => "%nctaid.y";
        /// Grid dimension in blocks, z.
        grid_dim_z => "%nctaid.z";
        /// Lane index within the warp (0..32).
        lane_id => "%laneid";
        /// The multiprocessor this thread runs on (for diagnostics only: not stable across launches).
        sm_id => "%smid";
    }

    /// Index of the calling thread's warp within its block (`thread_idx_x() / 32` for 1-D blocks).
    #[inline(always)]
    pub fn warp_id() -> u32 {
        thread_idx_x() / crate::warp::WARP_SIZE
    }

    /// The global linear thread index along x: `block_idx_x() * block_dim_x() + thread_idx_x()`.
    #[inline(always)]
    pub fn global_idx_x() -> u32 {
        block_idx_x() * block_dim_x() + thread_idx_x()
    }

    /// Total threads in the grid along x (the stride of a grid-stride loop).
    #[inline(always)]
    pub fn grid_stride_x() -> u32 {
        grid_dim_x() * block_dim_x()
    }

    /// The launch-bound marker `#[kernel(max_threads = N)]` puts at the top of an entry: a PTX
    /// comment the PTX builder turns into the entry's `.maxntid N, 1, 1` directive. Emits no
    /// instruction.
    ///
    /// PTX: `// kiln.maxntid N`
    #[inline(always)]
    pub fn max_threads_marker<const N: u32>() {
        // SAFETY: a comment; not `pure`, so the compiler keeps it.
        unsafe { asm!("// kiln.maxntid {n}", n = const N, options(nomem, nostack, preserves_flags)) }
    }

    /// The occupancy marker `#[kernel(max_threads = N, min_blocks = B)]` puts at the top of an
    /// entry: a PTX comment the PTX builder turns into the entry's `.minnctapersm B` directive, so
    /// ptxas keeps registers low enough for B blocks of N threads per SM. Emits no instruction.
    ///
    /// PTX: `// kiln.minnctapersm B`
    #[inline(always)]
    pub fn min_blocks_marker<const B: u32>() {
        // SAFETY: a comment; not `pure`, so the compiler keeps it.
        unsafe { asm!("// kiln.minnctapersm {b}", b = const B, options(nomem, nostack, preserves_flags)) }
    }

    /// Aborts the kernel: the launch fails with an illegal-instruction error the host reports.
    ///
    /// PTX: `trap;`
    #[inline(always)]
    pub fn trap() -> ! {
        // SAFETY: `trap` ends the grid; nothing runs after it.
        unsafe { asm!("trap;", options(noreturn, nostack)) }
    }

    /// Reads the global nanosecond timer (shared by all SMs; it advances in steps of about a
    /// microsecond). Used to bound waits in wall-clock time.
    ///
    /// PTX: `mov.u64 %rd, %globaltimer;`
    #[inline(always)]
    pub fn globaltimer_ns() -> u64 {
        let r: u64;
        // SAFETY: reading a counter has no side effects.
        unsafe { asm!("mov.u64 {r}, %globaltimer;", r = out(reg64) r, options(nomem, nostack)) };
        r
    }

    /// Reads the per-SM cycle counter.
    ///
    /// PTX: `mov.u64 %rd, %clock64;`
    #[inline(always)]
    pub fn clock64() -> u64 {
        let r: u64;
        // SAFETY: reading a counter has no side effects.
        unsafe { asm!("mov.u64 {r}, %clock64;", r = out(reg64) r, options(nomem, nostack)) };
        r
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

//! Shared memory: the block's dynamic allocation, static arrays, and shared-window addresses.
//!
//! Two kinds of address reach shared memory:
//! - a *generic* pointer (`*mut T`), for ordinary Rust loads and stores;
//! - a 32-bit *shared-window* address ([`SharedAddr`]), the form `mbarrier`, `cp.async`, TMA,
//!   `ldmatrix`, `wgmma` descriptors and `tcgen05` take.
//!
//! Dynamic shared memory is one block-wide array, [`DYNAMIC_SMEM_SYMBOL`], sized at launch. Above
//! 48 KB the host raises the kernel's `MAX_DYNAMIC_SHARED_SIZE_BYTES` attribute before launching (the
//! kiln runtime does this by itself); the H200 allows up to 227 KB per block.

/// The PTX symbol of the dynamic shared-memory array (aligned to 1024 bytes, as 128-byte swizzled
/// TMA and wgmma tiles need).
pub const DYNAMIC_SMEM_SYMBOL: &str = "kiln_dynamic_smem";

/// A 32-bit address in the shared-memory window.
pub type SharedAddr = u32;

/// Shared memory a block may request without raising the kernel's attribute.
pub const DEFAULT_MAX_DYNAMIC_SMEM: u32 = 48 * 1024;

#[cfg(target_arch = "nvptx64")]
mod device {
    use super::SharedAddr;
    use core::arch::{asm, global_asm};

    global_asm!(".extern .shared .align 1024 .b8 kiln_dynamic_smem[];");

    /// The shared-window address of the block's dynamic shared memory.
    ///
    /// PTX: `mov.u32 %r, kiln_dynamic_smem;`
    #[inline(always)]
    pub fn dynamic_smem_addr() -> SharedAddr {
        let r: u32;
        // SAFETY: takes an address; touches no memory.
        unsafe { asm!("mov.u32 {r}, kiln_dynamic_smem;", r = out(reg32) r, options(nomem, nostack, pure)) };
        r
    }

    /// A generic pointer to the block's dynamic shared memory, `byte_offset` bytes in.
    ///
    /// PTX: `mov.u64 %rd, kiln_dynamic_smem; cvta.shared.u64 %rd, %rd;`
    #[inline(always)]
    pub fn dynamic_smem<T>(byte_offset: usize) -> *mut T {
        let r: u64;
        // SAFETY: takes an address; touches no memory.
        unsafe {
            asm!("mov.u64 {r}, kiln_dynamic_smem;", "cvta.shared.u64 {r}, {r};", r = out(reg64) r,
                options(nomem, nostack, pure))
        };
        (r as usize + byte_offset) as *mut T
    }

    /// The shared-window address of a generic pointer into shared memory.
    ///
    /// PTX: `cvta.to.shared.u64 %rd, ptr; cvt.u32.u64 %r, %rd;`
    ///
    /// # Safety
    /// `ptr` must point into shared memory.
    #[inline(always)]
    pub unsafe fn shared_addr<T>(ptr: *const T) -> SharedAddr {
        let r: u32;
        unsafe {
            asm!("{{ .reg .u64 t; cvta.to.shared.u64 t, {p}; cvt.u32.u64 {r}, t; }}", r = out(reg32) r,
                p = in(reg64) ptr, options(nomem, nostack, pure))
        };
        r
    }

    /// Loads 16 bytes from a shared-window address.
    ///
    /// PTX: `ld.shared.v4.u32 {a, b, c, d}, [addr];`
    ///
    /// # Safety
    /// `addr` must be a 16-byte-aligned shared address inside the block's allocation.
    #[inline(always)]
    pub unsafe fn ld_shared_v4(addr: SharedAddr) -> [u32; 4] {
        let (a, b, c, d): (u32, u32, u32, u32);
        unsafe {
            asm!("ld.shared.v4.u32 {{{a}, {b}, {c}, {d}}}, [{p}];", a = out(reg32) a, b = out(reg32) b,
                c = out(reg32) c, d = out(reg32) d, p = in(reg32) addr, options(nostack, readonly))
        };
        [a, b, c, d]
    }

    /// Loads 8 bytes from a shared-window address.
    ///
    /// PTX: `ld.shared.v2.u32 {a, b}, [addr];`
    ///
    /// # Safety
    /// `addr` must be an 8-byte-aligned shared address inside the block's allocation.
    #[inline(always)]
    pub unsafe fn ld_shared_v2(addr: SharedAddr) -> [u32; 2] {
        let (a, b): (u32, u32);
        unsafe {
            asm!("ld.shared.v2.u32 {{{a}, {b}}}, [{p}];", a = out(reg32) a, b = out(reg32) b, p = in(reg32) addr,
                options(nostack, readonly))
        };
        [a, b]
    }

    /// Loads 4 bytes from a shared-window address.
    ///
    /// PTX: `ld.shared.b32 v, [addr];`
    ///
    /// # Safety
    /// `addr` must be a 4-byte-aligned shared address inside the block's allocation.
    #[inline(always)]
    pub unsafe fn ld_shared_b32(addr: SharedAddr) -> u32 {
        let v: u32;
        unsafe { asm!("ld.shared.b32 {v}, [{p}];", v = out(reg32) v, p = in(reg32) addr, options(nostack, readonly)) };
        v
    }

    /// Stores 4 bytes to a shared-window address.
    ///
    /// PTX: `st.shared.b32 [addr], v;`
    ///
    /// # Safety
    /// `addr` must be a 4-byte-aligned shared address inside the block's allocation.
    #[inline(always)]
    pub unsafe fn st_shared_b32(addr: SharedAddr, v: u32) {
        unsafe { asm!("st.shared.b32 [{p}], {v};", p = in(reg32) addr, v = in(reg32) v, options(nostack)) };
    }

    /// Stores 8 bytes to a shared-window address.
    ///
    /// PTX: `st.shared.v2.u32 [addr], {a, b};`
    ///
    /// # Safety
    /// `addr` must be an 8-byte-aligned shared address inside the block's allocation.
    #[inline(always)]
    pub unsafe fn st_shared_v2(addr: SharedAddr, v: [u32; 2]) {
        unsafe {
            asm!("st.shared.v2.u32 [{p}], {{{a}, {b}}};", p = in(reg32) addr, a = in(reg32) v[0], b = in(reg32) v[1],
                options(nostack))
        };
    }

    /// Stores 16 bytes to a shared-window address.
    ///
    /// PTX: `st.shared.v4.u32 [addr], {a, b, c, d};`
    ///
    /// # Safety
    /// `addr` must be a 16-byte-aligned shared address inside the block's allocation.
    #[inline(always)]
    pub unsafe fn st_shared_v4(addr: SharedAddr, v: [u32; 4]) {
        unsafe {
            asm!("st.shared.v4.u32 [{p}], {{{a}, {b}, {c}, {d}}};", p = in(reg32) addr, a = in(reg32) v[0],
                b = in(reg32) v[1], c = in(reg32) v[2], d = in(reg32) v[3], options(nostack))
        };
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

/// Declares a static shared-memory array and an accessor returning a generic pointer to it.
///
/// ```ignore
/// kiln_gpu::shared_array!(fn partials() -> [f32; 32], align 16);
/// let p: *mut [f32; 32] = partials();
/// ```
///
/// Emits the PTX `.shared .align 16 .b8 kiln_static_partials[128];` and, in the accessor,
/// `mov.u64 %rd, kiln_static_partials; cvta.shared.u64 %rd, %rd;`. Static shared memory counts
/// towards the 48 KB a block gets without raising its attribute.
#[macro_export]
macro_rules! shared_array {
    (fn $name:ident() -> [$t:ty; $n:expr], align $align:literal) => {
        #[cfg(target_arch = "nvptx64")]
        ::core::arch::global_asm!(
            concat!(".shared .align ", stringify!($align), " .b8 kiln_static_", stringify!($name), "[{size}];"),
            size = const ::core::mem::size_of::<[$t; $n]>(),
        );
        #[cfg(target_arch = "nvptx64")]
        #[inline(always)]
        fn $name() -> *mut [$t; $n] {
            let r: u64;
            // SAFETY: takes the address of the block's array; touches no memory.
            unsafe {
                ::core::arch::asm!(
                    concat!("mov.u64 {r}, kiln_static_", stringify!($name), ";"),
                    "cvta.shared.u64 {r}, {r};",
                    r = out(reg64) r,
                    options(nomem, nostack, pure)
                )
            };
            r as usize as *mut [$t; $n]
        }
    };
}

//! Atomics on global (or generic) addresses, and acquire/release loads and stores for
//! inter-block signalling.

#[cfg(target_arch = "nvptx64")]
mod device {
    use core::arch::asm;

    /// Adds `v` to `*addr`, returning the old value.
    ///
    /// PTX: `atom.add.f32 %f, [addr], v;`
    ///
    /// # Safety
    /// `addr` must be a valid, 4-byte-aligned global or shared address.
    #[inline(always)]
    pub unsafe fn atomic_add_f32(addr: *mut f32, v: f32) -> f32 {
        let r: u32;
        unsafe {
            asm!("atom.add.f32 {r}, [{a}], {v};", r = out(reg32) r, a = in(reg64) addr, v = in(reg32) v.to_bits(), options(nostack))
        };
        f32::from_bits(r)
    }

    /// Adds `v` to `*addr`, returning the old value.
    ///
    /// PTX: `atom.add.u32 %r, [addr], v;`
    ///
    /// # Safety
    /// `addr` must be a valid, 4-byte-aligned global or shared address.
    #[inline(always)]
    pub unsafe fn atomic_add_u32(addr: *mut u32, v: u32) -> u32 {
        let r: u32;
        unsafe {
            asm!("atom.add.u32 {r}, [{a}], {v};", r = out(reg32) r, a = in(reg64) addr, v = in(reg32) v, options(nostack))
        };
        r
    }

    /// Stores `max(*addr, v)`, returning the old value.
    ///
    /// PTX: `atom.max.u32 %r, [addr], v;`
    ///
    /// # Safety
    /// `addr` must be a valid, 4-byte-aligned global or shared address.
    #[inline(always)]
    pub unsafe fn atomic_max_u32(addr: *mut u32, v: u32) -> u32 {
        let r: u32;
        unsafe {
            asm!("atom.max.u32 {r}, [{a}], {v};", r = out(reg32) r, a = in(reg64) addr, v = in(reg32) v, options(nostack))
        };
        r
    }

    /// Compare-and-swap: stores `new` when `*addr == expected`; returns the old value.
    ///
    /// PTX: `atom.cas.b32 %r, [addr], expected, new;`
    ///
    /// # Safety
    /// `addr` must be a valid, 4-byte-aligned global or shared address.
    #[inline(always)]
    pub unsafe fn atomic_cas_u32(addr: *mut u32, expected: u32, new: u32) -> u32 {
        let r: u32;
        unsafe {
            asm!("atom.cas.b32 {r}, [{a}], {e}, {n};", r = out(reg32) r, a = in(reg64) addr,
                e = in(reg32) expected, n = in(reg32) new, options(nostack))
        };
        r
    }

    /// Loads with acquire semantics at GPU scope: later reads see what the releasing writer wrote.
    ///
    /// PTX: `ld.acquire.gpu.global.u32 %r, [addr];`
    ///
    /// # Safety
    /// `addr` must be a valid, 4-byte-aligned global address.
    #[inline(always)]
    pub unsafe fn load_acquire_gpu(addr: *const u32) -> u32 {
        let r: u32;
        unsafe {
            asm!("ld.acquire.gpu.global.u32 {r}, [{a}];", r = out(reg32) r, a = in(reg64) addr, options(nostack))
        };
        r
    }

    /// Loads with relaxed semantics at GPU scope: sees another block's atomic updates (no stale L1
    /// copy), orders nothing. Poll with it, then [`fence_gpu`](crate::fence::fence_gpu) once the
    /// value is seen: that pair is an acquire, and the polls skip the L1 invalidation
    /// (`CCTL.IVALL`) that each `ld.acquire` compiles to.
    ///
    /// PTX: `ld.relaxed.gpu.global.u32 %r, [addr];`
    ///
    /// # Safety
    /// `addr` must be a valid, 4-byte-aligned global address.
    #[inline(always)]
    pub unsafe fn load_relaxed_gpu(addr: *const u32) -> u32 {
        let r: u32;
        unsafe {
            asm!("ld.relaxed.gpu.global.u32 {r}, [{a}];", r = out(reg32) r, a = in(reg64) addr, options(nostack))
        };
        r
    }

    /// Stores with release semantics at GPU scope: earlier writes are visible before this one.
    ///
    /// PTX: `st.release.gpu.global.u32 [addr], v;`
    ///
    /// # Safety
    /// `addr` must be a valid, 4-byte-aligned global address.
    #[inline(always)]
    pub unsafe fn store_release_gpu(addr: *mut u32, v: u32) {
        unsafe { asm!("st.release.gpu.global.u32 [{a}], {v};", a = in(reg64) addr, v = in(reg32) v, options(nostack)) };
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

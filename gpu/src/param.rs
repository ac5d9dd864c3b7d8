//! The contract between a kernel's declaration and its host launcher.
//!
//! Everything here compiles on both sides. [`kernel`](crate::kernel) implements [`Kernel`] for each
//! kernel's host descriptor; the host runtime launches any `K: Kernel` with a `K::Args` tuple.

use core::ffi::c_void;

/// A PTX module kiln builds: one per GPU generation it targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    /// Ampere and newer without arch-specific features (`cp.async`, `mma.sync`, `ldmatrix`).
    /// Devices newer than kiln knows (for example 12.x) JIT this module.
    Sm80,
    /// Hopper with its arch-specific features (`wgmma`, `setmaxnreg`), plus TMA and `stmatrix`.
    Sm90a,
    /// Blackwell datacenter (10.x) with `tcgen05` and tensor memory.
    Sm100a,
}

impl Arch {
    /// Every module kiln builds, oldest first.
    pub const ALL: [Arch; 3] = [Arch::Sm80, Arch::Sm90a, Arch::Sm100a];

    /// The name used for `-C target-cpu`, for ptxas's `-arch`, and for the module file.
    pub const fn name(self) -> &'static str {
        match self {
            Arch::Sm80 => "sm_80",
            Arch::Sm90a => "sm_90a",
            Arch::Sm100a => "sm_100a",
        }
    }

    /// The SM version number (80, 90, 100).
    pub const fn sm(self) -> u32 {
        match self {
            Arch::Sm80 => 80,
            Arch::Sm90a => 90,
            Arch::Sm100a => 100,
        }
    }

    /// Extra target features the module is built with (the PTX ISA version tcgen05 needs).
    pub const fn target_features(self) -> &'static str {
        match self {
            Arch::Sm100a => "+ptx86",
            _ => "",
        }
    }

    /// The module for a device of compute capability `major.minor`: 9.0 takes sm_90a, 10.x sm_100a,
    /// 8.x and anything newer kiln has no module for take sm_80 (the driver JIT-compiles it).
    /// `None` below 8.0: kiln's kernels need `cp.async` and bf16 tensor cores.
    pub const fn for_compute_capability(major: u32, minor: u32) -> Option<Arch> {
        match (major, minor) {
            (9, 0) => Some(Arch::Sm90a),
            (10, _) => Some(Arch::Sm100a),
            (m, _) if m >= 8 => Some(Arch::Sm80),
            _ => None,
        }
    }

    /// Looks up a module by its name (`"sm_90a"`). Host only (string comparison would call into
    /// `core`'s `memcmp`, which a PTX module cannot link).
    #[cfg(not(target_arch = "nvptx64"))]
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// Which modules a kernel is compiled into (set by `#[kernel(...)]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelTarget {
    /// Every module.
    Any,
    /// Modules for this SM version and newer (`#[kernel(sm = 90)]`).
    MinSm(u32),
    /// Exactly one module (`#[kernel(arch = "sm_90a")]`): arch-specific instructions.
    Exact(Arch),
}

impl KernelTarget {
    /// Whether a kernel with this target is present in `arch`'s module.
    pub const fn available_on(self, arch: Arch) -> bool {
        match self {
            KernelTarget::Any => true,
            KernelTarget::MinSm(sm) => arch.sm() >= sm,
            KernelTarget::Exact(a) => a as u8 == arch as u8,
        }
    }
}

/// A type that may be passed to a kernel by value: plain bits with the same layout on host and device.
///
/// # Safety
/// The type must be `#[repr(C)]` or `#[repr(transparent)]` (or a primitive), contain no host
/// references, and have the same size and alignment when compiled for the host and for nvptx64.
pub unsafe trait KernelParam: Copy + 'static {}

macro_rules! scalar_params {
    ($($t:ty),*) => { $(unsafe impl KernelParam for $t {})* };
}
scalar_params!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64);

/// A read-only pointer into device global memory, as a kernel parameter.
///
/// On the device it is the kernel's pointer parameter (the backend knows it points to global memory);
/// on the host it is the address of a device allocation. Both sides see one 64-bit value.
#[repr(transparent)]
pub struct DevicePtr<T>(*const T);

/// A writable pointer into device global memory, as a kernel parameter.
#[repr(transparent)]
pub struct DevicePtrMut<T>(*mut T);

macro_rules! ptr_common {
    ($name:ident, $raw:ty) => {
        impl<T> Clone for $name<T> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<T> Copy for $name<T> {}
        // SAFETY: a device address is plain data on the host; the device side is one thread's copy.
        unsafe impl<T> Send for $name<T> {}
        unsafe impl<T> Sync for $name<T> {}
        unsafe impl<T: 'static> KernelParam for $name<T> {}
        impl<T> core::fmt::Debug for $name<T> {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0 as usize)
            }
        }
        impl<T> $name<T> {
            /// A pointer from a raw device address (host side: what the allocator returned).
            pub const fn from_addr(addr: u64) -> Self {
                Self(addr as usize as $raw)
            }
            /// The device address.
            pub fn addr(self) -> u64 {
                self.0 as usize as u64
            }
            /// The pointer offset by `count` elements.
            pub const fn offset(self, count: usize) -> Self {
                Self(self.0.wrapping_add(count))
            }
            /// The same address as a pointer to `U` (a buffer that holds another element type
            /// on some paths, such as the megakernel's operand copies of bf16).
            pub const fn cast<U>(self) -> $name<U> {
                $name(self.0.cast::<U>())
            }
            /// The raw pointer, for use on the device.
            pub const fn as_ptr(self) -> *const T {
                self.0 as *const T
            }
            /// Reads element `i`.
            ///
            /// # Safety
            /// `i` must be in bounds of the allocation, and this only makes sense on the device.
            #[inline(always)]
            pub unsafe fn read(self, i: usize) -> T
            where
                T: Copy,
            {
                unsafe { *self.0.add(i) }
            }
        }
    };
}
ptr_common!(DevicePtr, *const T);
ptr_common!(DevicePtrMut, *mut T);

impl<T> DevicePtrMut<T> {
    /// The raw mutable pointer, for use on the device.
    pub const fn as_mut_ptr(self) -> *mut T {
        self.0
    }
    /// Writes element `i`.
    ///
    /// # Safety
    /// `i` must be in bounds of the allocation, and this only makes sense on the device.
    #[inline(always)]
    pub unsafe fn write(self, i: usize, value: T) {
        unsafe { *self.0.add(i) = value }
    }
    /// A read-only view of the same address.
    pub const fn as_const(self) -> DevicePtr<T> {
        DevicePtr(self.0 as *const T)
    }
}

/// Four `f32` with 16-byte alignment: loads and stores of it are single 128-bit accesses
/// (`ld.global.v4.f32` / `st.global.v4.f32`).
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct F32x4(pub [f32; 4]);

impl DevicePtr<f32> {
    /// Reads elements `i, i + 1` as one 8-byte load (`ld.global.v2.f32`).
    ///
    /// # Safety
    /// `i` must be even, the pointer 8-byte aligned and both elements in bounds; device only.
    #[inline(always)]
    pub unsafe fn read2(self, i: usize) -> [f32; 2] {
        unsafe { (*(self.0.add(i) as *const F32x2)).0 }
    }

    /// Reads elements `4 q .. 4 q + 4` as one 16-byte load (`ld.global.v4.f32`).
    ///
    /// # Safety
    /// The pointer must be 16-byte aligned and the four elements in bounds; device only.
    #[inline(always)]
    pub unsafe fn read4(self, q: usize) -> [f32; 4] {
        unsafe { (*(self.0 as *const F32x4).add(q)).0 }
    }
}

/// Two `f32` with 8-byte alignment (`st.global.v2.f32`).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct F32x2(pub [f32; 2]);

impl DevicePtrMut<f32> {
    /// Writes elements `i, i + 1` as one 8-byte store (`st.global.v2.f32`).
    ///
    /// # Safety
    /// `i` must be even, the pointer 8-byte aligned and both elements in bounds; device only.
    #[inline(always)]
    pub unsafe fn write2(self, i: usize, v: [f32; 2]) {
        unsafe { *(self.0.add(i) as *mut F32x2) = F32x2(v) }
    }

    /// Writes elements `4 q .. 4 q + 4` as one 16-byte store (`st.global.v4.f32`).
    ///
    /// # Safety
    /// The pointer must be 16-byte aligned and the four elements in bounds; device only.
    #[inline(always)]
    pub unsafe fn write4(self, q: usize, v: [f32; 4]) {
        unsafe { *(self.0 as *mut F32x4).add(q) = F32x4(v) }
    }
}

/// A tuple of kernel parameters, turned into the array of parameter addresses `cuLaunchKernel` takes.
///
/// # Safety
/// `param_ptrs` must return one pointer per element, in order, each to a `KernelParam` value.
pub unsafe trait KernelArgs {
    /// Number of parameters.
    const ARITY: usize;
    /// The array of parameter addresses.
    type Ptrs: AsMut<[*mut c_void]>;
    /// Addresses of each element, valid while `self` is borrowed.
    fn param_ptrs(&self) -> Self::Ptrs;
}

macro_rules! tuple_args {
    ($n:literal; $($idx:tt $t:ident),*) => {
        unsafe impl<$($t: KernelParam),*> KernelArgs for ($($t,)*) {
            const ARITY: usize = $n;
            type Ptrs = [*mut c_void; $n];
            #[allow(clippy::unused_unit)]
            fn param_ptrs(&self) -> Self::Ptrs {
                [$(&self.$idx as *const $t as *mut c_void),*]
            }
        }
    };
}
tuple_args!(0;);
tuple_args!(1; 0 A);
tuple_args!(2; 0 A, 1 B);
tuple_args!(3; 0 A, 1 B, 2 C);
tuple_args!(4; 0 A, 1 B, 2 C, 3 D);
tuple_args!(5; 0 A, 1 B, 2 C, 3 D, 4 E);
tuple_args!(6; 0 A, 1 B, 2 C, 3 D, 4 E, 5 F);
tuple_args!(7; 0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G);
tuple_args!(8; 0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H);
tuple_args!(9; 0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I);
tuple_args!(10; 0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J);
tuple_args!(11; 0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J, 10 K);
tuple_args!(12; 0 A, 1 B, 2 C, 3 D, 4 E, 5 F, 6 G, 7 H, 8 I, 9 J, 10 K, 11 L);

/// A kernel's host-side descriptor, generated by `#[kernel]` from its device declaration.
pub trait Kernel: Copy + Default + 'static {
    /// The PTX `.entry` name.
    const NAME: &'static str;
    /// Which modules contain it.
    const TARGET: KernelTarget;
    /// Parameter names, for error messages and listings.
    const PARAMS: &'static [&'static str];
    /// CTAs per cluster (`#[kernel(cluster = N)]`; 1 without): the grid's x size must be a multiple.
    const CLUSTER: u32 = 1;
    /// The parameter tuple, in declaration order.
    type Args: KernelArgs;
}

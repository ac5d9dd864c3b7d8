use cudarc::driver::{CudaSlice, DevicePtr as _, DeviceRepr};
use kiln_gpu::{DevicePtr, DevicePtrMut};

/// A device allocation of `len` elements of `T`, freed on drop.
#[derive(Debug)]
pub struct DeviceBuffer<T> {
    slice: CudaSlice<T>,
}

impl<T: DeviceRepr> DeviceBuffer<T> {
    pub(crate) fn from_slice(slice: CudaSlice<T>) -> Self {
        DeviceBuffer { slice }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.slice.len()
    }
    /// Whether it holds no elements.
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }
    /// The device address.
    pub fn addr(&self) -> u64 {
        let (ptr, _sync) = self.slice.device_ptr(self.slice.stream());
        ptr
    }
    /// A read-only kernel parameter pointing at element 0.
    pub fn ptr(&self) -> DevicePtr<T> {
        DevicePtr::from_addr(self.addr())
    }
    /// A writable kernel parameter pointing at element 0 (borrows the buffer mutably, so that the
    /// same buffer cannot also be passed as an input by mistake while the pointer is made).
    pub fn ptr_mut(&mut self) -> DevicePtrMut<T> {
        DevicePtrMut::from_addr(self.addr())
    }
    /// The underlying cudarc slice.
    pub fn slice(&self) -> &CudaSlice<T> {
        &self.slice
    }
    /// The underlying cudarc slice, mutably.
    pub fn slice_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

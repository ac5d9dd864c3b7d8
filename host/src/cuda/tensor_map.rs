use super::{Device, DeviceBuffer};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use kiln_gpu::DevicePtr;
use kiln_gpu::swizzle::Swizzle;
use kiln_gpu::tma::TensorMap;

/// Element types kiln's TMA maps describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TmaDtype {
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
}

impl TmaDtype {
    /// Bytes per element.
    pub const fn size(self) -> u32 {
        match self {
            TmaDtype::F32 => 4,
            TmaDtype::Bf16 | TmaDtype::F16 => 2,
        }
    }
    fn cu(self) -> sys::CUtensorMapDataType {
        match self {
            TmaDtype::F32 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            TmaDtype::Bf16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            TmaDtype::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        }
    }
}

/// A 2-D row-major matrix in global memory and the box a TMA copy moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorMapSpec {
    /// Element type.
    pub dtype: TmaDtype,
    /// Rows of the matrix.
    pub rows: u64,
    /// Columns of the matrix (the contiguous dimension).
    pub cols: u64,
    /// Elements from one row to the next (>= cols; the row pitch in bytes must be a multiple of 16).
    pub row_pitch: u64,
    /// Box rows (1..=256).
    pub box_rows: u32,
    /// Box columns (1..=256; with a swizzle, at most the swizzle span in bytes).
    pub box_cols: u32,
    /// Shared-memory swizzle.
    pub swizzle: Swizzle,
}

impl TensorMapSpec {
    /// Checks the driver's rules for a tiled tensor map, with errors that say which value to change.
    pub fn validate(&self, addr: u64) -> Result<()> {
        let op = "tensor map";
        let e = |msg: String| Err(Error::shape(op, msg));
        let elem = self.dtype.size() as u64;
        if !addr.is_multiple_of(16) {
            return e(format!("global address {addr:#x} must be 16-byte aligned"));
        }
        if self.rows == 0 || self.cols == 0 || self.rows > 1 << 32 || self.cols > 1 << 32 {
            return e(format!("matrix {}x{}: each dimension must be in 1..=2^32", self.rows, self.cols));
        }
        if self.row_pitch < self.cols {
            return e(format!("row pitch {} is smaller than the {} columns", self.row_pitch, self.cols));
        }
        if !(self.row_pitch * elem).is_multiple_of(16) {
            return e(format!(
                "row pitch {} elements = {} bytes must be a multiple of 16 bytes: pad rows to a multiple of {} elements",
                self.row_pitch,
                self.row_pitch * elem,
                16 / elem
            ));
        }
        if !(1..=256).contains(&self.box_rows) || !(1..=256).contains(&self.box_cols) {
            return e(format!("box {}x{}: each dimension must be in 1..=256", self.box_rows, self.box_cols));
        }
        let inner = self.box_cols as u64 * elem;
        if !inner.is_multiple_of(16) {
            return e(format!("box rows of {inner} bytes must be a multiple of 16 bytes"));
        }
        if self.swizzle != Swizzle::None && inner > self.swizzle.span() as u64 {
            return e(format!("box rows of {inner} bytes exceed the {}-byte swizzle span", self.swizzle.span()));
        }
        Ok(())
    }

    /// Bytes of one box in shared memory.
    pub fn box_bytes(&self) -> u32 {
        self.box_rows * self.box_cols * self.dtype.size()
    }

    /// Encodes the map for the matrix at device address `addr` (`cuTensorMapEncodeTiled`).
    pub fn encode(&self, addr: u64) -> Result<TensorMap> {
        self.validate(addr)?;
        let elem = self.dtype.size() as u64;
        let dims = [self.cols, self.rows];
        let strides = [self.row_pitch * elem];
        let boxes = [self.box_cols, self.box_rows];
        let elem_strides = [1u32, 1];
        let swizzle = match self.swizzle {
            Swizzle::None => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            Swizzle::B32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
            Swizzle::B64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            Swizzle::B128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        };
        let mut map = std::mem::MaybeUninit::<sys::CUtensorMap>::zeroed();
        // SAFETY: every array has `rank` (or rank - 1) entries; the output is 128 writable bytes.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                map.as_mut_ptr(),
                self.dtype.cu(),
                2,
                addr as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                elem_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
            .result()
            .map_err(Error::driver(format!("encoding a tensor map for {self:?}")))?;
            Ok(TensorMap { opaque: map.assume_init().opaque })
        }
    }
}

/// The alignment the copy engine needs for a tensor map in global memory.
pub const TENSOR_MAP_ALIGN: u64 = 64;

/// Tensor maps in device global memory (one, or an array of them back to back), passed to kernels
/// by pointer.
#[derive(Debug)]
pub struct DeviceTensorMap {
    store: MapStore,
    offset: usize,
}

/// Where a [`DeviceTensorMap`]'s words live.
#[derive(Debug)]
enum MapStore {
    /// A stream-ordered pool buffer, written by a copy on the device's stream (maps made outside a
    /// capture).
    Pool(DeviceBuffer<u64>),
    /// A `cuMemAlloc` allocation outside any graph, written by a synchronous copy that ran when the
    /// map was made (maps made during a capture: see [`Device::tensor_map_cached`]). Freed by
    /// `cuMemFree` when the last holder (the cache, the graphs that use it) drops it.
    Raw(RawMapMemory),
}

/// Device memory from `cuMemAlloc` (256-byte aligned), freed on drop.
#[derive(Debug)]
struct RawMapMemory {
    ptr: sys::CUdeviceptr,
}

// SAFETY: a plain device address; the driver calls that use it are thread-safe.
unsafe impl Send for RawMapMemory {}
// SAFETY: as above; nothing mutates it after it is written.
unsafe impl Sync for RawMapMemory {}

impl Drop for RawMapMemory {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `cuMemAlloc` and is freed once; its holders (the cache and the
        // graphs that read it) are gone. Nothing to report from a drop.
        unsafe {
            let _ = cudarc::driver::result::free_sync(self.ptr);
        }
    }
}

impl DeviceTensorMap {
    /// The kernel parameter: the first map (64-byte aligned whatever the allocator returned).
    pub fn ptr(&self) -> DevicePtr<TensorMap> {
        let base = match &self.store {
            MapStore::Pool(buf) => buf.addr(),
            MapStore::Raw(raw) => raw.ptr,
        };
        DevicePtr::from_addr(base + (self.offset * 8) as u64)
    }
}

/// Sets this thread's stream-capture mode to `mode` and gives back the one it replaces
/// (`cuThreadExchangeStreamCaptureMode`).
fn exchange_capture_mode(mode: sys::CUstreamCaptureMode) -> Result<sys::CUstreamCaptureMode> {
    let mut m = mode;
    // SAFETY: `m` is a valid in/out location.
    unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut m) }
        .result()
        .map_err(Error::driver("exchanging the thread's stream-capture mode"))?;
    Ok(m)
}

impl Device {
    /// Encodes a tensor map for the matrix at `addr` and copies it to device memory, 64-byte aligned.
    pub fn tensor_map(&self, addr: u64, spec: &TensorMapSpec) -> Result<DeviceTensorMap> {
        self.tensor_maps(&[(addr, *spec)])
    }

    /// Encodes a tensor map for each `(address, spec)` and copies them to device memory as an array
    /// (map `i` at `ptr() + i`), 64-byte aligned.
    pub fn tensor_maps(&self, maps: &[(u64, TensorMapSpec)]) -> Result<DeviceTensorMap> {
        if self.is_capturing() {
            return Err(Error::Unsupported {
                op: "graph capture",
                what: "making an uncached tensor map (its upload is a copy from pageable host memory, which a graph \
                       cannot replay): make it with Device::tensor_map_cached, or before the capture"
                    .into(),
            });
        }
        let mut words = Vec::with_capacity(16 * maps.len());
        for (addr, spec) in maps {
            words.extend_from_slice(&spec.encode(*addr)?.opaque);
        }
        // Stream-ordered pool allocations promise less alignment than cuMemAlloc: over-allocate and
        // place the maps at the first 64-byte boundary.
        let mut buf = self.zeros::<u64>(words.len() + (TENSOR_MAP_ALIGN / 8) as usize)?;
        let offset = ((TENSOR_MAP_ALIGN - buf.addr() % TENSOR_MAP_ALIGN) % TENSOR_MAP_ALIGN / 8) as usize;
        let mut host = vec![0u64; buf.len()];
        host[offset..offset + words.len()].copy_from_slice(&words);
        self.write(&mut buf, &host)?;
        Ok(DeviceTensorMap { store: MapStore::Pool(buf), offset })
    }

    /// Encodes the maps of `maps` and writes them, now, to device memory that no graph owns: a
    /// `cuMemAlloc` allocation and a synchronous host-to-device copy, both made with this thread's
    /// capture mode relaxed for the two calls (the way PyTorch's caching allocator allocates while
    /// a graph is captured). Neither call is recorded into the graph being captured: the words are
    /// in place before the capture ends, and every replay reads them unchanged (a map is never
    /// rewritten). The result must outlive every graph that reads it: only
    /// [`Device::tensor_map_cached`] calls this, and it hands the map to the capture.
    fn tensor_maps_outside_capture(&self, maps: &[(u64, TensorMapSpec)]) -> Result<DeviceTensorMap> {
        let mut words = Vec::with_capacity(16 * maps.len());
        for (addr, spec) in maps {
            words.extend_from_slice(&spec.encode(*addr)?.opaque);
        }
        self.bind_context()?;
        let before = exchange_capture_mode(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
        // SAFETY: the context is bound; `cuMemAlloc` returns 256-byte aligned memory of the size
        // asked (>= TENSOR_MAP_ALIGN alignment, so offset 0); the copy writes exactly that many bytes
        // from a live host slice, synchronously.
        let made = unsafe {
            cudarc::driver::result::malloc_sync(words.len() * 8).and_then(|ptr| {
                let raw = RawMapMemory { ptr };
                cudarc::driver::result::memcpy_htod_sync(ptr, &words).map(|()| raw)
            })
        };
        exchange_capture_mode(before)?;
        let raw = made.map_err(Error::driver("uploading a tensor map outside the graph being captured"))?;
        Ok(DeviceTensorMap { store: MapStore::Raw(raw), offset: 0 })
    }

    /// As [`Device::tensor_map`], remembered: the same address and geometry give the same map, so a
    /// map made for a buffer serves a later buffer the pool allocator places at the same address
    /// (a map describes where and what shape, never the contents). Plans built per call (the
    /// training path's products) then skip the encode and the host-to-device copy. At most
    /// `TENSOR_MAP_CACHE` maps are kept; past that the cache starts over (a dropped map's memory
    /// is freed in stream order, after the kernels already launched with it; a captured graph keeps
    /// its own references to the maps it uses). Hits and misses are counted
    /// ([`Device::tensor_map_cache_stats`]).
    ///
    /// During a capture ([`Device::capture`]) a miss is served too, so that a step whose buffers
    /// the graph allocates (at addresses of the graph's own, unlike the eager step's) can be
    /// captured: the map is encoded for the graph's address and written at once to device memory
    /// outside the graph (see `tensor_maps_outside_capture`), and the graph keeps a reference to
    /// every map it reads, hit or miss. The key is everything the map encodes (address and
    /// geometry), so a later lookup with the same key, in or out of a graph, gets a map that is
    /// right for it; and while a capture is open the cache grows past its capacity instead of
    /// starting over (dropping maps there would free memory inside the capture).
    pub fn tensor_map_cached(&self, addr: u64, spec: &TensorMapSpec) -> Result<std::sync::Arc<DeviceTensorMap>> {
        let capturing = self.is_capturing();
        let (map, _hit) = {
            let mut cache = self.tensor_map_cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.set_growing(capturing);
            cache.get_or_insert_with(addr, spec, || {
                if capturing {
                    self.tensor_maps_outside_capture(&[(addr, *spec)]).map(std::sync::Arc::new)
                } else {
                    self.tensor_map(addr, spec).map(std::sync::Arc::new)
                }
            })?
        };
        if capturing {
            // the graph being captured will read this map at every replay: it keeps a reference
            self.captured_maps.lock().unwrap_or_else(|p| p.into_inner()).push(map.clone());
        }
        Ok(map)
    }

    /// The tensor-map cache's counters ([`Device::tensor_map_cached`]) since the device was opened.
    pub fn tensor_map_cache_stats(&self) -> MapCacheStats {
        self.tensor_map_cache.lock().unwrap_or_else(|p| p.into_inner()).stats()
    }
}

/// Counters of a [`MapCache`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapCacheStats {
    /// Lookups that found a map.
    pub hits: u64,
    /// Lookups that made one.
    pub misses: u64,
    /// Maps held now.
    pub len: usize,
}

/// Tensor maps (or anything made from the same key) by `(global address, TensorMapSpec)`: the
/// address, the matrix's shape and row pitch, the box, the element type and the swizzle. At most
/// `capacity` entries; past that it starts over, except while it is set growing
/// ([`MapCache::set_growing`]). Counts hits and misses.
#[derive(Debug)]
pub struct MapCache<V> {
    maps: std::collections::HashMap<(u64, TensorMapSpec), V>,
    capacity: usize,
    growing: bool,
    stats: MapCacheStats,
}

impl<V: Clone> MapCache<V> {
    /// An empty cache of at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        MapCache { maps: std::collections::HashMap::new(), capacity, growing: false, stats: MapCacheStats::default() }
    }

    /// While `growing`, a full cache keeps every entry and grows instead of starting over (a
    /// device's cache grows while a graph is captured: its entries may not be dropped there).
    pub fn set_growing(&mut self, growing: bool) {
        self.growing = growing;
    }

    /// The entry for (`addr`, `spec`), made by `make` on a miss (an error is returned, not cached);
    /// and whether it was a hit.
    pub fn get_or_insert_with(
        &mut self,
        addr: u64,
        spec: &TensorMapSpec,
        make: impl FnOnce() -> Result<V>,
    ) -> Result<(V, bool)> {
        let key = (addr, *spec);
        if let Some(v) = self.maps.get(&key) {
            self.stats.hits += 1;
            return Ok((v.clone(), true));
        }
        let v = make()?;
        self.stats.misses += 1;
        if self.maps.len() >= self.capacity && !self.growing {
            self.maps.clear();
        }
        self.maps.insert(key, v.clone());
        Ok((v, false))
    }

    /// The counters.
    pub fn stats(&self) -> MapCacheStats {
        MapCacheStats { len: self.maps.len(), ..self.stats }
    }
}

/// Most tensor maps [`Device::tensor_map_cached`] keeps (128 bytes of device memory each, plus
/// alignment).
pub const TENSOR_MAP_CACHE: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TensorMapSpec {
        TensorMapSpec {
            dtype: TmaDtype::Bf16,
            rows: 300,
            cols: 136,
            row_pitch: 136,
            box_rows: 64,
            box_cols: 64,
            swizzle: Swizzle::B128,
        }
    }

    #[test]
    fn map_cache_counts_hits_and_misses_by_every_key_field() {
        let mut cache = MapCache::<u32>::new(16);
        let mut made = 0;
        let mut get = |c: &mut MapCache<u32>, addr: u64, s: TensorMapSpec| {
            c.get_or_insert_with(addr, &s, || {
                made += 1;
                Ok(made)
            })
            .unwrap()
        };
        let base = spec();
        assert_eq!(get(&mut cache, 0x1000, base), (1, false));
        assert_eq!(get(&mut cache, 0x1000, base), (1, true));
        // each field of the key makes a different map
        let variants = [
            TensorMapSpec { rows: 301, ..base },
            TensorMapSpec { cols: 128, ..base },
            TensorMapSpec { row_pitch: 144, ..base },
            TensorMapSpec { box_rows: 128, ..base },
            TensorMapSpec { box_cols: 32, ..base },
            TensorMapSpec { swizzle: Swizzle::None, ..base },
            TensorMapSpec { dtype: TmaDtype::F16, ..base },
        ];
        for v in variants {
            assert!(!get(&mut cache, 0x1000, v).1, "{v:?} must miss");
        }
        assert!(!get(&mut cache, 0x2000, base).1, "another address must miss");
        assert_eq!(get(&mut cache, 0x1000, base), (1, true));
        assert_eq!(cache.stats(), MapCacheStats { hits: 2, misses: 9, len: 9 });
    }

    #[test]
    fn map_cache_keeps_errors_out_and_starts_over_when_full() {
        let mut cache = MapCache::<u32>::new(2);
        let s = spec();
        let e = cache.get_or_insert_with(0x10, &s, || Err(Error::shape("tensor map", "bad")));
        assert!(e.is_err());
        assert_eq!(cache.stats(), MapCacheStats { hits: 0, misses: 0, len: 0 });
        for a in [0x10, 0x20, 0x30] {
            cache.get_or_insert_with(a, &s, || Ok(a as u32)).unwrap();
        }
        // the third insert found the cache full and cleared it
        assert_eq!(cache.stats(), MapCacheStats { hits: 0, misses: 3, len: 1 });
        assert_eq!(cache.get_or_insert_with(0x30, &s, || Ok(0)).unwrap(), (0x30, true));
    }

    #[test]
    fn map_cache_grows_past_capacity_while_growing_and_starts_over_after() {
        let mut cache = MapCache::<u32>::new(2);
        let s = spec();
        cache.set_growing(true);
        for a in [0x10u64, 0x20, 0x30, 0x40] {
            assert_eq!(cache.get_or_insert_with(a, &s, || Ok(a as u32)).unwrap(), (a as u32, false));
        }
        // nothing was dropped while growing: every entry still hits
        assert_eq!(cache.stats().len, 4);
        for a in [0x10u64, 0x20, 0x30, 0x40] {
            assert_eq!(cache.get_or_insert_with(a, &s, || Ok(0)).unwrap(), (a as u32, true));
        }
        // a map made for a graph's address is keyed like any other: the same address with another
        // geometry misses
        let other = TensorMapSpec { rows: s.rows + 1, ..s };
        assert!(!cache.get_or_insert_with(0x10, &other, || Ok(7)).unwrap().1);
        assert_eq!(cache.stats().len, 5);
        cache.set_growing(false);
        cache.get_or_insert_with(0x50, &s, || Ok(0x50)).unwrap();
        // the next miss after growing found it over capacity and started over
        assert_eq!(cache.stats().len, 1);
    }
}

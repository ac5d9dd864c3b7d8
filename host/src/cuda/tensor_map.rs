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
    buf: DeviceBuffer<u64>,
    offset: usize,
}

impl DeviceTensorMap {
    /// The kernel parameter: the first map (64-byte aligned whatever the allocator returned).
    pub fn ptr(&self) -> DevicePtr<TensorMap> {
        DevicePtr::from_addr(self.buf.addr() + (self.offset * 8) as u64)
    }
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
                what: "making a new tensor map (its upload is a host copy, which a graph cannot replay): capture \
                       work whose maps already exist, or use f32 products (MatmulPrecision::F32), which need none"
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
        Ok(DeviceTensorMap { buf, offset })
    }

    /// As [`Device::tensor_map`], remembered: the same address and geometry give the same map, so a
    /// map made for a buffer serves a later buffer the pool allocator places at the same address
    /// (a map describes where and what shape, never the contents). Plans built per call (the
    /// training path's products) then skip the encode and the host-to-device copy. At most
    /// `TENSOR_MAP_CACHE` maps are kept; past that the cache starts over (a dropped map's memory
    /// is freed in stream order, after the kernels already launched with it; a captured graph keeps
    /// its own references to the maps it uses). Hits and misses are counted
    /// ([`Device::tensor_map_cache_stats`]).
    pub fn tensor_map_cached(&self, addr: u64, spec: &TensorMapSpec) -> Result<std::sync::Arc<DeviceTensorMap>> {
        let (map, hit) = {
            let mut cache = self.tensor_map_cache.lock().unwrap_or_else(|p| p.into_inner());
            cache.get_or_insert_with(addr, spec, || self.tensor_map(addr, spec).map(std::sync::Arc::new))?
        };
        if hit && self.is_capturing() {
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
/// `capacity` entries; past that it starts over. Counts hits and misses.
#[derive(Debug)]
pub struct MapCache<V> {
    maps: std::collections::HashMap<(u64, TensorMapSpec), V>,
    capacity: usize,
    stats: MapCacheStats,
}

impl<V: Clone> MapCache<V> {
    /// An empty cache of at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        MapCache { maps: std::collections::HashMap::new(), capacity, stats: MapCacheStats::default() }
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
        if self.maps.len() >= self.capacity {
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
}

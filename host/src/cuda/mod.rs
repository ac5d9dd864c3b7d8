//! The CUDA runtime: device discovery, lazy module loading, typed kernel launches, device buffers,
//! TMA tensor maps and the attention launchers ([`attention`]), on the CUDA driver API through cudarc.

pub mod attention;
mod buffer;
pub mod cublas;
mod device;
pub mod gemm;
mod module_load;
pub mod ops;
pub mod optim;
mod tensor_map;
pub mod timing;

pub use buffer::DeviceBuffer;
pub use cudarc::driver::LaunchConfig;
pub use device::{
    CapturedGraph, Device, MatmulPrecision, MatmulPrecisionScope, SYNC_LAUNCHES_ENV, TILE_COUNTER_WORDS,
    matmul_precision, matmul_precision_scope,
};
pub use module_load::{ModuleLoadTime, jit_cache_disabled};
pub use tensor_map::{DeviceTensorMap, MapCache, MapCacheStats, TensorMapSpec, TmaDtype};

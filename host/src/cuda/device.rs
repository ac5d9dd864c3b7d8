use super::DeviceBuffer;
use crate::error::{Error, Result};
use crate::ptx;
use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr, LaunchConfig, ValidAsZeroBits};
use kiln_gpu::{Arch, Kernel, KernelArgs, KernelTarget};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// Set to `1` to synchronize after every launch, so that a failing kernel is named at its launch
/// instead of at the next synchronization.
pub const SYNC_LAUNCHES_ENV: &str = "KILN_SYNC_LAUNCHES";

/// One CUDA device: its context, a stream, and its module (loaded on first use: the embedded cubin
/// where one runs on the device, else the PTX; see [`Device::module_source`]).
///
/// Cheap to share: hold it in an `Arc` (see [`Device::shared`]). Everything kiln does on the device
/// goes through this one stream, in order. It is a stream of its own (non-blocking, so that it can
/// be captured into a graph), not the legacy default stream: work that other code enqueues on
/// another stream of the same context (`context().default_stream()`, or a second `Device::new`)
/// is not ordered with kiln's; synchronize between them.
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    arch: Arch,
    name: String,
    cc: (u32, u32),
    module: OnceLock<Arc<CudaModule>>,
    functions: Mutex<HashMap<&'static str, (CudaFunction, u32)>>,
    sync_launches: bool,
    last_kernel: Mutex<&'static str>,
    /// Tensor maps by (global address, geometry): see [`Device::tensor_map_cached`].
    pub(super) tensor_map_cache: Mutex<super::tensor_map::MapCache<Arc<super::DeviceTensorMap>>>,
    /// The cached tensor maps handed out during the current capture: the graph keeps them alive.
    pub(super) captured_maps: Mutex<Vec<Arc<super::DeviceTensorMap>>>,
    /// [`Device::max_active_clusters`] answers by (kernel, threads, shared memory).
    clusters: Mutex<HashMap<(&'static str, u32, u32), u32>>,
    /// [`Device::max_active_blocks`] answers by (kernel, threads, shared memory).
    blocks: Mutex<HashMap<(&'static str, u32, u32), u32>>,
    /// Kernels launched through [`Device::launch`]: see [`Device::launch_count`].
    launches: std::sync::atomic::AtomicU64,
    /// The tile counter of the kernels that hand out their tiles as blocks free up: see
    /// [`Device::tile_counter`].
    tile_counter: DeviceBuffer<u32>,
}

/// u32 words of [`Device::tile_counter`].
pub const TILE_COUNTER_WORDS: usize = 2;

/// How the matrix products of f32 CUDA tensors are computed (`Tensor::matmul`, `matmul_t` and
/// their gradients), set per thread like PyTorch's autocast state: [`matmul_precision_scope`] sets
/// it until the returned guard drops. A training loop's forward and backward run on its thread, so
/// two trainings (or two tests) on other threads do not see each other's setting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulPrecision {
    /// f32 FMA chains on the CUDA cores (the GEMM ladder's FP32 rungs): kiln's deterministic f32
    /// tier, bit-identical to the CPU reference's ascending-k chains. The default.
    #[default]
    F32,
    /// Each operand rounded once to bf16 (8 significant bits), products on the tensor cores with
    /// f32 accumulation: `wgmma` on sm_90a, `mma.sync` elsewhere
    /// ([`crate::cuda::gemm::gemm_bf16`]). Each product's relative error grows to about `2^-8`
    /// per operand. Still reproducible run to run and batch-invariant (row i of a product depends
    /// only on row i of its left operand). Batched products with a batched right operand
    /// (`(B, M, K) x (B, K, N)`) stay f32.
    Bf16,
}

impl MatmulPrecision {
    /// The command-line name (`f32`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            MatmulPrecision::F32 => "f32",
            MatmulPrecision::Bf16 => "bf16",
        }
    }
}

thread_local! {
    static MATMUL_PRECISION: std::cell::Cell<MatmulPrecision> = const { std::cell::Cell::new(MatmulPrecision::F32) };
}

/// This thread's [`MatmulPrecision`] (f32 unless a scope set another).
pub fn matmul_precision() -> MatmulPrecision {
    MATMUL_PRECISION.with(|p| p.get())
}

/// Sets this thread's [`MatmulPrecision`] until the guard drops, then puts the previous one back.
///
/// ```no_run
/// let _bf16 = kiln::cuda::matmul_precision_scope(kiln::cuda::MatmulPrecision::Bf16);
/// // f32 CUDA products on this thread now run on the tensor cores in bf16
/// ```
#[must_use = "the precision holds only while the guard lives"]
pub fn matmul_precision_scope(p: MatmulPrecision) -> MatmulPrecisionScope {
    let previous = MATMUL_PRECISION.with(|c| c.replace(p));
    MatmulPrecisionScope { previous, _not_send: std::marker::PhantomData }
}

/// The guard of [`matmul_precision_scope`] (stays on its thread). Nested scopes must end in the
/// reverse order they began, as blocks do: each guard restores the setting it found.
pub struct MatmulPrecisionScope {
    previous: MatmulPrecision,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for MatmulPrecisionScope {
    fn drop(&mut self) {
        MATMUL_PRECISION.with(|c| c.set(self.previous));
    }
}

impl std::str::FromStr for MatmulPrecision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(MatmulPrecision::F32),
            "bf16" => Ok(MatmulPrecision::Bf16),
            other => Err(Error::Unsupported {
                op: "matmul precision",
                what: format!("`{other}`: use f32 (exact f32 chains) or bf16 (tensor cores)"),
            }),
        }
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.ctx.ordinal())
            .field("name", &self.name)
            .field("compute_capability", &self.cc)
            .field("arch", &self.arch)
            .finish()
    }
}

fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the driver library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

impl Device {
    /// Number of CUDA devices; [`Error::NoDriver`] when no driver is installed (never panics).
    pub fn count() -> Result<usize> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        cudarc::driver::result::init().map_err(Error::driver("initializing the CUDA driver"))?;
        let n = CudaContext::device_count().map_err(Error::driver("counting devices"))?;
        Ok(n.max(0) as usize)
    }

    /// Opens device `ordinal`. Fails with a typed error (never a panic) without a driver, without
    /// such a device, or on a device older than compute capability 8.0.
    pub fn new(ordinal: usize) -> Result<Device> {
        let count = Self::count()?;
        if ordinal >= count {
            return Err(Error::NoDevice { ordinal, count });
        }
        let ctx =
            CudaContext::new(ordinal).map_err(Error::driver(format!("creating a context on device {ordinal}")))?;
        // kiln uses one stream per device; cudarc's cross-stream event tracking is not needed.
        // SAFETY: no other stream of this context exists yet.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().map_err(Error::driver("reading the device name"))?;
        let (major, minor) = ctx.compute_capability().map_err(Error::driver("reading the compute capability"))?;
        let cc = (major as u32, minor as u32);
        let arch = ptx::arch_for(&name, cc.0, cc.1)?;
        // A stream of its own, not the legacy default stream: only such a stream can be captured
        // into a CUDA graph (`Device::capture`).
        let stream = ctx.new_stream().map_err(Error::driver("creating the device's stream"))?;
        let sync_launches = std::env::var(SYNC_LAUNCHES_ENV).is_ok_and(|v| v == "1");
        keep_pool_memory(&ctx)?;
        let tile_counter = DeviceBuffer::from_slice(
            stream.alloc_zeros::<u32>(TILE_COUNTER_WORDS).map_err(Error::driver("allocating the tile counter"))?,
        );
        Ok(Device {
            ctx,
            stream,
            arch,
            name,
            cc,
            module: OnceLock::new(),
            functions: Mutex::new(HashMap::new()),
            sync_launches,
            last_kernel: Mutex::new("(none)"),
            tensor_map_cache: Mutex::new(super::tensor_map::MapCache::new(super::tensor_map::TENSOR_MAP_CACHE)),
            captured_maps: Mutex::new(Vec::new()),
            clusters: Mutex::new(HashMap::new()),
            blocks: Mutex::new(HashMap::new()),
            launches: std::sync::atomic::AtomicU64::new(0),
            tile_counter,
        })
    }

    /// Device 0, opened once per process and shared.
    pub fn shared() -> Result<Arc<Device>> {
        static SHARED: OnceLock<Arc<Device>> = OnceLock::new();
        if let Some(d) = SHARED.get() {
            return Ok(d.clone());
        }
        let d = Arc::new(Device::new(0)?);
        Ok(SHARED.get_or_init(|| d).clone())
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Compute capability (major, minor).
    pub fn compute_capability(&self) -> (u32, u32) {
        self.cc
    }
    /// The module this device loads (its image: [`Device::module_source`]).
    pub fn arch(&self) -> Arch {
        self.arch
    }
    /// The cudarc context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// The stream kiln launches on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// A device attribute.
    pub fn attribute(&self, a: cudarc::driver::sys::CUdevice_attribute) -> Result<i32> {
        self.ctx.attribute(a).map_err(Error::driver(format!("reading attribute {a:?}")))
    }
    /// The number of streaming multiprocessors.
    pub fn sm_count(&self) -> Result<usize> {
        Ok(self.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize)
    }
    /// Whether launches synchronize and check each kernel (see [`SYNC_LAUNCHES_ENV`]).
    pub fn set_sync_launches(&mut self, on: bool) {
        self.sync_launches = on;
    }

    fn module(&self) -> Result<&Arc<CudaModule>> {
        if let Some(m) = self.module.get() {
            return Ok(m);
        }
        let m = super::module_load::load(&self.ctx, &self.module_source())?;
        Ok(self.module.get_or_init(|| m))
    }

    /// Whether kernel `K` is in this device's module.
    pub fn supports<K: Kernel>(&self) -> bool {
        K::TARGET.available_on(self.arch)
    }

    /// [`Error::KernelUnavailable`] unless kernel `K` is in this device's module.
    pub fn require<K: Kernel>(&self) -> Result<()> {
        if self.supports::<K>() {
            return Ok(());
        }
        let needs = match K::TARGET {
            KernelTarget::Any => "every architecture".to_string(),
            KernelTarget::MinSm(sm) => format!("sm_{sm} and newer"),
            KernelTarget::Exact(a) => format!("{} only", a.name()),
        };
        Err(Error::KernelUnavailable {
            kernel: K::NAME,
            arch: self.arch.name(),
            needs,
            major: self.cc.0,
            minor: self.cc.1,
        })
    }

    fn function<K: Kernel>(&self, dynamic_smem: u32) -> Result<CudaFunction> {
        self.require::<K>()?;
        let mut fns = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if !fns.contains_key(K::NAME) {
            let f = self
                .module()?
                .load_function(K::NAME)
                .map_err(Error::driver(format!("finding kernel `{}`", K::NAME)))?;
            fns.insert(K::NAME, (f, kiln_gpu::shared::DEFAULT_MAX_DYNAMIC_SMEM));
        }
        let entry = fns.get_mut(K::NAME).expect("inserted above");
        if dynamic_smem > entry.1 {
            entry
                .0
                .set_attribute(
                    CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dynamic_smem as i32,
                )
                .map_err(Error::driver(format!(
                    "raising `{}`'s dynamic shared memory to {dynamic_smem} bytes",
                    K::NAME
                )))?;
            entry.1 = dynamic_smem;
        }
        Ok(entry.0.clone())
    }

    /// Launches kernel `K` with `args`, typed by the kernel's own declaration.
    ///
    /// The launch error is checked; with `KILN_SYNC_LAUNCHES=1` the stream is also synchronized and
    /// a failure is reported with the kernel's name.
    ///
    /// # Safety
    /// The kernel reads and writes through the pointers in `args`: they must be live allocations of
    /// this device, large enough for what the kernel touches with this configuration, and not
    /// accessed concurrently by the host. The safe wrappers in [`ops`](super::ops) check this.
    ///
    /// The arguments are the kernel's own parameter types, in order:
    ///
    /// ```no_run
    /// # use kiln::cuda::{Device, LaunchConfig};
    /// # use kiln_gpu::kernels::elementwise::VectorAdd;
    /// # fn f(dev: &Device, a: kiln_gpu::DevicePtr<f32>, out: kiln_gpu::DevicePtrMut<f32>) -> kiln::Result<()> {
    /// unsafe { dev.launch(VectorAdd, LaunchConfig::for_num_elems(1), (a, a, out, 1u32)) }
    /// # }
    /// ```
    ///
    /// A wrong argument type is a compile error:
    ///
    /// ```compile_fail
    /// # use kiln::cuda::{Device, LaunchConfig};
    /// # use kiln_gpu::kernels::elementwise::VectorAdd;
    /// # fn f(dev: &Device, a: kiln_gpu::DevicePtr<f32>, out: kiln_gpu::DevicePtrMut<f32>) {
    /// // `b` passed as f32 where the kernel declares DevicePtr<f32>:
    /// unsafe { dev.launch(VectorAdd, LaunchConfig::for_num_elems(1), (a, 1.0f32, out, 1u32)) };
    /// # }
    /// ```
    ///
    /// and so is a missing argument:
    ///
    /// ```compile_fail
    /// # use kiln::cuda::{Device, LaunchConfig};
    /// # use kiln_gpu::kernels::elementwise::VectorAdd;
    /// # fn f(dev: &Device, a: kiln_gpu::DevicePtr<f32>, out: kiln_gpu::DevicePtrMut<f32>) {
    /// unsafe { dev.launch(VectorAdd, LaunchConfig::for_num_elems(1), (a, a, out)) };
    /// # }
    /// ```
    pub unsafe fn launch<K: Kernel>(&self, _kernel: K, cfg: LaunchConfig, args: K::Args) -> Result<()> {
        if !cfg.grid_dim.0.is_multiple_of(K::CLUSTER) {
            return Err(Error::Unsupported {
                op: "launch",
                what: format!(
                    "`{}` runs in clusters of {} blocks along x, so the grid's x size ({}) must be a multiple of {}",
                    K::NAME,
                    K::CLUSTER,
                    cfg.grid_dim.0,
                    K::CLUSTER
                ),
            });
        }
        let f = self.function::<K>(cfg.shared_mem_bytes)?;
        let mut ptrs = args.param_ptrs();
        *self.last_kernel.lock().unwrap_or_else(|p| p.into_inner()) = K::NAME;
        self.ctx.bind_to_thread().map_err(Error::driver("binding the context"))?;
        // SAFETY: the parameter array matches the kernel's declaration (same tuple type on both sides);
        // the caller guarantees the pointers.
        unsafe {
            cudarc::driver::result::launch_kernel(
                f.cu_function(),
                cfg.grid_dim,
                cfg.block_dim,
                cfg.shared_mem_bytes,
                self.stream.cu_stream(),
                ptrs.as_mut(),
            )
        }
        .map_err(|source| Error::Launch { kernel: K::NAME, source })?;
        self.launches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if self.sync_launches {
            self.stream.synchronize().map_err(|source| Error::Launch { kernel: K::NAME, source })?;
        }
        Ok(())
    }

    /// How many kernels [`Device::launch`] has enqueued on this device (captured launches count
    /// too; graph replays and cuBLAS calls do not). A test hook: the difference around a call is
    /// the number of kernels it launched (a fused optimizer step is one).
    pub fn launch_count(&self) -> u64 {
        self.launches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Makes the device's context current on this thread (for raw driver calls).
    pub(super) fn bind_context(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(Error::driver("binding the context"))
    }

    /// Whether the device's stream is being captured into a graph ([`Device::capture`]).
    pub fn is_capturing(&self) -> bool {
        use cudarc::driver::sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        self.stream.capture_status().is_ok_and(|s| s != CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Records the work `f` enqueues on this device's stream (kernels, copies, stream-ordered
    /// allocations and frees) into a CUDA graph instead of running it, and instantiates the graph:
    /// [`CapturedGraph::launch`] then replays all of it with one launch. Nothing runs during the
    /// capture. Values `f` reads on the host (a learning rate, a shape) are frozen into the graph;
    /// buffers keep their addresses, so a replay reads and writes whatever lives there at that
    /// time (which is why launching is `unsafe`). The tensor maps the captured work uses are kept
    /// alive by the graph.
    ///
    /// Run `f` once outside the capture first: the first run loads the module, sets kernel
    /// attributes and fills the caches (tensor maps, uploaded targets), which a capture cannot do.
    /// Anything in `f` that waits for the device (a download, a synchronize), copies from pageable
    /// host memory or makes an uncached tensor map ([`Device::tensor_map`]) fails the capture
    /// (cached maps, [`Device::tensor_map_cached`], are made outside the graph and kept by it); the capture ends either way (also
    /// when `f` panics). After a failed capture, host objects `f` created point at memory of a graph
    /// that never ran: drop them (a training step's gradients: `zero_grad`). Memory `f` allocates
    /// must also be freed in `f` (a training step's activations and gradients are), or the second
    /// replay fails. Needs this thread to be the only one enqueueing on the device while it
    /// captures: another thread's work would be recorded instead of run.
    pub fn capture(&self, f: impl FnOnce() -> Result<()>) -> Result<CapturedGraph> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        if self.sync_launches {
            return Err(Error::Unsupported {
                op: "graph capture",
                what: format!("with {SYNC_LAUNCHES_ENV}=1 (each launch synchronizes): unset it"),
            });
        }
        /// Ends a capture that is still open when dropped (when `f` panics), discarding the graph.
        struct Open<'a>(&'a Arc<CudaStream>, bool);
        impl Drop for Open<'_> {
            fn drop(&mut self) {
                if self.1 {
                    // nothing to report from a drop: the capture is abandoned either way
                    let _ = self.0.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
                }
            }
        }
        self.captured_maps.lock().unwrap_or_else(|p| p.into_inner()).clear();
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(Error::driver("beginning a stream capture"))?;
        let mut open = Open(&self.stream, true);
        let recorded = f();
        open.1 = false;
        let ended = self.stream.end_capture(CUgraphInstantiate_flags(0));
        let maps = std::mem::take(&mut *self.captured_maps.lock().unwrap_or_else(|p| p.into_inner()));
        recorded?;
        match ended.map_err(Error::driver(
            "ending the stream capture (the captured work used an operation a graph cannot hold)",
        ))? {
            Some(graph) => Ok(CapturedGraph { graph, _maps: maps }),
            None => Err(Error::Unsupported { op: "graph capture", what: "nothing was captured".into() }),
        }
    }

    /// How many clusters of kernel `K` (of `K::CLUSTER` blocks of `block_threads` threads with
    /// `dynamic_smem` bytes each) can be resident at once: the size of a persistent grid that never
    /// waits for a second wave. Clusters must fit within one GPC, so this can be less than
    /// `SMs / CLUSTER`.
    /// Asked once per (kernel, threads, shared memory) and remembered.
    pub fn max_active_clusters<K: Kernel>(&self, block_threads: u32, dynamic_smem: u32) -> Result<u32> {
        let key = (K::NAME, block_threads, dynamic_smem);
        if let Some(&n) = self.clusters.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(n);
        }
        let f = self.function::<K>(dynamic_smem)?;
        let cfg = LaunchConfig {
            grid_dim: (K::CLUSTER, 1, 1),
            block_dim: (block_threads, 1, 1),
            shared_mem_bytes: dynamic_smem,
        };
        let n = f
            .occupancy_max_active_clusters(cfg, &self.stream)
            .map_err(Error::driver(format!("querying how many clusters of `{}` fit", K::NAME)))?;
        self.clusters.lock().unwrap_or_else(|p| p.into_inner()).insert(key, n);
        Ok(n)
    }

    /// How many blocks of kernel `K` (of `block_threads` threads with `dynamic_smem` bytes each) can
    /// be resident on the whole device at once (the per-multiprocessor occupancy times the
    /// multiprocessors): the size of a persistent grid that never waits for a second wave. Asked
    /// once per (kernel, threads, shared memory) and remembered.
    pub fn max_active_blocks<K: Kernel>(&self, block_threads: u32, dynamic_smem: u32) -> Result<u32> {
        let key = (K::NAME, block_threads, dynamic_smem);
        if let Some(&n) = self.blocks.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return Ok(n);
        }
        let f = self.function::<K>(dynamic_smem)?;
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(block_threads, dynamic_smem as usize, None)
            .map_err(Error::driver(format!("querying how many blocks of `{}` fit", K::NAME)))?;
        let n = per_sm * self.sm_count()? as u32;
        self.blocks.lock().unwrap_or_else(|p| p.into_inner()).insert(key, n);
        Ok(n)
    }

    /// Waits for all work on the device's stream; an asynchronous kernel failure is reported with the
    /// name of the last kernel launched.
    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(|source| Error::Async {
            last_kernel: self.last_kernel.lock().unwrap_or_else(|p| p.into_inner()).to_string(),
            source,
        })
    }

    /// The high-water mark, in bytes, of the memory in use in the device's stream-ordered pool (where
    /// every tensor buffer and workspace kiln allocates comes from) since the device was made or
    /// since the last [`Device::reset_peak_memory`]: the figure `torch.cuda.max_memory_allocated`
    /// reports for PyTorch's caching allocator. Waits for the stream first, so that frees already
    /// queued are counted.
    pub fn peak_memory(&self) -> Result<u64> {
        self.pool_attribute(cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, None)
    }

    /// Starts a new high-water mark for [`Device::peak_memory`] at the memory in use now.
    pub fn reset_peak_memory(&self) -> Result<()> {
        self.pool_attribute(cudarc::driver::sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, Some(0))
            .map(|_| ())
    }

    /// Reads (or, with `set`, writes) a u64 attribute of the device's default memory pool.
    fn pool_attribute(&self, attr: cudarc::driver::sys::CUmemPool_attribute, set: Option<u64>) -> Result<u64> {
        use cudarc::driver::sys;
        self.synchronize()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        let mut value = set.unwrap_or(0);
        // SAFETY: a live context's device; the attribute is a u64 passed by pointer.
        unsafe {
            self.ctx.bind_to_thread().map_err(Error::driver("binding the context"))?;
            sys::cuDeviceGetDefaultMemPool(&mut pool, self.ctx.cu_device())
                .result()
                .map_err(Error::driver("finding the device's memory pool"))?;
            let at = (&mut value) as *mut u64 as *mut std::ffi::c_void;
            match set {
                Some(_) => sys::cuMemPoolSetAttribute(pool, attr, at),
                None => sys::cuMemPoolGetAttribute(pool, attr, at),
            }
            .result()
            .map_err(Error::driver("reading the memory pool's use"))?;
        }
        Ok(value)
    }

    /// Allocates `len` elements for a kernel that writes every one of them before anything reads
    /// them: no zeroing pass. The contents are unspecified, so this is not public: with
    /// `KILN_POISON=1` (the GPU test bundle sets it) they are filled with a NaN pattern instead, so a
    /// kernel that leaves an element unwritten fails its comparison.
    pub(crate) fn alloc_uninit_f32(&self, len: usize) -> Result<DeviceBuffer<f32>> {
        // SAFETY: fills `n` 4-byte elements at a live allocation on this device's stream.
        self.alloc_uninit(len, |at, n, st| unsafe {
            cudarc::driver::sys::cuMemsetD32Async(at, crate::testing::POISON_F32.to_bits(), n, st)
        })
    }

    /// As [`Device::alloc_uninit_f32`], for bf16 (poisoned with the NaN pattern `0xffff`).
    pub(crate) fn alloc_uninit_bf16(&self, len: usize) -> Result<DeviceBuffer<half::bf16>> {
        // SAFETY: fills `n` 2-byte elements at a live allocation on this device's stream.
        self.alloc_uninit(len, |at, n, st| unsafe { cudarc::driver::sys::cuMemsetD16Async(at, 0xffff, n, st) })
    }

    /// As [`Device::alloc_uninit_f32`], for f16 (poisoned with the NaN pattern `0xffff`).
    pub(crate) fn alloc_uninit_f16(&self, len: usize) -> Result<DeviceBuffer<half::f16>> {
        // SAFETY: fills `n` 2-byte elements at a live allocation on this device's stream.
        self.alloc_uninit(len, |at, n, st| unsafe { cudarc::driver::sys::cuMemsetD16Async(at, 0xffff, n, st) })
    }

    /// `len` elements of a type with no invalid bit patterns, unwritten, or filled by `poison`
    /// (address, elements, stream) under `KILN_POISON=1`.
    fn alloc_uninit<T: DeviceRepr>(
        &self,
        len: usize,
        poison: impl FnOnce(u64, usize, cudarc::driver::sys::CUstream) -> cudarc::driver::sys::CUresult,
    ) -> Result<DeviceBuffer<T>> {
        // SAFETY: callers' types take every bit pattern, and their kernels write every element.
        let s = unsafe { self.stream.alloc::<T>(len) }.map_err(Error::driver(format!("allocating {len} elements")))?;
        let buf = DeviceBuffer::from_slice(s);
        if poison_allocations() && len > 0 {
            poison(buf.addr(), len, self.stream.cu_stream())
                .result()
                .map_err(Error::driver("poisoning a new allocation"))?;
        }
        Ok(buf)
    }

    /// [`TILE_COUNTER_WORDS`] u32 on the device, zero when a kernel that uses them starts: the
    /// counter from which a persistent kernel's blocks take their next tile (the flash forward's).
    /// Such a kernel leaves it at zero when it ends (its last block out resets it), and kernels of
    /// the one stream run one after another, so every launch, captured graphs' too, finds it zero.
    /// Allocated with the device, so that a graph captured with it stays valid.
    pub fn tile_counter(&self) -> kiln_gpu::DevicePtrMut<u32> {
        kiln_gpu::DevicePtrMut::from_addr(self.tile_counter.addr())
    }

    /// Allocates `len` zeroed elements.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let s = self.stream.alloc_zeros::<T>(len).map_err(Error::driver(format!("allocating {len} elements")))?;
        Ok(DeviceBuffer::from_slice(s))
    }

    /// Copies a host slice to a new device buffer.
    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<DeviceBuffer<T>> {
        let s = self
            .stream
            .clone_htod(host)
            .map_err(Error::driver(format!("copying {} elements to the device", host.len())))?;
        Ok(DeviceBuffer::from_slice(s))
    }

    /// Copies a device buffer to a new host vector (synchronizes).
    pub fn download<T: DeviceRepr>(&self, buf: &DeviceBuffer<T>) -> Result<Vec<T>> {
        let v = self.stream.clone_dtoh(buf.slice()).map_err(|source| Error::Async {
            last_kernel: self.last_kernel.lock().unwrap_or_else(|p| p.into_inner()).to_string(),
            source,
        })?;
        self.synchronize()?;
        Ok(v)
    }

    /// Overwrites a device buffer with host data.
    pub fn write<T: DeviceRepr>(&self, buf: &mut DeviceBuffer<T>, host: &[T]) -> Result<()> {
        if host.len() != buf.len() {
            return Err(Error::shape(
                "write",
                format!("buffer holds {} elements, host slice {}", buf.len(), host.len()),
            ));
        }
        self.stream.memcpy_htod(host, buf.slice_mut()).map_err(Error::driver("copying to the device"))
    }

    /// Copies `host` into the first `host.len()` elements of `buf`, leaving the rest as it is.
    pub fn write_prefix<T: DeviceRepr>(&self, buf: &mut DeviceBuffer<T>, host: &[T]) -> Result<()> {
        if host.len() > buf.len() {
            return Err(Error::shape(
                "write",
                format!("buffer holds {} elements, host slice {}", buf.len(), host.len()),
            ));
        }
        let mut view = buf.slice_mut().slice_mut(..host.len());
        self.stream.memcpy_htod(host, &mut view).map_err(Error::driver("copying to the device"))
    }

    /// Sets every element of `buf` to zero bits, on the device.
    pub fn zero<T: DeviceRepr + ValidAsZeroBits>(&self, buf: &mut DeviceBuffer<T>) -> Result<()> {
        self.stream.memset_zeros(buf.slice_mut()).map_err(Error::driver("zeroing a buffer"))
    }
}

/// Whether new uninitialized allocations are poisoned (`KILN_POISON=1`).
fn poison_allocations() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_POISON").is_ok_and(|v| v == "1"))
}

/// Keeps freed memory in the device's stream-ordered pool instead of returning it to the driver at
/// every synchronization (the default release threshold is 0): a training step or a benchmark that
/// allocates and frees the same sizes each iteration then reuses mapped memory instead of mapping
/// it again, which costs more than many kernels.
fn keep_pool_memory(ctx: &std::sync::Arc<cudarc::driver::CudaContext>) -> Result<()> {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: a live context's device; the attribute takes a u64 by pointer.
    unsafe {
        ctx.bind_to_thread().map_err(Error::driver("binding the context"))?;
        let r = sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device());
        if r != sys::CUresult::CUDA_SUCCESS {
            return Ok(()); // no stream-ordered allocator here: cudarc falls back to cuMemAlloc
        }
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold) as *mut u64 as *mut std::ffi::c_void,
        )
        .result()
        .map_err(Error::driver("setting the memory pool's release threshold"))?;
    }
    Ok(())
}

/// Work captured from a device's stream by [`Device::capture`], replayed with one launch.
pub struct CapturedGraph {
    graph: cudarc::driver::CudaGraph,
    /// The tensor maps its kernels read (the device's cache may drop its own references).
    _maps: Vec<Arc<super::DeviceTensorMap>>,
}

impl CapturedGraph {
    /// Enqueues one replay of the captured work on the device's stream (asynchronous, like a
    /// kernel launch; errors inside it surface at the next synchronization).
    ///
    /// # Safety
    /// Every buffer the captured work read or wrote that was allocated before the capture (a
    /// model's parameters, optimizer state, inputs) must still be alive: the graph holds their
    /// addresses, not the buffers, and would write to whatever now lives there.
    pub unsafe fn launch(&self) -> Result<()> {
        self.graph.launch().map_err(Error::driver("launching a captured graph"))
    }
}

impl std::fmt::Debug for CapturedGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapturedGraph")
    }
}

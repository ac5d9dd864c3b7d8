//! kiln's error type: every failure a user can cause or meet says what happened and what to change.

use crate::dtype::DType;
use cudarc::driver::DriverError;

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in kiln.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No CUDA driver library could be loaded.
    #[error("no CUDA driver: libcuda could not be loaded. Install an NVIDIA driver, or use the CPU backend")]
    NoDriver,
    /// The driver reports no device at that ordinal.
    #[error("no CUDA device {ordinal}: the driver reports {count} device(s)")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// Fewer GPUs are present than a multi-GPU run asked for.
    #[error(
        "--gpus {asked}: the driver reports {present} GPU(s); ask for at most {present}, or run where more are present"
    )]
    TooFewGpus {
        /// GPUs asked for.
        asked: usize,
        /// GPUs present.
        present: usize,
    },
    /// The NCCL library could not be found or loaded.
    #[error(
        "NCCL (libnccl.so.2) could not be loaded: {detail}. Point KILN_NCCL_LIB at the library file or its directory \
         (PyTorch's wheel carries it: pip install nvidia-nccl-cu12, then .../site-packages/nvidia/nccl/lib), or add that \
         directory to LD_LIBRARY_PATH. Searched: {searched}"
    )]
    NoNccl {
        /// Why the last candidate failed.
        detail: String,
        /// The places tried.
        searched: String,
    },
    /// Ranks of a multi-process run could not meet (the torchrun-style TCP rendezvous).
    #[error("rendezvous at {addr} (rank {rank} of {world}): {msg}")]
    Rendezvous {
        /// The master's address and port.
        addr: String,
        /// This rank.
        rank: usize,
        /// The world size this rank was given.
        world: usize,
        /// What went wrong, and what to change.
        msg: String,
    },
    /// Another rank of a data-parallel run failed: this rank stopped (its NCCL communicator
    /// aborted) instead of waiting for it forever.
    #[error("rank {rank} failed, so rank {this} stopped (its NCCL communicator aborted): {msg}")]
    RankFailed {
        /// The rank that failed first.
        rank: usize,
        /// The rank reporting.
        this: usize,
        /// The failed rank's error.
        msg: String,
    },
    /// A collective did not complete in time (a peer rank gone or stuck): the communicator was
    /// aborted.
    #[error(
        "rank {rank}: {what} did not complete within {seconds} s, so its NCCL communicator was aborted: a peer \
         rank has likely failed or stopped (see its error). Raise the limit with KILN_DIST_TIMEOUT (seconds) \
         if the peers are only slow"
    )]
    CommTimeout {
        /// This rank.
        rank: usize,
        /// The collective.
        what: String,
        /// The limit in seconds.
        seconds: u64,
    },
    /// A failure planted for testing (`KILN_FAIL_RANK`): the rank stops before its gradients are
    /// reduced.
    #[error("rank {rank} failed at step {step}, as planted by KILN_FAIL_RANK (a test of failure handling; unset it)")]
    PlantedFailure {
        /// The rank.
        rank: usize,
        /// The step.
        step: usize,
    },
    /// An NCCL call failed.
    #[error("NCCL error while {context}: {msg} (ncclResult_t {code})")]
    Nccl {
        /// What kiln was doing.
        context: String,
        /// The ncclResult_t code.
        code: u32,
        /// NCCL's description.
        msg: String,
    },
    /// The device is too old for kiln's kernels.
    #[error(
        "{name} has compute capability {major}.{minor}; kiln's kernels need 8.0 or newer \
         (Ampere, Hopper or Blackwell: cp.async and bf16 tensor cores). Use the CPU backend on this machine"
    )]
    UnsupportedDevice {
        /// Device name.
        name: String,
        /// Compute capability, major.
        major: u32,
        /// Compute capability, minor.
        minor: u32,
    },
    /// The kernel is not compiled into the module this device loads.
    #[error(
        "kernel `{kernel}` is not in the {arch} module that this device ({major}.{minor}) loads: it is built for {needs}"
    )]
    KernelUnavailable {
        /// Kernel name.
        kernel: &'static str,
        /// The module loaded.
        arch: &'static str,
        /// What the kernel needs.
        needs: String,
        /// Compute capability, major.
        major: u32,
        /// Compute capability, minor.
        minor: u32,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver error while {context}: {source}")]
    Driver {
        /// What kiln was doing.
        context: String,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// A kernel launch, or the kernel itself, failed.
    #[error("kernel `{kernel}` failed: {source}")]
    Launch {
        /// Kernel name.
        kernel: &'static str,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// An asynchronous error surfaced at a synchronization point.
    #[error(
        "a kernel failed asynchronously ({source}); the last kernel launched was `{last_kernel}`. \
         Run with KILN_SYNC_LAUNCHES=1 to synchronize after each launch and name the kernel that failed"
    )]
    Async {
        /// The last kernel launched before the sync.
        last_kernel: String,
        /// The driver's error.
        #[source]
        source: DriverError,
    },
    /// Arguments of the wrong shape or size for an operation.
    #[error("{op}: {msg}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// What is wrong, with the shapes involved.
        msg: String,
    },
    /// Inputs of different dtypes, or a dtype the op does not take.
    #[error("{op}: expected dtype {expected:?}, got {got:?}")]
    DType {
        /// The operation.
        op: &'static str,
        /// The dtype given.
        got: DType,
        /// The dtype expected.
        expected: DType,
    },
    /// Inputs on different devices.
    #[error("{op}: inputs are on different devices ({a} and {b}); move one with .to_device()")]
    Device {
        /// The operation.
        op: &'static str,
        /// The first input's device.
        a: String,
        /// The second input's device.
        b: String,
    },
    /// Something the op does not support.
    #[error("{op} does not support {what}")]
    Unsupported {
        /// The operation.
        op: &'static str,
        /// What is unsupported, and what to do instead.
        what: String,
    },
    /// An index or target out of range.
    #[error("{op}: {msg}")]
    Index {
        /// The operation.
        op: &'static str,
        /// Which index, and the valid range.
        msg: String,
    },
    /// Autograd misuse (backward from a non-scalar, no graph).
    #[error("backward: {0}")]
    Autograd(String),
    /// A loss or gradient that is NaN or infinite.
    #[error(
        "{what} is not finite ({value}) at step {step}: lower the learning rate, check the inputs, or enable gradient clipping"
    )]
    NonFinite {
        /// What became non-finite.
        what: String,
        /// Its value.
        value: f64,
        /// The training step.
        step: usize,
    },
    /// A setting outside its allowed range, or one the chosen mode cannot honour, refused before
    /// any work starts.
    #[error("{setting} = {value}: {allowed}")]
    InvalidSetting {
        /// The setting, as the CLI's flag names it (`--lr`; `TrainConfig`'s field of that name).
        setting: &'static str,
        /// The value given.
        value: String,
        /// What it may be, and what to change.
        allowed: String,
    },
    /// Work that would need more memory than the host or the device has available, refused
    /// before allocating any of it.
    #[error("{what} needs {} of {place} memory, and {} is available: {hint}", bytes(*.needed), bytes(*.available))]
    OutOfMemory {
        /// What needs it.
        what: String,
        /// `"host"` or `"GPU"`.
        place: &'static str,
        /// Bytes needed (`u64::MAX`: more than 64 bits count).
        needed: u64,
        /// Bytes available.
        available: u64,
        /// What to change.
        hint: String,
    },
    /// Reading or writing a file.
    #[error("{path}: {msg}")]
    File {
        /// The file.
        path: std::path::PathBuf,
        /// What went wrong.
        msg: String,
    },
    /// A checkpoint's tensor data does not match the checksum saved with it.
    #[error(
        "{path}: tensor `{tensor}` is corrupted: its data's CRC32 is {actual:08x}, the checkpoint recorded \
         {expected:08x}. The file changed after it was saved; restore it from a copy or train again"
    )]
    CorruptCheckpoint {
        /// The checkpoint.
        path: std::path::PathBuf,
        /// The tensor whose data changed.
        tensor: String,
        /// The CRC32 saved with the tensor.
        expected: u32,
        /// The CRC32 of the data read.
        actual: u32,
    },
    /// A checkpoint cannot be written where it was asked for (checked before training starts).
    #[error(
        "cannot save a checkpoint to {path}: {msg}. Choose a path in an existing folder that kiln can write \
         (`--checkpoint` on the command line)"
    )]
    CheckpointDestination {
        /// The checkpoint path asked for.
        path: std::path::PathBuf,
        /// What is wrong with it.
        msg: String,
    },
    /// A kernel stopped waiting instead of hanging (a dependency that never completed).
    #[error("kernel `{kernel}` stalled and stopped: {msg}")]
    Stalled {
        /// Kernel name.
        kernel: &'static str,
        /// Where it waited.
        msg: String,
    },
    /// A PTX override file could not be read.
    #[error("reading PTX module {path}: {source} (KILN_PTX_DIR points at a directory without kiln's modules?)")]
    PtxFile {
        /// The file.
        path: std::path::PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// `n` bytes in words, with a binary unit (`1.5 GiB`); `u64::MAX` reads as beyond 64 bits.
fn bytes(n: u64) -> String {
    if n == u64::MAX {
        return "more than 16 EiB (a size beyond 64 bits)".into();
    }
    const UNITS: [&str; 7] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let (mut v, mut u) = (n as f64, 0);
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{n} bytes") } else { format!("{v:.1} {}", UNITS[u]) }
}

impl Error {
    pub(crate) fn driver(context: impl Into<String>) -> impl FnOnce(DriverError) -> Error {
        let context = context.into();
        move |source| Error::Driver { context, source }
    }

    pub(crate) fn shape(op: &'static str, msg: impl Into<String>) -> Error {
        Error::Shape { op, msg: msg.into() }
    }
}

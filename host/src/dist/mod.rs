//! Collectives over NCCL: one thread per GPU of this process, each with its own kiln [`Device`]
//! (context and compute stream), a communication stream and an NCCL communicator ([`run`],
//! [`Rank`]); the processes of a multi-process run meet through [`rendezvous`] ([`run_with`]).
//! [`ddp`] synchronizes gradients during the backward pass (replicated or ZeRO-1, laid out by
//! [`plan`]); a rank that fails ends every rank with an error (see [`Rank::settle`]).
//!
//! ```no_run
//! # fn main() -> kiln::Result<()> {
//! // Sum a buffer over two GPUs; every rank ends with the same values.
//! let sums = kiln::dist::run(2, |r| {
//!     let mut buf = r.device.upload(&[r.rank as f32; 4])?;
//!     r.comm.all_reduce_f32(&r.device, &mut buf, kiln::dist::ReduceOp::Sum)?;
//!     r.device.download(&buf)
//! })?;
//! assert_eq!(sums[1], vec![1.0; 4]);
//! # Ok(()) }
//! ```

pub mod bucket;
pub mod ddp;
mod group;
pub mod nccl;
pub mod plan;
pub mod rendezvous;

pub use group::{
    DEFAULT_TIMEOUT, Pending, Rank, RunConfig, TIMEOUT_ENV, TimelineEvent, run, run_with, running_ranks,
    timeout_from_env,
};

use crate::cuda::{Device, DeviceBuffer};
use crate::error::{Error, Result};
use crate::tensor::{DType, Storage, Tensor};
use cudarc::nccl::sys::{ncclComm_t, ncclUniqueId};
use nccl::Nccl;
use std::ffi::c_void;

/// A reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Elementwise sum over ranks.
    Sum,
    /// Elementwise mean over ranks (NCCL's `ncclAvg`).
    Avg,
}

impl ReduceOp {
    fn raw(self) -> i32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Avg => 4,
        }
    }
}

const NCCL_FLOAT32: i32 = 7;
const NCCL_FLOAT64: i32 = 8;
const NCCL_BFLOAT16: i32 = 9;

/// The unique id ranks share to form one communicator (128 opaque bytes made by rank 0).
#[derive(Clone, Copy)]
pub struct UniqueId(ncclUniqueId);

impl UniqueId {
    /// A fresh id from NCCL.
    pub fn new() -> Result<UniqueId> {
        let nccl = Nccl::get()?;
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: writes 128 bytes into `id`.
        nccl.check(unsafe { (nccl.get_unique_id)(&mut id) }, || "creating a unique id".into())?;
        Ok(UniqueId(id))
    }

    /// The id's bytes (to send to other processes).
    pub fn bytes(&self) -> [u8; 128] {
        self.0.internal.map(|c| c as u8)
    }

    /// An id from bytes another rank sent.
    pub fn from_bytes(b: [u8; 128]) -> UniqueId {
        UniqueId(ncclUniqueId { internal: b.map(|c| c as _) })
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

/// One rank's NCCL communicator; collectives run on the device's stream, in stream order.
pub struct Comm {
    raw: ncclComm_t,
    nccl: &'static Nccl,
    rank: usize,
    world: usize,
    aborted: std::cell::Cell<bool>,
}

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it are not
// concurrent; `Comm`'s methods take `&self` but each rank's comm is used by its own thread only
// (`run` hands each thread its own), and `Comm` is not `Sync`.
unsafe impl Send for Comm {}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Comm(rank {} of {})", self.rank, self.world)
    }
}

impl Comm {
    /// Joins communicator `id` as `rank` of `world` on `device` (binds its context to this thread).
    /// Blocks until every rank has joined, so the ranks must call this concurrently.
    pub fn init(device: &Device, id: UniqueId, rank: usize, world: usize) -> Result<Comm> {
        let nccl = Nccl::get()?;
        device.context().bind_to_thread().map_err(Error::driver("binding the context for NCCL"))?;
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `raw` receives the new communicator; the id is 128 bytes made by ncclGetUniqueId.
        let code = unsafe { (nccl.comm_init_rank)(&mut raw, world as i32, id.0, rank as i32) };
        nccl.check(code, || format!("rank {rank} of {world} joining the communicator"))?;
        Ok(Comm { raw, nccl, rank, world, aborted: std::cell::Cell::new(false) })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    fn stream(device: &Device) -> *mut c_void {
        device.stream().cu_stream() as *mut c_void
    }

    /// # Safety
    /// `ptr` must address `len` elements of `dtype` on `device`, live until the stream passes the call.
    unsafe fn all_reduce_raw(&self, device: &Device, ptr: u64, len: usize, dtype: i32, op: ReduceOp) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.all_reduce_on(device, Self::stream(device), ptr, len, dtype, op) }
    }

    /// In-place all-reduce of `len` elements of `dtype` at `ptr`, enqueued on `stream` (a stream of
    /// `device`'s context).
    ///
    /// # Safety
    /// `ptr` must address `len` elements of `dtype` on `device`, live until `stream` passes the call.
    pub(crate) unsafe fn all_reduce_on(
        &self,
        device: &Device,
        stream: *mut c_void,
        ptr: u64,
        len: usize,
        dtype: i32,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_live("an all-reduce")?;
        device.context().bind_to_thread().map_err(Error::driver("binding the context for NCCL"))?;
        let p = ptr as *mut c_void;
        // SAFETY: in-place all-reduce of `len` elements at `p` (the caller's contract).
        let code = unsafe { (self.nccl.all_reduce)(p, p, len, dtype, op.raw(), self.raw, stream) };
        self.nccl.check(code, || format!("all-reduce of {len} elements on rank {}", self.rank))
    }

    /// Reduce-scatter: `recv` (`count` elements) gets part `rank` of the reduction of every rank's
    /// `send` (`count x world` elements), enqueued on `stream`.
    ///
    /// # Safety
    /// `send` and `recv` must address that many elements of `dtype` on `device`, live until
    /// `stream` passes the call.
    pub(crate) unsafe fn reduce_scatter_on(
        &self,
        device: &Device,
        stream: *mut c_void,
        (send, recv): (u64, u64),
        count: usize,
        dtype: i32,
        op: ReduceOp,
    ) -> Result<()> {
        self.check_live("a reduce-scatter")?;
        device.context().bind_to_thread().map_err(Error::driver("binding the context for NCCL"))?;
        // SAFETY: the caller's contract.
        let code = unsafe {
            (self.nccl.reduce_scatter)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dtype,
                op.raw(),
                self.raw,
                stream,
            )
        };
        self.nccl.check(code, || format!("reduce-scatter of {count} elements per rank on rank {}", self.rank))
    }

    /// All-gather: `recv` (`count x world` elements) gets every rank's `send` (`count` elements)
    /// in rank order, enqueued on `stream`. `send` may be `recv`'s own part (in place).
    ///
    /// # Safety
    /// As [`Comm::reduce_scatter_on`].
    pub(crate) unsafe fn all_gather_on(
        &self,
        device: &Device,
        stream: *mut c_void,
        (send, recv): (u64, u64),
        count: usize,
        dtype: i32,
    ) -> Result<()> {
        self.check_live("an all-gather")?;
        device.context().bind_to_thread().map_err(Error::driver("binding the context for NCCL"))?;
        // SAFETY: the caller's contract.
        let code = unsafe {
            (self.nccl.all_gather)(send as *const c_void, recv as *mut c_void, count, dtype, self.raw, stream)
        };
        self.nccl.check(code, || format!("all-gather of {count} elements per rank on rank {}", self.rank))
    }

    /// Starts an NCCL group (the collectives until [`Comm::group_end`] become one launch).
    pub(crate) fn group_start(&self) -> Result<()> {
        // SAFETY: no arguments; paired with group_end by the caller.
        self.nccl.check(unsafe { (self.nccl.group_start)() }, || "starting an NCCL group".into())
    }

    /// Ends an NCCL group.
    pub(crate) fn group_end(&self) -> Result<()> {
        // SAFETY: no arguments; ends the group group_start opened.
        self.nccl.check(unsafe { (self.nccl.group_end)() }, || "ending an NCCL group".into())
    }

    /// NCCL's asynchronous error of this communicator (a peer lost, a network failure), if any.
    pub fn async_error(&self) -> Result<()> {
        if self.aborted.get() {
            return Ok(());
        }
        let mut res: i32 = 0;
        // SAFETY: the communicator is valid (not aborted); `res` receives an ncclResult_t.
        let code = unsafe { (self.nccl.comm_get_async_error)(self.raw, &mut res) };
        self.nccl.check(code, || format!("asking rank {}'s communicator for errors", self.rank))?;
        // ncclInProgress (7) is not an error
        if res == 7 {
            return Ok(());
        }
        self.nccl.check(res, || format!("a collective on rank {} (reported asynchronously)", self.rank))
    }

    fn check_live(&self, what: &str) -> Result<()> {
        if self.aborted.get() {
            return Err(Error::Unsupported {
                op: "NCCL",
                what: format!("{what} on rank {}'s communicator, which was aborted", self.rank),
            });
        }
        Ok(())
    }

    /// # Safety
    /// As [`Comm::all_reduce_raw`].
    unsafe fn broadcast_raw(&self, device: &Device, ptr: u64, len: usize, dtype: i32, root: usize) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.broadcast_on(device, Self::stream(device), ptr, len, dtype, root) }
    }

    /// In-place broadcast of `len` elements of `dtype` at `ptr` from `root`, enqueued on `stream`
    /// (a stream of `device`'s context).
    ///
    /// # Safety
    /// As [`Comm::all_reduce_on`].
    unsafe fn broadcast_on(
        &self,
        device: &Device,
        stream: *mut c_void,
        ptr: u64,
        len: usize,
        dtype: i32,
        root: usize,
    ) -> Result<()> {
        if root >= self.world {
            return Err(Error::Index { op: "broadcast", msg: format!("root {root} is not a rank of {}", self.world) });
        }
        self.check_live("a broadcast")?;
        device.context().bind_to_thread().map_err(Error::driver("binding the context for NCCL"))?;
        let p = ptr as *mut c_void;
        // SAFETY: in-place broadcast of `len` elements at `p`.
        let code = unsafe { (self.nccl.broadcast)(p, p, len, dtype, root as i32, self.raw, stream) };
        self.nccl.check(code, || format!("broadcast of {len} elements on rank {}", self.rank))
    }

    /// In-place all-reduce of an f32 buffer on `device`'s stream (every rank must call it with
    /// the same length).
    pub fn all_reduce_f32(&self, device: &Device, buf: &mut DeviceBuffer<f32>, op: ReduceOp) -> Result<()> {
        // SAFETY: the buffer is borrowed mutably and lives on `device`; kiln frees through the
        // same stream, so the memory outlives the collective.
        unsafe { self.all_reduce_raw(device, buf.addr(), buf.len(), NCCL_FLOAT32, op) }
    }

    /// In-place all-reduce of a bf16 buffer (NCCL reduces in bf16 arithmetic).
    pub fn all_reduce_bf16(&self, device: &Device, buf: &mut DeviceBuffer<half::bf16>, op: ReduceOp) -> Result<()> {
        // SAFETY: as in `all_reduce_f32`.
        unsafe { self.all_reduce_raw(device, buf.addr(), buf.len(), NCCL_BFLOAT16, op) }
    }

    /// In-place broadcast of an f32 buffer from `root` to every rank.
    pub fn broadcast_f32(&self, device: &Device, buf: &mut DeviceBuffer<f32>, root: usize) -> Result<()> {
        // SAFETY: as in `all_reduce_f32`.
        unsafe { self.broadcast_raw(device, buf.addr(), buf.len(), NCCL_FLOAT32, root) }
    }

    /// In-place broadcast of a bf16 buffer from `root`.
    pub fn broadcast_bf16(&self, device: &Device, buf: &mut DeviceBuffer<half::bf16>, root: usize) -> Result<()> {
        // SAFETY: as in `all_reduce_f32`.
        unsafe { self.broadcast_raw(device, buf.addr(), buf.len(), NCCL_BFLOAT16, root) }
    }

    /// In-place all-reduce of CUDA tensors (f32 or bf16; dense leaves such as gradients), grouped
    /// into buckets of about `bucket_bytes` in reverse order ([`bucket::buckets`]): each bucket's
    /// all-reduces are issued inside one NCCL group (one fused launch), buckets in order.
    pub fn all_reduce_tensors(
        &self,
        device: &Device,
        tensors: &[Tensor],
        op: ReduceOp,
        bucket_bytes: usize,
    ) -> Result<()> {
        let sizes: Vec<usize> = tensors.iter().map(|t| t.elem_count() * t.dtype().size()).collect();
        for group in bucket::buckets(&sizes, bucket_bytes) {
            let guards: Vec<_> = group.iter().map(|&i| tensors[i].storage_mut()).collect();
            let mut calls = Vec::with_capacity(group.len());
            for (g, &i) in guards.iter().zip(&group) {
                let Storage::Cuda(c) = &**g else {
                    return Err(Error::Unsupported { op: "all_reduce_tensors", what: "a tensor on the CPU".into() });
                };
                let dtype = match c.dtype() {
                    DType::F32 => NCCL_FLOAT32,
                    DType::BF16 => NCCL_BFLOAT16,
                    d => return Err(Error::DType { op: "all_reduce_tensors", got: d, expected: DType::F32 }),
                };
                calls.push((c.addr(), tensors[i].elem_count(), dtype));
            }
            // SAFETY: group start/end bracket the calls below; each address holds its tensor's
            // elements on `device`, write-locked (`guards`) until the calls are enqueued.
            unsafe {
                self.nccl.check((self.nccl.group_start)(), || "starting an NCCL group".into())?;
                let mut first_err = Ok(());
                for (addr, len, dtype) in calls {
                    if let Err(e) = self.all_reduce_raw(device, addr, len, dtype, op) {
                        first_err = first_err.and(Err(e));
                    }
                }
                let end = self.nccl.check((self.nccl.group_end)(), || "ending an NCCL group".into());
                first_err?;
                end?;
            }
            drop(guards);
        }
        Ok(())
    }

    /// In-place broadcast of CUDA tensors (f32 or bf16) from `root`, one NCCL group, on the
    /// device's stream. A host wait behind it blocks while a peer never joins: in training use
    /// [`Rank::broadcast_tensors`] (polled).
    pub fn broadcast_tensors(&self, device: &Device, tensors: &[Tensor], root: usize) -> Result<()> {
        // SAFETY: the device's own stream.
        unsafe { self.broadcast_tensors_on(device, Self::stream(device), tensors, root) }
    }

    /// [`Comm::broadcast_tensors`] enqueued on `stream`.
    ///
    /// # Safety
    /// `stream` is a stream of `device`'s context, and the tensors' memory stays alive until it
    /// passes the broadcast (kiln frees in the compute stream's order: make the compute stream
    /// wait for `stream`).
    pub(crate) unsafe fn broadcast_tensors_on(
        &self,
        device: &Device,
        stream: *mut c_void,
        tensors: &[Tensor],
        root: usize,
    ) -> Result<()> {
        let guards: Vec<_> = tensors.iter().map(|t| t.storage_mut()).collect();
        // SAFETY: as in `all_reduce_tensors`; the caller's contract for `stream`.
        unsafe {
            self.nccl.check((self.nccl.group_start)(), || "starting an NCCL group".into())?;
            let mut first_err = Ok(());
            for (g, t) in guards.iter().zip(tensors) {
                let r = match &**g {
                    Storage::Cuda(c) if c.dtype() == DType::F32 => {
                        self.broadcast_on(device, stream, c.addr(), t.elem_count(), NCCL_FLOAT32, root)
                    }
                    Storage::Cuda(c) if c.dtype() == DType::BF16 => {
                        self.broadcast_on(device, stream, c.addr(), t.elem_count(), NCCL_BFLOAT16, root)
                    }
                    _ => Err(Error::Unsupported {
                        op: "broadcast_tensors",
                        what: "a tensor that is not an f32 or bf16 CUDA tensor".into(),
                    }),
                };
                first_err = first_err.and(r);
            }
            let end = self.nccl.check((self.nccl.group_end)(), || "ending an NCCL group".into());
            first_err?;
            end?;
        }
        Ok(())
    }

    /// Ends the communicator at once, failing its pending collectives (for a rank that cannot go
    /// on, or one whose peer failed). Later calls on it are refused; aborting twice does nothing.
    pub fn abort(&self) {
        if !self.aborted.replace(true) {
            // SAFETY: the communicator is valid and, flagged as aborted, not used after this.
            unsafe { (self.nccl.comm_abort)(self.raw) };
        }
    }

    /// Whether [`Comm::abort`] ended this communicator.
    pub fn is_aborted(&self) -> bool {
        self.aborted.get()
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if !self.aborted.get() {
            // SAFETY: the communicator is valid and no longer used.
            unsafe { (self.nccl.comm_destroy)(self.raw) };
        }
    }
}

/// Checks that `gpus` GPUs are present: [`Error::TooFewGpus`] otherwise (`gpus` = 0 is refused too).
pub fn check_gpus(gpus: usize) -> Result<()> {
    let present = Device::count()?;
    check_gpu_count(gpus, present)
}

/// [`check_gpus`] against a given count of present GPUs.
pub fn check_gpu_count(gpus: usize, present: usize) -> Result<()> {
    if gpus == 0 {
        return Err(Error::InvalidSetting { setting: "--gpus", value: "0".into(), allowed: "1 or more".into() });
    }
    if gpus > present {
        return Err(Error::TooFewGpus { asked: gpus, present });
    }
    Ok(())
}

/// What [`bench_all_reduce`] measured.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllReduceBench {
    /// Bytes reduced per call (f32 elements x 4).
    pub bytes: usize,
    /// Ranks (GPUs).
    pub gpus: usize,
    /// Mean seconds per all-reduce over the timed calls.
    pub seconds: f64,
    /// Algorithm bandwidth, bytes / seconds, in GB/s (10^9).
    pub algbw_gbs: f64,
    /// Bus bandwidth, algbw x 2 (n-1)/n, in GB/s.
    pub busbw_gbs: f64,
}

/// Times an in-place f32 sum all-reduce of `bytes` (a multiple of 4) over `gpus` GPUs the way
/// nccl-tests does: `warmup` untimed calls, then `reps` calls back to back on each rank's stream,
/// timed on rank 0 from a common start (a barrier after synchronizing) to the end of its stream.
pub fn bench_all_reduce(gpus: usize, bytes: usize, reps: usize, warmup: usize) -> Result<AllReduceBench> {
    if bytes == 0 || !bytes.is_multiple_of(4) {
        return Err(Error::InvalidSetting {
            setting: "--bytes",
            value: bytes.to_string(),
            allowed: "a positive multiple of 4 (f32 elements)".into(),
        });
    }
    if reps == 0 {
        return Err(Error::InvalidSetting { setting: "--reps", value: "0".into(), allowed: "1 or more".into() });
    }
    let barrier = std::sync::Barrier::new(gpus.max(1));
    let times = run(gpus, |r| {
        let mut buf = r.device.zeros::<f32>(bytes / 4)?;
        for _ in 0..warmup {
            r.comm.all_reduce_f32(&r.device, &mut buf, ReduceOp::Sum)?;
        }
        // polled: a rank that failed before its warm-up collectives does not leave this one waiting
        r.synchronize()?;
        barrier.wait();
        let t0 = std::time::Instant::now();
        for _ in 0..reps {
            r.comm.all_reduce_f32(&r.device, &mut buf, ReduceOp::Sum)?;
        }
        r.device.synchronize()?;
        Ok(t0.elapsed().as_secs_f64() / reps as f64)
    })?;
    let seconds = times[0];
    let algbw_gbs = bytes as f64 / seconds / 1e9;
    Ok(AllReduceBench { bytes, gpus, seconds, algbw_gbs, busbw_gbs: bus_bandwidth(algbw_gbs, gpus) })
}

/// Bus bandwidth of an all-reduce over `ranks` ranks from its algorithm bandwidth (bytes/time):
/// a ring all-reduce moves `2 (n-1)/n` of the buffer over each link.
pub fn bus_bandwidth(algbw: f64, ranks: usize) -> f64 {
    if ranks == 0 {
        return 0.0;
    }
    algbw * 2.0 * (ranks as f64 - 1.0) / ranks as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_count_errors() {
        assert!(matches!(check_gpu_count(4, 2), Err(Error::TooFewGpus { asked: 4, present: 2 })));
        assert!(check_gpu_count(0, 2).is_err());
        assert!(check_gpu_count(2, 2).is_ok());
        let s = check_gpu_count(3, 1).unwrap_err().to_string();
        assert!(s.contains("--gpus 3") && s.contains("1 GPU"), "{s}");
    }

    #[test]
    fn bus_bandwidth_is_two_n_minus_one_over_n() {
        assert_eq!(bus_bandwidth(100.0, 2), 100.0);
        assert_eq!(bus_bandwidth(100.0, 4), 150.0);
        assert_eq!(bus_bandwidth(100.0, 1), 0.0);
    }

    #[test]
    fn unique_id_bytes_round_trip() {
        let b: [u8; 128] = std::array::from_fn(|i| (i * 7) as u8);
        assert_eq!(UniqueId::from_bytes(b).bytes(), b);
    }
}

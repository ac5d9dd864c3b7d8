//! The ranks of a run: one thread per GPU of this process, each with its own kiln [`Device`]
//! (context and compute stream), a communication stream and an NCCL communicator; the processes
//! of a multi-process run meet first through [`rendezvous`](super::rendezvous).
//!
//! Collectives of training ([`Rank::launch`]) run on the rank's communication stream behind an
//! event of its compute stream, so they overlap whatever the compute stream does next; the
//! compute stream waits for them (on the GPU) where it reads their results
//! ([`Rank::then_compute`]), and the host checks they finished by polling ([`Rank::settle`]).
//! A rank's host never blocks in the driver while its streams may wait for a collective: it waits
//! by polling ([`Rank::wait_event`], [`Rank::synchronize`]), and downloads only after a settle
//! (a blocking download behind a collective that a failed peer never joins would never return).
//! A rank that fails (an error, a panic, a planted failure: [`Rank::fail`] shares it at once)
//! records its failure; the other ranks of the process see it at their next launch or poll, abort
//! their communicators (which ends the NCCL kernels that wait for the failed rank; abort, never
//! destroy, which would wait for them) and stop with [`Error::RankFailed`]. A peer in
//! another process that is gone shows as NCCL's asynchronous error or as the timeout
//! ([`Error::CommTimeout`], `KILN_DIST_TIMEOUT` seconds), never as a hang.

use super::rendezvous::{self, Rendezvous};
use super::{Comm, NCCL_FLOAT64, ReduceOp, UniqueId, check_gpu_count, nccl::Nccl};
use crate::cuda::Device;
use crate::error::{Error, Result};
use cudarc::driver::{CudaEvent, CudaStream};
use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The environment variable of the collective timeout, in seconds.
pub const TIMEOUT_ENV: &str = "KILN_DIST_TIMEOUT";

/// The default collective timeout (a step's collectives take milliseconds; NCCL's first call
/// sets up its connections, which can take seconds).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The collective timeout: `KILN_DIST_TIMEOUT` seconds, else [`DEFAULT_TIMEOUT`].
pub fn timeout_from_env() -> Result<Duration> {
    match std::env::var(TIMEOUT_ENV) {
        Err(_) => Ok(DEFAULT_TIMEOUT),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(s) if s > 0 => Ok(Duration::from_secs(s)),
            _ => Err(Error::InvalidSetting {
                setting: TIMEOUT_ENV,
                value: v,
                allowed: "seconds a collective may take before the run is aborted, a whole number from 1".into(),
            }),
        },
    }
}

/// Where a run's ranks come from.
#[derive(Clone, Debug, PartialEq)]
pub struct RunConfig {
    /// GPUs this process drives (one rank each).
    pub gpus: usize,
    /// The ordinal of this process's first GPU (`--local-rank` in a multi-process run).
    pub first_device: usize,
    /// A multi-process run's rendezvous (this process is one rank of it, `gpus` = 1).
    pub rendezvous: Option<Rendezvous>,
    /// How long a collective (and the rendezvous) may take before the run is aborted.
    pub timeout: Duration,
}

impl RunConfig {
    /// A single-process run on GPUs `0..gpus`, the timeout from the environment.
    pub fn local(gpus: usize) -> Result<RunConfig> {
        Ok(RunConfig { gpus, first_device: 0, rendezvous: None, timeout: timeout_from_env()? })
    }

    /// Ranks in the run (over all processes).
    pub fn world(&self) -> usize {
        self.rendezvous.as_ref().map_or(self.gpus, |r| r.world)
    }

    /// The global rank of this process's first GPU.
    pub fn first_rank(&self) -> usize {
        self.rendezvous.as_ref().map_or(0, |r| r.rank)
    }

    /// Refusals that need no GPU: no GPUs, or a multi-process rank driving more than one GPU.
    pub fn validate(&self) -> Result<()> {
        if self.gpus == 0 {
            return Err(Error::InvalidSetting { setting: "--gpus", value: "0".into(), allowed: "1 or more".into() });
        }
        if let Some(r) = &self.rendezvous
            && (r.world == 0 || r.rank >= r.world)
        {
            return Err(Error::InvalidSetting {
                setting: "--rank",
                value: r.rank.to_string(),
                allowed: format!("0 to world size - 1 (--world-size {})", r.world),
            });
        }
        if self.rendezvous.is_some() && self.gpus != 1 {
            return Err(Error::InvalidSetting {
                setting: "--gpus",
                value: self.gpus.to_string(),
                allowed: "1 with --world-size: each process is one rank on one GPU (--local-rank picks it), as \
                          torchrun starts one process per GPU"
                    .into(),
            });
        }
        Ok(())
    }
}

/// What the ranks of this process share: the first failure.
struct Shared {
    failed: Mutex<Option<(usize, String)>>,
    any_failed: AtomicBool,
}

impl Shared {
    fn fail(&self, rank: usize, msg: String) {
        let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        if f.is_none() {
            *f = Some((rank, msg));
        }
        self.any_failed.store(true, Ordering::SeqCst);
    }
    fn failure(&self) -> Option<(usize, String)> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// How a [`poll_until`] ended other than by completion.
#[derive(Debug)]
pub(crate) enum WaitEnd<E> {
    /// The query itself failed (a driver error).
    Query(E),
    /// The check between polls ended the wait (a peer failed, NCCL's asynchronous error).
    Stopped(Error),
    /// The timeout passed first.
    TimedOut,
}

/// Polls `query` (an event or stream query: `Ok(true)` once the work is done) until it reports
/// completion, calling `check(polls)` after every unfinished poll (the poll count, so that costly
/// checks can run every so many polls): an error from `check` ends the wait, and so does
/// `timeout`. Yields for the first 2 ms, then sleeps 50 us between polls. The host never blocks
/// in the driver, so a wait behind a collective that never completes still ends.
pub(crate) fn poll_until<E>(
    timeout: Duration,
    mut query: impl FnMut() -> std::result::Result<bool, E>,
    mut check: impl FnMut(u64) -> Result<()>,
) -> std::result::Result<(), WaitEnd<E>> {
    let start = Instant::now();
    let mut polls = 0u64;
    loop {
        match query() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => return Err(WaitEnd::Query(e)),
        }
        polls += 1;
        check(polls).map_err(WaitEnd::Stopped)?;
        let waited = start.elapsed();
        if waited > timeout {
            return Err(WaitEnd::TimedOut);
        }
        if waited < Duration::from_millis(2) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

/// The global ranks of this process whose threads (in [`run_with`]) have not ended yet: a
/// diagnostic for tests of failure handling (which rank is still blocked).
pub fn running_ranks() -> Vec<usize> {
    let mut v = RUNNING.lock().unwrap_or_else(|p| p.into_inner()).clone();
    v.sort_unstable();
    v
}

static RUNNING: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Lists a rank in [`running_ranks`] while alive.
struct Running(usize);

impl Running {
    fn new(rank: usize) -> Running {
        RUNNING.lock().unwrap_or_else(|p| p.into_inner()).push(rank);
        Running(rank)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let mut v = RUNNING.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = v.iter().position(|&r| r == self.0) {
            v.swap_remove(i);
        }
    }
}

/// A collective in flight on a rank's communication stream.
pub struct Pending {
    done: CudaEvent,
    what: String,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pending({})", self.what)
    }
}

/// One event of a step's timeline: its label, its stream, its time from the first mark.
#[derive(Clone, Debug, PartialEq)]
pub struct TimelineEvent {
    /// What happened there (`backward start`, `bucket 0 all-reduce start`, ...).
    pub label: String,
    /// `compute` or `comm`.
    pub stream: &'static str,
    /// Milliseconds from the first event recorded.
    pub ms: f64,
}

/// What each rank's thread gets from [`run`].
pub struct Rank {
    /// This rank (over all processes).
    pub rank: usize,
    /// Number of ranks (over all processes).
    pub world: usize,
    /// This rank's communicator (declared before `device`: it is destroyed while the device's
    /// context is still alive).
    pub comm: Comm,
    /// This rank's GPU.
    pub device: Arc<Device>,
    comm_stream: Arc<CudaStream>,
    shared: Arc<Shared>,
    timeout: Duration,
    outstanding: RefCell<Vec<Pending>>,
    marks: RefCell<Option<Vec<(String, bool, CudaEvent)>>>,
}

impl std::fmt::Debug for Rank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Rank({} of {} on {})", self.rank, self.world, self.device.name())
    }
}

impl Rank {
    /// The communication stream.
    pub fn comm_stream(&self) -> &Arc<CudaStream> {
        &self.comm_stream
    }

    /// The collective timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Enqueues a collective: the communication stream first waits for the work enqueued so far
    /// on the compute stream, then `f` enqueues the NCCL calls on it (given the stream). The
    /// result is in flight until [`Rank::then_compute`] (the GPU waits) and [`Rank::settle`] (the
    /// host checks it finished). An error aborts the communicator.
    pub fn launch(&self, what: impl Into<String>, f: impl FnOnce(*mut c_void) -> Result<()>) -> Result<Pending> {
        let what = what.into();
        self.check_peers()?;
        let ready = self.device.stream().record_event(None).map_err(Error::driver("recording a compute event"))?;
        self.comm_stream.wait(&ready).map_err(Error::driver("ordering the communication stream"))?;
        self.mark(|| format!("{what} start"), true)?;
        if let Err(e) = f(self.comm_stream.cu_stream() as *mut c_void) {
            self.comm.abort();
            return Err(e);
        }
        let done = self.comm_stream.record_event(None).map_err(Error::driver("recording a communication event"))?;
        self.mark(|| format!("{what} end"), true)?;
        Ok(Pending { done, what })
    }

    /// Makes the compute stream wait (on the GPU) for `p`, and keeps `p` to be checked by the next
    /// [`Rank::settle`].
    pub fn then_compute(&self, p: Pending) -> Result<()> {
        self.device.stream().wait(&p.done).map_err(Error::driver("ordering the compute stream"))?;
        self.outstanding.borrow_mut().push(p);
        Ok(())
    }

    /// Waits on the host for every collective handed to [`Rank::then_compute`] since the last
    /// settle, polling: another rank of this process failing, NCCL's asynchronous error, or the
    /// timeout ends the wait with an error and aborts the communicator. Call it before anything
    /// that blocks the host on the compute stream (a download, a synchronize).
    pub fn settle(&self) -> Result<()> {
        let pending = std::mem::take(&mut *self.outstanding.borrow_mut());
        for p in &pending {
            self.wait(p)?;
        }
        Ok(())
    }

    /// Polls `p` until done (see [`Rank::settle`]).
    pub fn wait(&self, p: &Pending) -> Result<()> {
        self.wait_event(&p.done, &p.what)
    }

    /// Waits on the host for `event` (recorded on one of this rank's streams; `what` names it in
    /// errors) by polling it (`poll_until`), never by a blocking call: another rank of this
    /// process failing, NCCL's asynchronous error, or the timeout ends the wait with an error and
    /// aborts the communicator (a blocking wait behind a collective that a failed peer never
    /// joins would never return).
    pub fn wait_event(&self, event: &CudaEvent, what: &str) -> Result<()> {
        let end = poll_until(
            self.timeout,
            || event.try_is_complete(),
            |polls| {
                self.check_peers()?;
                if polls.is_multiple_of(64) {
                    self.comm.async_error()?;
                }
                Ok(())
            },
        );
        match end {
            Ok(()) => Ok(()),
            Err(WaitEnd::Query(e)) => {
                self.comm.abort();
                Err(Error::Driver { context: format!("waiting for {what} on rank {}", self.rank), source: e })
            }
            Err(WaitEnd::Stopped(e)) => {
                self.comm.abort();
                Err(e)
            }
            Err(WaitEnd::TimedOut) => {
                self.comm.abort();
                self.shared.fail(self.rank, format!("{what} timed out"));
                Err(Error::CommTimeout { rank: self.rank, what: what.to_string(), seconds: self.timeout.as_secs() })
            }
        }
    }

    /// Waits on the host, polling ([`Rank::wait_event`]), for everything enqueued so far on the
    /// compute stream (and, first, for the collectives it was told to wait for): the polled
    /// counterpart of [`Device::synchronize`], for the points where a rank must wait for its GPU
    /// while its compute stream may wait for a collective.
    pub fn synchronize(&self) -> Result<()> {
        self.settle()?;
        let done = self.device.stream().record_event(None).map_err(Error::driver("recording a compute event"))?;
        self.wait_event(&done, "the compute stream")
    }

    /// Records `e` as this rank's failure at once, so that the other ranks of this process stop
    /// at their next launch or poll (before this rank's thread has unwound), aborts this rank's
    /// communicator, and hands `e` back to be returned.
    pub fn fail(&self, e: Error) -> Error {
        if !matches!(e, Error::RankFailed { .. }) {
            self.shared.fail(self.rank, e.to_string());
        }
        self.comm.abort();
        e
    }

    /// In-place broadcast of CUDA tensors (f32 or bf16) from `root` on the communication stream
    /// ([`Rank::launch`]), waited for by polling ([`Rank::settle`]): a peer that fails before it
    /// joins ends this rank with an error instead of leaving its next download waiting.
    pub fn broadcast_tensors(&self, tensors: &[crate::tensor::Tensor], root: usize) -> Result<()> {
        let p = self.launch("parameter broadcast", |s| {
            // SAFETY: `s` is this rank's communication stream, on the device's context.
            unsafe { self.comm.broadcast_tensors_on(&self.device, s, tensors, root) }
        })?;
        self.then_compute(p)?;
        self.settle()
    }

    /// [`Error::RankFailed`] (and this rank's communicator aborted) when another rank of this
    /// process has failed.
    pub fn check_peers(&self) -> Result<()> {
        if self.shared.any_failed.load(Ordering::SeqCst)
            && let Some((rank, msg)) = self.shared.failure()
            && rank != self.rank
        {
            self.comm.abort();
            return Err(Error::RankFailed { rank, this: self.rank, msg });
        }
        Ok(())
    }

    /// Sums `values` over the ranks in f64 (small host-side statistics: losses, counts), on the
    /// communication stream, polled like any collective.
    pub fn all_reduce_host_f64(&self, values: &mut [f64]) -> Result<()> {
        if values.is_empty() {
            return Ok(());
        }
        self.settle()?;
        let buf = self.device.upload(values)?;
        let (addr, len) = (buf.addr(), buf.len());
        let p = self.launch("statistics all-reduce", |s| {
            // SAFETY: `buf` holds `len` f64 on this device and lives until the wait below.
            unsafe { self.comm.all_reduce_on(&self.device, s, addr, len, NCCL_FLOAT64, ReduceOp::Sum) }
        })?;
        self.then_compute(p)?;
        self.settle()?;
        let got = self.device.download(&buf)?;
        values.copy_from_slice(&got);
        Ok(())
    }

    /// Blocks until every rank reaches this point (a one-element all-reduce, polled).
    pub fn barrier(&self) -> Result<()> {
        self.all_reduce_host_f64(&mut [0.0])
    }

    /// Starts (or, with `false`, stops and clears) recording a timeline: [`Rank::mark`] then
    /// records timed events.
    pub fn record_timeline(&self, on: bool) {
        *self.marks.borrow_mut() = if on { Some(Vec::new()) } else { None };
    }

    /// Records a timed event labelled `label` on the compute stream, or the communication stream
    /// with `comm`, when a timeline is being recorded.
    pub fn mark(&self, label: impl FnOnce() -> String, comm: bool) -> Result<()> {
        let mut marks = self.marks.borrow_mut();
        let Some(v) = marks.as_mut() else { return Ok(()) };
        let stream = if comm { &self.comm_stream } else { self.device.stream() };
        let ev = stream
            .record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(Error::driver("recording a timeline event"))?;
        v.push((label(), comm, ev));
        Ok(())
    }

    /// The timeline recorded since [`Rank::record_timeline`] (waits for its events; call after
    /// [`Rank::settle`]), in time order, and clears it.
    pub fn take_timeline(&self) -> Result<Vec<TimelineEvent>> {
        let marks = self.marks.borrow_mut().as_mut().map(std::mem::take).unwrap_or_default();
        let Some((_, _, first)) = marks.first() else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        for (label, comm, ev) in &marks {
            self.wait_event(ev, "a timeline event")?;
            let ms = first.elapsed_ms(ev).map_err(Error::driver("reading a timeline event"))? as f64;
            out.push(TimelineEvent { label: label.clone(), stream: if *comm { "comm" } else { "compute" }, ms });
        }
        out.sort_by(|a, b| a.ms.total_cmp(&b.ms));
        Ok(out)
    }
}

/// Runs `f` on `gpus` threads, one per GPU (ordinals 0..gpus), each with its device, its
/// communication stream and its communicator joined into one group. Returns the ranks' results in
/// rank order, or the error of the rank that failed first (the others stop with
/// [`Error::RankFailed`] instead of waiting for it). See [`run_with`].
pub fn run<T: Send>(gpus: usize, f: impl Fn(&Rank) -> Result<T> + Sync) -> Result<Vec<T>> {
    run_with(&RunConfig::local(gpus)?, f)
}

/// [`run`] for any [`RunConfig`]: with a rendezvous, this process is one rank of a multi-process
/// run and meets the others over TCP first (rank 0 makes the NCCL id and hands it out).
///
/// Refuses, before any thread starts: more GPUs than present ([`Error::TooFewGpus`]), no NCCL
/// ([`Error::NoNccl`]), a rendezvous that fails ([`Error::Rendezvous`]).
pub fn run_with<T: Send>(cfg: &RunConfig, f: impl Fn(&Rank) -> Result<T> + Sync) -> Result<Vec<T>> {
    cfg.validate()?;
    let present = Device::count()?;
    if cfg.rendezvous.is_some() && cfg.first_device >= present {
        return Err(Error::InvalidSetting {
            setting: "--local-rank",
            value: cfg.first_device.to_string(),
            allowed: format!("a GPU of this machine, 0 to {} (LOCAL_RANK)", present.saturating_sub(1)),
        });
    }
    check_gpu_count(cfg.first_device + cfg.gpus, present)?;
    Nccl::get()?;
    let world = cfg.world();
    let id = match &cfg.rendezvous {
        Some(r) => UniqueId::from_bytes(rendezvous::share_id(&r.addr, r.port, r.rank, r.world, cfg.timeout, || {
            Ok(UniqueId::new()?.bytes())
        })?),
        None => UniqueId::new()?,
    };
    let shared = Arc::new(Shared { failed: Mutex::new(None), any_failed: AtomicBool::new(false) });
    let opened = std::sync::Barrier::new(cfg.gpus);
    let (f, shared_ref, opened) = (&f, &shared, &opened);
    let results: Vec<Result<T>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cfg.gpus)
            .map(|i| {
                let rank = cfg.first_rank() + i;
                let ordinal = cfg.first_device + i;
                let timeout = cfg.timeout;
                s.spawn(move || -> Result<T> {
                    let _running = Running::new(rank);
                    // every local GPU opens before any rank joins the communicator: a rank that
                    // cannot open its GPU must not leave the others waiting in NCCL's init
                    let device = Device::new(ordinal).map(Arc::new);
                    if let Err(e) = &device {
                        shared_ref.fail(rank, e.to_string());
                    }
                    opened.wait();
                    let device = device?;
                    if let Some((failed, msg)) = shared_ref.failure() {
                        return Err(Error::RankFailed { rank: failed, this: rank, msg });
                    }
                    let comm =
                        Comm::init(&device, id, rank, world).inspect_err(|e| shared_ref.fail(rank, e.to_string()))?;
                    let comm_stream = match device.context().new_stream() {
                        Ok(s) => s,
                        Err(e) => {
                            let e = Error::Driver { context: "creating the communication stream".into(), source: e };
                            shared_ref.fail(rank, e.to_string());
                            comm.abort();
                            return Err(e);
                        }
                    };
                    let r = Rank {
                        rank,
                        world,
                        comm,
                        device,
                        comm_stream,
                        shared: shared_ref.clone(),
                        timeout,
                        outstanding: RefCell::new(Vec::new()),
                        marks: RefCell::new(None),
                    };
                    let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&r)))
                        .unwrap_or_else(|p| Err(panic_error(p.as_ref())));
                    let out = match out {
                        Err(e @ Error::RankFailed { .. }) => Err(e),
                        Err(e) => {
                            shared_ref.fail(rank, e.to_string());
                            Err(e)
                        }
                        // what the body left in flight finishes before the communicator goes
                        Ok(v) => match r.synchronize() {
                            Ok(()) => Ok(v),
                            Err(e) => {
                                shared_ref.fail(rank, e.to_string());
                                Err(e)
                            }
                        },
                    };
                    // abort, not destroy, after a failure: destroy would wait for collectives
                    // that the other ranks may never finish
                    if out.is_err() {
                        r.comm.abort();
                    }
                    let _ = r.device.context().bind_to_thread();
                    drop(r);
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|p| Err(panic_error(p.as_ref())))).collect()
    });
    let first = shared.failure().map(|(r, _)| r);
    let mut out = Vec::with_capacity(results.len());
    let mut errors: Vec<(usize, Error)> = Vec::new();
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(v) => out.push(v),
            Err(e) => errors.push((cfg.first_rank() + i, e)),
        }
    }
    if errors.is_empty() {
        return Ok(out);
    }
    // the root cause: the error of the rank that failed first, where it is one of ours
    let pick = errors.iter().position(|(r, _)| Some(*r) == first).unwrap_or(0);
    Err(errors.swap_remove(pick).1)
}

/// A rank's panic as an error (the panic's message).
fn panic_error(p: &(dyn std::any::Any + Send)) -> Error {
    let msg = p
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into());
    Error::Unsupported { op: "data-parallel rank", what: format!("a panic: {msg}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_config_refusals_and_ranks() {
        let mut c = RunConfig { gpus: 2, first_device: 0, rendezvous: None, timeout: DEFAULT_TIMEOUT };
        assert_eq!((c.world(), c.first_rank()), (2, 0));
        c.validate().expect("two local GPUs");
        c.rendezvous = Some(Rendezvous { addr: "127.0.0.1".into(), port: 29500, rank: 3, world: 4 });
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("--gpus") && e.contains("--world-size"), "{e}");
        c.gpus = 1;
        c.validate().expect("one GPU per process");
        assert_eq!((c.world(), c.first_rank()), (4, 3));
        c.gpus = 0;
        assert!(c.validate().is_err());
    }

    #[test]
    fn poll_ends_on_completion() {
        let mut n = 0;
        let mut checks = Vec::new();
        let r = poll_until::<()>(
            Duration::from_secs(60),
            || {
                n += 1;
                Ok(n == 5)
            },
            |polls| {
                checks.push(polls);
                Ok(())
            },
        );
        assert!(r.is_ok());
        // a check after every unfinished poll, counted from 1
        assert_eq!(checks, [1, 2, 3, 4]);
        assert!(poll_until::<()>(Duration::ZERO, || Ok(true), |_| Ok(())).is_ok(), "done work never times out");
    }

    #[test]
    fn poll_ends_on_the_shared_failure_flag() {
        // a query that never completes (a collective a failed peer never joins) and a flag that
        // another thread sets: the wait ends with the check's error, well before the timeout
        let flag = Arc::new(AtomicBool::new(false));
        let setter = {
            let flag = flag.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                flag.store(true, Ordering::SeqCst);
            })
        };
        let t0 = Instant::now();
        let r = poll_until::<()>(
            Duration::from_secs(60),
            || Ok(false),
            |_| {
                if flag.load(Ordering::SeqCst) {
                    return Err(Error::RankFailed { rank: 0, this: 1, msg: "planted".into() });
                }
                Ok(())
            },
        );
        setter.join().expect("setter");
        assert!(matches!(r, Err(WaitEnd::Stopped(Error::RankFailed { rank: 0, this: 1, .. }))), "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    }

    #[test]
    fn poll_ends_on_the_timeout_and_on_a_query_error() {
        let t0 = Instant::now();
        let r = poll_until::<()>(Duration::from_millis(30), || Ok(false), |_| Ok(()));
        assert!(matches!(r, Err(WaitEnd::TimedOut)), "{r:?}");
        let waited = t0.elapsed();
        assert!(waited >= Duration::from_millis(30) && waited < Duration::from_secs(10), "{waited:?}");
        let r = poll_until(Duration::from_secs(60), || Err("lost"), |_| Ok(()));
        assert!(matches!(r, Err(WaitEnd::Query("lost"))), "{r:?}");
    }

    #[test]
    fn running_ranks_list_live_guards() {
        // ranks far above any test's, so that runs of other tests do not interfere
        let a = Running::new(9_001);
        let b = Running::new(9_000);
        let mine = |v: Vec<usize>| v.into_iter().filter(|&r| r >= 9_000).collect::<Vec<_>>();
        assert_eq!(mine(running_ranks()), [9_000, 9_001]);
        drop(a);
        assert_eq!(mine(running_ranks()), [9_000]);
        drop(b);
        assert!(mine(running_ranks()).is_empty());
    }

    #[test]
    fn timeout_env_parses_whole_seconds() {
        // the variable is read, not set, here (tests run in threads of one process)
        if std::env::var(TIMEOUT_ENV).is_err() {
            assert_eq!(timeout_from_env().expect("default"), DEFAULT_TIMEOUT);
        }
    }
}

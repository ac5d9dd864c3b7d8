//! The GPU runner: [`GpuStep`] uploads a schedule, the weights and the step's buffers, and runs
//! each training step as one launch of its [`DataPath`]'s kernel. Its device layout lives in
//! `layout`, the tensor maps of the tensor-core paths in `tensor_maps`, and reading results, traces
//! and stall reports back in `read_back`.

mod layout;
mod read_back;
mod tensor_maps;

pub use read_back::OperandCopies;

use super::{DataPath, Loss, MlpShape, Schedule, StepInputs, StepState, WeightReads};
use crate::error::{Error, Result};
use kiln_gpu::megakernel::{Instruction, pitch};
use layout::{InstructionWords, OperandBuffer, pad_rows, transpose_padded};

/// Where [`GpuStep::set_give_up`]'s planted warp gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiveUp {
    /// The first page of each page walk, without waiting for it, while the rest of its page
    /// group sees the page arrive.
    Pages,
    /// Each meeting that publishes an instruction, after arriving at it: the other warps pass
    /// the meeting and go on to the next instruction without it.
    Publish,
}

/// Whether `dev` runs the tensor-core step kernels ([`DataPath::Tf32`], [`DataPath::Tf32x3`],
/// [`DataPath::Bf16`]): they use TMA and are built for sm_90a only, all five
/// (`kiln_gpu::kernels::megakernel_tc`).
pub fn tensor_core_step_supported(dev: &crate::cuda::Device) -> bool {
    use kiln_gpu::kernels::megakernel_tc::{
        MegakernelStepBf16T64, MegakernelStepTf32T32, MegakernelStepTf32T64, MegakernelStepTf32x3T32,
        MegakernelStepTf32x3T64,
    };
    dev.supports::<MegakernelStepTf32T32>()
        && dev.supports::<MegakernelStepTf32x3T32>()
        && dev.supports::<MegakernelStepTf32T64>()
        && dev.supports::<MegakernelStepTf32x3T64>()
        && dev.supports::<MegakernelStepBf16T64>()
}

/// The schedule and buffers of one model on the GPU: [`GpuStep::step`] runs one training step as a
/// single launch of the megakernel of its [`DataPath`].
///
/// Device layout: every matrix (`act[l]`, `grad[l]`: `batch x dims[l]`; `W[l]`, its gradient and
/// momentum: `dims[l+1] x dims[l]`) is row-major with a row pitch of
/// [`pitch`]`(columns)` (a multiple of 8 elements, so that every row starts 16-byte aligned, as TMA
/// needs, in f32 and in bf16 alike); the padding is never read or written. The host API takes and returns unpadded rows.
/// The tensor-core paths also keep the K-major copies their products read
/// (`kiln_gpu::megakernel::map`): `act_t[l]` and `grad_t[l]` (`dims[l] x batch`), `w_t[l]`
/// (`dims[l] x dims[l+1]`) and, on [`DataPath::Tf32`] and [`DataPath::Bf16`], `w_op[l]` (the
/// weights rounded to the products' format); on [`DataPath::Bf16`] all of them bf16, with bf16
/// copies of `act` and `grad` besides.
pub struct GpuStep {
    dev: std::sync::Arc<crate::cuda::Device>,
    shape: MlpShape,
    path: DataPath,
    sms: u32,
    counters: usize,
    tile: u32,
    instructions: crate::cuda::DeviceBuffer<InstructionWords>,
    sm_offsets: crate::cuda::DeviceBuffer<u32>,
    counter_buf: crate::cuda::DeviceBuffer<u32>,
    dims: crate::cuda::DeviceBuffer<u32>,
    w_off: crate::cuda::DeviceBuffer<u32>,
    a_off: crate::cuda::DeviceBuffer<u32>,
    t_off: crate::cuda::DeviceBuffer<u32>,
    wt_off: crate::cuda::DeviceBuffer<u32>,
    weights: crate::cuda::DeviceBuffer<f32>,
    velocity: crate::cuda::DeviceBuffer<f32>,
    dw: crate::cuda::DeviceBuffer<f32>,
    act: crate::cuda::DeviceBuffer<f32>,
    grad: crate::cuda::DeviceBuffer<f32>,
    /// The tensor-core paths' K-major operand copies (one element each on the CUDA-core path;
    /// `w_op` also on 3xTF32, which multiplies `weights` itself).
    act_t: OperandBuffer,
    grad_t: OperandBuffer,
    /// The weights' copies, twice ([`WeightReads::StepStartCopy`]): a step's products read
    /// `[front]` (through `maps[front]`) and its updates write `[1 - front]`, the copy the next
    /// step reads, so no update waits for the input gradients that read the old weights.
    w_op: [OperandBuffer; 2],
    w_t: [OperandBuffer; 2],
    /// Which of the weights' copies the next step reads.
    front: usize,
    /// [`DataPath::Bf16`]: `act` and `grad` as bf16, what its forwards and input gradients read
    /// (one element each on the other paths).
    act_bf16: OperandBuffer,
    grad_bf16: OperandBuffer,
    y: crate::cuda::DeviceBuffer<f32>,
    classes: crate::cuda::DeviceBuffer<u32>,
    /// The tensor-core path's cross-entropy row-statistic partials (`kiln_gpu::megakernel::loss_partials`).
    row_stats: crate::cuda::DeviceBuffer<f32>,
    /// The tensor maps of the tensor-core path (`map::PER_LAYER` per layer), absent on the
    /// CUDA-core path: `[c]` reads the weights' copies `w_op[c]`, `w_t[c]`.
    maps: Option<[crate::cuda::DeviceTensorMap; 2]>,
    extra_free_arrivals: u32,
    give_up_warp: u32,
    give_up_at: u32,
    /// The step kernel launched last (for stall reports).
    kernel: &'static str,
    /// Every instruction with its SM, in the order of `instructions` (what a trace's rows are).
    listing: Vec<(u32, Instruction)>,
    /// Timestamps of the next steps, when tracing ([`GpuStep::set_trace`]).
    trace: Option<crate::cuda::DeviceBuffer<u64>>,
    steps_since_check: u32,
    /// How long a dependency wait may take before the step is abandoned (nanoseconds).
    pub wait_limit_ns: u32,
    /// Check for a stalled wait after every this many steps (1, the default: after each step, which
    /// waits for the step to finish; 0: only in [`GpuStep::check`] and [`GpuStep::weights`]). The
    /// abort flag stays set until a check reads it, so a stall is never missed, only reported later;
    /// steps launched after a stall stop at their first unmet wait.
    pub check_every: u32,
}

impl GpuStep {
    /// Uploads `schedule` and the initial weights (`W[l]`, `dims[l+1] x dims[l]`) for the kernel of
    /// `path` (the schedule's tile must be one of `path.tiles()`).
    pub fn new(
        dev: std::sync::Arc<crate::cuda::Device>,
        schedule: &Schedule,
        weights: &[Vec<f32>],
        path: DataPath,
    ) -> Result<GpuStep> {
        use kiln_gpu::megakernel::{RECORD_WORDS, RECORDS_PER_BLOCK};
        let shape = schedule.shape.clone();
        StepState::new(&shape, weights.to_vec())?;
        if !path.tiles().contains(&schedule.tile) {
            return Err(Error::Unsupported {
                op: "megakernel",
                what: format!(
                    "a schedule with tile {} for the {path:?} path, which takes tiles {:?}: build it with `build(.., {path:?})`",
                    schedule.tile,
                    path.tiles()
                ),
            });
        }
        if schedule.weight_reads == WeightReads::StepStartCopy && path.weight_reads() == WeightReads::InPlace {
            return Err(Error::Unsupported {
                op: "megakernel",
                what: format!(
                    "a schedule without write-after-read guards (WeightReads::StepStartCopy) for the {path:?} path, \
                     whose input gradients read the weights the updates overwrite: build it with `build(.., {path:?})` \
                     or WeightReads::InPlace"
                ),
            });
        }
        if path != DataPath::CudaCores && !tensor_core_step_supported(&dev) {
            return Err(Error::Unsupported {
                op: "megakernel",
                what: format!(
                    "the {path:?} path needs TMA (sm_90); this GPU is {:?}: use DataPath::CudaCores",
                    dev.compute_capability()
                ),
            });
        }
        if path != DataPath::CudaCores {
            use cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN as OPTIN;
            let need =
                kiln_gpu::kernels::megakernel_tc::tc_smem_bytes(shape.layers() as u32, path.code(), schedule.tile);
            let max_smem = dev.attribute(OPTIN)?.max(0) as u32;
            if need > max_smem {
                return Err(Error::Unsupported {
                    op: "megakernel",
                    what: format!(
                        "{} layers: the {path:?} kernel's shared memory (its page ring, a {}-byte table entry per layer and, bf16 at tile 128, a weight buffer) would be {need} bytes, over this GPU's {max_smem}: use fewer layers or DataPath::CudaCores",
                        shape.layers(),
                        4 * kiln_gpu::kernels::megakernel_tc::TABLE_COLUMNS
                    ),
                });
            }
        }
        let sms = schedule.per_sm.len();
        let max_sms = dev.sm_count()?;
        if sms > max_sms {
            return Err(Error::shape(
                "megakernel",
                format!("a schedule for {sms} SMs on a GPU with {max_sms}: every block must be resident"),
            ));
        }
        let mut flat = Vec::new();
        let mut offsets = vec![0u32];
        let mut listing = Vec::new();
        for (sm, list) in schedule.per_sm.iter().enumerate() {
            flat.extend(list.iter().map(|i| InstructionWords(*i)));
            listing.extend(list.iter().map(|i| (sm as u32, *i)));
            offsets.push(flat.len() as u32);
        }
        let d = &shape.dims;
        let p = |l: usize| pitch(d[l] as u32) as usize;
        let mut w_off = vec![];
        let mut total = 0usize;
        for l in 0..shape.layers() {
            w_off.push(total as u32);
            total += d[l + 1] * p(l);
        }
        let mut a_off = vec![];
        let mut atotal = 0usize;
        for l in 0..d.len() {
            a_off.push(atotal as u32);
            atotal += shape.batch * p(l);
        }
        // the tensor-core paths' K-major copies: act_t[l] / grad_t[l] (dims[l] rows of the batch),
        // w_t[l] (dims[l] rows of dims[l + 1])
        let (mut t_off, mut ttotal) = (vec![], 0usize);
        for &dim in d.iter() {
            t_off.push(ttotal as u32);
            ttotal += dim * pitch(shape.batch as u32) as usize;
        }
        let (mut wt_off, mut wttotal) = (vec![], 0usize);
        for (l, w) in d.windows(2).enumerate() {
            wt_off.push(wttotal as u32);
            wttotal += w[0] * p(l + 1);
        }
        // (the transposed copies exist on the tensor-core paths only, and not where the step
        // reads its operands in place)
        let tc = path != DataPath::CudaCores && !kiln_gpu::megakernel::reads_in_place(path.code(), schedule.tile);
        let sizes = [
            ("weights", total),
            ("activations", atotal),
            ("instructions", flat.len()),
            ("transposed activations", if tc { ttotal } else { 0 }),
            ("transposed weights", if tc { wttotal } else { 0 }),
        ];
        if let Some((what, n)) = sizes.iter().find(|(_, n)| *n > crate::cuda::gemm::MAX_OPERAND_ELEMENTS) {
            return Err(Error::Unsupported {
                op: "megakernel",
                what: format!(
                    "{n} {what} (padded): the kernel indexes in 32 bits (at most 2^31 - 1): use a smaller model"
                ),
            });
        }
        let flat_w: Vec<f32> = weights.iter().enumerate().flat_map(|(l, w)| pad_rows(w, d[l])).collect();
        // Each copy as the products read it: rounded to tf32 or bf16 on those paths.
        let operand = |v: f32| path.operand(v);
        let w_op: Vec<f32> = match path {
            DataPath::Tf32 | DataPath::Bf16 => flat_w.iter().map(|&v| operand(v)).collect(),
            DataPath::CudaCores | DataPath::Tf32x3 => vec![0.0],
        };
        let bf16 = path == DataPath::Bf16;
        let w_t: Vec<f32> = match tc {
            true => {
                (0..shape.layers()).flat_map(|l| transpose_padded(&weights[l], d[l + 1], d[l])).map(operand).collect()
            }
            false => vec![0.0],
        };
        let records = RECORD_WORDS as usize * RECORDS_PER_BLOCK as usize * sms;
        let mut step = GpuStep {
            sms: sms as u32,
            counters: schedule.counters,
            tile: schedule.tile,
            instructions: dev.upload(&flat)?,
            sm_offsets: dev.upload(&offsets)?,
            counter_buf: dev.zeros::<u32>(schedule.counters + 1 + records)?,
            y: dev.zeros::<f32>(shape.batch * d[shape.layers()])?,
            classes: dev.zeros::<u32>(shape.batch)?,
            row_stats: dev.zeros::<f32>(
                kiln_gpu::megakernel::row_stats_words(shape.batch as u32, d[shape.layers()] as u32, schedule.tile)
                    .max(1) as usize,
            )?,
            steps_since_check: 0,
            check_every: 1,
            dims: dev.upload(&d.iter().map(|&x| x as u32).collect::<Vec<_>>())?,
            w_off: dev.upload(&w_off)?,
            a_off: dev.upload(&a_off)?,
            t_off: dev.upload(&t_off)?,
            wt_off: dev.upload(&wt_off)?,
            velocity: dev.zeros::<f32>(total)?,
            dw: dev.zeros::<f32>(total)?,
            weights: dev.upload(&flat_w)?,
            act: dev.zeros::<f32>(atotal)?,
            // (the bf16 path keeps its gradients in `grad_bf16` alone)
            grad: dev.zeros::<f32>(if bf16 { 1 } else { atotal })?,
            act_t: OperandBuffer::zeros(&dev, path, if tc { ttotal } else { 1 })?,
            grad_t: OperandBuffer::zeros(&dev, path, if tc { ttotal } else { 1 })?,
            w_op: [OperandBuffer::upload(&dev, path, &w_op)?, OperandBuffer::upload(&dev, path, &w_op)?],
            w_t: [OperandBuffer::upload(&dev, path, &w_t)?, OperandBuffer::upload(&dev, path, &w_t)?],
            front: 0,
            act_bf16: OperandBuffer::zeros(&dev, path, if bf16 { atotal } else { 1 })?,
            grad_bf16: OperandBuffer::zeros(&dev, path, if bf16 { atotal } else { 1 })?,
            maps: None,
            extra_free_arrivals: 0,
            give_up_warp: 0,
            give_up_at: 0,
            kernel: "",
            listing,
            trace: None,
            wait_limit_ns: 1_000_000_000,
            path,
            shape,
            dev,
        };
        if path != DataPath::CudaCores {
            step.maps = Some([
                step.encode_maps(&w_off, &a_off, &t_off, &wt_off, 0)?,
                step.encode_maps(&w_off, &a_off, &t_off, &wt_off, 1)?,
            ]);
        }
        Ok(step)
    }

    /// The step's data path.
    pub fn path(&self) -> DataPath {
        self.path
    }

    /// Whether the step reads every product operand in place and keeps no transposed copies
    /// (`kiln_gpu::megakernel::reads_in_place`: [`DataPath::Bf16`] at tile 128).
    pub fn reads_in_place(&self) -> bool {
        kiln_gpu::megakernel::reads_in_place(self.path.code(), self.tile)
    }

    /// The output tile edge of the schedule.
    pub fn tile(&self) -> u32 {
        self.tile
    }

    /// Test hook for the hang-proof check: every page's free barrier of the tensor-core kernel
    /// expects `n` more arrivals than the consumer warps make, so the loader's first reuse of a page
    /// waits forever; the step must then report [`Error::Stalled`] with the page and parity. 0
    /// (the default) for real training. No effect on the CUDA-core path (it has no pages).
    pub fn set_extra_free_arrivals(&mut self, n: u32) {
        self.extra_free_arrivals = n;
    }

    /// Test hook for the give-up paths: consumer warp `w` of block 0 of the tensor-core kernel gives
    /// up where `at` says (as if its limit had passed) while the other warps go on; the
    /// step must then report [`Error::Stalled`] without hanging (on the `wgmma` path the warp
    /// keeps issuing its group's products to the end of its list, so that the others never wait
    /// for it in one). `None` (the default) for real training. No effect on the CUDA-core path.
    pub fn set_give_up(&mut self, plant: Option<(u32, GiveUp)>) -> Result<()> {
        use kiln_gpu::megakernel::{CONSUMER_WARPS, give_up};
        let (warp, at) = match plant {
            None => (0, 0),
            Some((w, at)) if w < CONSUMER_WARPS => {
                (w + 1, if at == GiveUp::Pages { give_up::PAGES } else { give_up::PUBLISH })
            }
            Some((w, _)) => {
                return Err(Error::Unsupported {
                    op: "GpuStep::set_give_up",
                    what: format!("warp {w}: the consumer warps are 0..{CONSUMER_WARPS}; pick one of them"),
                });
            }
        };
        (self.give_up_warp, self.give_up_at) = (warp, at);
        Ok(())
    }

    /// One training step on the GPU: [`GpuStep::load_batch`], then [`GpuStep::run`]. After an
    /// [`Error::Stalled`] the weights may be partly updated (tiles whose waits were met ran): treat
    /// the model as poisoned and rebuild it.
    pub fn step(&mut self, inp: &StepInputs<'_>) -> Result<()> {
        self.load_batch(inp)?;
        self.run(inp.loss, inp.lr, inp.momentum)
    }

    /// Copies a batch (inputs, and the targets its loss needs) into the step's device buffers, where
    /// every later [`GpuStep::run`] reads it.
    pub fn load_batch(&mut self, inp: &StepInputs<'_>) -> Result<()> {
        let (b, d0, dl) = (self.shape.batch, self.shape.dims[0], *self.shape.dims.last().expect("layers"));
        if inp.x.len() != b * d0
            || (inp.loss == Loss::Mse && inp.y.len() != b * dl)
            || (inp.loss == Loss::CrossEntropy && inp.classes.len() != b)
        {
            return Err(Error::shape("megakernel step", format!("inputs for batch {b}, {d0} features, {dl} outputs")));
        }
        if let Some(c) = inp.classes.iter().find(|&&c| c >= dl) {
            return Err(Error::Index {
                op: "megakernel step",
                msg: format!("class {c} is out of range for {dl} outputs"),
            });
        }
        // The batch goes into layer 0's activations; the other layers are overwritten by the forward.
        // The tf32 and bf16 paths keep every stored product operand rounded (their page loops read
        // them without converting), so the batch is rounded here: the value its products would
        // use. The tensor-core paths' weight gradients read it transposed, from `act_t[0]`; the
        // bf16 path's forwards from its bf16 copy.
        let operand = |v: f32| self.path.operand(v);
        let x: Vec<f32> = pad_rows(inp.x, d0).into_iter().map(operand).collect();
        self.dev.write_prefix(&mut self.act, &x)?;
        if self.path == DataPath::Bf16 {
            self.act_bf16.write_prefix(&self.dev, &x)?;
        }
        if self.path != DataPath::CudaCores && !self.reads_in_place() {
            let xt: Vec<f32> = transpose_padded(inp.x, b, d0).into_iter().map(operand).collect();
            self.act_t.write_prefix(&self.dev, &xt)?;
        }
        match inp.loss {
            Loss::Mse => self.dev.write_prefix(&mut self.y, inp.y)?,
            Loss::CrossEntropy => {
                let classes: Vec<u32> = inp.classes.iter().map(|&c| c as u32).collect();
                self.dev.write_prefix(&mut self.classes, &classes)?
            }
        }
        Ok(())
    }

    /// One training step, one launch, on the batch last loaded. Checks for a stall when
    /// [`GpuStep::check_every`] says so.
    pub fn run(&mut self, loss_kind: Loss, lr: f32, momentum: f32) -> Result<()> {
        use kiln_gpu::kernels::megakernel_step::{MEGA_THREADS, MegakernelStep};
        use kiln_gpu::kernels::megakernel_tc::{
            MegakernelStepBf16T64, MegakernelStepBf16T128, MegakernelStepTf32T32, MegakernelStepTf32T64,
            MegakernelStepTf32x3T32, MegakernelStepTf32x3T64, tc_smem_bytes, tc_threads,
        };
        use kiln_gpu::megakernel::{MegaBuffers, MegaConfig, loss};
        // Zero the dependency counters only: the abort flag and the records after them stay until
        // a check reads them.
        {
            let mut deps = self.counter_buf.slice_mut().slice_mut(..self.counters);
            self.dev.stream().memset_zeros(&mut deps).map_err(Error::driver("zeroing the megakernel's counters"))?;
        }
        // the products read the weights' copies `front`; the updates write the other
        let (front, back) = (self.front, 1 - self.front);
        let maps = self.maps.as_ref().map_or(kiln_gpu::DevicePtr::from_addr(0), |m| m[front].ptr());
        let bufs = MegaBuffers {
            instructions: kiln_gpu::DevicePtr::from_addr(self.instructions.addr()),
            sm_offsets: self.sm_offsets.ptr(),
            counters: self.counter_buf.ptr_mut(),
            dims: self.dims.ptr(),
            w_off: self.w_off.ptr(),
            a_off: self.a_off.ptr(),
            t_off: self.t_off.ptr(),
            wt_off: self.wt_off.ptr(),
            weights: self.weights.ptr_mut(),
            velocity: self.velocity.ptr_mut(),
            dw: self.dw.ptr_mut(),
            act: self.act.ptr_mut(),
            grad: self.grad.ptr_mut(),
            act_t: self.act_t.ptr_mut(),
            grad_t: self.grad_t.ptr_mut(),
            w_op: self.w_op[back].ptr_mut(),
            w_t: self.w_t[back].ptr_mut(),
            act_bf16: self.act_bf16.ptr_mut().cast(),
            grad_bf16: self.grad_bf16.ptr_mut().cast(),
            y: self.y.ptr(),
            classes: self.classes.ptr(),
            maps,
            row_stats: self.row_stats.ptr_mut(),
            trace: match self.trace.as_mut() {
                Some(t) => {
                    self.dev.zero(t)?;
                    t.ptr_mut()
                }
                None => kiln_gpu::DevicePtrMut::from_addr(0),
            },
        };
        let cfg = MegaConfig {
            batch: self.shape.batch as u32,
            layers: self.shape.layers() as u32,
            counters: self.counters as u32,
            loss: if loss_kind == Loss::Mse { loss::MSE } else { loss::CROSS_ENTROPY },
            lr,
            momentum,
            wait_limit_ns: self.wait_limit_ns,
            tile: self.tile,
            precision: self.path.code(),
            extra_free_arrivals: self.extra_free_arrivals,
            give_up_warp: self.give_up_warp,
            give_up_at: self.give_up_at,
        };
        let launch = |threads: u32, smem: u32| crate::cuda::LaunchConfig {
            grid_dim: (self.sms, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem,
        };
        let tc_block = tc_threads(cfg.precision, cfg.tile);
        let (mega, tc) =
            (launch(MEGA_THREADS, 0), launch(tc_block, tc_smem_bytes(cfg.layers, cfg.precision, cfg.tile)));
        let args = (bufs, cfg);
        // The step's kernel: one per data path and, on tensor cores, per tile (the schedule's,
        // which `GpuStep::new` checked is one of the path's).
        // SAFETY: every buffer was sized from the schedule's shape, and the tensor maps describe
        // them; the kernels index within them.
        unsafe {
            match (self.path, self.tile) {
                (DataPath::CudaCores, _) => self.launch_step(MegakernelStep, mega, args),
                (DataPath::Tf32, 32) => self.launch_step(MegakernelStepTf32T32, tc, args),
                (DataPath::Tf32x3, 32) => self.launch_step(MegakernelStepTf32x3T32, tc, args),
                (DataPath::Tf32, _) => self.launch_step(MegakernelStepTf32T64, tc, args),
                (DataPath::Tf32x3, _) => self.launch_step(MegakernelStepTf32x3T64, tc, args),
                (DataPath::Bf16, 128) => self.launch_step(MegakernelStepBf16T128, tc, args),
                (DataPath::Bf16, _) => self.launch_step(MegakernelStepBf16T64, tc, args),
            }?
        }
        // the copies this step's updates write are the next step's
        self.front = back;
        self.steps_since_check += 1;
        if self.check_every != 0 && self.steps_since_check >= self.check_every {
            self.check()?;
        }
        Ok(())
    }

    /// Launches step kernel `K` and remembers its name for stall reports.
    ///
    /// # Safety
    /// As [`crate::cuda::Device::launch`]: `args` must describe buffers the kernel may index.
    unsafe fn launch_step<K>(&mut self, k: K, cfg: crate::cuda::LaunchConfig, args: K::Args) -> Result<()>
    where
        K: kiln_gpu::Kernel<Args = (kiln_gpu::megakernel::MegaBuffers, kiln_gpu::megakernel::MegaConfig)>,
    {
        self.kernel = K::NAME;
        unsafe { self.dev.launch(k, cfg, args) }
    }
}

//! Reading a [`GpuStep`] back: stalled waits as [`Error::Stalled`] reports, step traces, the
//! activations, gradients and weights, and the tensor-core paths' operand copies.

use super::GpuStep;
use super::layout::{OperandBuffer, split_rows};
use crate::error::{Error, Result};
use crate::megakernel::{DataPath, StepTrace};

impl GpuStep {
    /// Waits for the launched steps and reports a stalled wait in any of them as
    /// [`Error::Stalled`] (then clears the flag).
    pub fn check(&mut self) -> Result<()> {
        use kiln_gpu::megakernel::{
            MASK_READY, PAGE_FREE, PAGE_READY, PAGE_TAG, RECORD_WORDS, RECORDS_PER_BLOCK, RENDEZVOUS, STAGE_FREE,
            STAGED, WEIGHTS_FREE, WEIGHTS_READY, record_offset,
        };
        self.steps_since_check = 0;
        let c = self.dev.download(&self.counter_buf)?;
        let k = self.counters;
        if c[k] == 0 {
            return Ok(());
        }
        let mut stuck = Vec::new();
        for blk in 0..self.sms {
            for role in 0..RECORDS_PER_BLOCK {
                let at = record_offset(k as u32, blk, role) as usize;
                let r = &c[at..at + RECORD_WORDS as usize];
                if r[0] == 0 {
                    continue;
                }
                let who = match role {
                    _ if self.path == DataPath::CudaCores => "block",
                    kiln_gpu::megakernel::role::LOADER => "loader of block",
                    kiln_gpu::megakernel::role::CONSUMERS => "consumers of block",
                    _ => "storer of block",
                };
                let what = if r[1] & PAGE_TAG == 0 {
                    format!("counter {} (saw {}, wanted {})", r[1], r[2], r[3])
                } else {
                    let slot = r[1] & 0xffff;
                    match (r[1] >> 16) & 0xff {
                        PAGE_READY => {
                            format!("the ready barrier of page {slot} with parity {} (page use {})", r[2], r[3])
                        }
                        PAGE_FREE => {
                            format!("the free barrier of page {slot} with parity {} (page use {})", r[2], r[3])
                        }
                        RENDEZVOUS => format!("the consumers' rendezvous with parity {} (meeting {})", r[2], r[3]),
                        STAGED => format!("the staged-tile hand-off with parity {} (staged tile {})", r[2], r[3]),
                        STAGE_FREE => {
                            format!(
                                "the storer's release of the staging buffer with parity {} (staged tile {})",
                                r[2], r[3]
                            )
                        }
                        MASK_READY => format!("the ReLU mask's barrier with parity {} (mask {})", r[2], r[3]),
                        WEIGHTS_READY => {
                            format!("the old weights' barrier with parity {} (staged update {})", r[2], r[3])
                        }
                        WEIGHTS_FREE => format!(
                            "the storer's release of the weight buffer with parity {} (staged update {})",
                            r[2], r[3]
                        ),
                        other => format!("barrier kind {other}, slot {slot}, parity {}", r[2]),
                    }
                };
                stuck.push(format!("{who} {blk} at instruction {} waited on {what}", r[0] - 1));
            }
        }
        self.dev.zero(&mut self.counter_buf)?;
        Err(Error::Stalled { kernel: self.kernel, msg: stuck.join("; ") })
    }

    /// Turns timestamps on or off for the steps that follow: each traced step records when every
    /// instruction waited, worked and signalled (`kiln_gpu::megakernel::trace`), which
    /// [`GpuStep::trace`] reads back. The timer reads and stores cost a little; benchmark untraced.
    pub fn set_trace(&mut self, on: bool) -> Result<()> {
        self.trace = match on {
            true => Some(self.dev.zeros::<u64>(self.listing.len() * kiln_gpu::megakernel::trace::WORDS as usize)?),
            false => None,
        };
        Ok(())
    }

    /// The timestamps of the last traced step (waiting for it to finish). It does not check for a
    /// stall, so that the trace of a step that was given up can be read: its unreached
    /// instructions show as unfinished; [`GpuStep::check`] then reports the stall records.
    pub fn trace(&mut self) -> Result<StepTrace> {
        let Some(buf) = self.trace.as_ref() else {
            return Err(Error::Unsupported {
                op: "megakernel trace",
                what: "a step run without tracing: call GpuStep::set_trace(true) before the step".into(),
            });
        };
        let words = self.dev.download(buf)?;
        Ok(StepTrace::new(&self.listing, &words, self.sms))
    }

    /// The last step's activations, `act[0]` (the batch as the products read it) to `act[L]` (the
    /// outputs), `batch x dims[l]` each (unpadded rows). On [`DataPath::Tf32`] every one but the
    /// outputs is a tf32 value (rounded to nearest, ties to even), on [`DataPath::Bf16`] a bf16
    /// one.
    pub fn activations(&mut self) -> Result<Vec<Vec<f32>>> {
        self.check()?;
        let mut act = self.per_layer_rows(&self.dev.download(&self.act)?);
        if self.path == DataPath::Bf16 {
            // the hidden layers are kept as bf16 only
            let bf16 = self.per_layer_rows(&self.act_bf16.download(&self.dev)?);
            let last = act.len() - 1;
            act[1..last].clone_from_slice(&bf16[1..last]);
        }
        Ok(act)
    }

    /// The last step's gradients of the loss by the activations, laid out as
    /// [`GpuStep::activations`]; layer 0's (the batch's) is not computed and reads as zeros. On
    /// [`DataPath::Tf32`] they are tf32 values, on [`DataPath::Bf16`] bf16 ones.
    pub fn activation_grads(&mut self) -> Result<Vec<Vec<f32>>> {
        self.check()?;
        // (kept as bf16 only on the bf16 path)
        let flat = match self.path {
            DataPath::Bf16 => self.grad_bf16.download(&self.dev)?,
            _ => self.dev.download(&self.grad)?,
        };
        Ok(self.per_layer_rows(&flat))
    }

    /// A buffer laid out as `act` (layer `l`: `batch` rows of `pitch(dims[l])`), split per layer
    /// and unpadded.
    fn per_layer_rows(&self, flat: &[f32]) -> Vec<Vec<f32>> {
        split_rows(flat, self.shape.dims.iter().map(|&d| (self.shape.batch, d)))
    }

    /// The current weights, per layer (unpadded rows).
    pub fn weights(&mut self) -> Result<Vec<Vec<f32>>> {
        self.check()?;
        let flat = self.dev.download(&self.weights)?;
        let d = &self.shape.dims;
        Ok(split_rows(&flat, (0..self.shape.layers()).map(|l| (d[l + 1], d[l]))))
    }

    /// The tensor-core paths' K-major operand copies as the last step left them (unpadded rows;
    /// see [`OperandCopies`]). For inspection and tests: the products read these, never the host.
    pub fn operand_copies(&mut self) -> Result<OperandCopies> {
        if self.path == DataPath::CudaCores {
            return Err(Error::Unsupported {
                op: "megakernel operand copies",
                what: "the CUDA-core path, which keeps none: use DataPath::Tf32, Tf32x3 or Bf16".into(),
            });
        }
        self.check()?;
        let (d, b, layers) = (&self.shape.dims, self.shape.batch, self.shape.layers());
        let per_layer = |flat: Vec<f32>| split_rows(&flat, d.iter().map(|&dim| (dim, b)));
        let dev = &self.dev;
        let kept = !self.reads_in_place();
        let w_t = match kept {
            true => Some(split_rows(&self.w_t[self.front].download(dev)?, (0..layers).map(|l| (d[l], d[l + 1])))),
            false => None,
        };
        let w_op = match self.path {
            DataPath::Tf32 | DataPath::Bf16 => {
                Some(split_rows(&self.w_op[self.front].download(dev)?, (0..layers).map(|l| (d[l + 1], d[l]))))
            }
            DataPath::CudaCores | DataPath::Tf32x3 => None,
        };
        let bf16 = |buf: &OperandBuffer| -> Result<Option<Vec<Vec<f32>>>> {
            Ok(match self.path {
                DataPath::Bf16 => Some(self.per_layer_rows(&buf.download(dev)?)),
                _ => None,
            })
        };
        Ok(OperandCopies {
            act_t: if kept { Some(per_layer(self.act_t.download(dev)?)) } else { None },
            grad_t: if kept { Some(per_layer(self.grad_t.download(dev)?)) } else { None },
            w_t,
            w_op,
            act_bf16: bf16(&self.act_bf16)?,
            grad_bf16: bf16(&self.grad_bf16)?,
        })
    }
}

/// The K-major copies of a tensor-core step's operands ([`GpuStep::operand_copies`]), each as its
/// products read it (rounded to tf32 on [`DataPath::Tf32`], stored as bf16 on
/// [`DataPath::Bf16`]), unpadded rows. The transposed copies are `None` where the step keeps
/// none ([`GpuStep::reads_in_place`]).
#[derive(Clone, Debug)]
pub struct OperandCopies {
    /// `act_t[l]`: `act[l]` transposed, `dims[l] x batch`, for `l` in `0..=L`. Written for the
    /// batch (`l = 0`) and the hidden layers; the outputs' (`l = L`) is never read and stays zero.
    pub act_t: Option<Vec<Vec<f32>>>,
    /// `grad_t[l]`: `grad[l]` transposed, laid out as `act_t`; layer 0's is never computed.
    pub grad_t: Option<Vec<Vec<f32>>>,
    /// `w_t[l]`: `W[l]` transposed, `dims[l] x dims[l + 1]`.
    pub w_t: Option<Vec<Vec<f32>>>,
    /// [`DataPath::Tf32`], [`DataPath::Bf16`]: `W[l]` rounded to the products' format (what the
    /// forward multiplies); `None` on 3xTF32, whose forward reads the weights themselves.
    pub w_op: Option<Vec<Vec<f32>>>,
    /// [`DataPath::Bf16`]: the bf16 copy of the activations (what the forwards read), laid out as
    /// [`GpuStep::activations`]; `None` on the other paths.
    pub act_bf16: Option<Vec<Vec<f32>>>,
    /// [`DataPath::Bf16`]: the bf16 copy of the activations' gradients (what the input gradients
    /// read), laid out as [`GpuStep::activation_grads`]; `None` on the other paths.
    pub grad_bf16: Option<Vec<Vec<f32>>>,
}

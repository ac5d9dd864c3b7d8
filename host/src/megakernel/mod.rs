//! The megakernel's host side: build the per-SM instruction schedule of one MLP training step, and
//! interpret it on the CPU — SMs interleaved in a seeded random order, every wait checked — as the
//! reference for the device kernel and as the check that the schedule cannot deadlock. (A missing
//! wait shows up there only when a random interleaving changes the numbers: the interpreter runs
//! each instruction whole, so it is a strong test of the ordering, not a proof.) On the GPU,
//! [`GpuStep`] runs the same schedule as one launch per step.
//!
//! The instruction format, opcodes and counter protocol are `kiln_gpu::megakernel`'s (one
//! definition for host and device). The model is an MLP without biases: hidden layers
//! `act[l+1] = relu(act[l] W[l]^T)`, a linear last layer, mean-squared error or softmax
//! cross-entropy, and SGD (optional momentum).
//!
//! ```text
//!   MlpShape, DataPath, Updates, WeightReads                            (config.rs)
//!                |
//!                v
//!   build / build_with_tile: the step's instructions in a topological order,
//!   counters wired, dealt to one in-order list per SM                  (schedule.rs)
//!                |
//!                v
//!   Schedule { order, per_sm, counters, tile, dealing, .. }
//!                |
//!       +--------+---------------------------------+
//!       v                                          v
//!   interpret(schedule, StepState, ..)         GpuStep::new(dev, schedule, weights, path)
//!   CPU: one SM's next ready instruction       uploads the lists, padded buffers, the
//!   at a time, picked at random, every         operand copies and tensor maps
//!   wait checked; the reference                (gpu_step.rs, gpu_step/)
//!   (interpret.rs)                                 |
//!                                                  v
//!                                              GpuStep::step: one launch of the path's
//!                                              kernel per training step; stalls reported
//!                                                  |  traced steps
//!                                                  v
//!                                              StepTrace: where the step's time went
//!                                              (trace.rs)
//! ```

mod config;
mod gpu_step;
mod interpret;
mod schedule;
mod trace;

pub use config::{DataPath, Loss, MlpShape, StepInputs, Updates, WeightReads};
pub use gpu_step::{GiveUp, GpuStep, OperandCopies, tensor_core_step_supported};
pub use interpret::{StepState, interpret};
pub use schedule::{Dealing, Schedule, build, build_with_tile};
pub use trace::{PhaseTimes, StepTrace, TraceRecord};

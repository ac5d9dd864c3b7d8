//! The training megakernel (the files in `megakernel/`): one launch per training step of an MLP,
//! one persistent block per SM walking its list of instructions (built by the host,
//! `kiln::megakernel`; the format is [`crate::megakernel`]), waiting on and signalling global
//! counters between instructions. The modules are `kernels::megakernel_step` and
//! `kernels::megakernel_tc` (see [`crate::kernels`]), re-exported here.
//!
//! - [`cuda_cores`] (`cuda_cores.rs`), version 1: CUDA-core FMA chains in the CPU interpreter's
//!   order, bit for bit its results (the reference the schedule is tested with). Its counters
//!   between blocks (waits, signals, stall records, trace words) and its SGD update serve version
//!   2 too.
//! - [`tensor_cores`] (`tensor_cores/`), version 2, the design's data path: a loader warp streams
//!   operand pages into a shared-memory ring with TMA while two consumer warpgroups multiply them
//!   on the tensor cores (`mma.sync` or `wgmma`), and at tile 128 a storer warp writes their
//!   outputs with TMA. Its module docs draw the data path; its files are split by role.

pub use super::megakernel_step as cuda_cores;
pub use super::megakernel_tc as tensor_cores;

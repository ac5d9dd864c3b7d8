//! What a megakernel step is built for and how it runs: the model ([`MlpShape`], [`Loss`]), the
//! device's data path ([`DataPath`]), where the updates go ([`Updates`]), what the input gradients
//! read the weights from ([`WeightReads`]), and one step's inputs ([`StepInputs`]). Shared by the
//! schedule builder, the CPU interpreter and the GPU runner.

use crate::error::{Error, Result};
use kiln_gpu::megakernel::precision;

/// The loss the step differentiates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loss {
    /// Mean over all outputs of (y - target)^2.
    Mse,
    /// Mean over the batch of softmax cross-entropy with integer targets.
    CrossEntropy,
}

/// How the device multiplies: which kernel runs the step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataPath {
    /// `megakernel_step` (any GPU): shared-memory slabs and CUDA-core FMA chains in ascending k,
    /// bit-identical to [`interpret`](super::interpret). Tiles 16, 32, 64.
    CudaCores,
    /// `megakernel_step_tf32_t32` / `_t64` (sm_90): TMA pages, a loader warp, tensor-core products
    /// (`mma.sync` at tile 32, `wgmma` at 64) with inputs rounded to tf32 (about 3 decimal digits
    /// per input, as PyTorch's `allow_tf32`; to nearest, ties to even). The activations and
    /// gradients are stored rounded (the values the products use), so [`GpuStep::activations`](super::GpuStep::activations)
    /// reads tf32 values, all but the outputs. Tiles 32, 64.
    Tf32,
    /// `megakernel_step_tf32x3_t32` / `_t64` (sm_90), 3xTF32 products on `mma.sync` (each input
    /// split into a tf32 head and tail): about f32 accuracy. The default. Tiles 32, 64.
    #[default]
    Tf32x3,
    /// `megakernel_step_bf16_t64` / `_t128` (sm_90): as [`DataPath::Tf32`] at tile 64, with every
    /// operand of the products rounded to bf16 (8 significant bits, as PyTorch's bf16 autocast;
    /// to nearest, ties to even) and stored as bf16, so that a page carries twice the K of an f32
    /// one; f32 sums, f32 weights. [`GpuStep::activations`](super::GpuStep::activations) reads bf16 values, all but the
    /// outputs. Tiles 64 and 128 (where each warpgroup owns 64 rows of the tile and multiplies
    /// with `wgmma` m64n128k16).
    Bf16,
}

impl DataPath {
    /// The kernel's [`precision`] code.
    pub fn code(self) -> u32 {
        match self {
            DataPath::CudaCores => precision::CUDA_CORES,
            DataPath::Tf32 => precision::TF32,
            DataPath::Tf32x3 => precision::TF32X3,
            DataPath::Bf16 => precision::BF16,
        }
    }

    /// `v` as the path's products read it from memory: rounded (nearest, ties to even) to tf32 on
    /// [`DataPath::Tf32`] and to bf16 on [`DataPath::Bf16`], whose page loops convert nothing; as
    /// it is on the others. The host stores what it uploads for the products (the batch, the
    /// weights' copies) this way, as the kernel's epilogues do.
    pub fn operand(self, v: f32) -> f32 {
        match self {
            DataPath::Tf32 => kiln_gpu::convert::tf32_round_host(v),
            DataPath::Bf16 => half::bf16::from_f32(v).to_f32(),
            DataPath::CudaCores | DataPath::Tf32x3 => v,
        }
    }

    /// Whether [`DataPath::operand`] rounds anything (tf32, bf16).
    pub(super) fn rounds(self) -> bool {
        matches!(self, DataPath::Tf32 | DataPath::Bf16)
    }

    /// The tile edges the path's kernel is built for, ascending.
    pub fn tiles(self) -> &'static [u32] {
        kiln_gpu::megakernel::tiles_for(self.code())
    }

    /// What the path's input gradients read `W[l]` from: the tensor-core paths read a copy
    /// (`w_t`, or at bf16 tile 128 `w_op`) that [`GpuStep`](super::GpuStep) keeps twice, so the step's updates
    /// write the other copy; the CUDA cores read the weights the updates overwrite.
    pub fn weight_reads(self) -> WeightReads {
        match self {
            DataPath::CudaCores => WeightReads::InPlace,
            DataPath::Tf32 | DataPath::Tf32x3 | DataPath::Bf16 => WeightReads::StepStartCopy,
        }
    }
}

/// What a step's input gradients read the weights `W[l]` from, which decides whether the update
/// of `W[l]` must wait for them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightReads {
    /// The weights the step's updates overwrite ([`DataPath::CudaCores`]): each update of `W[l]`
    /// waits for every input gradient of layer `l`, which reads the old `W[l]` (a
    /// write-after-read guard, the instructions' second wait). Correct on every path.
    #[default]
    InPlace,
    /// A copy of the weights as the step started, which no update of the step writes (the
    /// tensor-core paths: [`GpuStep`](super::GpuStep) keeps the products' weight copies twice and alternates
    /// them, the updates writing the copy the next step reads): no guard, so a layer's updates
    /// can run beside its input gradients.
    StepStartCopy,
}

/// Parses `cuda-cores`, `tf32`, `tf32x3` or `bf16` (the main job's `--mega-path`).
impl std::str::FromStr for DataPath {
    type Err = Error;
    fn from_str(s: &str) -> Result<DataPath> {
        match s {
            "cuda-cores" => Ok(DataPath::CudaCores),
            "tf32" => Ok(DataPath::Tf32),
            "tf32x3" => Ok(DataPath::Tf32x3),
            "bf16" => Ok(DataPath::Bf16),
            other => Err(Error::Unsupported {
                op: "megakernel data path",
                what: format!("{other:?}: choose cuda-cores, tf32, tf32x3 or bf16"),
            }),
        }
    }
}

/// The model and batch a schedule is built for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MlpShape {
    /// Rows per step.
    pub batch: usize,
    /// `dims[0]` inputs, `dims[l + 1]` outputs of layer l; `dims.len() - 1` layers.
    pub dims: Vec<usize>,
}

impl MlpShape {
    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.dims.len() - 1
    }
}

/// Where a schedule applies each layer's SGD update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Updates {
    /// `LINEAR_BWD_WEIGHT_SGD`: each weight-gradient tile updates its own weights from the product,
    /// once every input gradient of its layer (which reads the old weights) is done. No `dW` round
    /// trip, no update phase at the end of the step. The default.
    #[default]
    Fused,
    /// `LINEAR_BWD_WEIGHT` tiles write `dW`; `SGD_UPDATE` tiles, last in every SM's list, apply it.
    Separate,
}

/// The step's inputs and hyper-parameters.
pub struct StepInputs<'a> {
    /// `batch x dims[0]`.
    pub x: &'a [f32],
    /// Regression targets (`batch x dims[L]`) for MSE.
    pub y: &'a [f32],
    /// Class per row for cross-entropy.
    pub classes: &'a [usize],
    /// The loss.
    pub loss: Loss,
    /// Learning rate.
    pub lr: f32,
    /// Momentum (0: plain SGD).
    pub momentum: f32,
}

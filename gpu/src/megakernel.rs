//! The instruction stream of the MLP training megakernel: one definition of the instruction format,
//! the opcodes, the tile size and the counter protocol, shared by the host (which builds the
//! per-SM schedule and interprets it on the CPU as a reference) and the device kernel.
//!
//! A training step for an MLP with layers `0..L` (layer l maps `dims[l]` to `dims[l + 1]` features)
//! is these instructions, each on one `tile` x `tile` output tile (`tile` is one of [`TILES`], chosen
//! per schedule so that small models still spread over many SMs):
//!
//! | opcode | output | reads | waits for |
//! | --- | --- | --- | --- |
//! | `LINEAR_FWD` l | `act[l+1]` rows of a row block | `act[l]` (same rows), `W[l]` | layer l-1's forward of those rows |
//! | `LOSS_GRAD` | `grad[L]` rows of a row block | `act[L]`, targets | the last forward of those rows |
//! | `LINEAR_BWD_INPUT` l | `grad[l]` rows of a row block | `grad[l+1]` (same rows), `W[l]` | `grad[l+1]` of those rows |
//! | `LINEAR_BWD_WEIGHT` l | `dW[l]` tile | all of `grad[l+1]` and `act[l]` | every row block of `grad[l+1]` |
//! | `SGD_UPDATE` l | `W[l]` tile | `dW[l]` tile | that `dW[l]` tile, and every `LINEAR_BWD_INPUT` l (which reads the old `W[l]`) |
//!
//! Dependencies are global counters: each instruction adds 1 to its `signal` counter when done;
//! a waiting instruction spins until its `wait` counter reaches `wait_value`. The host orders all
//! instructions topologically, deals them round-robin to the SMs, and each SM runs its list in order,
//! so every wait names work that comes earlier in the global order: with all blocks resident, the
//! earliest unfinished instruction can always run, and no schedule the host builds deadlocks.

/// The output tile edges the kernel is built for: a block of [`MEGA_THREADS`](crate::kernels::megakernel_step::MEGA_THREADS)
/// threads, 16 x 16, computes `tile / 16` x `tile / 16` outputs per thread.
pub const TILES: [u32; 3] = [16, 32, 64];

/// Elements of one operand's shared-memory slab: a `tile` x `SLAB / tile` block of the K dimension
/// (so small tiles take long K steps, and one slab's loads are all in flight at once).
pub const SLAB: u32 = 2048;

/// The tile for a model: the largest of [`TILES`] whose forward of the widest layer (`batch` rows by
/// `widest` outputs) still has a tile for every 10 SMs, else the smallest. Bigger tiles do more math
/// per byte loaded and per wait, and that outweighs idle SMs down to about that ratio: tuned from the
/// tile sweep in `benches/results/mlp_step.md` (64 rows of 256: tile 32 beat 16 and 64; 256 rows of
/// 1024: 64 beat 32).
pub const fn choose_tile(batch: u32, widest: u32, sms: u32) -> u32 {
    let mut i = TILES.len();
    while i > 1 {
        i -= 1;
        let t = TILES[i];
        if batch.div_ceil(t) as u64 * widest.div_ceil(t) as u64 * 10 >= sms as u64 {
            return t;
        }
    }
    TILES[0]
}

/// Instruction opcodes.
pub mod opcode {
    /// `act[l+1] = f(act[l] W[l]^T)` on one tile.
    pub const LINEAR_FWD: u32 = 1;
    /// `grad[L] = dLoss/d act[L]` on one tile.
    pub const LOSS_GRAD: u32 = 2;
    /// `dW[l] = grad[l+1]^T act[l]` on one tile.
    pub const LINEAR_BWD_WEIGHT: u32 = 3;
    /// `grad[l] = (grad[l+1] W[l]) * f'(act[l])` on one tile.
    pub const LINEAR_BWD_INPUT: u32 = 4;
    /// `W[l] -= lr dW[l]` (with momentum when enabled) on one tile.
    pub const SGD_UPDATE: u32 = 5;
}

/// "No counter": an instruction that waits for nothing.
pub const NO_COUNTER: u32 = u32::MAX;

/// One instruction: 12 words (48 bytes), the same layout on host and device.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Instruction {
    /// What to do ([`opcode`]).
    pub opcode: u32,
    /// The layer.
    pub layer: u32,
    /// Tile row (in tiles) of the output.
    pub tile_row: u32,
    /// Tile column (in tiles) of the output.
    pub tile_col: u32,
    /// Counter to wait on ([`NO_COUNTER`]: none).
    pub wait: u32,
    /// Value the wait counter must reach.
    pub wait_value: u32,
    /// Second counter to wait on (SGD's write-after-read guard), or [`NO_COUNTER`].
    pub wait2: u32,
    /// Value the second counter must reach.
    pub wait2_value: u32,
    /// Counter to add 1 to when done ([`NO_COUNTER`]: none).
    pub signal: u32,
    /// Second counter to add 1 to when done (a layer-wide total), or [`NO_COUNTER`].
    pub signal2: u32,
    /// Padding to a 16-byte multiple.
    pub _pad: [u32; 2],
}

// SAFETY: repr(C), u32 fields only.
unsafe impl crate::KernelParam for Instruction {}

/// Consumer warps per block: each signals a page free once it is done with it.
pub const CONSUMER_WARPS: u32 = 4;
/// Arrivals that free a shared-memory page: one per consumer warp. The device initializes each
/// page's "free" barrier with this count and every consumer warp arrives exactly once per use, so
/// host tests and the kernel read the same number.
pub const PAGE_FREE_ARRIVALS: u32 = CONSUMER_WARPS;
/// Arrivals that make a page ready: the loader's one `arrive.expect_tx` (the bytes complete it).
pub const PAGE_READY_ARRIVALS: u32 = 1;

/// The parity a waiter uses for the `use_index`-th use of a page barrier (phase `use_index`).
pub const fn page_parity(use_index: u32) -> u32 {
    use_index & 1
}

/// Loss codes for [`MegaConfig::loss`].
pub mod loss {
    /// Mean squared error.
    pub const MSE: u32 = 0;
    /// Softmax cross-entropy.
    pub const CROSS_ENTROPY: u32 = 1;
}

/// The device buffers of one step (all f32 arrays concatenate the layers; offsets are in elements).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MegaBuffers {
    /// Every SM's instructions, concatenated.
    pub instructions: crate::DevicePtr<Instruction>,
    /// SM `s` runs `instructions[sm_offsets[s] .. sm_offsets[s + 1]]`.
    pub sm_offsets: crate::DevicePtr<u32>,
    /// The dependency counters, then the abort flag, then 4 diagnostic words.
    pub counters: crate::DevicePtrMut<u32>,
    /// `dims[0..=L]`.
    pub dims: crate::DevicePtr<u32>,
    /// Offset of `W[l]` in `weights`, `velocity` and `dw`.
    pub w_off: crate::DevicePtr<u32>,
    /// Offset of `act[l]` / `grad[l]` in `act` and `grad`.
    pub a_off: crate::DevicePtr<u32>,
    /// Weights.
    pub weights: crate::DevicePtrMut<f32>,
    /// Momentum buffers.
    pub velocity: crate::DevicePtrMut<f32>,
    /// Weight gradients.
    pub dw: crate::DevicePtrMut<f32>,
    /// Activations (`act[0]` is the input).
    pub act: crate::DevicePtrMut<f32>,
    /// Activation gradients.
    pub grad: crate::DevicePtrMut<f32>,
    /// MSE targets.
    pub y: crate::DevicePtr<f32>,
    /// Cross-entropy classes.
    pub classes: crate::DevicePtr<u32>,
}
// SAFETY: repr(C), device pointers only.
unsafe impl crate::KernelParam for MegaBuffers {}

/// Scalars of one step.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MegaConfig {
    /// Rows.
    pub batch: u32,
    /// Layers.
    pub layers: u32,
    /// Number of dependency counters (the abort flag follows them).
    pub counters: u32,
    /// [`loss`] code.
    pub loss: u32,
    /// Learning rate.
    pub lr: f32,
    /// Momentum.
    pub momentum: f32,
    /// A wait longer than this (global-timer nanoseconds) aborts the step.
    pub wait_limit_ns: u32,
    /// Output tile edge, one of [`TILES`] (the schedule's).
    pub tile: u32,
}
// SAFETY: repr(C), 4-byte fields only.
unsafe impl crate::KernelParam for MegaConfig {}

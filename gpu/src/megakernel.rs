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
//! | `LINEAR_BWD_WEIGHT_SGD` l | `W[l]` tile | all of `grad[l+1]` and `act[l]` | every row block of `grad[l+1]`, and every `LINEAR_BWD_INPUT` l |
//!
//! `LINEAR_BWD_WEIGHT_SGD` is the weight gradient and the update of one tile in one instruction:
//! the product's accumulators go straight into the update, with no `dW` round trip through memory
//! and no separate update phase at the end of the step. A schedule uses either it or the pair
//! `LINEAR_BWD_WEIGHT` + `SGD_UPDATE` (the host's `Updates` choice); the results are the same.
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

/// The tile edges of the tensor-core data path ([`precision::TF32`], [`precision::TF32X3`]): a block's
/// consumer warps each own a `tile/2` square (per page group), at least one 16 x 16 `mma` pair.
pub const TC_TILES: [u32; 2] = [32, 64];

/// The tile edges of the bf16 data path ([`precision::BF16`]): its consumers multiply on `wgmma`
/// only. At 64 each page group is a warpgroup holding the whole 64 x 64 tile (the groups split the
/// pages); at 128 each holds 64 rows of it (the groups split the rows, [`groups_split_rows`]).
pub const BF16_TILES: [u32; 2] = [64, 128];

/// Every tile edge some kernel is built for (a schedule's tile must be one of these, and of its
/// data path's [`tiles_for`]).
pub const SCHEDULE_TILES: [u32; 4] = [16, 32, 64, 128];

/// The tiles a data path ([`precision`] code) is built for.
pub const fn tiles_for(precision: u32) -> &'static [u32] {
    match precision {
        precision::CUDA_CORES => &TILES,
        precision::BF16 => &BF16_TILES,
        _ => &TC_TILES,
    }
}

/// The tile for a model: the largest of `tiles` (ascending) whose forward of the widest layer
/// (`batch` rows by `widest` outputs) still has a tile for every 10 SMs (tiles up to 64), or a
/// tile for every SM (tile 128), else the smallest. Bigger tiles do more math per byte loaded and
/// per wait, and that outweighs idle SMs down to about that ratio: tuned from the tile sweeps in
/// `benches/results/mlp_step.md` (64 rows of 256: tile 32 beat 16 and 64; 256 rows of 1024: 64
/// beat 32 and 128; 4096 rows of 1024: 128 beat 64).
pub const fn choose_tile(batch: u32, widest: u32, sms: u32, tiles: &[u32]) -> u32 {
    let mut i = tiles.len();
    while i > 1 {
        i -= 1;
        let t = tiles[i];
        let sms_per_tile = if t > 64 { 1 } else { 10 };
        if batch.div_ceil(t) as u64 * widest.div_ceil(t) as u64 * sms_per_tile >= sms as u64 {
            return t;
        }
    }
    tiles[0]
}

/// Data-path codes for [`MegaConfig::precision`]: which kernel runs the step and how it multiplies.
pub mod precision {
    /// `megakernel_step`: CUDA-core FMA chains in ascending k, bit-identical to the CPU interpreter.
    pub const CUDA_CORES: u32 = 0;
    /// `megakernel_step_tf32_t32` / `_t64`: TMA pages and tensor-core products (`mma.sync` at tile
    /// 32, `wgmma` at 64) with inputs rounded to tf32 (10-bit mantissa).
    pub const TF32: u32 = 1;
    /// `megakernel_step_tf32x3_t32` / `_t64` (`mma.sync`): each input split into a tf32 head and a
    /// tf32 tail and three products (`a_t b_h + a_h b_t + a_h b_h`): about f32 accuracy at three
    /// times the tensor work.
    pub const TF32X3: u32 = 2;
    /// `megakernel_step_bf16_t64` / `_t128`: TMA pages and `wgmma` products (m64n64k16 at tile
    /// 64, m64n128k16 at 128) with bf16 inputs (8
    /// significant bits, as PyTorch's bf16 autocast) and f32 sums; every operand the products
    /// read is stored as bf16 (half the bytes of a page row of f32, twice the K), the weights
    /// themselves kept in f32.
    pub const BF16: u32 = 3;
}

/// The row pitch (elements) of every matrix of the step in device memory: `dim` rounded up to 8,
/// so that each row starts 16-byte aligned, as TMA requires, whether its elements are f32 or
/// the bf16 path's 2-byte operands (which sit at the same element indices as their f32
/// counterparts would, so both share one set of offsets). The padding is never read (tensor
/// maps describe the live columns, and loads past them are zero-filled) and never written.
pub const fn pitch(dim: u32) -> u32 {
    dim.div_ceil(8) * 8
}

/// The K extent of one page of f32 operands: one 128-byte swizzled row.
pub const PAGE_K: u32 = 32;
/// The K extent of one page on the bf16 path: one 128-byte swizzled row of bf16, the same bytes
/// as an f32 page (so page sizes, swizzle and descriptors are the same on every path).
pub const PAGE_K_BF16: u32 = 64;
/// The K extent of a page on data path `precision`.
pub const fn page_k(precision: u32) -> u32 {
    if precision == precision::BF16 { PAGE_K_BF16 } else { PAGE_K }
}
/// Stages (slots) of each block's page ring. Up to tile 64 a slot holds a K block's A page and B
/// page; at tile 128 a page fills a slot, and a K block takes two consecutive uses of the ring (A,
/// then B: [`slot_uses_per_block`]).
///
/// Eight: every step measures faster with 8 than with 12, and the large step slower with any
/// other length tried (4, 6, 7, 10). Why is not known. Not the L1 share of the SM's shared memory:
/// padding the shared memory of 8 slots to that of 12 changes nothing. The host sizes shared
/// memory from this constant, so host and PTX must be built with the same value.
pub const PAGE_STAGES: u32 = 8;
/// Bytes of one operand page: `tile` rows of [`PAGE_K`] f32 (or [`PAGE_K_BF16`] bf16), K-major (every operand the tensor-core
/// path reads is stored with K contiguous: see [`map`]).
pub const fn page_bytes(tile: u32) -> u32 {
    tile * PAGE_K * 4
}
/// Bytes between stages: room for the A and B pages of tile 64, or one page of tile 128.
pub const STAGE_BYTES: u32 = 2 * page_bytes(64);
/// Ring uses (slots) a K block of `tile` takes: 1 while both pages fit a slot, else 2 (A, then B).
pub const fn slot_uses_per_block(tile: u32) -> u32 {
    if 2 * page_bytes(tile) <= STAGE_BYTES { 1 } else { 2 }
}
/// The bytes the loader announces on a slot's ready barrier: the pages it holds, whole (TMA
/// delivers every byte of a box, zero-filled outside the matrix).
pub const fn stage_tx_bytes(tile: u32) -> u32 {
    2 * page_bytes(tile) / slot_uses_per_block(tile)
}

/// The ring slot of a block's `use_index`-th page use (counted over all its products in order).
pub const fn page_slot(use_index: u32) -> u32 {
    use_index % PAGE_STAGES
}
/// The parity consumers wait for on the ready barrier of use `use_index`: the slot's phase
/// `use_index / PAGE_STAGES`.
pub const fn ready_parity(use_index: u32) -> u32 {
    page_parity(use_index / PAGE_STAGES)
}
/// The parity the loader waits for on the free barrier before use `use_index >= PAGE_STAGES`: the
/// consumers' release of the slot's previous use, phase `use_index / PAGE_STAGES - 1`.
pub const fn free_parity(use_index: u32) -> u32 {
    page_parity(use_index / PAGE_STAGES + 1)
}

/// Tensor maps per layer, in the buffer [`MegaBuffers::maps`] points to (index `PER_LAYER * l +`
/// one of these). Every map is K-major: each product reads rows whose K elements are contiguous,
/// one box of [`page_k`] columns (128 bytes: [`PAGE_K`] f32 or [`PAGE_K_BF16`] bf16) by `tile` rows
/// per page, so every page is read the same way (with `ldmatrix`, or by `wgmma` through a
/// descriptor on the tf32 and bf16 paths at tile 64).
/// For that the step keeps a transposed copy of what is read along its rows: the activations and
/// their gradients (`act_t`, `grad_t`, written beside `act` and `grad` by the same epilogues), and
/// the weights (`w_t`, written by every update). On [`precision::TF32`] and [`precision::BF16`]
/// the products' weights are `w_op`, the weights rounded when updated, so that no page loop
/// converts anything. On [`precision::BF16`] every map is of bf16 (`act_t`, `grad_t`, `w_op` and
/// `w_t` hold bf16, and `act`, `grad` are read from their bf16 copies `act_bf16`, `grad_bf16`).
/// The exception: bf16 at tile 128 keeps no transposed copies, and its maps for them describe the
/// operands themselves, MN-major ([`reads_in_place`]).
pub mod map {
    /// `act[l]` (`batch x dims[l]`, k = input feature): the forward's A (`act_bf16` on
    /// [`precision::BF16`](super::precision::BF16)).
    pub const ACT: u32 = 0;
    /// `act_t[l]` (`dims[l] x batch`, n = input feature, k = row): the weight gradient's B.
    pub const ACT_T: u32 = 1;
    /// `grad[l + 1]` (`batch x dims[l + 1]`, k = output feature): the input gradient's A
    /// (`grad_bf16` on [`precision::BF16`](super::precision::BF16)).
    pub const GRAD: u32 = 2;
    /// `grad_t[l + 1]` (`dims[l + 1] x batch`, m = output feature, k = row): the weight gradient's A.
    pub const GRAD_T: u32 = 3;
    /// `W[l]` as the products read it (`w_op` on `precision::TF32` and
    /// [`precision::BF16`](super::precision::BF16), else `weights`;
    /// `dims[l + 1] x dims[l]`, k = input feature): the forward's B.
    pub const W: u32 = 4;
    /// `w_t[l]` (`dims[l] x dims[l + 1]`, n = input feature, k = output feature): the input
    /// gradient's B.
    pub const W_T: u32 = 5;
    // Where the step reads in place (`reads_in_place`: bf16 at tile 128) `ACT_T`, `GRAD_T` and
    // `W_T` describe `act_bf16[l]`, `grad_bf16[l + 1]` and `w_op[l]` themselves, MN-major.
    /// The logits, `act[L]` (f32, `batch x dims[L]`), in boxes of `tile` rows by
    /// [`F32_BOX_COLS`](super::F32_BOX_COLS) columns, 128-byte swizzled: the loss gradient's
    /// input, where the loader stages it ([`box_slot_uses`](super::box_slot_uses)). (The same map
    /// in every layer's maps; the kernels read the last layer's.)
    pub const LOGITS: u32 = 6;
    /// `weights[l]`, the f32 weights themselves (`dims[l + 1] x dims[l]`), in boxes of `tile`
    /// rows by [`F32_BOX_COLS`](super::F32_BOX_COLS) columns, 128-byte swizzled: where a fused
    /// update stages its tile ([`staged`](super::staged)), the loader loads the old weights
    /// through it and the storer stores the new ones.
    pub const WEIGHTS: u32 = 7;
    /// The copy of `W[l]` the updates write (`w_op` of the next step: the other copy from the one
    /// [`W`] describes), as [`W`] describes it: the storer stores a staged fused update's rounded
    /// weights through it.
    pub const W_NEXT: u32 = 8;
    /// Maps per layer.
    pub const PER_LAYER: u32 = 9;
}

/// Columns of one box of f32 staged through the ring ([`box_slot_uses`]): 32 f32, one
/// 128-byte swizzle span.
pub const F32_BOX_COLS: u32 = 32;

/// Ring uses of f32 boxes that an instruction reads from shared memory, on data path `precision`
/// at `tile` (the loader fills them, and the consumers wait for, read and free them as they do
/// pages, so both count the same uses): where the step reads its operands in place (bf16 at tile
/// 128), a loss gradient's logits ([`map::LOGITS`]), `tile / F32_BOX_COLS` boxes of `tile` rows by
/// [`F32_BOX_COLS`] f32, a slot each, which the loader issues once the last forward's row block is
/// done, behind the pages before it. None elsewhere.
///
/// (Loss tiles loading their logits themselves measure slightly slower. A fused update's old
/// weights staged the same way, in the ring behind its pages, speed up its epilogue but not the
/// step, with more spills: not done.)
pub const fn box_slot_uses(opcode: u32, precision: u32, tile: u32) -> u32 {
    if opcode == opcode::LOSS_GRAD && reads_in_place(precision, tile) { tile / F32_BOX_COLS } else { 0 }
}

// a box of f32 fills a slot exactly, as a page of that tile does
const _: () = assert!(BF16_TILES[1] * F32_BOX_COLS * 4 == stage_tx_bytes(BF16_TILES[1]));

/// A stall record's second word for a page wait: this tag, the barrier kind
/// ([`PAGE_READY`]/[`PAGE_FREE`]/[`RENDEZVOUS`] in bits 16..24) and the ring slot (low bits); the
/// third word is then the parity waited for. Counter waits record the counter index.
pub const PAGE_TAG: u32 = 0x8000_0000;
/// Record kind: a consumer waited for a page's bytes.
pub const PAGE_READY: u32 = 1;
/// Record kind: the loader waited for consumers to free a page.
pub const PAGE_FREE: u32 = 2;
/// Record kind: a consumer warp waited for the others at an instruction boundary.
pub const RENDEZVOUS: u32 = 3;
/// Record kind: the storer waited for the consumers to stage a tile ([`stores_through_tma`]); the
/// slot bits are 0 and the fourth word counts the block's staged tiles.
pub const STAGED: u32 = 4;
/// Record kind: the consumers waited for the storer to free the staging buffer
/// ([`stores_through_tma`]).
pub const STAGE_FREE: u32 = 5;
/// Record kind: the consumers waited for an input gradient's ReLU mask to land in the staging
/// buffer ([`stores_through_tma`]); the fourth word counts the block's masks.
pub const MASK_READY: u32 = 6;
/// Record kind: the consumers waited for a staged fused update's old weights to land in the
/// weight buffer ([`staged`]); the fourth word counts the block's staged updates.
pub const WEIGHTS_READY: u32 = 7;
/// Record kind: the loader waited for the storer to release the weight buffer (its stores of the
/// last staged update's weights have read it); the fourth word counts the block's staged updates.
pub const WEIGHTS_FREE: u32 = 8;
/// Whose stall record a block writes ([`record_offset`]): each role's first stall only, so that
/// a stall one role causes in another (a storer waiting for consumers that gave up) never hides
/// the other's own record.
pub mod role {
    /// The loader of the tensor-core kernels, or the whole block of the CUDA-core kernel.
    pub const LOADER: u32 = 0;
    /// The consumer warps.
    pub const CONSUMERS: u32 = 1;
    /// The storer warp (kernels that [`stores_through_tma`](super::stores_through_tma)).
    pub const STORER: u32 = 2;
}
/// Stall records per block (after the counters and the abort flag): one per [`role`] (the
/// CUDA-core kernel uses only the first).
pub const RECORDS_PER_BLOCK: u32 = 3;
/// Words per stall record: 1 + instruction index, what was waited on, value seen, value wanted.
pub const RECORD_WORDS: u32 = 4;
/// Word offset of block `block`'s record for `role` (a [`role`]) in the counter buffer of a step
/// with `counters` dependency counters.
pub const fn record_offset(counters: u32, block: u32, role: u32) -> u32 {
    counters + 1 + RECORD_WORDS * (RECORDS_PER_BLOCK * block + role)
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
    /// `LINEAR_BWD_WEIGHT` and `SGD_UPDATE` of one tile, fused: `W[l] -= lr (grad[l+1]^T act[l])`.
    pub const LINEAR_BWD_WEIGHT_SGD: u32 = 6;
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
    /// Second counter to wait on (the update's write-after-read guard), or [`NO_COUNTER`].
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

/// Consumer warps per block, in [`PAGE_GROUPS`] groups of [`GROUP_WARPS`].
pub const CONSUMER_WARPS: u32 = 8;
/// The groups a product's pages are dealt to: group `g` multiplies the pages `kt` with
/// [`page_group`]`(kt) == g` into its own accumulators (each group's warps cover the whole tile),
/// and the groups add their sums at the end. Two groups put two consumer warps on each scheduler,
/// so that one's waits (fragment loads, conversions, `mma` results) hide behind the other's work.
pub const PAGE_GROUPS: u32 = 2;
/// Warps per group: each owns a `tile / 2` square of the output tile.
pub const GROUP_WARPS: u32 = CONSUMER_WARPS / PAGE_GROUPS;
/// The group that multiplies K page `kt` of a product.
pub const fn page_group(kt: u32) -> u32 {
    kt % PAGE_GROUPS
}
/// Whether a block's two page groups split a product's rows at `tile` (each a warpgroup
/// multiplying every page into its own 64 rows: tile 128), rather than its pages ([`page_group`],
/// then adding their sums: tiles up to 64).
pub const fn groups_split_rows(tile: u32) -> bool {
    tile > 64
}
/// Whether data path `precision` at `tile` reads every product operand in place, with no
/// transposed copies: bf16 at tile 128, whose `wgmma` reads a K-major page or, transposed, an
/// MN-major one (bf16 has that form, tf32 does not). There the weight gradient reads `grad` and
/// `act` and the input gradient reads `W` (`w_op`) as they are stored, through the maps
/// [`map::GRAD_T`], [`map::ACT_T`] and [`map::W_T`], each then loading a page as
/// `tile / MN_BOX` boxes of [`PAGE_K_BF16`] rows (K) by [`MN_BOX`] columns (M or N).
pub const fn reads_in_place(precision: u32, tile: u32) -> bool {
    precision == precision::BF16 && groups_split_rows(tile)
}
/// Whether data path `precision` at `tile` hands its activation and gradient tiles to a storer
/// warp through shared memory, which writes them with TMA and publishes them, while the consumers
/// go on to the next instruction: bf16 at tile 128 (where the staged tile, 128 x 128 bf16, fills
/// the shared memory the page groups use for their sums at smaller tiles). The instructions
/// staged are those of [`staged`]; there the input gradient's ReLU mask (`act[l]`) also arrives
/// in the staging buffer, loaded with TMA by the storer, instead of by the consumers' loads.
pub const fn stores_through_tma(precision: u32, tile: u32) -> bool {
    reads_in_place(precision, tile)
}

/// Whether an instruction stages its output tile where the step [`stores_through_tma`]: a hidden
/// layer's forward (`act[l + 1]`, bf16), every input gradient (`grad[l]`, bf16) and every fused
/// update (its new weights, f32 in the weight buffer, where the loader loaded the old ones
/// through [`map::WEIGHTS`], and bf16 in the staging buffer, `w_op`'s next copy). (The last
/// forward writes f32 logits and the loss partials; the separate weight gradients write f32 `dW`.)
pub const fn staged(op: u32, layer: u32, layers: u32) -> bool {
    match op {
        opcode::LINEAR_FWD => layer + 1 < layers,
        // (every one the schedule has: it computes no gradient of the step's input, so there is
        // no layer-0 input gradient. Asking `layer > 0` here made ptxas spill more in the
        // tile-128 kernel: 220 bytes against 152.)
        opcode::LINEAR_BWD_INPUT | opcode::LINEAR_BWD_WEIGHT_SGD => true,
        _ => false,
    }
}

/// Bytes of the weight buffer of a kernel that [`stores_through_tma`]: one staged fused update's
/// f32 weights, `tile / F32_BOX_COLS` boxes of `tile` rows by [`F32_BOX_COLS`] f32 (the
/// [`map::WEIGHTS`] boxes), one after another.
pub const fn weight_buffer_bytes(tile: u32) -> u32 {
    4 * tile * tile
}

/// The columns (M or N, 128 bytes of bf16) of one box of an MN-major page ([`reads_in_place`]).
pub const MN_BOX: u32 = 64;

/// Arrivals that free a shared-memory page up to tile 64: one per warp of the group that
/// multiplies it ([`page_free_arrivals`]).
pub const PAGE_FREE_ARRIVALS: u32 = GROUP_WARPS;
/// Arrivals that free a slot of the page ring at `tile`: one per warp that reads it, the page's
/// group's [`PAGE_FREE_ARRIVALS`], or every consumer warp when the groups split rows
/// ([`groups_split_rows`]). The device initializes each slot's "free" barrier with this count and
/// each of those warps arrives exactly once per use, so host tests and the kernel read the same
/// number.
pub const fn page_free_arrivals(tile: u32) -> u32 {
    if groups_split_rows(tile) { CONSUMER_WARPS } else { PAGE_FREE_ARRIVALS }
}
/// Arrivals that make a page ready: the loader's one `arrive.expect_tx` (the bytes complete it).
pub const PAGE_READY_ARRIVALS: u32 = 1;

/// The parity a waiter uses for the `use_index`-th use of a page barrier (phase `use_index`).
pub const fn page_parity(use_index: u32) -> u32 {
    use_index & 1
}

/// A traced step's record: [`WORDS`](trace::WORDS) words per instruction at `WORDS * index + word`,
/// first [`STAMPS`](trace::STAMPS) global-timer stamps in nanoseconds (`%globaltimer`, one clock
/// for every SM), then four SM-clock cycle counts ([`READY_WAIT_CLK`](trace::READY_WAIT_CLK) on).
/// Words the kernel does not reach stay 0 (the host zeroes the buffer before the step).
///
/// A product instruction's life: the loader reaches it ([`LOADER_START`](trace::LOADER_START)),
/// its dependency counter is met ([`LOADER_DEPS`](trace::LOADER_DEPS)), its last page is issued
/// ([`LOADER_ISSUED`](trace::LOADER_ISSUED)); the consumers reach it ([`START`](trace::START)),
/// its first page is ready ([`FIRST`](trace::FIRST)), its last page is multiplied
/// ([`WORK_DONE`](trace::WORK_DONE)), its outputs are stored ([`STORED`](trace::STORED)) and
/// published ([`SIGNALED`](trace::SIGNALED)). An element-wise instruction (loss gradient, update)
/// has no loader stamps; its `FIRST` is when its dependency counters were met and `WORK_DONE`
/// when its work was done. The CUDA-core kernel writes `START`, `FIRST` (dependencies met),
/// `STORED` (work done) and `SIGNALED`. A wait that gives up writes no `FIRST`/`LOADER_DEPS`.
/// Consumer stamps are thread 0's view, taken when it issues the next instruction: `WORK_DONE`
/// once its warp has issued its last `mma` (a product's results land in the epilogue's first
/// stores), `STORED` once its warp has issued its stores (the other warps may still be storing;
/// the rendezvous before `SIGNALED` waits for them).
pub mod trace {
    /// Words per instruction: [`STAMPS`] global-timer stamps, then four cycle counts.
    pub const WORDS: u32 = 12;
    /// The global-timer stamps (nanoseconds) come first: words `0..STAMPS`.
    pub const STAMPS: u32 = 8;
    /// The loader reached the instruction.
    pub const LOADER_START: u32 = 0;
    /// The loader saw the instruction's dependency counter met.
    pub const LOADER_DEPS: u32 = 1;
    /// The loader issued the instruction's last page.
    pub const LOADER_ISSUED: u32 = 2;
    /// The consumers reached the instruction.
    pub const START: u32 = 3;
    /// The first page was ready (products), or the dependencies were met (element-wise).
    pub const FIRST: u32 = 4;
    /// The last page was multiplied, or the element-wise work was done.
    pub const WORK_DONE: u32 = 5;
    /// The outputs were stored.
    pub const STORED: u32 = 6;
    /// The signal counters were incremented.
    pub const SIGNALED: u32 = 7;
    /// Tensor-core products, SM clock cycles: consumer thread 0 waiting for pages after the first.
    /// The tensor-core kernel's loss gradient: cycles in its rendezvous between the row
    /// statistics and the gradients.
    pub const READY_WAIT_CLK: u32 = 8;
    /// Tensor-core products, cycles: consumer thread 0 from the first page ready to the last
    /// page's `mma` issued (about the span of [`FIRST`]..[`WORK_DONE`], on the SM clock). The tensor-core
    /// kernel's loss gradient: cycles of its whole body (statistics, rendezvous, gradients).
    pub const WORK_CLK: u32 = 9;
    /// Tensor-core products, cycles: the loader waiting for free pages.
    pub const FREE_WAIT_CLK: u32 = 10;
    /// Tensor-core products, cycles: the loader from the dependency met to the last page issued.
    pub const ISSUE_CLK: u32 = 11;
}

/// The tensor-core path's cross-entropy row statistics come in partials: the last layer's forward
/// epilogue writes, for each row and each group of `tile / 2` columns (one consumer warp's share of
/// a tile), the group's maximum `m` and `sum exp(x - m)`; the loss gradient combines a row's
/// partials instead of reading its whole row again. This is the number of partials of a row of
/// `dout` logits (the groups holding at least one live column).
pub const fn loss_partials(dout: u32, tile: u32) -> u32 {
    dout.div_ceil(tile / 2)
}

/// The words of [`MegaBuffers::row_stats`] for a step: a `(max, sum)` pair per row and partial,
/// pair `batch_row * partials + partial`.
pub const fn row_stats_words(batch: u32, dout: u32, tile: u32) -> u32 {
    2 * batch * loss_partials(dout, tile)
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
    /// Offset of `act_t[l]` / `grad_t[l]` (`dims[l]` rows of [`pitch`]`(batch)`) in `act_t` and
    /// `grad_t` (tensor-core path).
    pub t_off: crate::DevicePtr<u32>,
    /// Offset of `w_t[l]` (`dims[l]` rows of [`pitch`]`(dims[l + 1])`) in `w_t` (tensor-core path).
    pub wt_off: crate::DevicePtr<u32>,
    /// Weights.
    pub weights: crate::DevicePtrMut<f32>,
    /// Momentum buffers.
    pub velocity: crate::DevicePtrMut<f32>,
    /// Weight gradients.
    pub dw: crate::DevicePtrMut<f32>,
    /// Activations (`act[0]` is the input). On [`precision::BF16`] only the input and the outputs
    /// (the logits) are here: the hidden layers are kept in `act_bf16` alone.
    pub act: crate::DevicePtrMut<f32>,
    /// Activation gradients; unused on [`precision::BF16`], which keeps them in `grad_bf16` alone.
    pub grad: crate::DevicePtrMut<f32>,
    /// The tensor-core path's transposed activations, `act_t[l][feature][row]` (see [`map`]),
    /// stored as the products read them. The four operand copies (this one, `grad_t`, `w_op` and
    /// `w_t`) hold f32 values, or on [`precision::BF16`] bf16 ones (2-byte elements) at the same
    /// element indices.
    pub act_t: crate::DevicePtrMut<f32>,
    /// The tensor-core path's transposed activation gradients, laid out as `act_t`.
    pub grad_t: crate::DevicePtrMut<f32>,
    /// [`precision::TF32`] and [`precision::BF16`]: the weights rounded to the products' format,
    /// laid out as `weights` (what the forward multiplies); unused on the other paths.
    pub w_op: crate::DevicePtrMut<f32>,
    /// The tensor-core path's transposed weights, `w_t[l][input][output]`, as the products read
    /// them (rounded on [`precision::TF32`] and [`precision::BF16`]).
    pub w_t: crate::DevicePtrMut<f32>,
    /// [`precision::BF16`]: the activations the products read, as bf16 bits, laid out as `act`
    /// (the input and the hidden layers; the only copy of the hidden ones); unused on the other
    /// paths, whose products read `act` itself.
    pub act_bf16: crate::DevicePtrMut<u16>,
    /// [`precision::BF16`]: the activation gradients as bf16 bits, laid out as `grad` (their only
    /// copy).
    pub grad_bf16: crate::DevicePtrMut<u16>,
    /// MSE targets.
    pub y: crate::DevicePtr<f32>,
    /// Cross-entropy classes.
    pub classes: crate::DevicePtr<u32>,
    /// The tensor maps of the tensor-core path ([`map`]); unused by the CUDA-core kernel.
    pub maps: crate::DevicePtr<crate::tma::TensorMap>,
    /// The tensor-core path's cross-entropy row-statistic partials ([`loss_partials`],
    /// [`row_stats_words`] words); unused by the CUDA-core kernel.
    pub row_stats: crate::DevicePtrMut<f32>,
    /// Timestamps of a traced step ([`trace`]: [`trace::WORDS`] per instruction, in the order of
    /// `instructions`), or address 0 for an untraced step (the kernels then write no stamps and read
    /// no timer for them).
    pub trace: crate::DevicePtrMut<u64>,
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
    /// Output tile edge, one of [`SCHEDULE_TILES`] (the schedule's).
    pub tile: u32,
    /// The data path, a [`precision`] code.
    pub precision: u32,
    /// Fault injection for the hang-proof test: extra arrivals each free barrier expects beyond
    /// [`page_free_arrivals`] (0 in every real step; 1 strands the loader at the first reuse of a page).
    pub extra_free_arrivals: u32,
    /// Fault injection for the give-up tests: when nonzero, consumer warp `give_up_warp - 1` of
    /// block 0 of the tensor-core kernel gives up where [`give_up_at`](Self::give_up_at) says,
    /// as if its limit had passed, while the other warps go on (0 in every real step). (Block 0
    /// only, so that its record is the planted stall, not a consequence of another block's.)
    pub give_up_warp: u32,
    /// Where the planted warp gives up: a [`give_up`] code.
    pub give_up_at: u32,
}

/// Where `MegaConfig::give_up_warp` gives up (the give-up tests' planted faults).
pub mod give_up {
    /// Each page walk's first page, without waiting for it, while the rest of its group sees
    /// the page arrive.
    pub const PAGES: u32 = 0;
    /// Each rendezvous that publishes an instruction, after arriving (so the others pass it
    /// and go on to the next instruction).
    pub const PUBLISH: u32 = 1;
}
// SAFETY: repr(C), 4-byte fields only.
unsafe impl crate::KernelParam for MegaConfig {}

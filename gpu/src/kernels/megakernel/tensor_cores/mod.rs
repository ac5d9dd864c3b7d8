//! The training megakernel, version 2: the design's data path. Same instruction stream, counters
//! and stall records as version 1 ([`megakernel_step`](super::megakernel_step)); the products run on tensor cores from
//! shared-memory pages that a loader warp fills with TMA while the consumers compute.
//!
//! ```text
//!   global memory (activations, gradients, weights and their operand copies; tensor maps)
//!         |
//!         | TMA loads: a product's A and B pages, a loss tile's logits, a staged update's weights
//!         v
//!   loader warp, lane 0 (loader.rs)
//!         waits for the instruction's counters; per K block: waits for the slot's "free",
//!         announces the bytes on its "ready", issues the loads
//!         |
//!         v
//!   page ring: PAGE_STAGES slots in shared memory (smem.rs)  <---- "free[s]": pages read
//!         |  "ready[s]": bytes landed                                     |
//!         v                                                               |
//!   consumer warpgroups, warps 0-3 and 4-7 (consumer.rs) -----------------+
//!         products.rs: mma.sync or wgmma from the pages
//!         tile <= 64: the groups' halves exchanged through shared memory
//!         epilogues.rs, loss.rs: ReLU, ReLU', dW, fused SGD; loss tiles
//!         |                                         |
//!         | stores.rs: stores, fence, rendezvous,   | tile 128, staged tiles: bf16 into the
//!         | signal the counters                     | staging buffer, "staged"
//!         v                                         v
//!   global memory                             storer warp, lane 0 (storer.rs): TMA stores,
//!                                             "stage free", signal the counters
//! ```
//!
//! - Block: [`CONSUMER_WARPS`] consumer warps (threads `0..256`, two warpgroups) and one loader
//!   warp (its lane 0 works, the others leave at once). Both walk the block's instruction list in
//!   order. (Nine warps put three on one scheduler, so ptxas budgets 168 registers a thread: as
//!   many as a loader warpgroup handing its registers over with `setmaxnreg` would leave.) The
//!   tile-128 kernel has a tenth warp, the storer (see *Staged tiles* below).
//! - Pages: a ring of [`PAGE_STAGES`] stages in dynamic shared memory, each an A page and a B page
//!   of `tile` rows of 128 bytes ([`PAGE_K`] f32, or [`PAGE_K_BF16`](crate::megakernel::PAGE_K_BF16) bf16 on the bf16 path;
//!   128-byte swizzled), with a *ready* barrier (count
//!   [`PAGE_READY_ARRIVALS`]: the loader's `arrive.expect_tx`, completed by the bytes) and a *free*
//!   barrier (count [`page_free_arrivals`]: one arrival per warp of the page's group). Use `u` of the ring (the
//!   block's page uses counted in order over all its products) is slot [`page_slot`]`(u)`; consumers
//!   wait for [`ready_parity`]`(u)`, the loader (from the second lap) for [`free_parity`]`(u)`.
//! - Loader, per product instruction: waits for the instruction's dependency counter (acquire),
//!   fences the generic and async proxies, then for each K block of a page ([`page_k`](crate::megakernel::page_k)): waits until the
//!   slot is free, announces [`stage_tx_bytes`] and issues the two TMA loads (A rows `m0..`, B rows
//!   `n0..`, one box each: every operand is K-major, see [`map`]). It runs up to the whole ring
//!   ahead, across instruction boundaries: the next tile's loads overlap this tile's math.
//! - Consumers, per product: two groups of [`GROUP_WARPS`] warps ([`PAGE_GROUPS`]); group `g`
//!   multiplies the pages `kt` with [`page_group`]`(kt) == g`, so two warps share each scheduler and
//!   hide each other's latencies. Warp `q` of a group owns the `tile/2` square at `(q / 2, q % 2)`
//!   of the output tile, as `tile/32 x tile/16` `mma.m16n8k8` tf32 tiles; it reads a page's
//!   fragments with `ldmatrix`, two k steps at a time, from the swizzled page, frees the page
//!   after the last reads (lane 0; the loader refills it during the last steps' math), and
//!   multiplies ([`precision::TF32`]: one product, nothing converted in the loop, because every
//!   operand is stored already rounded to tf32 (`rounded_operand`: activations, gradients and
//!   the weights' copies by the epilogues and updates that write them, the batch by the host);
//!   [`precision::TF32X3`]: the inputs split into tf32 head and tail, three products, tail terms
//!   first). Every operand is K-major ([`map`]), so one page loop serves all three products.
//!   [`precision::TF32`] at tile 64 multiplies on the asynchronous path instead (`tile_wgmma`):
//!   each group is a warpgroup (warps `0..4`, `4..8`) that issues four `wgmma` m64n64k8 tf32 per
//!   page straight from the swizzled page through descriptors, no fragments in registers; warp
//!   `w` of a group then holds rows `16 w .. 16 w + 16` of the tile, every column.
//!   [`precision::BF16`] at tile 64
//!   takes the same path with pages of bf16, 64 deep in K in the same 128-byte rows, and four
//!   `wgmma` m64n64k16 per page; every operand it reads is stored as bf16 (`store_op`: the
//!   transposed copies and the weights' copies in bf16, and the hidden activations and the
//!   gradients in `act_bf16` and `grad_bf16` only).
//!   [`precision::BF16`] at tile 128 (`tile_wgmma_rows`, `layout` `ROWS`) splits the rows
//!   instead: each warpgroup multiplies every K block (a 128-row A page and a 128-row B page, a
//!   ring slot each) into its own 64 rows with four `wgmma` m64n128k16, so no sums are
//!   exchanged; and it keeps no transposed copies, reading `grad`, `act` and `w_op` in place,
//!   MN-major, with the products' transpose flags ([`reads_in_place`](crate::megakernel::reads_in_place),
//!   [`mn_page_descriptor`]).
//!   Up to tile 64 each group then finishes half of every warp square (its `Half`): it leaves the other half's
//!   sums in shared memory (two buffers, alternating per product), the consumers meet, and each
//!   group adds the other's sums to its half and runs the epilogue on it (ReLU, the ReLU
//!   derivative, the fused update) straight from the accumulators, so all eight warps store.
//!   Beside each activation or gradient it stores the transposed copy (`act_t`, `grad_t`), and
//!   beside each new weight its copies (`w_t`, and `w_op` on the tf32 and bf16 paths), that later
//!   products read K-major (on bf16 the copies `act_bf16`, `grad_bf16` instead of `act`, `grad`;
//!   at tile 128 no transposed copies). The
//!   global values an epilogue reads (the ReLU mask, the old weights) are loaded while the pages
//!   stream in (`Prefetched`). Loss gradients and SGD updates run on all 256 consumer threads
//!   after consumer thread 0 has waited for their counters. At tile 128 the loader also stages
//!   each loss tile's logits in the ring as f32 boxes
//!   ([`box_slot_uses`](crate::megakernel::box_slot_uses)), after acquiring the tile's counter
//!   itself, so the consumers wait for the boxes alone; they read and free them as pages.
//! - Publishing: every consumer thread fences its stores for the async proxy (another block's TMA
//!   reads them next), the consumers meet at a rendezvous barrier, and consumer thread 0 signals.
//! - Staged tiles ([`stores_through_tma`]: bf16 at tile 128; the instructions of
//!   [`staged`](crate::megakernel::staged), the hidden forwards and the input gradients): the
//!   consumers do not store or publish. Each thread writes its bf16 outputs into a staging buffer
//!   (the sums buffers, unused at that tile) laid out as two 128-byte-swizzled boxes of 64 columns
//!   ([`staged_offset`]), fences them for the async proxy and arrives on a *staged* barrier; the
//!   consumers then go straight on to the next instruction's pages. The storer warp's lane 0
//!   stores the two boxes with TMA through the maps the later products read them with, frees the
//!   buffer once the stores have read it (*stage free*), and once they are written signals the
//!   instruction's counters. An input gradient's ReLU mask (`act[l]` at the output tile) is put
//!   in the staging buffer by the storer's TMA once it has read the last staged tile out of it
//!   (*mask ready*); each consumer thread reads its mask where it then writes its gradient.
//!   Before writing the buffer, consumers wait for *stage free* of the tile before (every staged
//!   tile but the first) and, on an input gradient, *mask ready*, so no phase of the three
//!   barriers can run a lap ahead of a waiter, nor a waiter two phases ahead of a barrier, and
//!   every phase of *stage free* is waited for (as compute-sanitizer's synccheck requires; see
//!   `store_tiles`).
//!   A fused update is staged too: halfway through its pages the loader loads the tile's old
//!   f32 weights into a weight buffer of their own ([`weight_buffer_offset`], through
//!   [`map::WEIGHTS`], *weights ready*), once the storer has
//!   stored the last staged update's out of it (*weights free*); the consumers read them there,
//!   write the new weights back in place and their bf16 copy into the staging buffer, and the
//!   storer stores both (`weights` and the next `w_op`), so no consumer loads or stores them.
//! - Hang-proof: every wait is bounded (the step's `wait_limit_ns`) and also gives up when another
//!   block has raised the abort flag. The consumers meet on an mbarrier (all 256 arrive) rather than `bar.sync`,
//!   so a warp that gave up can never strand the others. A stall writes the waiter's record (the
//!   loader's, the consumers' and the storer's are separate, each the first stall's): instruction, page slot and
//!   barrier kind, parity. A consumer warp that gave up abandons the step but does not leave: it
//!   walks the rest of its list running only the products' page walks, which drain, so that the
//!   rest of its warpgroup never waits for it in a `wgmma` (see `group_pages` and `consume`).
//! - Traced steps ([`MegaBuffers::trace`] set): the loader and consumer thread 0 stamp each
//!   instruction with the global timer at the points [`trace`](crate::megakernel::trace) names.
//!
//! The device code is one module, `dev`, whose files are split by role and included textually
//! (`include!`): `smem.rs` (the device's view of the shared-memory map laid out below), `waits.rs`
//! (bounded waits, the consumers' rendezvous, stall records), `loader.rs` (the loader warp),
//! `products.rs` (page walks and tile products), `stores.rs` (outputs stored as the operands later
//! products read), `epilogues.rs` (what the consumers do with a product's sums), `loss.rs` (loss
//! tiles), `storer.rs` (the storer warp), `consumer.rs` (the consumers' instruction loop) and
//! `block.rs` (one block's start, every kernel's body). Included, not submodules: rustc hands
//! LLVM the crate's functions (one codegen unit) sorted by symbol name, LLVM's inlining follows
//! that order, and with the functions renamed into submodules the tile-64 `wgmma` kernels' PTX
//! changed (register numbering). The
//! counters between blocks and the SGD update are version 1's (`../cuda_cores.rs`). Speed against
//! PyTorch is in `benches/results/mlp_step.md`.

use crate::kernel;
use crate::megakernel::{
    BF16_TILES, CONSUMER_WARPS, GROUP_WARPS, MN_BOX, MegaBuffers, MegaConfig, PAGE_GROUPS, PAGE_STAGES, STAGE_BYTES,
    TC_TILES, page_bytes, precision, stores_through_tma, weight_buffer_bytes,
};
// (named by the docs above)
use crate::megakernel::{
    PAGE_K, PAGE_READY_ARRIVALS, free_parity, map, page_free_arrivals, page_group, page_slot, ready_parity,
    stage_tx_bytes,
};

/// Warps of the loader: one, whose lane 0 issues every load (the other lanes leave at once).
const LOADER_WARPS: u32 = 1;
/// Threads per block: the consumer warps and the loader warp. (ptxas budgets 168 registers a
/// thread for it: each scheduler's quarter of the register file, 16 384, shared by up to three of
/// the nine warps.)
pub const TC_THREADS: u32 = 32 * (CONSUMER_WARPS + LOADER_WARPS);
/// Threads per block of a kernel that [`stores_through_tma`]: one storer warp more, whose lane 0
/// writes the staged tiles (the other lanes leave at once). (Ten warps still put at most three on
/// a scheduler: the same register budget.)
pub const TC_THREADS_STORER: u32 = TC_THREADS + 32;
/// The block of the tensor-core kernel for data path `precision` at `tile`.
pub const fn tc_threads(precision: u32, tile: u32) -> u32 {
    if stores_through_tma(precision, tile) { TC_THREADS_STORER } else { TC_THREADS }
}
/// Largest tile whose page groups split the pages (and hand each other sums); also the edge of
/// the loss tile's quarters at tile 128 (see `LossTile`).
const MAX_TILE: u32 = TC_TILES[TC_TILES.len() - 1];
/// Largest tile.
const BIGGEST_TILE: u32 = BF16_TILES[BF16_TILES.len() - 1];
/// After the stages, two buffers (used by alternate products) for the sums the page groups hand
/// each other: in each, a region per group holding the other group's half of a tile-64 product
/// (one f32 per output).
const SUMS: u32 = STAGE_BYTES * PAGE_STAGES;
const SUMS_BYTES: u32 = 4 * MAX_TILE * MAX_TILE;
/// Barriers: ready and free per stage, the consumers' rendezvous, one never arrived on (see
/// `Smem::drained`), then the staged tiles' five (see [`stores_through_tma`]): staged
/// (consumers to storer), stage free (storer to consumers), mask ready (the storer's TMA of a
/// ReLU mask), weights ready (the loader's TMA of a staged update's old weights), weights free
/// (storer to loader).
const BARRIERS: u32 = SUMS + 2 * SUMS_BYTES;
const BARRIER_COUNT: u32 = 2 * PAGE_STAGES + 7;
/// The loss gradient's row statistics (`2 * BIGGEST_TILE` f32), then the "go" word.
const STATS: u32 = BARRIERS + 8 * BARRIER_COUNT;
const GO: u32 = STATS + 8 * BIGGEST_TILE;
/// The layer table: `dims`, `w_off`, `a_off`, `t_off`, `wt_off` ([`TABLE_COLUMNS`] columns of
/// `layers + 1` words), copied from global memory once per launch.
const LAYER_TABLE: u32 = GO + 16;
/// Columns of the layer table.
pub const TABLE_COLUMNS: u32 = 5;
/// The descriptor of k step `kk` (16 bf16) of one operand page read MN-major
/// ([`reads_in_place`](crate::megakernel::reads_in_place)), at shared address `page`: the page is
/// `tile / MN_BOX` boxes of [`PAGE_K_BF16`](crate::megakernel::PAGE_K_BF16) K rows by 64 M (or N)
/// columns, each row 128 bytes, 128-byte swizzled, the boxes one after another. In the terms of
/// the descriptor's MN-major form: 64-column chunks of M or N are a box apart (the leading byte
/// offset, 8 KiB), 8-row groups of K 1024 bytes apart (the stride byte offset), and a k step of 16
/// rows starts 2048 bytes on.
pub const fn mn_page_descriptor(page: u32, kk: u32) -> u64 {
    use crate::megakernel::{MN_BOX, PAGE_K_BF16};
    let row = 2 * MN_BOX;
    crate::wgmma::smem_descriptor(page + kk * 16 * row, PAGE_K_BF16 * row, 8 * row, 0, crate::swizzle::Swizzle::B128)
}

/// Bytes of one box of a staged tile ([`stores_through_tma`]): `BIGGEST_TILE` rows of 128 bytes
/// ([`MN_BOX`] bf16), 128-byte swizzled, as the `ACT` and `GRAD` maps' boxes at tile 128.
pub const STAGE_BOX_BYTES: u32 = BIGGEST_TILE * 2 * MN_BOX;
/// Bytes of one box of the weight buffer ([`map::WEIGHTS`]):
/// `BIGGEST_TILE` rows of [`F32_BOX_COLS`](crate::megakernel::F32_BOX_COLS) f32 (128 bytes),
/// 128-byte swizzled.
pub const F32_BOX_BYTES: u32 = BIGGEST_TILE * 4 * crate::megakernel::F32_BOX_COLS;
/// Byte offset of element (row `r`, column `c`) of a row of f32 boxes (the logits staged in the
/// ring, the weight buffer) inside its box, box `c / F32_BOX_COLS`: row `r` is 128 bytes at
/// `128 r` whose 16-byte chunks are XORed with `r % 8` (TMA's 128-byte swizzle).
pub const fn f32_box_offset(r: u32, c: u32) -> u32 {
    use crate::megakernel::F32_BOX_COLS;
    crate::swizzle::Swizzle::B128.apply(r * 4 * F32_BOX_COLS + 4 * (c % F32_BOX_COLS))
}
/// Byte offset of element (row `r`, column `c`) of a staged tile (a `BIGGEST_TILE`-square of
/// bf16) in the staging buffer: box `c / MN_BOX`, in which row `r` is 128 bytes at `128 r` whose
/// 16-byte chunks are XORed with `r % 8` (TMA's 128-byte swizzle; the buffer is 1024-byte
/// aligned). A warp's pair stores of one accumulator register pair (8 rows, 4 lanes of 4 bytes
/// each) then hit 32 different banks.
pub const fn staged_offset(r: u32, c: u32) -> u32 {
    (c / MN_BOX) * STAGE_BOX_BYTES + crate::swizzle::Swizzle::B128.apply(r * 2 * MN_BOX + 2 * (c % MN_BOX))
}

/// Byte offset of the weight buffer ([`weight_buffer_bytes`]) of a kernel that
/// [`stores_through_tma`], for a model of `layers` layers: after the layer table, 1024-byte
/// aligned (for TMA's 128-byte swizzle).
pub const fn weight_buffer_offset(layers: u32) -> u32 {
    (LAYER_TABLE + 4 * TABLE_COLUMNS * (layers + 1)).div_ceil(1024) * 1024
}

/// Dynamic shared memory of one block of the kernel for data path `precision` at `tile`, for a
/// model of `layers` layers: the layer table's end, or, where the kernel [`stores_through_tma`],
/// the weight buffer's.
pub const fn tc_smem_bytes(layers: u32, precision: u32, tile: u32) -> u32 {
    if stores_through_tma(precision, tile) {
        weight_buffer_offset(layers) + weight_buffer_bytes(tile)
    } else {
        LAYER_TABLE + 4 * TABLE_COLUMNS * (layers + 1)
    }
}

/// How a kernel's consumer warps hold a product's outputs (the `L` parameter of its
/// functions): which rows and columns a warp's accumulators are, and how the two page groups
/// share the product. (Read by device code only.)
#[cfg_attr(not(all(target_arch = "nvptx64", target_feature = "sm_90a")), allow(dead_code))]
mod layout {
    /// `mma.sync` (`tile_mma`): the groups split the pages; warp `q` of a
    /// group holds the `tile / 2` square at `(q / 2, q % 2)` of the tile.
    pub const SQUARES: u32 = 0;
    /// `wgmma` at tile 64 (`tile_wgmma`): the groups split the pages; warp
    /// `w` of a group holds rows `16 w .. 16 w + 16`, every column.
    pub const WIDE: u32 = 1;
    /// `wgmma` at tile 128 (`tile_wgmma_rows`): the groups split the
    /// rows (each multiplies every page); warp `w` of group `g` holds rows `64 g + 16 w ..
    /// 64 g + 16 w + 16`, every column.
    pub const ROWS: u32 = 2;
}

#[cfg(all(target_arch = "nvptx64", target_feature = "sm_90a"))]
mod dev {
    use super::{
        BARRIERS, BIGGEST_TILE, F32_BOX_BYTES, GO, LAYER_TABLE, MAX_TILE, STAGE_BOX_BYTES, STATS, SUMS, SUMS_BYTES,
        TABLE_COLUMNS, f32_box_offset, layout, staged_offset,
    };

    /// Consumer threads.
    const CONSUMERS: u32 = 32 * CONSUMER_WARPS;
    use crate::kernels::gemm_wgmma::tile_descriptor;
    use crate::kernels::megakernel_step::{aborted, record, record_stall, sgd_update, signal, stamp, wait};
    use crate::megakernel::{
        CONSUMER_WARPS, F32_BOX_COLS, GROUP_WARPS, Instruction, MASK_READY, MN_BOX, MegaBuffers, MegaConfig,
        NO_COUNTER, PAGE_FREE, PAGE_GROUPS, PAGE_K, PAGE_K_BF16, PAGE_READY, PAGE_READY_ARRIVALS, PAGE_STAGES,
        PAGE_TAG, RENDEZVOUS, STAGE_BYTES, STAGE_FREE, STAGED, TC_TILES, WEIGHTS_FREE, WEIGHTS_READY, box_slot_uses,
        free_parity, give_up, groups_split_rows, loss, loss_partials, map, opcode, page_bytes, page_free_arrivals,
        page_group, page_k, page_parity, page_slot, pitch, precision, reads_in_place, ready_parity,
        slot_uses_per_block, stage_tx_bytes, staged, stores_through_tma, trace, weight_buffer_bytes,
    };
    use crate::{convert, fence, math, matrix, mbarrier, mma, shared, thread, tma, warp, wgmma};

    // The device code, one file per role, included so that every function keeps its symbol
    // `megakernel_tc::dev::...` (see the module docs).
    include!("smem.rs");
    include!("waits.rs");
    include!("loader.rs");
    include!("products.rs");
    include!("stores.rs");
    include!("epilogues.rs");
    include!("loss.rs");
    include!("storer.rs");
    include!("consumer.rs");
    include!("block.rs");
}

// One training step on the tensor-core data path (see the module docs), one kernel per tile and
// precision: each holds only its own consumers' code (one kernel for all, picked by a `match` on
// `cfg`, is slower: about three times the SASS instructions). Grid: one block per SM; block
// [`TC_THREADS`] (the launch bound; ptxas budgets 168 registers each, three of the nine warps
// sharing a scheduler); dynamic shared memory [`tc_smem_bytes`]`(cfg.layers)`. Each traps if
// `cfg.tile` is not its tile; `cfg.precision` must be its precision (the host's `GpuStep` picks
// the kernel from the schedule's tile and the data path).

/// [`precision::TF32`] at tile 32: `mma.sync` m16n8k8, `MT x NT = 1 x 2` tiles a warp.
#[kernel(arch = "sm_90a", max_threads = 288)]
pub unsafe fn megakernel_step_tf32_t32(b: MegaBuffers, cfg: MegaConfig) {
    unsafe { dev::run::<1, 2, 1, { precision::TF32 }, { layout::SQUARES }>(&b, &cfg) }
}

/// [`precision::TF32X3`] at tile 32: `mma.sync` m16n8k8, three products a k step.
#[kernel(arch = "sm_90a", max_threads = 288)]
pub unsafe fn megakernel_step_tf32x3_t32(b: MegaBuffers, cfg: MegaConfig) {
    unsafe { dev::run::<1, 2, 1, { precision::TF32X3 }, { layout::SQUARES }>(&b, &cfg) }
}

/// [`precision::TF32`] at tile 64: each page group a warpgroup multiplying whole pages with
/// `wgmma` m64n64k8 (`tile_wgmma`).
#[kernel(arch = "sm_90a", max_threads = 288)]
pub unsafe fn megakernel_step_tf32_t64(b: MegaBuffers, cfg: MegaConfig) {
    unsafe { dev::run::<1, 8, 2, { precision::TF32 }, { layout::WIDE }>(&b, &cfg) }
}

/// [`precision::TF32X3`] at tile 64: `mma.sync` m16n8k8, `MT x NT = 2 x 4` tiles a warp.
#[kernel(arch = "sm_90a", max_threads = 288)]
pub unsafe fn megakernel_step_tf32x3_t64(b: MegaBuffers, cfg: MegaConfig) {
    unsafe { dev::run::<2, 4, 2, { precision::TF32X3 }, { layout::SQUARES }>(&b, &cfg) }
}

/// [`precision::BF16`] at tile 64: as `megakernel_step_tf32_t64`, with bf16 pages (64 deep in K)
/// multiplied by `wgmma` m64n64k16.
#[kernel(arch = "sm_90a", max_threads = 288)]
pub unsafe fn megakernel_step_bf16_t64(b: MegaBuffers, cfg: MegaConfig) {
    unsafe { dev::run::<1, 8, 2, { precision::BF16 }, { layout::WIDE }>(&b, &cfg) }
}

/// [`precision::BF16`] at tile 128: the page groups split the rows, each a warpgroup multiplying
/// every K block (two ring slots: a 128-row A page and a 128-row B page) into its 64 rows with
/// `wgmma` m64n128k16 (`tile_wgmma_rows`).
#[kernel(arch = "sm_90a", max_threads = 320)]
pub unsafe fn megakernel_step_bf16_t128(b: MegaBuffers, cfg: MegaConfig) {
    unsafe { dev::run::<2, 8, 4, { precision::BF16 }, { layout::ROWS }>(&b, &cfg) }
}

// The launch bound above is the block.
const _: () = assert!(TC_THREADS == 288 && TC_THREADS_STORER == 320 && (CONSUMER_WARPS * 32).is_multiple_of(128));
// The sums go through exactly two groups (one writes, one adds).
const _: () = assert!(PAGE_GROUPS == 2 && GROUP_WARPS == 4);
// The page layout must hold the largest tile's two pages.
const _: () = assert!(2 * page_bytes(MAX_TILE) <= STAGE_BYTES);
// A loss tile's staged gradients fit in one sums buffer.
const _: () = assert!(4 * MAX_TILE * MAX_TILE <= SUMS_BYTES);
// A staged tile (two boxes) fits in the two sums buffers, which start 1024-byte aligned (the
// swizzle's atoms).
const _: () = assert!(2 * STAGE_BOX_BYTES <= 2 * SUMS_BYTES && SUMS.is_multiple_of(1024));

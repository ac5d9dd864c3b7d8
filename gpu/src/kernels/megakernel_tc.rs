//! The training megakernel, version 2: the design's data path. Same instruction stream, counters
//! and stall records as [`megakernel_step`](super::megakernel_step); the products run on tensor
//! cores from shared-memory pages that a loader warp fills with TMA while the consumers compute.
//!
//! - Block: [`CONSUMER_WARPS`] consumer warps (threads `0..256`, two warpgroups) and one loader
//!   warp (its lane 0 works, the others leave at once). Both walk the block's instruction list in
//!   order. (Nine warps put three on one scheduler, so ptxas budgets 168 registers a thread: the
//!   same as with a loader warpgroup handing its registers over with `setmaxnreg`, which this
//!   kernel used until run 98 and which bought nothing as compiled.) The tile-128 kernel has a
//!   tenth warp, the storer (see *Staged tiles* below).
//! - Pages: a ring of [`PAGE_STAGES`] stages in dynamic shared memory, each an A page and a B page
//!   of `tile` rows of 128 bytes ([`PAGE_K`] f32, or [`PAGE_K_BF16`](crate::megakernel::PAGE_K_BF16) bf16 on the bf16 path;
//!   128-byte swizzled), with a *ready* barrier (count
//!   [`PAGE_READY_ARRIVALS`]: the loader's `arrive.expect_tx`, completed by the bytes) and a *free*
//!   barrier (count [`PAGE_FREE_ARRIVALS`]: one arrival per warp of the page's group). Use `u` of the ring (the
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
//!   `w` of a group then holds rows `16 w .. 16 w + 16` of the tile, every column. (Medium model
//!   0.151 -> 0.130 ms, large 2.34 -> 1.94 ms, H200 run 124; with the give-up path that keeps
//!   it hang-proof, 0.138 and 2.04 ms in run 130's form, 0.130-0.132 and 1.95 ms in run 133's:
//!   see `group_pages`.) [`precision::BF16`] at tile 64 takes the same path with pages of
//!   bf16, 64 deep in K in the same 128-byte rows, and four `wgmma` m64n64k16 per page; every
//!   operand it reads is stored as bf16 (`store_op`: the transposed copies and the weights'
//!   copies in bf16, and the hidden activations and the gradients in `act_bf16` and `grad_bf16`
//!   only). Medium 0.127 -> 0.100 ms, large 1.92 -> 1.35 ms (H200 run 139).
//!   [`precision::BF16`] at tile 128 (`tile_wgmma_rows`, [`layout`] `ROWS`) splits the rows
//!   instead: each warpgroup multiplies every K block (a 128-row A page and a 128-row B page, a
//!   ring slot each) into its own 64 rows with four `wgmma` m64n128k16, so no sums are
//!   exchanged; and it keeps no transposed copies, reading `grad`, `act` and `w_op` in place,
//!   MN-major, with the products' transpose flags ([`reads_in_place`](crate::megakernel::reads_in_place),
//!   [`mn_page_descriptor`]). Large 1.35 -> 0.92 ms (H200 runs 140, 154).
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
//!   every phase of *stage free* is waited for (synccheck, run 160). Large model 0.93 -> 0.66
//!   ms (H100 runs 156-158, with the loader loading the masks; see `store_tiles`).
//!   A fused update is staged too: halfway through its pages the loader loads the tile's old
//!   f32 weights into a weight buffer of their own ([`weight_buffer_offset`], through
//!   [`map::WEIGHTS`](crate::megakernel::map::WEIGHTS), *weights ready*), once the storer has
//!   stored the last staged update's out of it (*weights free*); the consumers read them there,
//!   write the new weights back in place and their bf16 copy into the staging buffer, and the
//!   storer stores both (`weights` and the next `w_op`). (Loading and storing the weights from
//!   the consumers cost a fused update 7 to 9 us of its 40, H200 run 190.)
//! - Hang-proof: every wait is bounded (the step's `wait_limit_ns`) and also gives up when another
//!   block has raised the abort flag. The consumers meet on an mbarrier (all 256 arrive) rather than `bar.sync`,
//!   so a warp that gave up can never strand the others. A stall writes the waiter's record (the
//!   loader's, the consumers' and the storer's are separate, each the first stall's): instruction, page slot and
//!   barrier kind, parity. A consumer warp that gave up abandons the step but does not leave: it
//!   walks the rest of its list running only the products' page walks, which drain, so that the
//!   rest of its warpgroup never waits for it in a `wgmma` (see `group_pages` and `consume`).
//! - Traced steps ([`MegaBuffers::trace`] set): the loader and consumer thread 0 stamp each
//!   instruction with the global timer at the points [`trace`](crate::megakernel::trace) names.

use crate::kernel;
use crate::megakernel::{
    BF16_TILES, CONSUMER_WARPS, GROUP_WARPS, MN_BOX, MegaBuffers, MegaConfig, PAGE_GROUPS, PAGE_STAGES, STAGE_BYTES,
    TC_TILES, page_bytes, precision, stores_through_tma, weight_buffer_bytes,
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

/// Bytes of one box of a staged tile ([`stores_through_tma`]): [`BIGGEST_TILE`] rows of 128 bytes
/// ([`MN_BOX`] bf16), 128-byte swizzled, as the `ACT` and `GRAD` maps' boxes at tile 128.
pub const STAGE_BOX_BYTES: u32 = BIGGEST_TILE * 2 * MN_BOX;
/// Bytes of one box of the weight buffer ([`map::WEIGHTS`](crate::megakernel::map::WEIGHTS)):
/// [`BIGGEST_TILE`] rows of [`F32_BOX_COLS`](crate::megakernel::F32_BOX_COLS) f32 (128 bytes),
/// 128-byte swizzled.
pub const F32_BOX_BYTES: u32 = BIGGEST_TILE * 4 * crate::megakernel::F32_BOX_COLS;
/// Byte offset of element (row `r`, column `c`) of a row of f32 boxes (the logits staged in the
/// ring, the weight buffer) inside its box, box `c / F32_BOX_COLS`: row `r` is 128 bytes at
/// `128 r` whose 16-byte chunks are XORed with `r % 8` (TMA's 128-byte swizzle).
pub const fn f32_box_offset(r: u32, c: u32) -> u32 {
    use crate::megakernel::F32_BOX_COLS;
    crate::swizzle::Swizzle::B128.apply(r * 4 * F32_BOX_COLS + 4 * (c % F32_BOX_COLS))
}
/// Byte offset of element (row `r`, column `c`) of a staged tile (a [`BIGGEST_TILE`]-square of
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

    /// `mma` k steps (of 8) per page.
    const KSTEPS: usize = (PAGE_K / 8) as usize;
    // the page loop takes k steps in pairs
    const _: () = assert!(KSTEPS >= 2 && KSTEPS.is_multiple_of(2));

    /// Roles of the stall records ([`role`](crate::megakernel::role)).
    const LOADER: u32 = crate::megakernel::role::LOADER;
    const CONSUMER: u32 = crate::megakernel::role::CONSUMERS;
    const STORER: u32 = crate::megakernel::role::STORER;

    /// The block's dynamic shared memory (see the constants above for its layout).
    #[derive(Clone, Copy)]
    struct Smem {
        base: shared::SharedAddr,
        /// The weight buffer ([`weight_buffer_offset`](super::weight_buffer_offset) from `base`).
        weights: shared::SharedAddr,
    }

    impl Smem {
        fn a_page(self, slot: u32) -> u32 {
            self.base + slot * STAGE_BYTES
        }
        fn b_page(self, slot: u32) -> u32 {
            self.a_page(slot) + STAGE_BYTES / 2
        }
        /// The A page of the K block whose first ring use is `u`: the first half of its slot, or,
        /// with `per` ([`slot_uses_per_block`]) 2, the whole slot.
        fn a_page_at(self, u: u32) -> u32 {
            self.a_page(page_slot(u))
        }
        /// The B page of that K block: the second half of the slot, or (`per` 2) the next use's slot.
        fn b_page_at(self, u: u32, per: u32) -> u32 {
            if per == 1 { self.b_page(page_slot(u)) } else { self.a_page(page_slot(u + 1)) }
        }
        fn ready(self, slot: u32) -> u32 {
            self.base + BARRIERS + 8 * slot
        }
        fn free(self, slot: u32) -> u32 {
            self.base + BARRIERS + 8 * (PAGE_STAGES + slot)
        }
        fn rendezvous(self) -> u32 {
            self.base + BARRIERS + 8 * (2 * PAGE_STAGES)
        }
        /// A barrier nobody arrives on: its phase 0 never completes, so a wait for parity 1 (the
        /// phase before it) returns at once. A warp that gave up a page walk waits on it instead
        /// of on pages (see [`group_pages`]).
        fn drained(self) -> u32 {
            self.base + BARRIERS + 8 * (2 * PAGE_STAGES + 1)
        }
        /// Staged tiles ([`stores_through_tma`]): the consumers' hand-off to the storer (every
        /// consumer thread arrives once per staged tile).
        fn staged(self) -> u32 {
            self.base + BARRIERS + 8 * (2 * PAGE_STAGES + 2)
        }
        /// The storer's release of the staging buffer once its stores have read it (one arrival
        /// per staged tile).
        fn stage_free(self) -> u32 {
            self.base + BARRIERS + 8 * (2 * PAGE_STAGES + 3)
        }
        /// An input gradient's ReLU mask in the staging buffer: the storer's `arrive.expect_tx`,
        /// completed by the bytes.
        fn mask_ready(self) -> u32 {
            self.base + BARRIERS + 8 * (2 * PAGE_STAGES + 4)
        }
        /// A staged fused update's old weights in the weight buffer: the loader's
        /// `arrive.expect_tx`, completed by the bytes.
        fn weights_ready(self) -> u32 {
            self.base + BARRIERS + 8 * (2 * PAGE_STAGES + 5)
        }
        /// The storer's release of the weight buffer once its stores of the new weights have read
        /// it (one arrival per staged update).
        fn weights_free(self) -> u32 {
            self.base + BARRIERS + 8 * (2 * PAGE_STAGES + 6)
        }
        /// The staging buffer: a staged tile's two boxes ([`staged_offset`]), over the two sums
        /// buffers (which the tile-128 kernel, whose groups split rows, does not use for sums).
        fn staging(self) -> u32 {
            self.base + SUMS
        }
        /// The sums the page groups hand each other for the `n`-th product of the block (buffer
        /// `n % 2`, a region per group).
        fn sums(self, n: u32) -> u32 {
            self.base + SUMS + (n % 2) * SUMS_BYTES
        }
    }

    /// The step's per-layer sizes and offsets (`MegaBuffers::dims`, `w_off`, `a_off`, `t_off`,
    /// `wt_off`), read from
    /// this block's shared-memory copy. The global arrays sit behind an L1 that every acquire and
    /// GPU-scope fence of the step invalidates, so each read there was an L2 round trip on the
    /// path from one instruction to the next.
    #[derive(Clone, Copy)]
    struct Layers {
        table: *const u32,
        layers: u32,
    }

    impl Layers {
        fn new(cfg: &MegaConfig) -> Layers {
            Layers { table: shared::dynamic_smem::<u32>(LAYER_TABLE as usize), layers: cfg.layers }
        }
        /// Copies the table from global memory: all block threads call it, then meet at a barrier.
        unsafe fn fill(self, b: &MegaBuffers) {
            let n = self.layers + 1;
            let mut j = thread::thread_idx_x();
            while j < n {
                unsafe {
                    let t = self.table as *mut u32;
                    let weighted = j < self.layers;
                    *t.add(j as usize) = b.dims.read(j as usize);
                    *t.add((n + j) as usize) = if weighted { b.w_off.read(j as usize) } else { 0 };
                    *t.add((2 * n + j) as usize) = b.a_off.read(j as usize);
                    *t.add((3 * n + j) as usize) = b.t_off.read(j as usize);
                    *t.add((4 * n + j) as usize) = if weighted { b.wt_off.read(j as usize) } else { 0 };
                }
                j += thread::block_dim_x();
            }
        }
        fn dim(self, l: u32) -> u32 {
            unsafe { *self.table.add(l as usize) }
        }
        fn w_off(self, l: u32) -> u32 {
            unsafe { *self.table.add((self.layers + 1 + l) as usize) }
        }
        fn a_off(self, l: u32) -> u32 {
            unsafe { *self.table.add((2 * (self.layers + 1) + l) as usize) }
        }
        fn t_off(self, l: u32) -> u32 {
            unsafe { *self.table.add((3 * (self.layers + 1) + l) as usize) }
        }
        fn wt_off(self, l: u32) -> u32 {
            unsafe { *self.table.add(((TABLE_COLUMNS - 1) * (self.layers + 1) + l) as usize) }
        }
    }

    /// The product an instruction computes, `C[m][n] = sum_k A(m, k) B(n, k)` over `k < k`, each
    /// operand one of the step's tensor maps ([`map`]), in `pages` K blocks of `page_k`
    /// ([`page_k`]: 32 f32 or 64 bf16 columns). Every operand is K-major but where `a_mn` /
    /// `b_mn` say it is read in place, MN-major ([`reads_in_place`]).
    #[derive(Clone, Copy)]
    struct Product {
        a_map: u32,
        b_map: u32,
        m0: u32,
        n0: u32,
        pages: u32,
        page_k: u32,
        a_mn: bool,
        b_mn: bool,
    }

    /// The product of a `LINEAR_*` instruction (see the table in [`crate::megakernel`]), or `None`.
    #[inline(always)]
    fn product<const TM: usize, const P: u32>(cfg: &MegaConfig, lt: Layers, i: &Instruction) -> Option<Product> {
        let l = i.layer;
        let at = |kind: u32| map::PER_LAYER * l + kind;
        let (m0, n0) = (i.tile_row * cfg.tile, i.tile_col * cfg.tile);
        let dim = |k: u32| lt.dim(k);
        // the operands read transposed, MN-major, where the step keeps no transposed copies
        // (from the kernel's tile and data path, constants: the consumers trap where `cfg` differs)
        let mn = reads_in_place(P, 32 * TM as u32);
        let ((a, a_mn), (b, b_mn), k) = match i.opcode {
            // act[l+1] = act[l] W[l]^T: k is the input feature
            opcode::LINEAR_FWD => ((map::ACT, false), (map::W, false), dim(l)),
            // grad[l] = grad[l+1] W[l]: k is the output feature, rows of W (columns of w_t)
            opcode::LINEAR_BWD_INPUT => ((map::GRAD, false), (map::W_T, mn), dim(l + 1)),
            // dW[l] = grad[l+1]^T act[l]: k is the batch row (the fused update's product too)
            opcode::LINEAR_BWD_WEIGHT | opcode::LINEAR_BWD_WEIGHT_SGD => {
                ((map::GRAD_T, mn), (map::ACT_T, mn), cfg.batch)
            }
            _ => return None,
        };
        let page_k = page_k(P);
        Some(Product { a_map: at(a), b_map: at(b), m0, n0, pages: k.div_ceil(page_k), page_k, a_mn, b_mn })
    }

    /// Issues the TMA loads of one operand's page for K block `kt` of `page_k` columns (rows, M or
    /// N, from `m0`): K-major, one box of `tile` rows by `page_k` columns; MN-major (`mn`), `tile /
    /// MN_BOX` boxes of `page_k` rows (K) by [`MN_BOX`] columns, one after another (see
    /// [`mn_page_descriptor`](super::mn_page_descriptor)).
    #[inline(always)]
    unsafe fn load_page(
        dst: u32,
        maps: crate::DevicePtr<tma::TensorMap>,
        (m, mn): (u32, bool),
        (m0, tile): (u32, u32),
        kt: u32,
        page_k: u32,
        bar: u32,
    ) {
        let map = unsafe { maps.as_ptr().add(m as usize) };
        if !mn {
            unsafe { tma::load_2d(dst, map, (kt * page_k) as i32, m0 as i32, bar) };
            return;
        }
        let mut j = 0;
        while j < tile / MN_BOX {
            let at = dst + j * page_k * 2 * MN_BOX;
            unsafe { tma::load_2d(at, map, (m0 + j * MN_BOX) as i32, (kt * page_k) as i32, bar) };
            j += 1;
        }
    }

    /// Waits for the phase of `bar` with `parity`, giving up (false) after the step's wait limit or
    /// when another block has aborted. Every lane that calls it waits by itself.
    #[inline(always)]
    unsafe fn bounded_wait(b: &MegaBuffers, cfg: &MegaConfig, bar: u32, parity: u32) -> bool {
        unsafe { mbarrier::wait_parity_or(bar, parity, cfg.wait_limit_ns as u64, |_| aborted(b, cfg)) }
    }

    /// Instruction `idx` of the block's list `..hi` (a default one past the end), read one
    /// instruction ahead by the loader and the consumers so that the global load's latency hides
    /// behind the current instruction's work.
    #[inline(always)]
    unsafe fn prefetch(b: &MegaBuffers, idx: u32, hi: u32) -> Instruction {
        if idx < hi { unsafe { b.instructions.read(idx as usize) } } else { Instruction::default() }
    }

    /// Records (lane 0 of the calling warp) that the consumers of instruction `idx` gave up
    /// waiting for the bytes of ring use `v`.
    #[inline(always)]
    unsafe fn record_page_stall(b: &MegaBuffers, cfg: &MegaConfig, idx: u32, v: u32) {
        if thread::lane_id() == 0 {
            let what = PAGE_TAG | PAGE_READY << 16 | page_slot(v);
            unsafe { record_stall(b, cfg, CONSUMER, idx, what, ready_parity(v), v) };
        }
    }

    /// The loader takes ring use `v` (instruction `idx`) for `bytes` of copies: from the second lap
    /// on, waits until the consumers have freed the slot's previous use, then announces the bytes
    /// on its ready barrier. False (after recording the stall) when the wait gave up.
    #[inline(always)]
    unsafe fn claim_slot(b: &MegaBuffers, cfg: &MegaConfig, sm: Smem, v: u32, idx: u32, bytes: u32) -> bool {
        let slot = page_slot(v);
        if v >= PAGE_STAGES && !unsafe { bounded_wait(b, cfg, sm.free(slot), free_parity(v)) } {
            unsafe { record_stall(b, cfg, LOADER, idx, PAGE_TAG | PAGE_FREE << 16 | slot, free_parity(v), v) };
            return false;
        }
        unsafe { mbarrier::arrive_expect_tx(sm.ready(slot), bytes) };
        true
    }

    /// The loader (one thread): fills pages for every product of `lo..hi`, in order. Returns early
    /// after recording a stall; then it waits (briefly) for the loads it issued, so that no copy lands
    /// in the shared memory of a block that has exited.
    #[inline(always)]
    unsafe fn load_pages<const TM: usize, const P: u32>(
        b: &MegaBuffers,
        cfg: &MegaConfig,
        sm: Smem,
        lt: Layers,
        lo: u32,
        hi: u32,
    ) {
        // the kernel's tile (the consumers trap where `cfg.tile` differs), a constant
        let tile = 32 * TM as u32;
        // ring uses, and staged updates whose old weights were loaded
        let (mut u, mut updates) = (0u32, 0u32);
        let mut idx = lo;
        let mut next = unsafe { prefetch(b, lo, hi) };
        'instructions: while idx < hi {
            let ins = next;
            next = unsafe { prefetch(b, idx + 1, hi) };
            let product = product::<TM, P>(cfg, lt, &ins);
            let boxes = box_slot_uses(ins.opcode, P, tile);
            if product.is_some() || boxes > 0 {
                unsafe { stamp(b, idx, trace::LOADER_START) };
                // (the fused update's second wait, its write-after-read guard, is met here too:
                // the consumers write W only after pages this loader issued after it)
                if !unsafe {
                    wait(b, cfg, ins.wait, ins.wait_value, idx, LOADER)
                        && wait(b, cfg, ins.wait2, ins.wait2_value, idx, LOADER)
                } {
                    break 'instructions;
                }
                unsafe { stamp(b, idx, trace::LOADER_DEPS) };
                // The producers' generic stores were acquired above; TMA (the async proxy) reads them next.
                fence::proxy_async_global();
                let (c0, mut free_wait) = (thread::clock64(), 0u64);
                // ring uses a K block takes: its pages' slots are those of uses u .. u + per
                let per = slot_uses_per_block(tile);
                let (mut kt, pages) = (0, product.map_or(0, |p| p.pages));
                // a staged update's old weights, loaded halfway through its pages: late enough
                // that the storer has long stored the last update's out of the buffer (the
                // consumers staged it before their first page of this one), early enough to land
                // before the last page
                let weights = ins.opcode == opcode::LINEAR_BWD_WEIGHT_SGD && stores_through_tma(P, tile);
                while let Some(p) = product
                    && kt < pages
                {
                    if weights && kt == pages / 2 {
                        if !unsafe { load_weights(b, cfg, sm, &ins, updates, idx) } {
                            break 'instructions;
                        }
                        updates += 1;
                    }
                    let w0 = thread::clock64();
                    let mut v = u;
                    while v < u + per {
                        if !unsafe { claim_slot(b, cfg, sm, v, idx, stage_tx_bytes(tile)) } {
                            break 'instructions;
                        }
                        v += 1;
                    }
                    free_wait += thread::clock64() - w0;
                    // (the B page's barrier is the last use's: the A page's when both share a slot)
                    let (a_bar, b_bar) = (sm.ready(page_slot(u)), sm.ready(page_slot(u + per - 1)));
                    unsafe {
                        load_page(sm.a_page_at(u), b.maps, (p.a_map, p.a_mn), (p.m0, tile), kt, p.page_k, a_bar);
                        load_page(sm.b_page_at(u, per), b.maps, (p.b_map, p.b_mn), (p.n0, tile), kt, p.page_k, b_bar);
                    }
                    u += per;
                    kt += 1;
                }
                // f32 boxes (see `box_slot_uses`), a box a slot: a loss tile's logits
                let at = map::PER_LAYER * (cfg.layers - 1) + map::LOGITS;
                let (m0, n0) = (ins.tile_row * tile, ins.tile_col * tile);
                let mut j = 0;
                while j < boxes {
                    if !unsafe { claim_slot(b, cfg, sm, u, idx, stage_tx_bytes(tile)) } {
                        break 'instructions;
                    }
                    let (slot, map) = (page_slot(u), unsafe { b.maps.as_ptr().add(at as usize) });
                    let col = (n0 + j * F32_BOX_COLS) as i32;
                    unsafe { tma::load_2d(sm.a_page(slot), map, col, m0 as i32, sm.ready(slot)) };
                    u += 1;
                    j += 1;
                }
                unsafe {
                    stamp(b, idx, trace::LOADER_ISSUED);
                    record(b, idx, trace::FREE_WAIT_CLK, free_wait);
                    record(b, idx, trace::ISSUE_CLK, thread::clock64() - c0);
                }
            }
            idx += 1;
        }
        if idx < hi {
            // Gave up: let the copies in flight (the last use of each slot, the last weights) land
            // before exiting.
            let mut back = 1;
            while back <= PAGE_STAGES && back <= u {
                let v = u - back;
                let _ = unsafe { mbarrier::wait_parity_bounded(sm.ready(page_slot(v)), ready_parity(v), 10_000_000) };
                back += 1;
            }
            if updates > 0 {
                let last = page_parity(updates - 1);
                let _ = unsafe { mbarrier::wait_parity_bounded(sm.weights_ready(), last, 10_000_000) };
            }
        }
    }

    /// The loader loads the old weights of the `n`-th staged fused update of the block (instruction
    /// `idx`, `ins`) into the weight buffer: once the storer has released the buffer from the
    /// update before (its phase `n - 1` of *weights free*), announces the bytes on *weights
    /// ready* and issues the tile's [`map::WEIGHTS`] boxes. The weights are this tile's alone
    /// during the step (no other instruction writes them), so no counter guards them. False
    /// (after recording the stall) when the wait gave up.
    #[inline(always)]
    unsafe fn load_weights(b: &MegaBuffers, cfg: &MegaConfig, sm: Smem, ins: &Instruction, n: u32, idx: u32) -> bool {
        if n > 0 && !unsafe { bounded_wait(b, cfg, sm.weights_free(), page_parity(n - 1)) } {
            let what = PAGE_TAG | WEIGHTS_FREE << 16;
            unsafe { record_stall(b, cfg, LOADER, idx, what, page_parity(n - 1), n - 1) };
            return false;
        }
        let tile = BIGGEST_TILE;
        let map = unsafe { b.maps.as_ptr().add((map::PER_LAYER * ins.layer + map::WEIGHTS) as usize) };
        let (m0, n0) = (ins.tile_row * tile, ins.tile_col * tile);
        unsafe { mbarrier::arrive_expect_tx(sm.weights_ready(), weight_buffer_bytes(tile)) };
        let mut j = 0;
        while j < tile / F32_BOX_COLS {
            let col = (n0 + j * F32_BOX_COLS) as i32;
            unsafe { tma::load_2d(sm.weights + j * F32_BOX_BYTES, map, col, m0 as i32, sm.weights_ready()) };
            j += 1;
        }
        true
    }

    /// The consumers' barrier: every consumer thread arrives (so each thread's own shared and global
    /// accesses are released by its own arrival), then waits for the phase. False (the same on
    /// every lane of the warp) when the step was given up.
    #[inline(always)]
    unsafe fn rendezvous(b: &MegaBuffers, cfg: &MegaConfig, sm: Smem, phase: &mut u32, idx: u32) -> bool {
        unsafe { rendezvous_or_plant(b, cfg, sm, phase, idx, false) }
    }

    /// [`rendezvous`], where a `planted` warp (the give-up test's, [`give_up::PUBLISH`]) arrives
    /// and then gives up without waiting.
    #[inline(always)]
    unsafe fn rendezvous_or_plant(
        b: &MegaBuffers,
        cfg: &MegaConfig,
        sm: Smem,
        phase: &mut u32,
        idx: u32,
        planted: bool,
    ) -> bool {
        unsafe { mbarrier::arrive(sm.rendezvous()) };
        let ok = !planted && unsafe { bounded_wait(b, cfg, sm.rendezvous(), *phase & 1) };
        let ok = warp::all(u32::MAX, ok);
        if !ok && thread::lane_id() == 0 {
            unsafe { record_stall(b, cfg, CONSUMER, idx, PAGE_TAG | RENDEZVOUS << 16, *phase & 1, *phase) };
        }
        *phase += 1;
        ok
    }

    /// Which fragments a [`Frags`] loads: the four registers of an `m16n8k8` A tile (16 rows), or
    /// the two registers of each of a pair of B tiles (16 columns).
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum FragKind {
        A,
        BPair,
    }

    /// One lane's addressing of a warp's fragments in an operand page, computed once per product:
    /// `G` groups of 16 rows (m for A, n for B) from row `base` of the (K-major) page, one
    /// `ldmatrix.x4` per group. Its four 8 x 8 b16 matrices are four 8-row x 4-f32 blocks, and a
    /// lane receives element `lane % 4` of row `lane / 4` of each: exactly the tf32 fragment (A:
    /// rows +0/+8 x k +0/+4; B: k +0/+4 x columns +0/+8). Lane `l` points at row `l % 8 (+8)`,
    /// 16-byte chunk `(l / 8)`; the 128-byte swizzle XORs the chunk with the row, and since the
    /// page is 1024-byte aligned and `kk / 4` only sets chunk bits, the address for k step `kk` is
    /// the lane's address XOR `(kk / 4) << 4`.
    #[derive(Clone, Copy)]
    struct Frags<const G: usize> {
        off: [u32; G],
    }

    impl<const G: usize> Frags<G> {
        #[inline(always)]
        fn new(base: u32, kind: FragKind) -> Self {
            let lane = thread::lane_id();
            let (q, r) = (lane / 8, lane % 8);
            // A: matrices (rows +0, k +0), (+8, +0), (+0, +4), (+8, +4);
            // B pair: (columns +0, k +0), (+0, +4), (+8, +0), (+8, +4)
            let (drow, dchunk) = if kind == FragKind::A { (8 * (q % 2), q / 2) } else { (8 * (q / 2), q % 2) };
            Frags { off: core::array::from_fn(|gi| (base + 16 * gi as u32 + r + drow) * 128 + ((dchunk ^ r) << 4)) }
        }

        /// The four fragment registers of group `gi` at k step `kk` of the page at `page`.
        #[inline(always)]
        unsafe fn load(&self, page: u32, gi: usize, kk: u32) -> [u32; 4] {
            unsafe { matrix::ldmatrix_x4(page + (self.off[gi] ^ ((kk / 4) << 4))) }
        }
    }

    /// An f32 as tf32 operands: on [`precision::TF32X3`], `(head, tail)` with `head = tf32(x)` and
    /// `tail = tf32(x - head)`; on [`precision::TF32`], `x` is already a tf32 value (see
    /// [`rounded_operand`]) and passes as it is.
    #[inline(always)]
    fn split<const P: u32>(x: f32) -> (u32, u32) {
        if P != precision::TF32X3 {
            return (x.to_bits(), 0);
        }
        let head = convert::f32_to_tf32(x);
        (head, convert::f32_to_tf32(x - f32::from_bits(head)))
    }

    /// One k step's raw fragments: A groups, then B groups (see [`Frags`]).
    type Step<const MT: usize> = ([[u32; 4]; MT], [[u32; 4]; MT]);

    /// Loads k step `ks` of the page pair at `pa`, `pb`.
    #[inline(always)]
    unsafe fn load_step<const MT: usize>(
        a_frag: &Frags<MT>,
        b_frag: &Frags<MT>,
        pa: u32,
        pb: u32,
        ks: usize,
    ) -> Step<MT> {
        let mut f: Step<MT> = ([[0u32; 4]; MT], [[0u32; 4]; MT]);
        for g in 0..MT {
            unsafe {
                f.0[g] = a_frag.load(pa, g, 8 * ks as u32);
                f.1[g] = b_frag.load(pb, g, 8 * ks as u32);
            }
        }
        f
    }

    /// Frees the slots of the K block at ring uses `u .. u + per` after this warp's last reads of
    /// them: the warp's lanes meet, lane 0 arrives on each.
    #[inline(always)]
    unsafe fn free_pages(sm: Smem, u: u32, per: u32) {
        crate::sync::sync_warp(u32::MAX);
        if thread::lane_id() == 0 {
            let mut v = u;
            while v < u + per {
                unsafe { mbarrier::arrive(sm.free(page_slot(v))) };
                v += 1;
            }
        }
    }

    /// One k step's products: splits the fragments into tf32 heads and tails (3xTF32; on tf32
    /// they are stored, already rounded operands) and accumulates the `MT x NT` `m16n8k8`
    /// products into `acc`.
    #[inline(always)]
    fn mma_step<const MT: usize, const NT: usize, const P: u32>((ra, rb): Step<MT>, acc: &mut [[[f32; 4]; NT]; MT]) {
        let mut fa = [[(0u32, 0u32); 4]; MT];
        for (f, raw) in fa.iter_mut().zip(ra.iter()) {
            for e in 0..4 {
                f[e] = split::<P>(f32::from_bits(raw[e]));
            }
        }
        // B group g holds tiles 2g and 2g + 1 (registers b0, b1 of each)
        let mut fb = [[(0u32, 0u32); 2]; NT];
        for (j, f) in fb.iter_mut().enumerate() {
            for (e, v) in f.iter_mut().enumerate() {
                *v = split::<P>(f32::from_bits(rb[j / 2][2 * (j % 2) + e]));
            }
        }
        for (j, fb) in fb.iter().enumerate() {
            let bh = [fb[0].0, fb[1].0];
            for i in 0..MT {
                let ah = [fa[i][0].0, fa[i][1].0, fa[i][2].0, fa[i][3].0];
                let mut c = acc[i][j];
                if P == precision::TF32X3 {
                    let at = [fa[i][0].1, fa[i][1].1, fa[i][2].1, fa[i][3].1];
                    c = mma::mma_m16n8k8_tf32(at, bh, c);
                    c = mma::mma_m16n8k8_tf32(ah, [fb[0].1, fb[1].1], c);
                }
                acc[i][j] = mma::mma_m16n8k8_tf32(ah, bh, c);
            }
        }
    }

    /// A product's pages as one consumer warp walks them: the step, the block's shared memory, the
    /// product, its first page use `*u` (advanced past the product's pages), the instruction
    /// index (for stall records and the trace), and whether the warp has abandoned the step.
    struct Pages<'a> {
        b: &'a MegaBuffers,
        cfg: &'a MegaConfig,
        sm: Smem,
        p: &'a Product,
        u: &'a mut u32,
        idx: u32,
        /// This warp gave up an earlier instruction of the step: the walk only drains (see
        /// [`consume`]).
        abandoned: bool,
    }

    /// The part of a product's page loop that does not depend on how a page is multiplied: steps
    /// through the product's K blocks from ring use `*u` on (each taking [`slot_uses_per_block`]
    /// uses) and, for each K block this warp's group multiplies (every one when the groups split
    /// rows, [`groups_split_rows`], else those of [`page_group`]), waits for its pages' bytes and
    /// runs `multiply(u, free)` with the block's first use `u` (which frees the block's slots when
    /// `free`: always, unless the walk only drains). `TM` is the tile over 32.
    /// `on_first` runs once the group's first page has arrived (the producers' stores are then
    /// visible, see [`Prefetched`]), and not at all in a group that has no page. Thread 0 stamps
    /// the first page and records its cycles waiting for pages after the first and from the
    /// first page on. False when the step was given up (a stall recorded).
    ///
    /// Each warp waits for a page by itself, and may give up (its limit, or another block's
    /// abort) while another warp sees the bytes arrive. Without `WARPGROUP` a warp that gave up
    /// leaves the walk at once. With it (the group multiplies as one warpgroup, whose `wgmma` must
    /// be executed by all four warps, the same instruction) it walks on, running `multiply` on
    /// every remaining page of its group without waiting for the page and without freeing it
    /// (the step is abandoned: what it multiplies no longer matters), so that the other three
    /// never wait in a `wgmma` for it; it waits on [`Smem::drained`] instead, which returns at
    /// once, so the walk's loop has one wait, one `multiply` and no branch around either. Either
    /// way the stall is recorded after the walk ([`record_page_stall`]; not at all if the warp had
    /// already abandoned the step before it, [`Pages::abandoned`]: then the walk only drains), and
    /// the walk returns false. (Recorded in the loop instead, where the warp gives up, the large
    /// step took 0.536-0.538 ms against 0.517-0.518: H200 run 187.)
    /// (Other shapes measured, medium model: a named barrier per page making the four agree
    /// first, 2 % slower, run 128; a branch skipping the wait once given up, 6 %, run 130; that
    /// with the stall recorded in the loop, 9 %, run 129.)
    ///
    /// `MegaConfig::give_up_warp` with [`give_up::PAGES`] plants the split for the give-up test:
    /// that warp gives up the first page of every walk without waiting.
    #[inline(always)]
    unsafe fn group_pages<const TM: usize, const WARPGROUP: bool>(
        pages: Pages<'_>,
        on_first: &mut impl FnMut(),
        mut multiply: impl FnMut(u32, bool),
    ) -> bool {
        let Pages { b, cfg, sm, p, u, idx, abandoned } = pages;
        let tile = 32 * TM as u32;
        let (rows, per) = (groups_split_rows(tile), slot_uses_per_block(tile));
        let group = thread::warp_id() / GROUP_WARPS;
        // the K block this group multiplies first
        let first_kt = if rows { 0 } else { group };
        let (mut ready_wait, mut first) = (0u64, 0u64);
        let pages = p.pages;
        // the page use this warp gave up on, if it did (from the start when it abandoned the step;
        // the planted fault gives up the group's first page)
        const NONE: u32 = u32::MAX;
        let planted = thread::warp_id() + 1 == cfg.give_up_warp
            && cfg.give_up_at == give_up::PAGES
            && thread::block_idx_x() == 0
            && first_kt < pages;
        let mut gave_up = if abandoned || planted { *u + per * first_kt } else { NONE };
        if planted && !abandoned {
            // The planted fault's record, at once: it stands for a wait that gave up here, and
            // the other consumer warps, which it strands, may give up (and record) before this
            // walk ends (with a ring of 8 or 10 slots, H200 runs 174 and 183).
            unsafe { record_page_stall(b, cfg, idx, gave_up) };
        }
        let mut kt = 0;
        while kt < pages {
            if !rows && page_group(kt) != group {
                // the other group's page
                *u += per;
                kt += 1;
                continue;
            }
            let w0 = thread::clock64();
            // The block's slots last first: the loader issues them in order, so the last lands
            // last, and the others' waits then return at once. (In order, at tile 128, each block
            // took a second wait that blocked for the B page after waking for the A page: the
            // large step 0.610-0.611 ms against 0.580-0.588 last first, H200 run 179.)
            let mut n = per;
            while n > 0 {
                n -= 1;
                let v = *u + n;
                let (bar, parity) =
                    if gave_up == NONE { (sm.ready(page_slot(v)), ready_parity(v)) } else { (sm.drained(), 1) };
                let ok = unsafe { bounded_wait(b, cfg, bar, parity) };
                if !warp::all(u32::MAX, ok) {
                    // (only while waiting on pages: the drained barrier never fails)
                    gave_up = v;
                }
            }
            let w1 = thread::clock64();
            if kt == first_kt {
                first = w1;
            } else {
                ready_wait += w1 - w0;
            }
            if !WARPGROUP && gave_up != NONE {
                break;
            }
            if kt == first_kt {
                on_first();
            }
            if kt == 0 && thread::thread_idx_x() == 0 {
                unsafe { stamp(b, idx, trace::FIRST) };
            }
            // A draining warp frees nothing: its arrivals would run ahead of the pages' phases (a
            // second arrival on a free barrier before the phase of its first has completed).
            multiply(*u, gave_up == NONE);
            *u += per;
            kt += 1;
        }
        if gave_up != NONE {
            if !abandoned && !planted {
                unsafe { record_page_stall(b, cfg, idx, gave_up) };
            }
            return false;
        }
        if thread::thread_idx_x() == 0 {
            unsafe {
                record(b, idx, trace::READY_WAIT_CLK, ready_wait);
                record(b, idx, trace::WORK_CLK, thread::clock64() - first);
            }
        }
        true
    }

    /// This warp's share of one product on `mma.sync`: `MT x NT` `m16n8` accumulators, `16 MT`
    /// rows by `8 NT` columns (`tile = 32 MT`, `NT = 2 MT`; warp `q = w % 4` of its group starts
    /// at row `(q / 2) 16 MT`, column `(q % 2) 8 NT` of the tile), summed over its group's pages
    /// ([`group_pages`]). False when the step was given up.
    #[inline(always)]
    unsafe fn tile_mma<const MT: usize, const NT: usize, const TM: usize, const P: u32>(
        pages: Pages<'_>,
        acc: &mut [[[f32; 4]; NT]; MT],
        on_first: &mut impl FnMut(),
    ) -> bool {
        let sm = pages.sm;
        if P == precision::BF16 {
            // bf16 pages multiply on `tile_wgmma` only (this instantiation is compiled away)
            thread::trap();
        }
        let w = thread::warp_id() % GROUP_WARPS;
        let (rm, rn) = ((w / 2) * 16 * MT as u32, (w % 2) * 8 * NT as u32);
        let a_frag = Frags::<MT>::new(rm, FragKind::A);
        let b_frag = Frags::<MT>::new(rn, FragKind::BPair);
        *acc = [[[0.0f32; 4]; NT]; MT];
        unsafe {
            group_pages::<TM, false>(pages, on_first, |u, free| {
                // Two k steps' fragments at a time (the other group's warps on the same scheduler
                // hide the rest of the latency); the page is freed right after the last loads, so
                // the loader refills it during the last two steps' math.
                let (pa, pb) = (sm.a_page_at(u), sm.b_page_at(u, 1));
                let mut ks = 0;
                while ks < KSTEPS {
                    let f0 = load_step(&a_frag, &b_frag, pa, pb, ks);
                    let f1 = load_step(&a_frag, &b_frag, pa, pb, ks + 1);
                    if free && ks + 2 == KSTEPS {
                        free_pages(sm, u, 1);
                    }
                    mma_step::<MT, NT, P>(f0, acc);
                    mma_step::<MT, NT, P>(f1, acc);
                    ks += 2;
                }
            })
        }
    }

    /// [`tile_mma`] on the asynchronous tensor-core path ([`precision::TF32`] and
    /// [`precision::BF16`] at tile 64): each page group is a warpgroup, and it multiplies each of
    /// its pages whole with four `wgmma` products (m64n64k8 tf32, or m64n64k16 bf16 from a page
    /// twice as deep in K) read straight from the swizzled pages through descriptors (no
    /// fragments in registers, nothing converted: every operand is stored in the products'
    /// format). A page's products stay in flight while the group waits for its next page and
    /// issues that page's products; then it waits for the older group (`wait_group 1`) and frees
    /// its page; after the walk, for the last (`wait_group 0`). The other group's products keep
    /// the tensor cores busy too. (Waiting for each page's products before the next page, as
    /// until run 139, left the bf16 large model's forward tiles at 3.8 us of work for 16 pages,
    /// with the loader waiting for free pages 80 % of its time.) Warp `w` of the group ends with
    /// rows `16 w .. 16 w + 16`, all 64 columns ([`wgmma::acc_m64`], which is `acc` as `[1][8]`
    /// `m16n8` tiles: `MT = 1`, `NT = 8`, [`layout::WIDE`]).
    #[inline(always)]
    unsafe fn tile_wgmma<const MT: usize, const NT: usize, const P: u32>(
        pages: Pages<'_>,
        acc: &mut [[[f32; 4]; NT]; MT],
        on_first: &mut impl FnMut(),
    ) -> bool {
        let sm = pages.sm;
        // four k steps of 32 bytes a row on either format
        const { assert!(PAGE_K == 32 && PAGE_K_BF16 == 2 * PAGE_K) };
        if MT != 1 || NT != 8 {
            // only the tile-64 tf32 and bf16 kernels call it (the other instantiations compile it away)
            thread::trap();
        }
        *acc = [[[0.0f32; 4]; NT]; MT];
        // SAFETY (of the cast): [[[f32; 4]; 8]; 1] and [f32; 32] have the same layout.
        let d = unsafe { &mut *(acc as *mut [[[f32; 4]; NT]; MT] as *mut [f32; 32]) };
        // the page whose products are in flight, and whether to free it (not when draining)
        let mut in_flight: Option<(u32, bool)> = None;
        let ok = unsafe {
            group_pages::<2, true>(pages, on_first, |u, free| {
                let (a, b) = (page_descriptors(sm.a_page_at(u)), page_descriptors(sm.b_page_at(u, 1)));
                if P == precision::BF16 {
                    wgmma::mma_m64n64k16x4_bf16(d, a, b);
                } else {
                    wgmma::mma_m64n64k8x4_tf32(d, a, b);
                }
                wgmma::wait_group_m64n64::<1>(d);
                if let Some((older, true)) = in_flight {
                    free_pages(sm, older, 1);
                }
                in_flight = Some((u, free));
            })
        };
        unsafe { wgmma::wait_group_m64n64::<0>(d) };
        if let Some((last, true)) = in_flight {
            unsafe { free_pages(sm, last, 1) };
        }
        ok
    }

    /// The four k steps' descriptors of a page at `page`: K-major, 128-byte swizzled, 8-row groups
    /// 1024 bytes apart (the GEMM's tile descriptor, whose k step, 16 bf16, is 32 bytes, as 8 tf32
    /// are).
    #[inline(always)]
    fn page_descriptors(page: u32) -> [u64; 4] {
        core::array::from_fn(|kk| tile_descriptor(page, kk as u32))
    }

    /// [`tile_wgmma`] at tile 128 ([`precision::BF16`], [`layout::ROWS`]): the groups split the
    /// tile's rows, and each multiplies every K block (an A page of 128 rows and a B page of 128
    /// rows, a ring slot each) with four `wgmma` m64n128k16 products: A from its own 64 rows of
    /// the A page (8 KiB in), B the whole B page. Both groups read every page, so every consumer
    /// warp frees it ([`page_free_arrivals`]), and the two groups' sums never meet: no exchange.
    /// The operands the product reads in place are MN-major pages ([`Product::a_mn`], `b_mn`):
    /// the products read them transposed (the group's 64 rows of A are then the A page's second
    /// box, 8 KiB in as well).
    /// As in [`tile_wgmma`], a block's products stay in flight while the next block is awaited.
    /// Warp `w` of group `g` ends with rows `64 g + 16 w .. + 16`, all 128 columns
    /// ([`wgmma::acc_m64`]).
    #[inline(always)]
    unsafe fn tile_wgmma_rows(pages: Pages<'_>, d: &mut [f32; 64], on_first: &mut impl FnMut()) -> bool {
        let sm = pages.sm;
        let (a_mn, b_mn) = (pages.p.a_mn, pages.p.b_mn);
        const PER: u32 = slot_uses_per_block(128);
        const { assert!(PER == 2 && groups_split_rows(128) && page_bytes(128) == STAGE_BYTES) };
        // the group's 64 rows of the A page: 8 row groups of 1024 bytes, or (MN-major) the
        // group's box of 64 K rows of 128 bytes
        let a_rows = (thread::warp_id() / GROUP_WARPS) * 64 * 128;
        let desc = |page: u32, mn: bool| -> [u64; 4] {
            core::array::from_fn(|kk| {
                if mn { super::mn_page_descriptor(page, kk as u32) } else { tile_descriptor(page, kk as u32) }
            })
        };
        *d = [0.0f32; 64];
        let mut in_flight: Option<(u32, bool)> = None;
        let ok = unsafe {
            group_pages::<4, true>(pages, on_first, |u, free| {
                let (a, b) = (desc(sm.a_page_at(u) + a_rows, a_mn), desc(sm.b_page_at(u, PER), b_mn));
                // one asm site per form, every warp of the group on the same one (the forms follow
                // the instruction)
                match (a_mn, b_mn) {
                    (false, false) => wgmma::mma_m64n128k16x4_bf16::<0, 0>(d, a, b),
                    (false, true) => wgmma::mma_m64n128k16x4_bf16::<0, 1>(d, a, b),
                    // (A is read in place only with B: the weight gradient)
                    (true, _) => wgmma::mma_m64n128k16x4_bf16::<1, 1>(d, a, b),
                }
                wgmma::wait_group_m64n128::<1>(d);
                if let Some((older, true)) = in_flight {
                    free_pages(sm, older, PER);
                }
                in_flight = Some((u, free));
            })
        };
        unsafe { wgmma::wait_group_m64n128::<0>(d) };
        if let Some((last, true)) = in_flight {
            unsafe { free_pages(sm, last, PER) };
        }
        ok
    }

    /// `v` as stored for later products of data path `P`: rounded (nearest, ties to even) to tf32
    /// on [`precision::TF32`] and to bf16 on [`precision::BF16`], the value the products would
    /// round it to anyway, so that the page loops read every operand (activations, gradients, the
    /// weights' copies) without converting it; on 3xTF32 as it is.
    #[inline(always)]
    fn rounded_operand<const P: u32>(v: f32) -> f32 {
        match P {
            precision::TF32 => f32::from_bits(convert::f32_to_tf32(v)),
            precision::BF16 => f32::from_bits((convert::f32_to_bf16_bits(v) as u32) << 16),
            _ => v,
        }
    }

    /// Stores product operand `v` (a [`rounded_operand`]) at element `i` of an operand copy: the
    /// f32 itself, or on [`precision::BF16`] its bf16 bits (exact: `v` is a bf16 value), 2 bytes
    /// at the same element index.
    #[inline(always)]
    unsafe fn store_op<const P: u32>(p: crate::DevicePtrMut<f32>, i: u32, v: f32) {
        if P == precision::BF16 {
            unsafe { p.cast::<u16>().write(i as usize, (v.to_bits() >> 16) as u16) };
        } else {
            unsafe { p.write(i as usize, v) };
        }
    }

    /// [`store_pair`] into an operand copy ([`store_op`]): on [`precision::BF16`] both bf16 in one
    /// 4-byte store (`at` is even: every row starts 16-byte aligned, see [`pitch`]).
    #[inline(always)]
    unsafe fn store_op_pair<const P: u32>(p: crate::DevicePtrMut<f32>, at: u32, c: u32, cols: u32, v: [f32; 2]) {
        if P != precision::BF16 {
            unsafe { store_pair(p, at, c, cols, v) };
        } else if c + 1 < cols {
            let bits = (v[1].to_bits() & 0xffff_0000) | (v[0].to_bits() >> 16);
            unsafe { p.cast::<u32>().write((at / 2) as usize, bits) };
        } else if c < cols {
            unsafe { store_op::<P>(p, at, v[0]) };
        }
    }

    /// Stores operand `v`, element (row `r`, feature `c`) of an activation or gradient layer, into
    /// its transposed copy `p` (`act_t` or `grad_t`) at the layer's offset `t_off`: row `c`, column
    /// `r` (rows of `pitch(batch)`), where the weight gradients read it K-major.
    #[inline(always)]
    unsafe fn store_t<const P: u32>(p: crate::DevicePtrMut<f32>, cfg: &MegaConfig, t_off: u32, r: u32, c: u32, v: f32) {
        unsafe { store_op::<P>(p, t_off + c * pitch(cfg.batch) + r, v) };
    }

    /// Stores the copies of new weights `w` (row `o`, columns `k..k + N` of `W[l]`, `N` 1 or 2,
    /// columns past the layer's inputs skipped) that the products read, as [`rounded_operand`]s
    /// ([`store_op`]): `w_t[l][k..][o]` (the input gradients' B; not where the step reads in
    /// place, [`reads_in_place`]) and, on tf32 and bf16, `w_op[l][o][k..]` (the forwards' B, a
    /// pair in one store; 3xTF32 reads `weights` itself).
    #[inline(always)]
    unsafe fn store_weight_copies<const N: usize, const P: u32>(
        b: &MegaBuffers,
        cfg: &MegaConfig,
        lt: Layers,
        l: u32,
        o: u32,
        k: u32,
        w: [f32; N],
    ) {
        let (din, dout) = (lt.dim(l), lt.dim(l + 1));
        let v = w.map(rounded_operand::<P>);
        if P == precision::TF32 || P == precision::BF16 {
            let at = lt.w_off(l) + o * pitch(din) + k;
            if N == 2 {
                unsafe { store_op_pair::<P>(b.w_op, at, k, din, [v[0], v[N - 1]]) };
            } else {
                unsafe { store_op::<P>(b.w_op, at, v[0]) };
            }
        }
        if reads_in_place(P, cfg.tile) {
            return;
        }
        for (j, &x) in v.iter().enumerate() {
            if k + (j as u32) < din {
                unsafe { store_op::<P>(b.w_t, lt.wt_off(l) + (k + j as u32) * pitch(dout) + o, x) };
            }
        }
    }

    /// One page group's half of a warp's accumulators: `[s][nj][c]` is the group's 8-row slab `s`
    /// (of `MT`), `n8` tile `nj`, column `c` of the lane's pair. Group `g` owns the warp square's
    /// rows `8 MT g .. 8 MT (g + 1)`: with `MT = 2` the whole `m16` tile `g`, with one the rows `+8g`
    /// of the only one (registers `2g, 2g + 1`). A lane's element `[s][nj][c]` is row `8 MT g + 8 s
    /// + lane / 4`, column `8 nj + 2 (lane % 4) + c` of the square.
    type Half<const MT: usize, const NT: usize> = [[[f32; 2]; NT]; MT];

    /// Group `g`'s half of `acc` (see [`Half`]).
    #[inline(always)]
    fn half<const MT: usize, const NT: usize>(acc: &[[[f32; 4]; NT]; MT], g: u32) -> Half<MT, NT> {
        core::array::from_fn(|s| {
            core::array::from_fn(|nj| {
                core::array::from_fn(|c| {
                    // MT = 2: tile g, register pair s; MT = 1: tile 0, register pair g
                    let (x, y) = if MT == 2 {
                        (acc[0][nj][2 * s + c], acc[1 % MT][nj][2 * s + c])
                    } else {
                        (acc[0][nj][c], acc[0][nj][2 + c])
                    };
                    if g == 0 { x } else { y }
                })
            })
        })
    }

    /// Where this lane's elements of a [`Half`] of instruction `i` sit in the output: `(row,
    /// column)` of `[s][nj][c]` is `(r + 8 s, c0 + 8 nj + c)`; `part` is the first loss partial
    /// ([`loss_partials`]) its columns belong to. By [`layout`]: warp `w` of group `g` holds the
    /// `16 MT x 8 NT` block at block row `w / 2`, column `w % 2` of the tile, whose rows `8 MT g ..`
    /// are the group's half ([`layout::SQUARES`]); or the 16 rows from `16 w`, every column, whose
    /// rows `+8 g` are the group's half ([`layout::WIDE`]); or, [`layout::ROWS`], the 16 rows from
    /// `64 g + 16 w`, whose columns `64 cols ..` (`8 NT = 64`) are this `Half`: the warp's
    /// accumulators make two, one per loss partial.
    #[derive(Clone, Copy)]
    struct HalfAt {
        r: u32,
        c0: u32,
        part: u32,
    }

    impl HalfAt {
        #[inline(always)]
        fn new<const MT: usize, const NT: usize, const L: u32>(cfg: &MegaConfig, i: &Instruction, cols: u32) -> HalfAt {
            let (lane, w, g) = (thread::lane_id(), thread::warp_id() % GROUP_WARPS, thread::warp_id() / GROUP_WARPS);
            let (r0, c0) = (i.tile_row * cfg.tile + lane / 4, i.tile_col * cfg.tile + 2 * (lane % 4));
            match L {
                layout::SQUARES => {
                    let (wr, wc) = (w / 2, w % 2);
                    let r = r0 + wr * 16 * MT as u32 + 8 * MT as u32 * g;
                    HalfAt { r, c0: c0 + wc * 8 * NT as u32, part: 2 * i.tile_col + wc }
                }
                layout::WIDE => HalfAt { r: r0 + w * 16 * MT as u32 + 8 * MT as u32 * g, c0, part: 2 * i.tile_col },
                _ => HalfAt { r: r0 + 64 * g + 16 * w, c0: c0 + 8 * NT as u32 * cols, part: 2 * i.tile_col + cols },
            }
        }
        #[inline(always)]
        fn at(self, s: usize, nj: usize, c: usize) -> (u32, u32) {
            (self.r + 8 * s as u32, self.c0 + 8 * nj as u32 + c as u32)
        }
    }

    /// Global values an epilogue needs, loaded while the product's pages stream in rather than
    /// after its last `mma` (a global load costs an L2 round trip, behind an L1 that the step's
    /// acquires invalidate), for the group's [`Half`] only:
    /// - the input gradient's ReLU mask, `act[l]`, after the first page: that page's arrival
    ///   orders these loads after the loader's acquire of the instruction's dependencies
    ///   (`act[l]` was written this step, by the forward);
    /// - the fused update's old weights, at the instruction's start: only this tile writes them
    ///   during the step. (Its velocities are loaded in the epilogue: a second array held through
    ///   the page loop costs more spills than it saves.)
    ///
    /// On [`layout::ROWS`] an input gradient's mask arrives in the staging buffer instead
    /// ([`store_tiles`]) and a fused update's old weights in the weight buffer ([`stage_update`]);
    /// the one epilogue there that loads anything, an input gradient's of a kernel that does not
    /// stage (none is built), loads its [`Half`] after the page walk (held through the walk beside
    /// its 64 accumulators, both halves' would take 64 more registers).
    struct Prefetched<const MT: usize, const NT: usize> {
        /// `act[l]` (input gradients) or the old weights (fused updates)
        x: Half<MT, NT>,
    }

    impl<const MT: usize, const NT: usize> Prefetched<MT, NT> {
        #[inline(always)]
        fn new() -> Self {
            Prefetched { x: [[[0.0f32; 2]; NT]; MT] }
        }

        /// The fused update's old weights.
        #[inline(always)]
        unsafe fn load_weights(&mut self, b: &MegaBuffers, lt: Layers, i: &Instruction, h: HalfAt) {
            let l = i.layer;
            let (din, dout, w_off) = (lt.dim(l), lt.dim(l + 1), lt.w_off(l));
            for s in 0..MT {
                for nj in 0..NT {
                    for c in 0..2 {
                        let (r, col) = h.at(s, nj, c);
                        if r < dout && col < din {
                            let j = (w_off + r * pitch(din) + col) as usize;
                            self.x[s][nj][c] = unsafe { b.weights.as_const().read(j) };
                        }
                    }
                }
            }
        }

        /// The input gradient's `act[l]`.
        #[inline(always)]
        /// On [`precision::BF16`] from its only copy, `act_bf16` (a pair of bf16 in one 4-byte
        /// load; the padding past a row's last column reads as whatever it holds, and masks a
        /// column that is never stored).
        unsafe fn load_act<const P: u32>(
            &mut self,
            b: &MegaBuffers,
            cfg: &MegaConfig,
            lt: Layers,
            i: &Instruction,
            h: HalfAt,
        ) {
            let (din, a_in) = (lt.dim(i.layer), lt.a_off(i.layer));
            for s in 0..MT {
                for nj in 0..NT {
                    let (r, col) = h.at(s, nj, 0);
                    if r < cfg.batch && col < din {
                        let at = a_in + r * pitch(din) + col;
                        self.x[s][nj] = if P == precision::BF16 {
                            let bits = unsafe { b.act_bf16.as_const().cast::<u32>().read((at / 2) as usize) };
                            [f32::from_bits(bits << 16), f32::from_bits(bits & 0xffff_0000)]
                        } else {
                            unsafe { load_pair(b.act.as_const(), at, col, din) }
                        };
                    }
                }
            }
        }
    }

    /// The last forward's share of the cross-entropy row statistics: for each row of a [`Half`]
    /// (at `h`) and each `tile / 2` of its columns (partial `h.part`, or `h.part + 0 or 1` on
    /// [`layout::WIDE`] whose `8 NT` columns are two such halves, see [`loss_partials`]), the
    /// maximum logit `m` and `sum exp(x - m)`, into `b.row_stats`. A quad of lanes holds a row's
    /// columns: each lane reduces its own, then two shuffles. Partials of halves past the last
    /// column are not written (nobody reads them).
    #[inline(always)]
    unsafe fn write_loss_partials<const MT: usize, const NT: usize, const L: u32>(
        b: &MegaBuffers,
        cfg: &MegaConfig,
        dout: u32,
        h: HalfAt,
        mine: &Half<MT, NT>,
    ) {
        let lane = thread::lane_id();
        let np = loss_partials(dout, cfg.tile);
        let halves = if L == layout::WIDE { 2 } else { 1 };
        for (s, slab) in mine.iter().enumerate() {
            for half in 0..halves {
                let p = h.part + half as u32;
                let cols = (NT / halves) * half..(NT / halves) * (half + 1);
                let mut m = f32::NEG_INFINITY;
                for nj in cols.clone() {
                    for (c, &x) in slab[nj].iter().enumerate() {
                        if h.at(s, nj, c).1 < dout {
                            m = m.max(x);
                        }
                    }
                }
                m = m.max(warp::shfl_xor_f32(u32::MAX, m, 1));
                m = m.max(warp::shfl_xor_f32(u32::MAX, m, 2));
                let mut z = 0.0f32;
                for nj in cols {
                    for (c, &x) in slab[nj].iter().enumerate() {
                        let t = math::exp_fast(x - m);
                        z += if h.at(s, nj, c).1 < dout { t } else { 0.0 };
                    }
                }
                z += warp::shfl_xor_f32(u32::MAX, z, 1);
                z += warp::shfl_xor_f32(u32::MAX, z, 2);
                let r = h.at(s, 0, 0).0;
                if lane % 4 == 0 && r < cfg.batch && p < np {
                    let at = (2 * (r * np + p)) as usize;
                    unsafe {
                        b.row_stats.write(at, m);
                        b.row_stats.write(at + 1, z);
                    }
                }
            }
        }
    }

    /// `(m, z)` pairs (a maximum and a sum of `exp(x - m)`) combined: `(M, z_a e^(m_a - M) + z_b
    /// e^(m_b - M))` with `M` the larger maximum; a pair with no terms (`m = -inf`) adds nothing.
    #[inline(always)]
    fn combine(a: (f32, f32), b: (f32, f32)) -> (f32, f32) {
        let m = a.0.max(b.0);
        let part = |x: (f32, f32)| if x.0 == f32::NEG_INFINITY { 0.0 } else { x.1 * math::exp_fast(x.0 - m) };
        (m, part(a) + part(b))
    }

    /// The cross-entropy statistics of a loss tile's rows from the last forward's partials
    /// ([`write_loss_partials`]): `T = CONSUMERS / tile` (256 / tile) neighbouring consumer threads per row, thread
    /// `t` taking partials `t % T, t % T + T, ...` of row `t / T`, [`PARTIAL_LOADS`] of them loaded
    /// at a time; then the `T` lanes combine by shuffles and the first writes the row's maximum to
    /// `stats[r]` and its sum to `stats[tile + r]`.
    #[inline(always)]
    unsafe fn loss_stats_from_partials<const MT: usize>(
        b: &MegaBuffers,
        cfg: &MegaConfig,
        lt: Layers,
        i: &Instruction,
        stats: *mut f32,
    ) {
        const PARTIAL_LOADS: u32 = 8;
        let tile = LossTile::<MT>::TILE;
        let t = thread::thread_idx_x();
        let per_row = CONSUMERS / tile;
        let (r, sub) = (t / per_row, t % per_row);
        let row = i.tile_row * tile + r;
        let dout = lt.dim(cfg.layers);
        let np = if row < cfg.batch { loss_partials(dout, tile) } else { 0 };
        let mut acc = (f32::NEG_INFINITY, 0.0f32);
        let mut p0 = sub;
        while p0 < np {
            let part: [(f32, f32); PARTIAL_LOADS as usize] = core::array::from_fn(|j| {
                let p = p0 + per_row * j as u32;
                if p < np {
                    let at = (2 * (row * np + p)) as usize;
                    unsafe { (b.row_stats.as_const().read(at), b.row_stats.as_const().read(at + 1)) }
                } else {
                    (f32::NEG_INFINITY, 0.0)
                }
            });
            for q in part.iter() {
                acc = combine(acc, *q);
            }
            p0 += per_row * PARTIAL_LOADS;
        }
        let mut x = 1;
        while x < per_row {
            acc = combine(acc, (warp::shfl_xor_f32(u32::MAX, acc.0, x), warp::shfl_xor_f32(u32::MAX, acc.1, x)));
            x *= 2;
        }
        if sub == 0 {
            unsafe {
                *stats.add(r as usize) = acc.0;
                *stats.add((tile + r) as usize) = acc.1;
            }
        }
    }

    /// Elements of a loss tile's quarter per consumer thread, at most (`sub^2 / CONSUMERS`: 16 at
    /// tiles 64 and 128, 4 at tile 32; see [`LossTile::SUB`]).
    const LOSS_ELEMS: usize = (MAX_TILE * MAX_TILE / CONSUMERS) as usize;

    /// One consumer thread's share of a quarter `q` of a `LOSS_GRAD` tile, loaded. A tile of up to
    /// [`MAX_TILE`] is one quarter (a tile of 128 would be four 64 x 64 quarters in turn, each
    /// staged through one sums buffer as a tile 64 is; since run 165 the tile-128 kernel takes
    /// [`loss_rows`] instead, and only its compiled-away arm still names quarters). Element `j`
    /// is `e = t + j CONSUMERS` of the quarter (row `e / sub`, column `e % sub` of it, so a warp
    /// reads 32 neighbouring logits), with its logit and, as loaded, its row's class
    /// (cross-entropy) or its target's bits (mean squared error). Only loads, nothing that uses
    /// them, so that all of them (and the row partials' loads behind them,
    /// [`loss_stats_from_partials`]) can be in flight at once. What made the loss tile slow was
    /// elsewhere: integer divisions by the run-time tile edge in every element's index (loads and
    /// partials took 10 300 cycles at tile 64, run 114, whether or not the loads came first, run
    /// 115; 4 100 with the edge a constant, run 116).
    struct LossTile<const MT: usize> {
        logit: [f32; LOSS_ELEMS],
        aux: [u32; LOSS_ELEMS],
        q: u32,
    }

    impl<const MT: usize> LossTile<MT> {
        /// The tile edge, `cfg.tile`, as a constant (so that finding an element's row and column
        /// takes shifts, not integer divisions).
        const TILE: u32 = 32 * MT as u32;
        /// The edge of a quarter (the tile itself up to [`MAX_TILE`]).
        const SUB: u32 = if Self::TILE < MAX_TILE { Self::TILE } else { MAX_TILE };
        /// Quarters of the tile.
        const QUARTERS: u32 = (Self::TILE / Self::SUB) * (Self::TILE / Self::SUB);

        /// Tile row and column of quarter `q`'s first element.
        #[inline(always)]
        fn origin(q: u32) -> (u32, u32) {
            let per_row = Self::TILE / Self::SUB;
            ((q / per_row) * Self::SUB, (q % per_row) * Self::SUB)
        }

        /// Tile row, global row and column of element `j` of quarter `q`, and whether it is live.
        #[inline(always)]
        fn at(cfg: &MegaConfig, i: &Instruction, dout: u32, q: u32, j: usize) -> (u32, u32, u32, bool) {
            let sub = Self::SUB;
            let e = thread::thread_idx_x() + j as u32 * CONSUMERS;
            let (qr, qc) = Self::origin(q);
            let (r, c) = (qr + e / sub, qc + e % sub);
            let (tr, tc) = (i.tile_row * Self::TILE + r, i.tile_col * Self::TILE + c);
            (r, tr, tc, e < sub * sub && tr < cfg.batch && tc < dout)
        }

        #[inline(always)]
        unsafe fn load(b: &MegaBuffers, cfg: &MegaConfig, lt: Layers, i: &Instruction, q: u32) -> Self {
            let (dout, a_out) = (lt.dim(cfg.layers), lt.a_off(cfg.layers));
            let mut x = LossTile { logit: [0.0; LOSS_ELEMS], aux: [0; LOSS_ELEMS], q };
            for j in 0..LOSS_ELEMS {
                let (_, tr, tc, live) = Self::at(cfg, i, dout, q, j);
                if live {
                    x.logit[j] = unsafe { b.act.as_const().read((a_out + tr * pitch(dout) + tc) as usize) };
                    x.aux[j] = if cfg.loss != loss::MSE {
                        unsafe { b.classes.read(tr as usize) }
                    } else {
                        unsafe { b.y.read((tr * dout + tc) as usize) }.to_bits()
                    };
                }
            }
            x
        }

        /// `grad[L] = dLoss / d act[L]` for the loaded elements (cross-entropy: from the row
        /// statistics in `stats`, filled by [`loss_stats_from_partials`] behind a rendezvous), with
        /// `exp` on the special-function unit and reciprocals, stored as [`rounded_operand`]s; each
        /// is also left in `staged` (shared memory, [`LossTile::staged_at`]) for
        /// [`LossTile::store_transposed`].
        /// Every gradient is computed before the first store (as far as the compiler knows, a store
        /// may change the statistics). This part takes about 4 500 cycles at tile 64 (run 116);
        /// what bounds it was not measured.
        #[inline(always)]
        unsafe fn store_grads<const P: u32>(
            &self,
            b: &MegaBuffers,
            cfg: &MegaConfig,
            lt: Layers,
            i: &Instruction,
            stats: *const f32,
            staged: u32,
        ) {
            let (dout, a_out) = (lt.dim(cfg.layers), lt.a_off(cfg.layers));
            let (inv_batch, mse_scale) = (1.0 / cfg.batch as f32, 2.0 / (cfg.batch * dout) as f32);
            let grad: [f32; LOSS_ELEMS] = core::array::from_fn(|j| {
                let (r, _, tc, live) = Self::at(cfg, i, dout, self.q, j);
                let v = self.logit[j];
                if !live {
                    0.0
                } else if cfg.loss != loss::MSE {
                    let (m, z) = unsafe { (*stats.add(r as usize), *stats.add((Self::TILE + r) as usize)) };
                    let target = (self.aux[j] == tc) as u32 as f32;
                    (math::exp_fast(v - m) * (1.0 / z) - target) * inv_batch
                } else {
                    (v - f32::from_bits(self.aux[j])) * mse_scale
                }
            });
            let (qr, qc) = Self::origin(self.q);
            for (j, &g) in grad.iter().enumerate() {
                let (r, tr, tc, live) = Self::at(cfg, i, dout, self.q, j);
                if live {
                    let g = rounded_operand::<P>(g);
                    let at = a_out + tr * pitch(dout) + tc;
                    unsafe {
                        if P == precision::BF16 {
                            store_op::<P>(b.grad_bf16.cast(), at, g);
                        } else {
                            b.grad.write(at as usize, g);
                        }
                        // (staged for the transpose only where the step keeps transposed copies;
                        // where it reads in place the buffer is the storer's, see
                        // `stores_through_tma`, and may still be read by its last store)
                        if !reads_in_place(P, Self::TILE) {
                            let (sr, sc) = (r - qr, tc % Self::TILE - qc);
                            shared::st_shared_b32(staged + Self::staged_at(sr, sc), g.to_bits());
                        }
                    }
                }
            }
        }

        /// Byte offset of quarter element (row `r`, column `c`) in the staged quarter:
        /// column-major (a column of the tile is a row of `grad_t`), each column's words rotated
        /// by XOR with the column, so that 32 lanes writing one row or reading one column hit 32
        /// banks.
        #[inline(always)]
        fn staged_at(r: u32, c: u32) -> u32 {
            4 * (c * Self::SUB + (r ^ (c % 32)))
        }

        /// `grad_t[L]` of quarter `q`, the gradients transposed, from the staged quarter (after the
        /// consumers have met behind [`LossTile::store_grads`]): thread `t` takes elements `t + j
        /// CONSUMERS` in column-major order, so a warp writes 32 neighbouring rows of `grad_t`
        /// (where writing them straight from the row-major registers cost one 32-byte segment per
        /// element: the loss tile took 10.3 us instead of 5.2, run 120).
        #[inline(always)]
        unsafe fn store_transposed<const P: u32>(
            b: &MegaBuffers,
            cfg: &MegaConfig,
            lt: Layers,
            i: &Instruction,
            staged: u32,
            q: u32,
        ) {
            let sub = Self::SUB;
            let (qr, qc) = Self::origin(q);
            let (dout, t_out) = (lt.dim(cfg.layers), lt.t_off(cfg.layers));
            for j in 0..LOSS_ELEMS {
                let e = thread::thread_idx_x() + j as u32 * CONSUMERS;
                let (c, r) = (e / sub, e % sub);
                let (tr, tc) = (i.tile_row * Self::TILE + qr + r, i.tile_col * Self::TILE + qc + c);
                if e < sub * sub && tr < cfg.batch && tc < dout {
                    let g = f32::from_bits(unsafe { shared::ld_shared_b32(staged + Self::staged_at(r, c)) });
                    unsafe { store_t::<P>(b.grad_t, cfg, t_out, tr, tc, g) };
                }
            }
        }
    }

    /// Rows of a loss tile at [`BIGGEST_TILE`] each consumer warp takes (`loss_rows`).
    const LOSS_WARP_ROWS: u32 = BIGGEST_TILE / CONSUMER_WARPS;
    /// Rows of a warp's share of a loss tile whose targets (mean squared error) are loaded at a
    /// time (`loss_rows`): 4 registers a row, the next chunk's loaded while this one's gradients
    /// are stored. (When the logits came the same way, H100 run 165: 2 rows, 8.3 us a loss tile
    /// and 0.627-0.630 ms a large step; 4 rows, 9.5 us and 0.633-0.641 ms.)
    const LOSS_CHUNK: usize = 2;

    /// A `LOSS_GRAD` tile at [`BIGGEST_TILE`] (bf16, tile 128, where the step reads its operands in
    /// place and keeps no transposed copies): `grad[L] = dLoss / d act[L]` into `grad_bf16`, from
    /// the logits the loader staged in the ring (`logits`, [`box_slot_uses`]). Each consumer warp
    /// takes [`LOSS_WARP_ROWS`] (16) whole rows of the tile, a row at a time as one conflict-free
    /// 512-byte shared read (lane `j` holds columns `4 j .. 4 j + 4`), and finds its rows'
    /// cross-entropy statistics itself from the last forward's partials
    /// ([`write_loss_partials`]): lane `j` combines every other partial of row `j / 2` and the
    /// pair of lanes combine by a shuffle; each row's class is one load, shared by shuffles.
    /// Mean squared error's targets come [`LOSS_CHUNK`] rows at a time, the next chunk's loads
    /// issued before this chunk's gradients are stored. The gradients are stored as bf16
    /// ([`rounded_operand`]), four to a lane in one 8-byte store where all four are live. (The
    /// quarter-wise `LossTile` took 15.8 us a tile here, H100 run 162; this function loading the
    /// logits from global memory itself, two rows ahead, 8.3 us, run 165.) Nothing else is
    /// staged in shared memory, so the warps never meet.
    #[inline(always)]
    unsafe fn loss_rows<const P: u32>(
        b: &MegaBuffers,
        cfg: &MegaConfig,
        lt: Layers,
        i: &Instruction,
        logits: F32Boxes,
    ) {
        const CHUNKS: usize = LOSS_WARP_ROWS as usize / LOSS_CHUNK;
        let (lane, w) = (thread::lane_id(), thread::warp_id());
        let (dout, a_out) = (lt.dim(cfg.layers), lt.a_off(cfg.layers));
        let pout = pitch(dout);
        let row0 = i.tile_row * BIGGEST_TILE + w * LOSS_WARP_ROWS;
        let col = i.tile_col * BIGGEST_TILE + 4 * lane;
        let ce = cfg.loss != loss::MSE;
        // the row statistics: lane j combines partials j % 2, j % 2 + 2, ... of row j / 2
        let (mut m, mut z) = (f32::NEG_INFINITY, 0.0f32);
        // each lane's row's class (lanes 0..16: row j), broadcast by shuffles below
        let mut class = u32::MAX;
        if ce {
            let row = row0 + lane / 2;
            let np = if row < cfg.batch { loss_partials(dout, BIGGEST_TILE) } else { 0 };
            const PARTIAL_LOADS: u32 = 8;
            let mut p0 = lane % 2;
            while p0 < np {
                let part: [[f32; 2]; PARTIAL_LOADS as usize] = core::array::from_fn(|j| {
                    let p = p0 + 2 * j as u32;
                    if p < np {
                        unsafe { b.row_stats.as_const().read2((2 * (row * np + p)) as usize) }
                    } else {
                        [f32::NEG_INFINITY, 0.0]
                    }
                });
                for q in part.iter() {
                    (m, z) = combine((m, z), (q[0], q[1]));
                }
                p0 += 2 * PARTIAL_LOADS;
            }
            (m, z) = combine((m, z), (warp::shfl_xor_f32(u32::MAX, m, 1), warp::shfl_xor_f32(u32::MAX, z, 1)));
            let own = row0 + lane % LOSS_WARP_ROWS;
            if lane < LOSS_WARP_ROWS && own < cfg.batch {
                class = unsafe { b.classes.read(own as usize) };
            }
        }
        let live = col < dout;
        // one chunk of rows' targets (mean squared error), loaded; the logits are in shared memory
        let load_y = |c: usize| -> [[f32; 4]; LOSS_CHUNK] {
            let mut y = [[0.0f32; 4]; LOSS_CHUNK];
            for (k, yk) in y.iter_mut().enumerate() {
                let r = row0 + (c * LOSS_CHUNK + k) as u32;
                if !ce && r < cfg.batch && live {
                    for (e, v) in yk.iter_mut().enumerate() {
                        if col + (e as u32) < dout {
                            *v = unsafe { b.y.read((r * dout + col + e as u32) as usize) };
                        }
                    }
                }
            }
            y
        };
        let (inv_batch, mse_scale) = (1.0 / cfg.batch as f32, 2.0 / (cfg.batch * dout) as f32);
        let mut cur = load_y(0);
        for c in 0..CHUNKS {
            let ahead = if c + 1 < CHUNKS { load_y(c + 1) } else { cur };
            for k in 0..LOSS_CHUNK {
                let j = (c * LOSS_CHUNK + k) as u32;
                let r = row0 + j;
                // (the same on every lane: a row is a warp's)
                if r >= cfg.batch {
                    continue;
                }
                // (every lane shuffles, live columns or not)
                let (rm, rz) = (warp::shfl_idx_f32(u32::MAX, m, 2 * j), warp::shfl_idx_f32(u32::MAX, z, 2 * j));
                let rc = warp::shfl_idx_u32(u32::MAX, class, j);
                if !live {
                    continue;
                }
                let x = unsafe { shared::ld_shared_v4(logits.at(r, col)) }.map(f32::from_bits);
                let g: [f32; 4] = core::array::from_fn(|e| {
                    let v = x[e];
                    let g = if ce {
                        let target = (rc == col + e as u32) as u32 as f32;
                        (math::exp_fast(v - rm) * (1.0 / rz) - target) * inv_batch
                    } else {
                        (v - cur[k][e]) * mse_scale
                    };
                    rounded_operand::<P>(g)
                });
                let at = a_out + r * pout + col;
                let bits = |e: usize| g[e].to_bits() >> 16;
                unsafe {
                    if col + 3 < dout {
                        let lo = bits(0) | bits(1) << 16;
                        let hi = bits(2) | bits(3) << 16;
                        b.grad_bf16.cast::<u64>().write((at / 4) as usize, (hi as u64) << 32 | lo as u64);
                    } else {
                        for e in 0..4 {
                            if col + (e as u32) < dout {
                                b.grad_bf16.write((at + e as u32) as usize, bits(e) as u16);
                            }
                        }
                    }
                }
            }
            cur = ahead;
        }
    }

    /// `f(row, column, [v0, v1], [s][nj])` for every pair of a group's [`Half`]: the values of
    /// columns `column` (even) and `column + 1` of a row.
    #[inline(always)]
    fn for_each_pair_in_half<const MT: usize, const NT: usize>(
        mine: &Half<MT, NT>,
        h: HalfAt,
        mut f: impl FnMut(u32, u32, [f32; 2], (usize, usize)),
    ) {
        for (s, slab) in mine.iter().enumerate() {
            for (nj, &pair) in slab.iter().enumerate() {
                let (r, col) = h.at(s, nj, 0);
                f(r, col, pair, (s, nj));
            }
        }
    }

    /// Stores the pair `v` at `p[at]`, `p[at + 1]`, columns `c` (even) and `c + 1` of a row with
    /// `cols` live columns: one 8-byte store when both are live (every row of the step starts
    /// 16-byte aligned, see [`pitch`]), the first alone when only it is.
    #[inline(always)]
    unsafe fn store_pair(p: crate::DevicePtrMut<f32>, at: u32, c: u32, cols: u32, v: [f32; 2]) {
        if c + 1 < cols {
            unsafe { p.write2(at as usize, v) };
        } else if c < cols {
            unsafe { p.write(at as usize, v[0]) };
        }
    }

    /// Loads the pair at `p[at]`, `p[at + 1]` as [`store_pair`] stores it (a dead column reads 0).
    #[inline(always)]
    unsafe fn load_pair(p: crate::DevicePtr<f32>, at: u32, c: u32, cols: u32) -> [f32; 2] {
        if c + 1 < cols {
            unsafe { p.read2(at as usize) }
        } else if c < cols {
            [unsafe { p.read(at as usize) }, 0.0]
        } else {
            [0.0; 2]
        }
    }

    /// Stores the pair `v` (row `r`, features `c`, `c + 1`, of `cols` live) into a transposed copy
    /// ([`store_t`]): two stores, one per row of the copy.
    #[inline(always)]
    unsafe fn store_t_pair<const P: u32>(
        p: crate::DevicePtrMut<f32>,
        cfg: &MegaConfig,
        t_off: u32,
        r: u32,
        c: u32,
        cols: u32,
        v: [f32; 2],
    ) {
        for (k, &x) in v.iter().enumerate() {
            if c + (k as u32) < cols {
                unsafe { store_t::<P>(p, cfg, t_off, r, c + k as u32, x) };
            }
        }
    }

    /// Stores a [`Half`] of instruction `i` (at `h`; live outputs only), a pair of columns at a
    /// time ([`store_pair`]): the forward's ReLU on hidden layers, the input gradient's ReLU
    /// derivative, the weight gradient as is, or the fused update's new weights (and
    /// velocities), the last two with the values in `pre`; each operand of a later product also
    /// into its K-major copy (hidden activations into `act_t`, gradients into `grad_t`, new
    /// weights into `w_t` and `w_op`). The last layer's forward under cross-entropy also writes its
    /// rows' partial statistics ([`write_loss_partials`]). One loop per opcode, each small enough
    /// to unroll fully (so the arrays stay in registers).
    #[inline(always)]
    unsafe fn epilogue<const MT: usize, const NT: usize, const P: u32, const L: u32>(
        b: &MegaBuffers,
        cfg: &MegaConfig,
        lt: Layers,
        i: &Instruction,
        h: HalfAt,
        mine: &Half<MT, NT>,
        pre: &Prefetched<MT, NT>,
    ) {
        let l = i.layer;
        let (din, dout) = (lt.dim(l), lt.dim(l + 1));
        let (pin, pout) = (pitch(din), pitch(dout));
        let (w_off, a_in, a_out) = (lt.w_off(l), lt.a_off(l), lt.a_off(l + 1));
        let (t_in, t_out) = (lt.t_off(l), lt.t_off(l + 1));
        let hidden = l + 1 < cfg.layers;
        // the transposed copies (none where the step reads its operands in place)
        let transposed = !reads_in_place(P, cfg.tile);
        match i.opcode {
            opcode::LINEAR_FWD => {
                if !hidden && cfg.loss != loss::MSE {
                    unsafe { write_loss_partials::<MT, NT, L>(b, cfg, dout, h, mine) };
                }
                for_each_pair_in_half(mine, h, |r: u32, c: u32, v: [f32; 2], _| {
                    if r < cfg.batch {
                        if hidden {
                            let v = v.map(|x| rounded_operand::<P>(x.max(0.0)));
                            let at = a_out + r * pout + c;
                            unsafe {
                                // (on bf16 the hidden activations are kept as bf16 only)
                                if P == precision::BF16 {
                                    store_op_pair::<P>(b.act_bf16.cast(), at, c, dout, v);
                                } else {
                                    store_pair(b.act, at, c, dout, v);
                                }
                                if transposed {
                                    store_t_pair::<P>(b.act_t, cfg, t_out, r, c, dout, v);
                                }
                            }
                        } else {
                            unsafe { store_pair(b.act, a_out + r * pout + c, c, dout, v) };
                        }
                    }
                });
            }
            opcode::LINEAR_BWD_INPUT => for_each_pair_in_half(mine, h, |r: u32, c: u32, v: [f32; 2], (s, nj)| {
                if r < cfg.batch {
                    let v: [f32; 2] =
                        core::array::from_fn(|k| if pre.x[s][nj][k] > 0.0 { rounded_operand::<P>(v[k]) } else { 0.0 });
                    let at = a_in + r * pin + c;
                    unsafe {
                        // (on bf16 the gradients are kept as bf16 only)
                        if P == precision::BF16 {
                            store_op_pair::<P>(b.grad_bf16.cast(), at, c, din, v);
                        } else {
                            store_pair(b.grad, at, c, din, v);
                        }
                        if transposed {
                            store_t_pair::<P>(b.grad_t, cfg, t_in, r, c, din, v);
                        }
                    }
                }
            }),
            opcode::LINEAR_BWD_WEIGHT => for_each_pair_in_half(mine, h, |r: u32, c: u32, v: [f32; 2], _| {
                if r < dout {
                    unsafe { store_pair(b.dw, w_off + r * pin + c, c, din, v) };
                }
            }),
            opcode::LINEAR_BWD_WEIGHT_SGD => {
                // SGD_UPDATE's arithmetic, on the accumulator instead of dW; the velocities are
                // all loaded before the first store (as far as the compiler knows, a store to
                // `weights` may change `velocity`, so interleaved loads would each wait in turn)
                let mut vel = [[[0.0f32; 2]; NT]; MT];
                if cfg.momentum != 0.0 {
                    for_each_pair_in_half(mine, h, |r: u32, c: u32, _, (s, nj)| {
                        if r < dout {
                            vel[s][nj] = unsafe { load_pair(b.velocity.as_const(), w_off + r * pin + c, c, din) };
                        }
                    });
                }
                for_each_pair_in_half(mine, h, |r: u32, c: u32, v: [f32; 2], (s, nj)| {
                    if r < dout {
                        let j = w_off + r * pin + c;
                        let step = if cfg.momentum != 0.0 {
                            let st: [f32; 2] = core::array::from_fn(|k| cfg.momentum * vel[s][nj][k] + v[k]);
                            unsafe { store_pair(b.velocity, j, c, din, st) };
                            st
                        } else {
                            v
                        };
                        let w: [f32; 2] = core::array::from_fn(|k| pre.x[s][nj][k] - cfg.lr * step[k]);
                        unsafe {
                            store_pair(b.weights, j, c, din, w);
                            store_weight_copies::<2, P>(b, cfg, lt, l, r, c, w);
                        }
                    }
                })
            }
            _ => {}
        }
    }

    /// The epilogue of column half `C` of a warp's accumulators on [`layout::ROWS`] (`d`, 16
    /// rows by 128 columns): its [`Half`] (columns `64 C ..`), that half's [`Prefetched`] values,
    /// loaded now, and [`epilogue`]. `C` is a constant, so that every index into `d` is one and the
    /// accumulators stay in registers.
    #[inline(always)]
    unsafe fn rows_epilogue<const MT: usize, const NT: usize, const P: u32, const L: u32, const C: usize>(
        b: &MegaBuffers,
        cfg: &MegaConfig,
        lt: Layers,
        i: &Instruction,
        d: &[f32; 64],
    ) {
        // accumulator 4 j + 2 s + c is row 8 s, column 8 j + c of the lane's ([`wgmma::acc_m64`])
        let mine: Half<MT, NT> = core::array::from_fn(|s| {
            core::array::from_fn(|nj| core::array::from_fn(|c| d[4 * (NT * C + nj) + 2 * s + c]))
        });
        let h = HalfAt::new::<MT, NT, L>(cfg, i, C as u32);
        let mut pre = Prefetched::<MT, NT>::new();
        // (a fused update never gets here: the only kernel of this layout stages it)
        if i.opcode == opcode::LINEAR_BWD_INPUT {
            unsafe { pre.load_act::<P>(b, cfg, lt, i, h) };
        }
        unsafe { epilogue::<MT, NT, P, L>(b, cfg, lt, i, h, &mine, &pre) };
    }

    /// f32 boxes staged in the ring ([`box_slot_uses`]: a loss tile's logits): box `j` (columns
    /// `n0 + 32 j ..` of the tile at `(m0, n0)`) in the slot of use `u + j`, its rows of 128 bytes
    /// 128-byte swizzled.
    #[derive(Clone, Copy)]
    struct F32Boxes {
        sm: Smem,
        u: u32,
        m0: u32,
        n0: u32,
    }

    impl F32Boxes {
        /// The shared address of element (row `r`, column `c`) of the matrix (`r`, `c` inside the
        /// tile).
        #[inline(always)]
        fn at(self, r: u32, c: u32) -> u32 {
            let (rt, ct) = (r - self.m0, c - self.n0);
            let slot = self.sm.a_page(page_slot(self.u + ct / F32_BOX_COLS));
            slot + f32_box_offset(rt, ct)
        }
    }

    /// Writes a warp's share of a staged tile ([`stores_through_tma`]; its accumulators `d` on
    /// [`layout::ROWS`]: warp `w` of group `g` holds rows `64 g + 16 w ..` of the tile, all 128
    /// columns, [`wgmma::acc_m64`]) into the staging buffer at `stage`, as the bf16 operands
    /// later products read ([`rounded_operand`], two columns in one 4-byte store, at
    /// [`staged_offset`]): the forward's ReLU, or (`BWD`) the input gradient where the ReLU mask
    /// that the storer put in the same place (`act[l]`, bf16) is positive, else 0. Each lane
    /// reads the mask at exactly the words it then overwrites, so no other thread's stores race
    /// with its reads. Rows and columns past the matrix are written too (the mask there is TMA's
    /// zero fill): the tensor map's bounds clip them from the store.
    #[inline(always)]
    unsafe fn stage_tile<const BWD: bool>(stage: u32, d: &[f32; 64]) {
        let (lane, w, g) = (thread::lane_id(), thread::warp_id() % GROUP_WARPS, thread::warp_id() / GROUP_WARPS);
        let r0 = 64 * g + 16 * w + lane / 4;
        for j in 0..16 {
            for s in 0..2 {
                let (r, c) = (r0 + 8 * s as u32, 8 * j as u32 + 2 * (lane % 4));
                let at = stage + staged_offset(r, c);
                let (x0, x1) = (d[4 * j + 2 * s], d[4 * j + 2 * s + 1]);
                let v = if BWD {
                    let mask = unsafe { shared::ld_shared_b32(at) };
                    let on = |bits: u32| f32::from_bits(bits) > 0.0;
                    [if on(mask << 16) { x0 } else { 0.0 }, if on(mask & 0xffff_0000) { x1 } else { 0.0 }]
                } else {
                    [x0.max(0.0), x1.max(0.0)]
                };
                let bits = |x: f32| convert::f32_to_bf16_bits(x) as u32;
                unsafe { shared::st_shared_b32(at, bits(v[1]) << 16 | bits(v[0])) };
            }
        }
    }

    /// Applies a staged fused update ([`staged`]: the weight gradient `d` of instruction `i`, a
    /// warp's share of it on [`layout::ROWS`] as in [`stage_tile`]): reads the old weights where
    /// the loader put them (the weight buffer, [`map::WEIGHTS`] boxes: element (row `r`, column
    /// `c`) of the tile in box `c / 32`, row `r` 128 bytes at `128 r` whose 16-byte chunks are
    /// XORed with `r % 8`), writes the new ones back in their place (f32, for the storer's store of
    /// `weights`) and, rounded to bf16 ([`rounded_operand`]), into the staging buffer (the storer
    /// stores it into the next step's `w_op`). With momentum the velocities are read and written
    /// in global memory, half the columns at a time (all of a half's loads first: a store to
    /// `velocity` between them would, as far as the compiler knows, wait for each in turn). The
    /// tile's rows and columns past the matrix are written too: the loads read them as TMA's zero
    /// fill, and the tensor maps' bounds clip them from the stores.
    #[inline(always)]
    unsafe fn stage_update(b: &MegaBuffers, cfg: &MegaConfig, lt: Layers, i: &Instruction, sm: Smem, d: &[f32; 64]) {
        unsafe {
            stage_update_half::<0>(b, cfg, lt, i, sm, d);
            stage_update_half::<1>(b, cfg, lt, i, sm, d);
        }
    }

    /// [`stage_update`] of the columns `64 H ..` of the warp's rows. `H` is a constant, so that
    /// every index into `d` is one and the accumulators stay in registers.
    #[inline(always)]
    unsafe fn stage_update_half<const H: usize>(
        b: &MegaBuffers,
        cfg: &MegaConfig,
        lt: Layers,
        i: &Instruction,
        sm: Smem,
        d: &[f32; 64],
    ) {
        let (lane, w, g) = (thread::lane_id(), thread::warp_id() % GROUP_WARPS, thread::warp_id() / GROUP_WARPS);
        let r0 = 64 * g + 16 * w + lane / 4;
        let l = i.layer;
        let (din, dout, w_off) = (lt.dim(l), lt.dim(l + 1), lt.w_off(l));
        let (m0, n0) = (i.tile_row * BIGGEST_TILE, i.tile_col * BIGGEST_TILE);
        let momentum = cfg.momentum != 0.0;
        // (row, column) in the tile of a lane's pair `s` of accumulator column block `j`
        let at = |j: usize, s: usize| (r0 + 8 * s as u32, 8 * j as u32 + 2 * (lane % 4));
        // the velocities' element index of a tile position, and whether it is in the matrix
        let vel_at = |r: u32, c: u32| (w_off + (m0 + r) * pitch(din) + n0 + c, m0 + r < dout);
        let mut vel = [[0.0f32; 2]; 16];
        if momentum {
            for jj in 0..8 {
                for s in 0..2 {
                    let (r, c) = at(8 * H + jj, s);
                    let (v, live) = vel_at(r, c);
                    if live {
                        vel[2 * jj + s] = unsafe { load_pair(b.velocity.as_const(), v, n0 + c, din) };
                    }
                }
            }
        }
        for jj in 0..8 {
            for s in 0..2 {
                let j = 8 * H + jj;
                let (r, c) = at(j, s);
                let grad = [d[4 * j + 2 * s], d[4 * j + 2 * s + 1]];
                let step = if momentum {
                    let st: [f32; 2] = core::array::from_fn(|k| cfg.momentum * vel[2 * jj + s][k] + grad[k]);
                    let (v, live) = vel_at(r, c);
                    if live {
                        unsafe { store_pair(b.velocity, v, n0 + c, din, st) };
                    }
                    st
                } else {
                    grad
                };
                let f32_at = sm.weights + (c / F32_BOX_COLS) * F32_BOX_BYTES + f32_box_offset(r, c);
                let old = unsafe { shared::ld_shared_v2(f32_at) }.map(f32::from_bits);
                let new: [f32; 2] = core::array::from_fn(|k| old[k] - cfg.lr * step[k]);
                unsafe { shared::st_shared_v2(f32_at, new.map(f32::to_bits)) };
                let bits = |x: f32| rounded_operand::<{ precision::BF16 }>(x).to_bits() >> 16;
                unsafe { shared::st_shared_b32(sm.staging() + staged_offset(r, c), bits(new[1]) << 16 | bits(new[0])) };
            }
        }
    }

    /// The storer (one thread; kernels that [`stores_through_tma`]): for each staged instruction
    /// of `lo..hi` ([`staged`]), in order:
    /// - on an input gradient, puts its ReLU mask (`act[l]` at the output tile, through layer
    ///   `l`'s [`map::ACT`]) into the staging buffer with TMA, completing *mask ready*: the
    ///   buffer is free, since the storer itself is the one that frees it (its stores of the last
    ///   staged tile have read it) and the consumers write it only after *stage free* or the
    ///   mask. First it acquires the instruction's dependency counter, as the loader does for the
    ///   pages (the forward that wrote `act[l]` precedes the gradients it waits for);
    /// - waits for the consumers to stage the tile ([`stage_tile`]);
    /// - stores its two boxes with TMA (`act[l + 1]` through layer `l + 1`'s [`map::ACT`], or
    ///   `grad[l]` through layer `l - 1`'s [`map::GRAD`]: the maps the products read them with;
    ///   a fused update's rounded weights through [`map::W_NEXT`], and its f32 weights from the
    ///   weight buffer through [`map::WEIGHTS`]), frees the buffer (*stage free*, and *weights
    ///   free*) as soon as the stores have read it, and once they are written fences them for the
    ///   other proxies and signals the instruction's counters (what the consumers do themselves
    ///   for other instructions; a fused update has none: the next step reads its weights).
    ///
    /// (Until run 158 the loader loaded the masks, after waiting for *stage free* of the tile
    /// before: a loader running two staged tiles ahead of the stores, as small K allows, would
    /// wait on a parity two phases ahead of the barrier and pass at once. The storer never
    /// runs ahead of its own frees.) Gives up (recording the stall as the storer's) when a wait
    /// passes the step's limit or another block aborts; a mask it loaded lands before it returns.
    #[inline(always)]
    unsafe fn store_tiles(b: &MegaBuffers, cfg: &MegaConfig, sm: Smem, lo: u32, hi: u32) {
        let (mut stages, mut masks) = (0u32, 0u32);
        let mut idx = lo;
        let mut next = unsafe { prefetch(b, lo, hi) };
        while idx < hi {
            let ins = next;
            next = unsafe { prefetch(b, idx + 1, hi) };
            if staged(ins.opcode, ins.layer, cfg.layers) {
                let l = ins.layer;
                let (m0, n0) = (ins.tile_row * BIGGEST_TILE, ins.tile_col * BIGGEST_TILE);
                if ins.opcode == opcode::LINEAR_BWD_INPUT {
                    if !unsafe { wait(b, cfg, ins.wait, ins.wait_value, idx, STORER) } {
                        return;
                    }
                    // the producers' generic stores were acquired above; TMA reads them next
                    fence::proxy_async_global();
                    let act = unsafe { b.maps.as_ptr().add((map::PER_LAYER * l + map::ACT) as usize) };
                    unsafe { mbarrier::arrive_expect_tx(sm.mask_ready(), 2 * STAGE_BOX_BYTES) };
                    let mut j = 0;
                    while j < 2 {
                        let dst = sm.staging() + j * STAGE_BOX_BYTES;
                        unsafe { tma::load_2d(dst, act, (n0 + j * MN_BOX) as i32, m0 as i32, sm.mask_ready()) };
                        j += 1;
                    }
                    masks += 1;
                }
                let parity = page_parity(stages);
                if !unsafe { bounded_wait(b, cfg, sm.staged(), parity) } {
                    unsafe { record_stall(b, cfg, STORER, idx, PAGE_TAG | STAGED << 16, parity, stages) };
                    if masks > 0 {
                        // let the last mask land before the block may exit
                        let last = page_parity(masks - 1);
                        let _ = unsafe { mbarrier::wait_parity_bounded(sm.mask_ready(), last, 10_000_000) };
                    }
                    return;
                }
                let update = ins.opcode == opcode::LINEAR_BWD_WEIGHT_SGD;
                let at = match ins.opcode {
                    opcode::LINEAR_FWD => map::PER_LAYER * (l + 1) + map::ACT,
                    opcode::LINEAR_BWD_INPUT => map::PER_LAYER * (l - 1) + map::GRAD,
                    _ => map::PER_LAYER * l + map::W_NEXT,
                };
                let out = unsafe { b.maps.as_ptr().add(at as usize) };
                let mut j = 0;
                while j < 2 {
                    let src = sm.staging() + j * STAGE_BOX_BYTES;
                    unsafe { tma::store_2d(out, (n0 + j * MN_BOX) as i32, m0 as i32, src) };
                    j += 1;
                }
                if update {
                    // the new f32 weights, from the weight buffer
                    let out = unsafe { b.maps.as_ptr().add((map::PER_LAYER * l + map::WEIGHTS) as usize) };
                    let mut j = 0;
                    while j < BIGGEST_TILE / F32_BOX_COLS {
                        let src = sm.weights + j * F32_BOX_BYTES;
                        unsafe { tma::store_2d(out, (n0 + j * F32_BOX_COLS) as i32, m0 as i32, src) };
                        j += 1;
                    }
                }
                tma::commit_group();
                tma::wait_group_read::<0>();
                unsafe { mbarrier::arrive(sm.stage_free()) };
                if update {
                    unsafe { mbarrier::arrive(sm.weights_free()) };
                }
                tma::wait_group::<0>();
                // the async proxy wrote the tile; the next readers acquire it through the counters
                fence::proxy_async_global();
                unsafe {
                    signal(b, &ins);
                    stamp(b, idx, trace::SIGNALED);
                }
                stages += 1;
            }
            idx += 1;
        }
    }

    /// The consumers: every instruction of `lo..hi` in order (see the module docs). Each warp
    /// accumulates `MT x NT` `m16n8` tiles (on [`layout::ROWS`], where a warp's 64 accumulators
    /// are two [`Half`]s, `MT x NT` is the shape of one); `TM` is the tile edge over 32 (the loss
    /// tile's, as a constant); `P`: the [`precision`] code; `L`: the [`layout`], whose products
    /// run on [`tile_mma`], [`tile_wgmma`] or [`tile_wgmma_rows`].
    #[inline(always)]
    unsafe fn consume<const MT: usize, const NT: usize, const TM: usize, const P: u32, const L: u32>(
        b: &MegaBuffers,
        cfg: &MegaConfig,
        sm: Smem,
        lt: Layers,
        lo: u32,
        hi: u32,
    ) {
        if cfg.tile != 32 * TM as u32 || cfg.precision != P {
            // an instantiation for another tile or data path (the host picked the wrong kernel;
            // the loader's page extents follow `cfg.precision`): fail the launch
            thread::trap();
        }
        let t = thread::thread_idx_x();
        let go = shared::dynamic_smem::<u32>(GO as usize);
        let stats = shared::dynamic_smem::<f32>(STATS as usize);
        let (mut u, mut phase, mut products) = (0u32, 0u32, 0u32);
        // tiles staged for the storer, ReLU masks taken from the staging buffer and staged
        // updates (`stores_through_tma`): the storer counts the same, the loader the updates
        let (mut stages, mut masks, mut updates) = (0u32, 0u32, 0u32);
        let group = thread::warp_id() / GROUP_WARPS;
        let mut acc = [[[0.0f32; 4]; NT]; MT];
        let mut idx = lo;
        let mut next = unsafe { prefetch(b, lo, hi) };
        // Set once this warp has given the step up. It then walks the rest of its list without
        // waiting, storing or meeting, but still runs every product's page walk, which only
        // drains (see `group_pages`): on the wgmma path its group's other warps, which may have
        // passed the meeting it gave up at, issue the same warpgroup products as it, however far
        // they get.
        let mut abandoned = false;
        // the give-up test's planted fault at the publishing meetings (`give_up::PUBLISH`)
        let planted = thread::warp_id() + 1 == cfg.give_up_warp
            && cfg.give_up_at == give_up::PUBLISH
            && thread::block_idx_x() == 0;
        macro_rules! abandon {
            () => {{
                abandoned = true;
                idx += 1;
                continue;
            }};
        }
        while idx < hi {
            let ins = next;
            next = unsafe { prefetch(b, idx + 1, hi) };
            if t == 0 {
                unsafe { stamp(b, idx, trace::START) };
            }
            let product = product::<TM, P>(cfg, lt, &ins);
            let is_product = product.is_some();
            if abandoned && !is_product {
                // (its boxes' ring uses counted, as a drained walk counts a product's pages)
                u += box_slot_uses(ins.opcode, P, 32 * TM as u32);
                idx += 1;
                continue;
            }
            if let Some(p) = product
                && L == layout::ROWS
            {
                // The warp's 64 accumulators (`acc` is `[2][8]` `m16n8` tiles, 64 f32) hold its
                // 16 rows, all 128 columns: no sums to exchange. Its two column halves are two
                // [`Half`]s, each with its own prefetch (see [`Prefetched`]) and epilogue.
                if MT != 2 || NT != 8 || TM != 4 {
                    // only the tile-128 kernel takes this layout
                    thread::trap();
                }
                // SAFETY (of the cast): [[[f32; 4]; 8]; 2] and [f32; 64] have the same layout.
                let d = unsafe { &mut *(&mut acc as *mut [[[f32; 4]; NT]; MT] as *mut [f32; 64]) };
                let pages = Pages { b, cfg, sm, p: &p, u: &mut u, idx, abandoned };
                if !unsafe { tile_wgmma_rows(pages, d, &mut || {}) } {
                    abandon!();
                }
                if t == 0 {
                    unsafe { stamp(b, idx, trace::WORK_DONE) };
                }
                if stores_through_tma(P, 32 * TM as u32) && staged(ins.opcode, ins.layer, cfg.layers) {
                    // Hand the tile to the storer: wait until the staging buffer is free (the
                    // storer has read the last staged tile out of it) or, on an input gradient,
                    // holds this tile's ReLU mask (which the storer loads only into a free
                    // buffer); write the tile's bf16 outputs there; fence them for the async
                    // proxy and arrive. The storer writes and publishes the tile; the consumers
                    // go straight on to the next instruction.
                    // (An input gradient's mask implies the buffer was freed, since the storer
                    // loads it only then; its consumers still wait for *stage free* too, which
                    // returns at once, so that every phase of that barrier is waited for before
                    // the storer completes the next: compute-sanitizer's synccheck reports a
                    // phase completed over one nobody waited for, "Missing wait", run 160.)
                    // (A staged update also waits for its old weights, which the loader loaded
                    // into the weight buffer: `load_weights`.)
                    let bwd = ins.opcode == opcode::LINEAR_BWD_INPUT;
                    let update = ins.opcode == opcode::LINEAR_BWD_WEIGHT_SGD;
                    let (bar, n, kind) = if bwd {
                        (sm.mask_ready(), masks, MASK_READY)
                    } else {
                        (sm.stage_free(), stages.wrapping_sub(1), STAGE_FREE)
                    };
                    let mut ok = (!bwd && stages == 0) || unsafe { bounded_wait(b, cfg, bar, page_parity(n)) };
                    if ok && bwd && stages > 0 {
                        // (returns at once: see above)
                        let last = stages - 1;
                        ok = unsafe { bounded_wait(b, cfg, sm.stage_free(), page_parity(last)) };
                    }
                    let (mut kind, mut n) = (kind, n);
                    if ok && update {
                        (kind, n) = (WEIGHTS_READY, updates);
                        ok = unsafe { bounded_wait(b, cfg, sm.weights_ready(), page_parity(updates)) };
                    }
                    if !warp::all(u32::MAX, ok) {
                        if thread::lane_id() == 0 {
                            unsafe { record_stall(b, cfg, CONSUMER, idx, PAGE_TAG | kind << 16, page_parity(n), n) };
                        }
                        abandon!();
                    }
                    unsafe {
                        if bwd {
                            stage_tile::<true>(sm.staging(), d);
                        } else if update {
                            stage_update(b, cfg, lt, &ins, sm, d);
                        } else {
                            stage_tile::<false>(sm.staging(), d);
                        }
                    }
                    fence::proxy_async_shared_cta();
                    unsafe { mbarrier::arrive(sm.staged()) };
                    masks += bwd as u32;
                    updates += update as u32;
                    stages += 1;
                    if planted {
                        // the give-up test's warp: arrived (the others go on), then gives up
                        if thread::lane_id() == 0 {
                            let parity = page_parity(stages - 1);
                            unsafe { record_stall(b, cfg, CONSUMER, idx, PAGE_TAG | STAGED << 16, parity, stages - 1) };
                        }
                        abandon!();
                    }
                    if t == 0 {
                        unsafe { stamp(b, idx, trace::STORED) };
                    }
                    idx += 1;
                    continue;
                }
                unsafe {
                    rows_epilogue::<MT, NT, P, L, 0>(b, cfg, lt, &ins, d);
                    rows_epilogue::<MT, NT, P, L, 1>(b, cfg, lt, &ins, d);
                }
            } else if let Some(p) = product {
                let h = HalfAt::new::<MT, NT, L>(cfg, &ins, 0);
                let mut pre = Prefetched::<MT, NT>::new();
                if ins.opcode == opcode::LINEAR_BWD_WEIGHT_SGD {
                    unsafe { pre.load_weights(b, lt, &ins, h) };
                }
                let mut on_first = || {
                    if ins.opcode == opcode::LINEAR_BWD_INPUT {
                        unsafe { pre.load_act::<P>(b, cfg, lt, &ins, h) };
                    }
                };
                let f = &mut on_first;
                let pages = Pages { b, cfg, sm, p: &p, u: &mut u, idx, abandoned };
                let ok = unsafe {
                    if L == layout::WIDE {
                        tile_wgmma::<MT, NT, P>(pages, &mut acc, f)
                    } else {
                        tile_mma::<MT, NT, TM, P>(pages, &mut acc, f)
                    }
                };
                if !ok {
                    abandon!();
                }
                // Each group finishes its [`Half`] of the warp's square: it leaves the other
                // half's sums in its region of a shared-memory buffer, the groups meet, and each
                // adds the other's sums to its own half. The buffers alternate per product, so a
                // group may write the next product's while the other still reads these (it cannot
                // get two products ahead: the groups meet here every product).
                let sums = sm.sums(products);
                products += 1;
                let j = t % (32 * GROUP_WARPS);
                let at = |g: u32, n: usize| sums + 4 * ((g * 2 * (MT * NT) as u32 + n as u32) * 32 * GROUP_WARPS + j);
                let theirs = half::<MT, NT>(&acc, 1 - group);
                let mut mine = half::<MT, NT>(&acc, group);
                for (n, &v) in theirs.as_flattened().as_flattened().iter().enumerate() {
                    unsafe { shared::st_shared_b32(at(group, n), v.to_bits()) };
                }
                if !unsafe { rendezvous(b, cfg, sm, &mut phase, idx) } {
                    abandon!();
                }
                for (n, v) in mine.as_flattened_mut().as_flattened_mut().iter_mut().enumerate() {
                    *v += f32::from_bits(unsafe { shared::ld_shared_b32(at(1 - group, n)) });
                }
                if p.pages <= group && ins.opcode == opcode::LINEAR_BWD_INPUT {
                    // A group with no page of its own (k of one page) never ran `on_first`; the
                    // rendezvous just met orders its loads after the other group's first page.
                    unsafe { pre.load_act::<P>(b, cfg, lt, &ins, h) };
                }
                if t == 0 {
                    unsafe { stamp(b, idx, trace::WORK_DONE) };
                }
                unsafe { epilogue::<MT, NT, P, L>(b, cfg, lt, &ins, h, &mine, &pre) };
            } else {
                // f32 boxes the loader stages for this instruction (see `box_slot_uses`): the
                // loader acquired its dependencies before issuing them, so their arrival is the
                // consumers' wait
                let boxes = box_slot_uses(ins.opcode, P, 32 * TM as u32);
                if boxes == 0 {
                    if t == 0 {
                        let ok = unsafe {
                            wait(b, cfg, ins.wait, ins.wait_value, idx, CONSUMER)
                                && wait(b, cfg, ins.wait2, ins.wait2_value, idx, CONSUMER)
                        };
                        if ok {
                            unsafe { stamp(b, idx, trace::FIRST) };
                        }
                        unsafe { *go = ok as u32 };
                    }
                    if !unsafe { rendezvous(b, cfg, sm, &mut phase, idx) } || unsafe { *go } == 0 {
                        abandon!();
                    }
                }
                let done = match ins.opcode {
                    opcode::LOSS_GRAD if boxes > 0 => unsafe {
                        // the logits' boxes; then each warp's rows (shuffles in `loss_rows` need
                        // every lane: rows and columns are warp-uniform there, so none has left)
                        let c0 = thread::clock64();
                        let mut ok = true;
                        let mut v = u;
                        while v < u + boxes {
                            ok &= bounded_wait(b, cfg, sm.ready(page_slot(v)), ready_parity(v));
                            v += 1;
                        }
                        let ok = warp::all(u32::MAX, ok);
                        let c1 = thread::clock64();
                        if ok {
                            if t == 0 {
                                stamp(b, idx, trace::FIRST);
                            }
                            let (m0, n0) = (ins.tile_row * BIGGEST_TILE, ins.tile_col * BIGGEST_TILE);
                            loss_rows::<P>(b, cfg, lt, &ins, F32Boxes { sm, u, m0, n0 });
                            free_pages(sm, u, boxes);
                        } else {
                            record_page_stall(b, cfg, idx, u);
                        }
                        u += boxes;
                        if t == 0 {
                            record(b, idx, trace::READY_WAIT_CLK, c1 - c0);
                            record(b, idx, trace::WORK_CLK, thread::clock64() - c0);
                        }
                        ok
                    },
                    opcode::LOSS_GRAD => unsafe {
                        let (c0, mut met) = (thread::clock64(), 0u64);
                        let mut done = true;
                        // every global load of the tile (its logits and targets, then the row
                        // partials) in flight together: one round trip to L2
                        let mut tile_loss = LossTile::<TM>::load(b, cfg, lt, &ins, 0);
                        if cfg.loss != loss::MSE {
                            loss_stats_from_partials::<TM>(b, cfg, lt, &ins, stats);
                            let m0 = thread::clock64();
                            done = rendezvous(b, cfg, sm, &mut phase, idx);
                            met = thread::clock64() - m0;
                        }
                        // the gradients, and their transposed copy through shared memory (the sums
                        // buffers: idle between products, and the meeting before this tile's
                        // signal keeps the next product's sums from overwriting them early), a
                        // quarter at a time, alternating buffers: quarter q + 2 overwrites
                        // quarter q's only after the meeting behind quarter q + 1's gradients,
                        // which every thread reaches after its share of quarter q's transpose.
                        // Where the step keeps no transposed copies (tile 128: the only tile of
                        // several quarters) nothing is staged, so the quarters need no meeting.
                        // (Loading the next quarter before this one's gradients, to hide its
                        // round trip, made ptxas spill in the products' epilogues: 400 bytes
                        // against 160.)
                        let quarters = LossTile::<TM>::QUARTERS;
                        let transposes = !reads_in_place(P, LossTile::<TM>::TILE);
                        let mut q = 0;
                        while done && q < quarters {
                            let staged = sm.sums(q);
                            tile_loss.store_grads::<P>(b, cfg, lt, &ins, stats, staged);
                            if transposes {
                                done = rendezvous(b, cfg, sm, &mut phase, idx);
                                if done {
                                    LossTile::<TM>::store_transposed::<P>(b, cfg, lt, &ins, staged, q);
                                }
                            }
                            q += 1;
                            if q < quarters {
                                tile_loss = LossTile::<TM>::load(b, cfg, lt, &ins, q);
                            }
                        }
                        if t == 0 {
                            record(b, idx, trace::READY_WAIT_CLK, met);
                            record(b, idx, trace::WORK_CLK, thread::clock64() - c0);
                        }
                        done
                    },
                    opcode::SGD_UPDATE => {
                        let copies = |o, k, w| unsafe { store_weight_copies::<1, P>(b, cfg, lt, ins.layer, o, k, [w]) };
                        unsafe { sgd_update(b, cfg, &ins, cfg.tile, CONSUMERS, t, copies) };
                        true
                    }
                    _ => true,
                };
                if !done {
                    abandon!();
                }
                if t == 0 {
                    unsafe { stamp(b, idx, trace::WORK_DONE) };
                }
            }
            if t == 0 {
                unsafe { stamp(b, idx, trace::STORED) };
            }
            // A product nobody waits for (a fused update: its weights are read next by the next
            // launch) publishes nothing; the others fence for the async proxy (another block's TMA
            // may read these stores next), meet, and signal. Element-wise instructions always meet
            // (they share the "go" word and the statistics in shared memory).
            let signals = ins.signal != NO_COUNTER || ins.signal2 != NO_COUNTER;
            if signals || !is_product {
                fence::proxy_async_global();
                if !unsafe { rendezvous_or_plant(b, cfg, sm, &mut phase, idx, planted) } {
                    abandon!();
                }
            }
            if t == 0 {
                if signals {
                    unsafe { signal(b, &ins) };
                }
                unsafe { stamp(b, idx, trace::SIGNALED) };
            }
            idx += 1;
        }
    }

    /// A kernel's body: barriers initialized by thread 0, then the loader and the consumers, which
    /// multiply with [`consume`]`::<MT, NT, TM, P, L>` (one instantiation per kernel).
    #[inline(always)]
    pub(super) unsafe fn run<const MT: usize, const NT: usize, const TM: usize, const P: u32, const L: u32>(
        b: &MegaBuffers,
        cfg: &MegaConfig,
    ) {
        let base = shared::dynamic_smem_addr();
        let sm = Smem { base, weights: base + super::weight_buffer_offset(cfg.layers) };
        if sm.base % 1024 != 0 {
            thread::trap();
        }
        if thread::thread_idx_x() == 0 {
            let mut s = 0;
            while s < PAGE_STAGES {
                unsafe {
                    mbarrier::init(sm.ready(s), PAGE_READY_ARRIVALS);
                    mbarrier::init(sm.free(s), page_free_arrivals(32 * TM as u32) + cfg.extra_free_arrivals);
                }
                s += 1;
            }
            unsafe {
                mbarrier::init(sm.rendezvous(), CONSUMERS);
                mbarrier::init(sm.drained(), 1);
                mbarrier::init(sm.staged(), CONSUMERS);
                mbarrier::init(sm.stage_free(), 1);
                mbarrier::init(sm.mask_ready(), PAGE_READY_ARRIVALS);
                mbarrier::init(sm.weights_ready(), PAGE_READY_ARRIVALS);
                mbarrier::init(sm.weights_free(), 1);
            }
            fence::mbarrier_init_release_cluster();
        }
        let lt = Layers::new(cfg);
        unsafe { lt.fill(b) };
        crate::sync::sync_threads();
        let block = thread::block_idx_x();
        let (lo, hi) = unsafe { (b.sm_offsets.read(block as usize), b.sm_offsets.read(block as usize + 1)) };
        if thread::warp_id() >= CONSUMER_WARPS {
            if thread::lane_id() == 0 {
                if thread::warp_id() == CONSUMER_WARPS {
                    unsafe { load_pages::<TM, P>(b, cfg, sm, lt, lo, hi) };
                } else if stores_through_tma(P, 32 * TM as u32) {
                    unsafe { store_tiles(b, cfg, sm, lo, hi) };
                }
            }
            return;
        }
        unsafe { consume::<MT, NT, TM, P, L>(b, cfg, sm, lt, lo, hi) }
    }
}

// One training step on the tensor-core data path (see the module docs), one kernel per tile and
// precision: each holds only its own consumers' code. (With the four in one kernel, picked by a
// `match` on `cfg`, the medium model's step took 0.130-0.132 ms against 0.125 for the tf32 tile-64
// consumers alone, H200 run 133: about 18 500 SASS instructions against 6 600.) Grid: one block per SM; block
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

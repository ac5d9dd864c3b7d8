// Included in `mod dev` (see `mod.rs`). The device's view of the block's shared memory: the
// ring's pages and barriers, the sums and staging buffers and the weight buffer at the offsets
// `mod.rs` lays out ([`Smem`]), and the block's copy of the layer table ([`Layers`]).

/// The block's dynamic shared memory (see the constants in `mod.rs` for its layout).
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

// Included in `mod dev` (see `mod.rs`). Loss tiles (`LOSS_GRAD`): the last forward's row
// partials ([`write_loss_partials`]), and the loss gradient, a quarter at a time up to tile 64
// ([`LossTile`]) or a warp per 16 whole rows from the logits the loader staged in the ring at
// tile 128 ([`loss_rows`], [`F32Boxes`]).

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
/// staged through one sums buffer as a tile 64 is; the tile-128 kernel takes [`loss_rows`]
/// instead, and only its compiled-away arm still names quarters). Element `j`
/// is `e = t + j CONSUMERS` of the quarter (row `e / sub`, column `e % sub` of it, so a warp
/// reads 32 neighbouring logits), with its logit and, as loaded, its row's class
/// (cross-entropy) or its target's bits (mean squared error). Only loads, nothing that uses
/// them, so that all of them (and the row partials' loads behind them,
/// [`loss_stats_from_partials`]) can be in flight at once. The tile edge is a constant
/// ([`LossTile::TILE`]): integer divisions by a run-time edge in every element's index cost the
/// loss tile more than the order of its loads does.
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
    /// may change the statistics).
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
    /// (writing them straight from the row-major registers would cost one 32-byte segment per
    /// element).
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
/// are stored. (2 rows measured faster than 4.)
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
/// ([`rounded_operand`]), four to a lane in one 8-byte store where all four are live. (It
/// replaced the quarter-wise `LossTile` at this tile, which was about twice as slow.) Nothing
/// else is staged in shared memory, so the warps never meet.
#[inline(always)]
unsafe fn loss_rows<const P: u32>(b: &MegaBuffers, cfg: &MegaConfig, lt: Layers, i: &Instruction, logits: F32Boxes) {
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

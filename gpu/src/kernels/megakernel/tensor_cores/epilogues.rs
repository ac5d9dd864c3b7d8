// Included in `mod dev` (see `mod.rs`). What the consumers do with a product's sums: a group's
// [`Half`] of a warp's accumulators and where it sits ([`HalfAt`]), the global values an epilogue
// needs, loaded early ([`Prefetched`]), and the epilogues (ReLU, the ReLU derivative, the weight
// gradient, the fused update), stored directly ([`epilogue`], [`rows_epilogue`]) or staged for the
// storer ([`stage_tile`], [`stage_update`]).

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
    let mine: Half<MT, NT> =
        core::array::from_fn(|s| core::array::from_fn(|nj| core::array::from_fn(|c| d[4 * (NT * C + nj) + 2 * s + c])));
    let h = HalfAt::new::<MT, NT, L>(cfg, i, C as u32);
    let mut pre = Prefetched::<MT, NT>::new();
    // (a fused update never gets here: the only kernel of this layout stages it)
    if i.opcode == opcode::LINEAR_BWD_INPUT {
        unsafe { pre.load_act::<P>(b, cfg, lt, i, h) };
    }
    unsafe { epilogue::<MT, NT, P, L>(b, cfg, lt, i, h, &mine, &pre) };
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

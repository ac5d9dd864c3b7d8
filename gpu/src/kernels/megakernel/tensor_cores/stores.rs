// Included in `mod dev` (see `mod.rs`). How the consumers store outputs: rounded to what later
// products read ([`rounded_operand`]), as f32 or bf16 ([`store_op`]), in pairs, and into the
// copies those products read K-major (the transposed activations and gradients, the weights'
// copies).

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

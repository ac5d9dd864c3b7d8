//! Naive attention in f64: `S = scale Q K^T`, the mask, a row softmax `P`, `O = P V`, and the
//! gradients of `O` by the formulas FlashAttention's backward computes:
//!
//! ```text
//! dV = P^T dO      dP = dO V^T      D_i = sum_j P_ij dP_ij (= dO_i . O_i)
//! dS = P * (dP - D)      dQ = scale dS K      dK = scale dS^T Q
//! ```

use super::AttentionParams;

/// The forward pass's outputs.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionOut {
    /// `[batch, heads, q_len, head_dim]`.
    pub o: Vec<f64>,
    /// `[batch, heads, q_len]`: `ln sum_j exp(s_ij)` over the visible keys, `-inf` where none is.
    pub lse: Vec<f64>,
}

/// The backward pass's outputs, each the shape of its input.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionGrads {
    /// The gradient of Q.
    pub dq: Vec<f64>,
    /// The gradient of K.
    pub dk: Vec<f64>,
    /// The gradient of V.
    pub dv: Vec<f64>,
}

/// The sizes `(q, kv, lse)` of the buffers of `p`.
fn sizes(p: &AttentionParams) -> (usize, usize, usize) {
    let bh = p.batch as usize * p.heads as usize;
    let d = p.head_dim as usize;
    (bh * p.q_len as usize * d, bh * p.kv_len as usize * d, bh * p.q_len as usize)
}

fn check(p: &AttentionParams, q: &[f64], k: &[f64], v: &[f64]) {
    let (nq, nkv, _) = sizes(p);
    assert_eq!(q.len(), nq, "q: {p:?}");
    assert_eq!(k.len(), nkv, "k: {p:?}");
    assert_eq!(v.len(), nkv, "v: {p:?}");
}

/// Row `i`'s probabilities over the keys of one head (0 past the visible ones) and its
/// log-sum-exp: `q` is the row, `k` the head's keys.
fn probabilities(p: &AttentionParams, i: usize, q: &[f64], k: &[f64]) -> (Vec<f64>, f64) {
    let d = p.head_dim as usize;
    let visible = p.visible_keys(i as u32) as usize;
    let s: Vec<f64> = (0..visible)
        .map(|j| p.scale as f64 * q.iter().zip(&k[j * d..(j + 1) * d]).map(|(a, b)| a * b).sum::<f64>())
        .collect();
    let mut probs = vec![0.0; p.kv_len as usize];
    if visible == 0 {
        return (probs, f64::NEG_INFINITY);
    }
    let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
    for (j, x) in s.iter().enumerate() {
        probs[j] = (x - m).exp() / sum;
    }
    (probs, m + sum.ln())
}

/// One query row of the forward pass: `(O row, log-sum-exp)` of row `i` of head `h` (counted over
/// `batch * heads`), for checking a sample of a large problem.
pub fn forward_row(p: &AttentionParams, q: &[f64], k: &[f64], v: &[f64], h: usize, i: usize) -> (Vec<f64>, f64) {
    check(p, q, k, v);
    let (d, sq, skv) = (p.head_dim as usize, p.q_len as usize, p.kv_len as usize);
    let kh = &k[h * skv * d..(h + 1) * skv * d];
    let vh = &v[h * skv * d..(h + 1) * skv * d];
    let (probs, l) = probabilities(p, i, &q[(h * sq + i) * d..(h * sq + i + 1) * d], kh);
    let mut out = vec![0.0; d];
    for (j, pj) in probs.iter().enumerate().filter(|(_, pj)| **pj != 0.0) {
        for (x, vv) in out.iter_mut().zip(&vh[j * d..(j + 1) * d]) {
            *x += pj * vv;
        }
    }
    (out, l)
}

/// Attention forward on `p`'s buffers (panics on buffers of the wrong size: a test's mistake).
pub fn forward(p: &AttentionParams, q: &[f64], k: &[f64], v: &[f64]) -> AttentionOut {
    check(p, q, k, v);
    let (nq, _, nl) = sizes(p);
    let (d, sq, skv) = (p.head_dim as usize, p.q_len as usize, p.kv_len as usize);
    let (mut o, mut lse) = (vec![0.0; nq], vec![0.0; nl]);
    for h in 0..p.heads_total() as usize {
        let (qh, kh, vh) = (&q[h * sq * d..], &k[h * skv * d..(h + 1) * skv * d], &v[h * skv * d..(h + 1) * skv * d]);
        for i in 0..sq {
            let (probs, l) = probabilities(p, i, &qh[i * d..(i + 1) * d], kh);
            lse[h * sq + i] = l;
            let out = &mut o[(h * sq + i) * d..(h * sq + i + 1) * d];
            for (j, pj) in probs.iter().enumerate().filter(|(_, pj)| **pj != 0.0) {
                for (x, vv) in out.iter_mut().zip(&vh[j * d..(j + 1) * d]) {
                    *x += pj * vv;
                }
            }
        }
    }
    AttentionOut { o, lse }
}

/// The gradients of `sum(O * d_o)` with respect to Q, K and V.
pub fn backward(p: &AttentionParams, q: &[f64], k: &[f64], v: &[f64], d_o: &[f64]) -> AttentionGrads {
    check(p, q, k, v);
    let (nq, nkv, _) = sizes(p);
    assert_eq!(d_o.len(), nq, "d_o: {p:?}");
    let (d, sq, skv) = (p.head_dim as usize, p.q_len as usize, p.kv_len as usize);
    let scale = p.scale as f64;
    let (mut dq, mut dk, mut dv) = (vec![0.0; nq], vec![0.0; nkv], vec![0.0; nkv]);
    for h in 0..p.heads_total() as usize {
        let (qo, ko) = (h * sq * d, h * skv * d);
        let kh = &k[ko..ko + skv * d];
        let vh = &v[ko..ko + skv * d];
        for i in 0..sq {
            let qi = &q[qo + i * d..qo + (i + 1) * d];
            let doi = &d_o[qo + i * d..qo + (i + 1) * d];
            let (probs, _) = probabilities(p, i, qi, kh);
            // dP_ij = dO_i . V_j, D_i = sum_j P_ij dP_ij
            let dp: Vec<f64> =
                (0..skv).map(|j| doi.iter().zip(&vh[j * d..(j + 1) * d]).map(|(a, b)| a * b).sum()).collect();
            let di: f64 = probs.iter().zip(&dp).map(|(a, b)| a * b).sum();
            for j in 0..skv {
                let pj = probs[j];
                if pj == 0.0 {
                    continue;
                }
                let ds = pj * (dp[j] - di);
                for c in 0..d {
                    dv[ko + j * d + c] += pj * doi[c];
                    dq[qo + i * d + c] += scale * ds * kh[j * d + c];
                    dk[ko + j * d + c] += scale * ds * qi[c];
                }
            }
        }
    }
    AttentionGrads { dq, dk, dv }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    fn params(b: u32, h: u32, sq: u32, skv: u32, d: u32, causal: bool) -> AttentionParams {
        AttentionParams {
            batch: b,
            heads: h,
            q_len: sq,
            kv_len: skv,
            head_dim: d,
            scale: 1.0 / (d as f32).sqrt(),
            causal: causal as u32,
        }
    }

    fn random(rng: &mut StdRng, n: usize) -> Vec<f64> {
        (0..n).map(|_| rng.random_range(-1.0..1.0)).collect()
    }

    fn inputs(p: &AttentionParams, seed: u64) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let (nq, nkv, _) = sizes(p);
        let mut rng = StdRng::seed_from_u64(seed);
        (random(&mut rng, nq), random(&mut rng, nkv), random(&mut rng, nkv), random(&mut rng, nq))
    }

    #[test]
    fn one_query_two_keys_by_hand() {
        // d = 1, scale 1: s = (q k0, q k1), o = softmax(s) . v
        let p = AttentionParams { scale: 1.0, ..params(1, 1, 1, 2, 1, false) };
        let (q, k, v) = ([0.5], [1.0, -2.0], [3.0, 7.0]);
        let out = forward(&p, &q, &k, &v);
        let (e0, e1) = (0.5f64.exp(), (-1.0f64).exp());
        assert!((out.o[0] - (3.0 * e0 + 7.0 * e1) / (e0 + e1)).abs() < 1e-15, "{out:?}");
        assert!((out.lse[0] - (e0 + e1).ln()).abs() < 1e-15, "{out:?}");
    }

    #[test]
    fn a_row_is_the_forward_pass_row() {
        let p = params(2, 2, 5, 7, 4, true);
        let (q, k, v, _) = inputs(&p, 9);
        let out = forward(&p, &q, &k, &v);
        for h in 0..4 {
            for i in 0..5 {
                let (o, l) = forward_row(&p, &q, &k, &v, h, i);
                assert_eq!(&o[..], &out.o[(h * 5 + i) * 4..(h * 5 + i + 1) * 4]);
                assert_eq!(l, out.lse[h * 5 + i]);
            }
        }
    }

    #[test]
    fn zero_queries_average_the_visible_values() {
        for causal in [false, true] {
            let p = params(1, 2, 3, 5, 4, causal);
            let (_, k, v, _) = inputs(&p, 7);
            let q = vec![0.0; sizes(&p).0];
            let out = forward(&p, &q, &k, &v);
            for h in 0..2 {
                for i in 0..3 {
                    // bottom-right: row i sees i + 3 keys causally (5 - 3 = 2 extra)
                    let n = if causal { i + 3 } else { 5 };
                    for c in 0..4 {
                        let want: f64 = (0..n).map(|j| v[(h * 5 + j) * 4 + c]).sum::<f64>() / n as f64;
                        assert!((out.o[(h * 3 + i) * 4 + c] - want).abs() < 1e-14, "causal {causal} h {h} i {i}");
                    }
                    assert!((out.lse[h * 3 + i] - (n as f64).ln()).abs() < 1e-14);
                }
            }
        }
    }

    #[test]
    fn causal_first_row_copies_the_first_value_and_masked_rows_are_zero() {
        let p = params(1, 1, 4, 4, 3, true);
        let (q, k, v, _) = inputs(&p, 3);
        let out = forward(&p, &q, &k, &v);
        assert_eq!(&out.o[..3], &v[..3]);
        assert_eq!(out.lse[0], p.scale as f64 * (0..3).map(|c| q[c] * k[c]).sum::<f64>());
        // more queries than keys: the first q_len - kv_len rows see nothing
        let p = params(1, 1, 5, 2, 3, true);
        let (q, k, v, d_o) = inputs(&p, 4);
        let out = forward(&p, &q, &k, &v);
        assert!(out.o[..9].iter().all(|&x| x == 0.0) && out.lse[..3].iter().all(|&x| x == f64::NEG_INFINITY));
        assert_eq!(&out.o[9..12], &v[..3], "row 3 sees key 0 only");
        let g = backward(&p, &q, &k, &v, &d_o);
        assert!(g.dq[..9].iter().all(|&x| x == 0.0));
    }

    #[test]
    fn visible_keys_is_bottom_right_aligned() {
        let p = params(1, 1, 3, 5, 1, true);
        assert_eq!((0..3).map(|i| p.visible_keys(i)).collect::<Vec<_>>(), [3, 4, 5]);
        let p = params(1, 1, 5, 3, 1, true);
        assert_eq!((0..5).map(|i| p.visible_keys(i)).collect::<Vec<_>>(), [0, 0, 1, 2, 3]);
        assert_eq!(p.keys_for_rows(0, 2), 0);
        assert_eq!(p.keys_for_rows(0, 64), 3);
        assert_eq!(params(1, 1, 5, 3, 1, false).visible_keys(0), 3);
        assert!(p.tile_needs_mask(4, 0, 64), "past kv_len");
        let p = params(1, 1, 256, 256, 1, true);
        assert!(!p.tile_needs_mask(128, 0, 64) && p.tile_needs_mask(128, 128, 64) && !p.tile_needs_mask(192, 64, 64));
        assert_eq!(params(2, 3, 5, 7, 64, true).forward_flops(), 2.0 * 2.0 * 3.0 * 5.0 * 7.0 * 64.0);
    }

    /// `sum(O * d_o)` at the given inputs.
    fn loss(p: &AttentionParams, q: &[f64], k: &[f64], v: &[f64], d_o: &[f64]) -> f64 {
        forward(p, q, k, v).o.iter().zip(d_o).map(|(a, b)| a * b).sum()
    }

    #[test]
    fn backward_matches_finite_differences() {
        for (sq, skv, causal) in [(3, 3, false), (3, 5, true), (5, 3, true), (4, 6, false)] {
            let p = params(2, 1, sq, skv, 3, causal);
            let (q, k, v, d_o) = inputs(&p, 11 + sq as u64);
            let g = backward(&p, &q, &k, &v, &d_o);
            let h = 1e-6;
            let numeric = |which: usize, i: usize| {
                let mut x = [q.clone(), k.clone(), v.clone()];
                x[which][i] += h;
                let up = loss(&p, &x[0], &x[1], &x[2], &d_o);
                x[which][i] -= 2.0 * h;
                let down = loss(&p, &x[0], &x[1], &x[2], &d_o);
                (up - down) / (2.0 * h)
            };
            for (which, grad) in [&g.dq, &g.dk, &g.dv].into_iter().enumerate() {
                for (i, &want) in grad.iter().enumerate() {
                    let got = numeric(which, i);
                    assert!(
                        (got - want).abs() <= 1e-7 * (1.0 + want.abs()),
                        "{sq}x{skv} causal {causal}: grad {which}[{i}] analytic {want}, numeric {got}"
                    );
                }
            }
        }
    }
}

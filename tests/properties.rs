//! Property tests: random shapes and values against naive references (broadcasting, reductions,
//! transposes), and gradient checks on random broadcast shapes.

use kiln::tensor::{DType, Tensor, gradcheck};
use proptest::prelude::*;

/// A shape of rank 1..=3 with dimensions 1..=4, and a second shape that broadcasts with it (each
/// dimension kept or set to 1, possibly with leading dimensions dropped).
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    prop::collection::vec(1usize..5, 1..4).prop_flat_map(|a| {
        let r = a.len();
        (Just(a.clone()), prop::collection::vec(any::<bool>(), r), 0..r).prop_map(move |(a, ones, drop)| {
            let b: Vec<usize> = a.iter().zip(&ones).map(|(&d, &one)| if one { 1 } else { d }).collect();
            (a, b[drop..].to_vec())
        })
    })
}

fn values(n: usize, seed: u64) -> Vec<f64> {
    Tensor::randn([n], DType::F64, &mut Tensor::rng(seed)).to_vec_f64()
}

/// Naive broadcast index: the offset into `shape` (right-aligned) of the out-index `idx`.
fn offset(shape: &[usize], out: &[usize], mut idx: usize) -> usize {
    let mut coords = vec![0; out.len()];
    for d in (0..out.len()).rev() {
        coords[d] = idx % out[d];
        idx /= out[d];
    }
    let off = out.len() - shape.len();
    let mut o = 0;
    for (d, &n) in shape.iter().enumerate() {
        let c = if n == 1 { 0 } else { coords[d + off] };
        o = o * n + c;
    }
    o
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn broadcast_mul_matches_naive((a_shape, b_shape) in broadcast_pair(), seed in 0u64..1000) {
        let (na, nb): (usize, usize) = (a_shape.iter().product(), b_shape.iter().product());
        let (av, bv) = (values(na, seed), values(nb, seed + 1));
        let a = Tensor::from_f64(&av, a_shape.clone(), DType::F64).unwrap();
        let b = Tensor::from_f64(&bv, b_shape.clone(), DType::F64).unwrap();
        let got = a.mul(&b).unwrap();
        prop_assert_eq!(got.dims(), &a_shape[..]);
        let g = got.to_vec_f64();
        for i in 0..na {
            let want = av[offset(&a_shape, &a_shape, i)] * bv[offset(&b_shape, &a_shape, i)];
            prop_assert_eq!(g[i], want);
        }
        // the reversed operand order broadcasts the same way
        prop_assert_eq!(b.mul(&a).unwrap().to_vec_f64(), g);
    }

    #[test]
    fn sum_to_inverts_expand_in_count((a_shape, b_shape) in broadcast_pair(), seed in 0u64..1000) {
        // expanding b to a's shape and summing back multiplies each element by the broadcast factor
        let nb: usize = b_shape.iter().product();
        let bv = values(nb, seed);
        let b = Tensor::from_f64(&bv, b_shape.clone(), DType::F64).unwrap();
        let factor = a_shape.iter().product::<usize>() / nb;
        let back = b.expand(&a_shape.clone().into()).unwrap().sum_to(&b_shape.clone().into()).unwrap().to_vec_f64();
        for (x, y) in back.iter().zip(&bv) {
            prop_assert!((x - y * factor as f64).abs() <= 1e-12 * (1.0 + y.abs() * factor as f64));
        }
    }

    #[test]
    fn transposes_and_reductions(shape in prop::collection::vec(1usize..5, 2..4), seed in 0u64..1000, d0 in 0usize..3, d1 in 0usize..3) {
        let (d0, d1) = (d0 % shape.len(), d1 % shape.len());
        let n: usize = shape.iter().product();
        let v = values(n, seed);
        let t = Tensor::from_f64(&v, shape.clone(), DType::F64).unwrap();
        let back = t.transpose(d0 as isize, d1 as isize).unwrap().transpose(d0 as isize, d1 as isize).unwrap();
        prop_assert_eq!(back.to_vec_f64(), v.clone());
        // the sum over every dimension, in any order, is the total
        let mut s = t.clone();
        for _ in 0..shape.len() {
            s = s.sum_dim(0, false).unwrap();
        }
        let total: f64 = v.iter().sum();
        prop_assert!((s.item().unwrap() - total).abs() <= 1e-9 * (1.0 + v.iter().map(|x| x.abs()).sum::<f64>()));
    }

    #[test]
    fn broadcast_gradients((a_shape, b_shape) in broadcast_pair(), seed in 0u64..1000) {
        let a = Tensor::from_f64(&values(a_shape.iter().product(), seed), a_shape.clone(), DType::F64).unwrap();
        let b = Tensor::from_f64(&values(b_shape.iter().product(), seed + 7), b_shape.clone(), DType::F64).unwrap();
        let r = gradcheck("div(mul(a, b), 2 + b^2)", &[a, b], |x| {
            x[0].mul(&x[1])?.div(&x[1].mul(&x[1])?.add_scalar(2.0)?)
        }, 1e-6);
        prop_assert!(r.is_ok(), "{}", r.unwrap_err());
    }
}

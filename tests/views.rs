//! Views and batched products on the CPU: what each view op reads, that views share storage and
//! in-place writes refuse them, the typed errors, every view op's backward against finite
//! differences in f64 (`gradcheck`), batched matmul with broadcast batches and 1-D operands, and
//! attention's head split and merge (reshape + permute views, one contiguous copy).
#![allow(clippy::cloned_ref_to_slice_refs)]

use kiln::Error;
use kiln::tensor::{DType, Tensor, gradcheck};

const TOL: f64 = 1e-6;

fn rnd(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(shape.to_vec(), DType::F64, &mut Tensor::rng(seed))
}

fn check(name: &str, inputs: &[Tensor], f: impl Fn(&[Tensor]) -> kiln::Result<Tensor>) {
    match gradcheck(name, inputs, f, TOL) {
        Ok(worst) => assert!(worst <= TOL, "{name}: {worst}"),
        Err(e) => panic!("{e}"),
    }
}

/// `0, 1, ..., n - 1` in `shape`, f64.
fn iota(shape: &[usize]) -> Tensor {
    Tensor::arange(shape.iter().product(), DType::F64).reshape(shape.to_vec()).unwrap()
}

/// The reference product of (b, m, k) and (b, k, n) row-major f64 slices.
fn naive_bmm(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; batch * m * n];
    for p in 0..batch {
        for i in 0..m {
            for j in 0..n {
                c[p * m * n + i * n + j] = (0..k).map(|l| a[p * m * k + i * k + l] * b[p * k * n + l * n + j]).sum();
            }
        }
    }
    c
}

#[test]
fn views_read_the_right_elements() {
    let x = iota(&[2, 3, 4]);
    let t = x.transpose(0, 2).unwrap();
    assert_eq!(t.dims(), [4, 3, 2]);
    assert!(t.is_view() && !t.is_contiguous());
    assert_eq!(&t.to_vec_f64()[..6], [0.0, 12.0, 4.0, 16.0, 8.0, 20.0]);
    let p = x.permute(&[1, 2, 0]).unwrap();
    assert_eq!(p.dims(), [3, 4, 2]);
    assert_eq!(&p.to_vec_f64()[..4], [0.0, 12.0, 1.0, 13.0]);
    let p_neg = x.permute(&[-2, -1, 0]).unwrap();
    assert_eq!(p_neg.to_vec_f64(), p.to_vec_f64());
    let n = x.narrow(2, 1, 2).unwrap();
    assert_eq!(n.dims(), [2, 3, 2]);
    assert_eq!(&n.to_vec_f64()[..4], [1.0, 2.0, 5.0, 6.0]);
    // a view of a view
    let nn = n.narrow(0, 1, 1).unwrap().transpose(1, 2).unwrap();
    assert_eq!(nn.to_vec_f64(), [13.0, 17.0, 21.0, 14.0, 18.0, 22.0]);
    // contiguous: the same handle when already contiguous, else a dense copy
    assert_eq!(x.contiguous().unwrap().id(), x.id());
    let c = t.contiguous().unwrap();
    assert!(c.is_contiguous() && !c.is_view());
    assert_eq!(c.to_vec_f64(), t.to_vec_f64());
    // reshape of a contiguous tensor is a view; of a non-contiguous one, a copy then a view
    let r = t.reshape([4, 6]).unwrap();
    assert_eq!(r.to_vec_f64(), t.to_vec_f64());
    // row narrows stay contiguous (at an offset)
    let rows = x.reshape([6, 4]).unwrap().narrow(0, 2, 3).unwrap();
    assert!(rows.is_contiguous());
    assert_eq!(rows.to_vec_f64(), (8..20).map(f64::from).collect::<Vec<_>>());
    assert_eq!(rows.reshape([12]).unwrap().to_vec_f64(), rows.to_vec_f64());
}

#[test]
fn split_chunk_and_cat() {
    let x = iota(&[5, 3]);
    let parts = x.split(2, 0).unwrap();
    assert_eq!(parts.iter().map(|p| p.dims()[0]).collect::<Vec<_>>(), [2, 2, 1]);
    assert_eq!(parts[2].to_vec_f64(), [12.0, 13.0, 14.0]);
    let cols = x.chunk(2, -1).unwrap();
    assert_eq!(cols.iter().map(|p| p.dims()[1]).collect::<Vec<_>>(), [2, 1]);
    assert_eq!(cols[1].to_vec_f64(), [2.0, 5.0, 8.0, 11.0, 14.0]);
    // PyTorch's chunk: fewer pieces when the dimension is short
    assert_eq!(iota(&[2]).chunk(4, 0).unwrap().len(), 2);
    let back = Tensor::cat(&[&cols[0], &cols[1]], 1).unwrap();
    assert_eq!(back.to_vec_f64(), x.to_vec_f64());
    let rows = Tensor::cat(&parts.iter().collect::<Vec<_>>(), 0).unwrap();
    assert_eq!(rows.to_vec_f64(), x.to_vec_f64());
    // cat of non-contiguous views and an empty piece
    let t = x.transpose(0, 1).unwrap();
    let empty = t.narrow(1, 0, 0).unwrap();
    let joined = Tensor::cat(&[&t, &empty, &t], 1).unwrap();
    assert_eq!(joined.dims(), [3, 10]);
    let v = joined.to_vec_f64();
    assert_eq!(&v[..10], [0.0, 3.0, 6.0, 9.0, 12.0, 0.0, 3.0, 6.0, 9.0, 12.0]);
}

#[test]
fn views_share_storage_and_in_place_writes_refuse_them() {
    let base = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap();
    let t = base.transpose(0, 1).unwrap();
    let n = base.narrow(0, 1, 1).unwrap();
    // writes to the base are seen by its views (they share its storage)
    base.set_data(&Tensor::from_vec(vec![5.0f32, 6.0, 7.0, 8.0], [2, 2]).unwrap()).unwrap();
    assert_eq!(t.to_vec_f32(), [5.0, 7.0, 6.0, 8.0]);
    assert_eq!(n.to_vec_f32(), [7.0, 8.0]);
    base.with_data_mut::<f32, _>(|d| d[0] = 9.0).unwrap();
    assert_eq!(t.to_vec_f32()[0], 9.0);
    // writes through a view refuse, saying what to do instead
    for view in [&t, &n, &base.reshape([4]).unwrap()] {
        let e = view.set_data(&view.contiguous().unwrap().detach()).unwrap_err();
        assert!(matches!(e, Error::Unsupported { op: "set_data", .. }), "{e}");
        assert!(e.to_string().contains(".detach()"), "{e}");
        let e = view.with_data_mut::<f32, _>(|d| d[0] = 0.0).unwrap_err();
        assert!(matches!(e, Error::Unsupported { op: "with_data_mut", .. }), "{e}");
    }
    assert_eq!(base.to_vec_f32(), [9.0, 6.0, 7.0, 8.0]);
    // a copy of a view is its own tensor: detach and requires_grad copy only the view's elements
    let d = t.detach();
    assert!(!d.is_view());
    assert_eq!(d.to_vec_f32(), [9.0, 7.0, 6.0, 8.0]);
    d.with_data_mut::<f32, _>(|v| v[0] = -1.0).unwrap();
    assert_eq!(base.to_vec_f32()[0], 9.0);
    let leaf = n.clone().requires_grad();
    assert!(!leaf.is_view());
    assert_eq!(leaf.to_vec_f32(), [7.0, 8.0]);
}

/// Optimizers write only leaves that hold gradients: a view (never a leaf) handed to one as a
/// parameter is left alone, and so is the storage it shares.
#[test]
fn optimizers_never_write_through_a_view() {
    use kiln::optim::{Optimizer, Sgd};
    let w = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap().requires_grad();
    let view = w.transpose(0, 1).unwrap();
    view.mul(&view).unwrap().sum_all().unwrap().backward().unwrap();
    assert!(view.grad().is_none() && w.grad().is_some());
    let mut opt = Sgd::new(vec![("view".to_string(), view.clone())], 0.1, 0.0, 0.0, false);
    opt.step().unwrap();
    assert_eq!(w.to_vec_f32(), [1.0, 2.0, 3.0, 4.0]);
    // the leaf itself steps, and its view sees the new values
    let mut opt = Sgd::new(vec![("w".to_string(), w.clone())], 0.1, 0.0, 0.0, false);
    opt.step().unwrap();
    assert_eq!(view.to_vec_f32(), [0.8, 2.4, 1.6, 3.2]);
}

#[test]
fn view_errors_are_typed() {
    let x = iota(&[2, 3]);
    let shape_err = |r: kiln::Result<Tensor>| matches!(r, Err(Error::Shape { .. }));
    assert!(shape_err(x.permute(&[0])));
    assert!(shape_err(x.permute(&[0, 0])));
    assert!(shape_err(x.permute(&[0, 2])));
    assert!(shape_err(x.transpose(0, 2)));
    assert!(shape_err(x.narrow(1, 2, 2)));
    assert!(shape_err(x.narrow(2, 0, 1)));
    assert!(matches!(x.split(0, 0), Err(Error::Shape { .. })));
    assert!(matches!(x.chunk(0, 0), Err(Error::Shape { .. })));
    assert!(shape_err(Tensor::cat(&[], 0)));
    assert!(shape_err(Tensor::cat(&[&x, &iota(&[3, 2])], 0)));
    assert!(shape_err(Tensor::cat(&[&x, &iota(&[2, 3, 1])], 0)));
    assert!(shape_err(Tensor::cat(&[&x, &x], 2)));
    let f32x = x.to_dtype(DType::F32).unwrap();
    assert!(matches!(Tensor::cat(&[&x, &f32x], 0), Err(Error::DType { op: "cat", .. })));
    assert!(shape_err(x.matmul(&iota(&[2, 3]))));
    assert!(shape_err(iota(&[2, 2, 3]).matmul(&iota(&[3, 3, 4]))));
    assert!(shape_err(iota(&[3]).matmul(&iota(&[4]))));
}

#[test]
fn gradcheck_view_ops() {
    let x = rnd(&[2, 3, 4], 1);
    check("permute", &[x.clone()], |t| t[0].permute(&[2, 0, 1])?.mul(&t[0].permute(&[2, 0, 1])?));
    check("transpose", &[x.clone()], |t| t[0].transpose(0, 2)?.exp());
    check("narrow", &[x.clone()], |t| t[0].narrow(2, 1, 2)?.mul_scalar(3.0)?.tanh());
    check("narrow of narrow", &[x.clone()], |t| t[0].narrow(1, 1, 2)?.narrow(2, 0, 3)?.transpose(0, 1)?.exp());
    check("split", &[x.clone()], |t| {
        let p = t[0].split(3, 2)?;
        p[0].mul(&p[0])?.sum_dim(2, true)?.add(&p[1])
    });
    check("chunk", &[x.clone()], |t| {
        let p = t[0].chunk(2, 1)?;
        Tensor::cat(&[&p[1], &p[0]], 1)?.sigmoid()
    });
    check("cat", &[rnd(&[2, 3], 2), rnd(&[2, 1], 3), rnd(&[3, 2], 4)], |t| {
        Tensor::cat(&[&t[0], &t[1], &t[2].transpose(0, 1)?], 1)?.tanh()
    });
    check("contiguous", &[x.clone()], |t| t[0].permute(&[1, 0, 2])?.contiguous()?.reshape([3, 8])?.exp());
    check("reshape of a view", &[x.clone()], |t| t[0].transpose(1, 2)?.reshape([8, 3])?.log_softmax());
    check("views into reductions", &[x.clone()], |t| t[0].transpose(0, 1)?.narrow(2, 1, 3)?.sum_dim(0, false));
    check("views into max and softmax", &[x], |t| {
        t[0].permute(&[2, 1, 0])?.max_dim(1, false)?.add(&t[0].transpose(0, 2)?.softmax()?.sum_dim(1, false)?)
    });
}

#[test]
fn batched_matmul_forward_matches_naive() {
    let (b, m, k, n) = (3, 4, 5, 2);
    let (a, w) = (rnd(&[b, m, k], 10), rnd(&[b, k, n], 11));
    let want = naive_bmm(&a.to_vec_f64(), &w.to_vec_f64(), b, m, k, n);
    let got = a.matmul(&w).unwrap();
    assert_eq!(got.dims(), [b, m, n]);
    let close = |g: &[f64], w: &[f64]| g.iter().zip(w).all(|(x, y)| (x - y).abs() < 1e-12);
    assert!(close(&got.to_vec_f64(), &want));
    // broadcast batches: (2, 1, m, k) x (3, k, n) -> (2, 3, m, n)
    let a2 = rnd(&[2, 1, m, k], 12);
    let out = a2.matmul(&w).unwrap();
    assert_eq!(out.dims(), [2, 3, m, n]);
    let av = a2.to_vec_f64();
    for i in 0..2 {
        let rep: Vec<f64> = (0..3).flat_map(|_| av[i * m * k..(i + 1) * m * k].to_vec()).collect();
        let want = naive_bmm(&rep, &w.to_vec_f64(), 3, m, k, n);
        assert!(close(&out.to_vec_f64()[i * 3 * m * n..(i + 1) * 3 * m * n], &want));
    }
    // a shared 2-D left operand against a batch, and 1-D operands
    assert_eq!(rnd(&[m, k], 13).matmul(&w).unwrap().dims(), [b, m, n]);
    assert_eq!(rnd(&[k], 14).matmul(&w).unwrap().dims(), [b, n]);
    assert_eq!(a.matmul(&rnd(&[k], 15)).unwrap().dims(), [b, m]);
    let dot = rnd(&[k], 16).matmul(&rnd(&[k], 17)).unwrap();
    assert_eq!(dot.dims(), [] as [usize; 0]);
    // (1, k, n) acts as a shared matrix
    assert_eq!(a.matmul(&rnd(&[1, k, n], 18)).unwrap().dims(), [b, m, n]);
    assert_eq!(rnd(&[m, k], 19).matmul(&rnd(&[1, 1, k, n], 20)).unwrap().dims(), [1, 1, m, n]);
}

/// bf16 batched products with broadcast batches on the CPU: the f32 product of the same values,
/// rounded once (the broadcast is a gather, which takes every dtype).
#[test]
fn bf16_broadcast_batches() {
    let (a, b) = (rnd(&[2, 1, 3, 8], 70), rnd(&[4, 8, 5], 71));
    let (a16, b16) = (a.to_dtype(DType::BF16).unwrap(), b.to_dtype(DType::BF16).unwrap());
    let got = a16.matmul(&b16).unwrap();
    assert_eq!((got.dtype(), got.dims()), (DType::BF16, &[2, 4, 3, 5][..]));
    let f32s = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let want = f32s(&a16).matmul(&f32s(&b16)).unwrap().to_dtype(DType::BF16).unwrap();
    assert_eq!(got.to_vec_f64(), want.to_vec_f64());
    // views of bf16 tensors: transpose, narrow and cat copy any dtype
    let t = b16.transpose(1, 2).unwrap().narrow(1, 1, 3).unwrap();
    let joined = Tensor::cat(&[&t, &t], 2).unwrap();
    assert_eq!(joined.dims(), [4, 3, 16]);
    assert_eq!(joined.narrow(2, 8, 8).unwrap().to_vec_f64(), t.to_vec_f64());
}

/// A batched right operand that is the transpose of contiguous data (`k.transpose(-1, -2)`) is
/// read in place by the batched `a b^T` product: the same values as the naive product of the
/// copied transpose, in f64 and in bf16 (the f32 product of the same values, rounded once), with
/// 4-D leading dimensions.
#[test]
fn batched_transposed_right_operand_in_place() {
    let (b, m, k, n) = (3, 4, 5, 6);
    let (a, bt) = (rnd(&[b, m, k], 80), rnd(&[b, n, k], 81));
    let view = bt.transpose(-1, -2).unwrap();
    let copied = view.contiguous().unwrap();
    let want = naive_bmm(&a.to_vec_f64(), &copied.to_vec_f64(), b, m, k, n);
    let got = a.matmul(&view).unwrap();
    assert_eq!(got.dims(), [b, m, n]);
    assert!(got.to_vec_f64().iter().zip(&want).all(|(x, y)| (x - y).abs() < 1e-12));
    let (a4, bt4) = (rnd(&[2, 3, m, k], 82), rnd(&[2, 3, n, k], 83));
    let got4 = a4.matmul(&bt4.transpose(-1, -2).unwrap()).unwrap();
    let want4 =
        naive_bmm(&a4.to_vec_f64(), &bt4.transpose(-1, -2).unwrap().contiguous().unwrap().to_vec_f64(), 6, m, k, n);
    assert_eq!(got4.dims(), [2, 3, m, n]);
    assert!(got4.to_vec_f64().iter().zip(&want4).all(|(x, y)| (x - y).abs() < 1e-12));
    let (a16, bt16) = (a.to_dtype(DType::BF16).unwrap(), bt.to_dtype(DType::BF16).unwrap());
    let got16 = a16.matmul(&bt16.transpose(-1, -2).unwrap()).unwrap();
    let f32s = |t: &Tensor| t.to_dtype(DType::F32).unwrap();
    let want16 = f32s(&a16).matmul(&f32s(&bt16).transpose(-1, -2).unwrap().contiguous().unwrap()).unwrap();
    assert_eq!(got16.dtype(), DType::BF16);
    assert_eq!(got16.to_vec_f64(), want16.to_dtype(DType::BF16).unwrap().to_vec_f64());
}

#[test]
fn gradcheck_batched_matmul() {
    check("bmm", &[rnd(&[3, 2, 4], 30), rnd(&[3, 4, 5], 31)], |t| t[0].matmul(&t[1]));
    check("bmm shared b", &[rnd(&[3, 2, 4], 32), rnd(&[4, 5], 33)], |t| t[0].matmul(&t[1]));
    check("bmm shared a", &[rnd(&[2, 4], 34), rnd(&[3, 4, 5], 35)], |t| t[0].matmul(&t[1]));
    check("bmm broadcast batches", &[rnd(&[2, 1, 3, 4], 36), rnd(&[3, 4, 2], 37)], |t| t[0].matmul(&t[1]));
    check("bmm broadcast both", &[rnd(&[2, 1, 3, 4], 38), rnd(&[1, 3, 4, 2], 39)], |t| t[0].matmul(&t[1]));
    check("bmm (1, k, n)", &[rnd(&[3, 2, 4], 40), rnd(&[1, 4, 5], 41)], |t| t[0].matmul(&t[1]));
    check("vector @ batch", &[rnd(&[4], 42), rnd(&[3, 4, 5], 43)], |t| t[0].matmul(&t[1]));
    check("batch @ vector", &[rnd(&[3, 2, 4], 44), rnd(&[4], 45)], |t| t[0].matmul(&t[1]));
    check("dot", &[rnd(&[4], 46), rnd(&[4], 47)], |t| t[0].matmul(&t[1]));
    check("transposed views", &[rnd(&[4, 3], 48), rnd(&[5, 4], 49)], |t| {
        t[0].transpose(0, 1)?.matmul(&t[1].transpose(0, 1)?)
    });
    check("batched transposed views", &[rnd(&[2, 4, 3], 50), rnd(&[2, 5, 4], 51)], |t| {
        t[0].transpose(1, 2)?.matmul(&t[1].transpose(-1, -2)?)
    });
    check("q k^T", &[rnd(&[2, 3, 4], 52), rnd(&[2, 5, 4], 53)], |t| t[0].matmul(&t[1].transpose(-1, -2)?));
    check("4-D q k^T", &[rnd(&[2, 2, 3, 4], 54), rnd(&[2, 2, 5, 4], 55)], |t| t[0].matmul(&t[1].transpose(-1, -2)?));
}

/// Attention's head split and merge: `[B, T, H*D] -> [B, H, T, D]` by reshape + permute (views),
/// scores `q k^T` as a batched product of a transposed view, softmax, `p v`, and the merge back
/// `[B, H, T, D] -> [B, T, H*D]` (one contiguous copy), with gradients against finite differences.
#[test]
fn attention_head_split_and_merge() {
    let (b, t, h, d) = (2, 3, 2, 4);
    let split = |x: &Tensor| x.reshape([b, t, h, d])?.permute(&[0, 2, 1, 3]);
    let attention = |x: &[Tensor]| -> kiln::Result<Tensor> {
        let (q, k, v) = (split(&x[0])?, split(&x[1])?, split(&x[2])?);
        assert!(q.is_view() && !q.is_contiguous());
        let scores = q.matmul(&k.transpose(-1, -2)?)?.mul_scalar(1.0 / (d as f64).sqrt())?;
        let out = scores.softmax()?.matmul(&v)?; // [B, H, T, D]
        let merged = out.permute(&[0, 2, 1, 3])?.contiguous()?.reshape([b, t, h * d])?;
        assert!(merged.is_contiguous());
        Ok(merged)
    };
    let inputs = [rnd(&[b, t, h * d], 60), rnd(&[b, t, h * d], 61), rnd(&[b, t, h * d], 62)];
    check("attention heads", &inputs, attention);
    // the split reads what the reshape says: head j of row (i, s) is columns j*D..(j+1)*D
    let x = iota(&[b, t, h * d]);
    let heads = split(&x).unwrap();
    let first = heads.narrow(0, 0, 1).unwrap().narrow(1, 1, 1).unwrap().narrow(2, 2, 1).unwrap().to_vec_f64();
    assert_eq!(first, [20.0, 21.0, 22.0, 23.0]);
}

/// The in-place writers a captured step relies on: `copy_from_host` and `copy_from` write into the
/// tensor's own storage (its views see the values), check the count, shape and dtype, and refuse
/// views; `Targets::overwrite` replaces the indices and refuses while a clone shares them.
#[test]
fn in_place_copies_write_the_same_storage_and_check_their_source() {
    let base = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]).unwrap();
    let t = base.transpose(0, 1).unwrap();
    base.copy_from_host(&[5.0, 6.0, 7.0, 8.0]).unwrap();
    assert_eq!(t.to_vec_f32(), [5.0, 7.0, 6.0, 8.0]);
    let e = base.copy_from_host(&[1.0; 3]).unwrap_err();
    assert!(e.to_string().contains("3 values"), "{e}");
    let e = t.copy_from_host(&[0.0; 4]).unwrap_err();
    assert!(matches!(e, Error::Unsupported { op: "copy_from_host", .. }), "{e}");
    let f64t = Tensor::from_f64(&[1.0, 2.0], [2], DType::F64).unwrap();
    assert!(matches!(f64t.copy_from_host(&[0.0; 2]).unwrap_err(), Error::DType { .. }));

    base.copy_from(&Tensor::from_vec(vec![9.0f32, 8.0, 7.0, 6.0], [2, 2]).unwrap()).unwrap();
    assert_eq!(t.to_vec_f32(), [9.0, 7.0, 8.0, 6.0]);
    // a view as the source copies the elements it reads
    base.copy_from(&t.contiguous().unwrap().transpose(0, 1).unwrap()).unwrap();
    assert_eq!(base.to_vec_f32(), [9.0, 8.0, 7.0, 6.0]);
    base.copy_from(&base).unwrap();
    assert!(base.copy_from(&Tensor::from_vec(vec![0.0f32; 4], [4]).unwrap()).is_err());
    assert!(base.copy_from(&Tensor::from_f64(&[0.0; 4], [2, 2], DType::F64).unwrap()).is_err());
    assert!(matches!(t.copy_from(&base).unwrap_err(), Error::Unsupported { op: "copy_from", .. }));

    let mut y = kiln::tensor::Targets::new(vec![0, 2, 1]);
    assert!(!y.overwrite(&[1, 1, 3]).unwrap(), "no device copy to write on the CPU");
    assert_eq!(y.as_slice(), [1, 1, 3]);
    assert_eq!(y.max(), Some(3));
    let clone = y.clone();
    assert!(matches!(y.overwrite(&[0, 0, 0]).unwrap_err(), Error::Unsupported { .. }));
    drop(clone);
    y.overwrite(&[2]).unwrap();
    assert_eq!(y.as_slice(), [2]);
}

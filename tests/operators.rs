//! The arithmetic operators on tensors (`&a + &b`, `-&a`, `&a * 2.0`, ...) against the methods they
//! stand for, on the CPU backend: the same bits, the same broadcasting, the same gradients, and a
//! mismatch comes back as an `Err` (from every operand pairing, and through a chain).

use kiln::{DType, Error, Result, Shape, Tensor};

fn rand(shape: &[usize], dtype: DType, seed: u64) -> Tensor {
    // away from zero, so the divisions are well defined
    Tensor::rand(0.5, 2.0, shape.to_vec(), dtype, &mut Tensor::rng(seed))
}

fn bits(t: Result<Tensor>) -> (Shape, Vec<u64>) {
    let t = t.expect("the operation succeeds");
    (t.shape().clone(), t.to_vec_f64().iter().map(|v| v.to_bits()).collect())
}

/// Pairs of shapes that broadcast: equal, a row vector, a column, a scalar, both sides growing.
const SHAPES: &[(&[usize], &[usize])] =
    &[(&[3, 4], &[3, 4]), (&[3, 4], &[4]), (&[3, 1], &[3, 4]), (&[2, 3, 4], &[]), (&[2, 1, 4], &[3, 1])];

#[test]
fn tensor_tensor_operators_give_the_methods_bits_for_every_operand_pairing() {
    for dtype in [DType::F32, DType::F64] {
        for (i, (sa, sb)) in SHAPES.iter().enumerate() {
            let (a, b) = (rand(sa, dtype, 2 * i as u64), rand(sb, dtype, 2 * i as u64 + 1));
            let cases: [(&str, fn(&Tensor, &Tensor) -> Result<Tensor>, [Result<Tensor>; 8]); 4] = [
                (
                    "add",
                    Tensor::add,
                    [
                        &a + &b,
                        &a + b.clone(),
                        a.clone() + &b,
                        a.clone() + b.clone(),
                        Ok(a.clone()) + &b,
                        Ok(a.clone()) + b.clone(),
                        &a + Ok(b.clone()),
                        a.clone() + Ok(b.clone()),
                    ],
                ),
                (
                    "sub",
                    Tensor::sub,
                    [
                        &a - &b,
                        &a - b.clone(),
                        a.clone() - &b,
                        a.clone() - b.clone(),
                        Ok(a.clone()) - &b,
                        Ok(a.clone()) - b.clone(),
                        &a - Ok(b.clone()),
                        a.clone() - Ok(b.clone()),
                    ],
                ),
                (
                    "mul",
                    Tensor::mul,
                    [
                        &a * &b,
                        &a * b.clone(),
                        a.clone() * &b,
                        a.clone() * b.clone(),
                        Ok(a.clone()) * &b,
                        Ok(a.clone()) * b.clone(),
                        &a * Ok(b.clone()),
                        a.clone() * Ok(b.clone()),
                    ],
                ),
                (
                    "div",
                    Tensor::div,
                    [
                        &a / &b,
                        &a / b.clone(),
                        a.clone() / &b,
                        a.clone() / b.clone(),
                        Ok(a.clone()) / &b,
                        Ok(a.clone()) / b.clone(),
                        &a / Ok(b.clone()),
                        a.clone() / Ok(b.clone()),
                    ],
                ),
            ];
            for (name, method, results) in cases {
                let want = bits(method(&a, &b));
                for (k, got) in results.into_iter().enumerate() {
                    assert_eq!(bits(got), want, "{name} {dtype:?} {sa:?} {sb:?}, operand pairing {k}");
                }
                // and the other way round, where the broadcast grows the left operand
                let want = bits(method(&b, &a));
                let got = match name {
                    "add" => &b + &a,
                    "sub" => &b - &a,
                    "mul" => &b * &a,
                    _ => &b / &a,
                };
                assert_eq!(bits(got), want, "{name} {dtype:?} {sb:?} {sa:?}");
            }
        }
    }
}

#[test]
fn negation_is_the_neg_method() {
    for dtype in [DType::F32, DType::F64] {
        let a = Tensor::rand(-2.0, 2.0, [5, 3], dtype, &mut Tensor::rng(7));
        let want = bits(a.neg());
        assert_eq!(bits(-&a), want);
        assert_eq!(bits(-a.clone()), want);
        assert_eq!(bits(a.mul_scalar(-1.0)), want);
    }
}

#[test]
fn scalar_operators_are_the_tensor_operators_with_a_one_element_tensor() {
    for dtype in [DType::F32, DType::F64] {
        let a = rand(&[4, 5], dtype, 11);
        for s in [3.0, -0.7, 0.1] {
            let st = Tensor::full(s, Shape::from(Vec::<usize>::new()), dtype);
            let label = format!("{dtype:?} s = {s}");
            // tensor on the left
            assert_eq!(bits(&a + s), bits(a.add(&st)), "t + s, {label}");
            assert_eq!(bits(a.clone() + s), bits(a.add_scalar(s)), "t + s, {label}");
            assert_eq!(bits(&a - s), bits(a.sub(&st)), "t - s, {label}");
            assert_eq!(bits(a.clone() - s), bits(a.sub(&st)), "t - s, {label}");
            assert_eq!(bits(&a * s), bits(a.mul(&st)), "t * s, {label}");
            assert_eq!(bits(a.clone() * s), bits(a.mul_scalar(s)), "t * s, {label}");
            assert_eq!(bits(&a / s), bits(a.div(&st)), "t / s, {label}");
            assert_eq!(bits(a.clone() / s), bits(a.div(&st)), "t / s, {label}");
            // scalar on the left
            assert_eq!(bits(s + &a), bits(st.add(&a)), "s + t, {label}");
            assert_eq!(bits(s + a.clone()), bits(st.add(&a)), "s + t, {label}");
            assert_eq!(bits(s - &a), bits(st.sub(&a)), "s - t, {label}");
            assert_eq!(bits(s - a.clone()), bits(st.sub(&a)), "s - t, {label}");
            assert_eq!(bits(s * &a), bits(st.mul(&a)), "s * t, {label}");
            assert_eq!(bits(s * a.clone()), bits(st.mul(&a)), "s * t, {label}");
            assert_eq!(bits(s / &a), bits(st.div(&a)), "s / t, {label}");
            assert_eq!(bits(s / a.clone()), bits(st.div(&a)), "s / t, {label}");
        }
    }
}

#[test]
fn a_chain_of_operators_is_the_chain_of_methods_with_its_gradients() -> Result<()> {
    let data = |seed| Tensor::rand(-1.0, 1.0, [3, 4], DType::F64, &mut Tensor::rng(seed)).to_vec_f64();
    let leaf =
        |v: &[f64], shape: &[usize]| Ok::<_, Error>(Tensor::from_f64(v, shape.to_vec(), DType::F64)?.requires_grad());
    let (va, vb, vc) = (data(1), data(2), data(3)[..4].to_vec());

    let (a, b, c) = (leaf(&va, &[3, 4])?, leaf(&vb, &[3, 4])?, leaf(&vc, &[4])?);
    let y = ((&a * &b + &c)? - ((&a / 2.0)? - 1.0)? * -&b)?;
    let loss = (&y * &y)?.sum_all()?;
    loss.backward()?;

    let (a2, b2, c2) = (leaf(&va, &[3, 4])?, leaf(&vb, &[3, 4])?, leaf(&vc, &[4])?);
    let two = Tensor::full(2.0, Shape::from(Vec::<usize>::new()), DType::F64);
    let t = a2.mul(&b2)?.add(&c2)?;
    let u = a2.div(&two)?.add_scalar(-1.0)?;
    let y2 = t.sub(&u.mul(&b2.neg()?)?)?;
    let loss2 = y2.mul(&y2)?.sum_all()?;
    loss2.backward()?;

    assert_eq!(bits(Ok(y)), bits(Ok(y2)));
    for (name, p, q) in [("a", &a, &a2), ("b", &b, &b2), ("c", &c, &c2)] {
        let (g, h) = (p.grad().expect("a gradient"), q.grad().expect("a gradient"));
        assert_eq!(bits(Ok(g)), bits(Ok(h)), "d loss / d {name}");
    }
    Ok(())
}

fn assert_shape_error(r: Result<Tensor>, op: &str, what: &str) {
    match r {
        Err(Error::Shape { op: o, msg }) => assert_eq!(o, op, "{what}: {msg}"),
        Err(e) => panic!("{what}: expected a shape error from {op}, got {e}"),
        Ok(t) => panic!("{what}: expected a shape error from {op}, got a tensor of shape {}", t.shape()),
    }
}

#[test]
fn shapes_that_do_not_broadcast_are_an_error_from_every_operator_and_pairing() {
    let (a, b) = (rand(&[3, 4], DType::F32, 1), rand(&[3], DType::F32, 2));
    for (name, r) in [
        ("add", &a + &b),
        ("add", a.clone() + b.clone()),
        ("add", a.clone() + &b),
        ("add", &a + b.clone()),
        ("sub", &a - &b),
        ("sub", &b - &a),
        ("mul", &a * &b),
        ("mul", a.clone() * b.clone()),
        ("div", &a / &b),
        ("div", b.clone() / &a),
    ] {
        assert_shape_error(r, name, &format!("[3, 4] {name} [3]"));
    }
}

#[test]
fn an_error_inside_a_chain_is_the_one_returned() -> Result<()> {
    let (a, b) = (rand(&[3, 4], DType::F32, 1), rand(&[3], DType::F32, 2));
    // the first failing op's error passes through the operators after it, on either side
    assert_shape_error((&a * &b) + &a, "mul", "(a * b) + a");
    assert_shape_error(&a + (&a - &b), "sub", "a + (a - b)");
    assert_shape_error(a.clone() / (&a / &b), "div", "a / (a / b)");
    assert_shape_error(((&a * 2.0)? + &b).and_then(|t| t * 3.0), "add", "(a * 2 + b) * 3");
    // a good chain stays good
    assert!(((&a * 2.0)? + &a).is_ok());
    Ok(())
}

#[test]
fn mismatched_dtypes_are_an_error_not_a_panic() {
    let (a, b) = (rand(&[2, 2], DType::F32, 1), rand(&[2, 2], DType::F64, 2));
    for (name, r) in [("add", &a + &b), ("sub", &a - &b), ("mul", &a * &b), ("div", &a / &b)] {
        match r {
            Err(Error::DType { op, .. }) => assert_eq!(op, name),
            Err(e) => panic!("{name}: expected a dtype error, got {e}"),
            Ok(_) => panic!("{name} of f32 and f64 succeeded"),
        }
    }
}

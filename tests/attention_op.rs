//! The attention op on the CPU: `Tensor::scaled_dot_product_attention` (the naive path on this
//! backend) against the f64 reference of `kiln::attention`, in f64, f32 and bf16, output and the
//! three gradients through `backward()`; its gradients by finite differences (`gradcheck`); its
//! typed refusals. The same cases run on CUDA from `gpu/attention_op.rs` (`attention_cases.rs`).

mod attention_cases;

use attention_cases::{Path, cases_match_reference, cpu_cases, odd_head_dim_cases};
use kiln::tensor::{DType, Device, Tensor, gradcheck};

#[test]
fn op_matches_the_f64_reference_in_f64() {
    cases_match_reference(&Device::Cpu, DType::F64, Path::Op, &cpu_cases()).unwrap();
    cases_match_reference(&Device::Cpu, DType::F64, Path::Op, &odd_head_dim_cases()).unwrap();
}

#[test]
fn op_matches_the_f64_reference_in_f32_and_bf16() {
    cases_match_reference(&Device::Cpu, DType::F32, Path::Op, &cpu_cases()).unwrap();
    let small: Vec<_> = cpu_cases().into_iter().filter(|c| c.sq.max(c.skv) <= 33).collect();
    cases_match_reference(&Device::Cpu, DType::BF16, Path::Naive, &small).unwrap();
}

#[test]
fn gradients_match_finite_differences() {
    // (heads, kv heads, q_len, kv_len, head_dim, causal): plain, causal square, causal with more
    // queries than keys (the first rows see nothing), grouped heads
    for &(h, hkv, sq, skv, d, causal) in &[
        (2, 2, 3, 4, 3, false),
        (2, 2, 4, 4, 2, true),
        (1, 1, 5, 3, 3, true),
        (4, 2, 3, 5, 2, true),
        (3, 1, 2, 3, 2, false),
    ] {
        let mut rng = Tensor::rng(7 + sq as u64);
        let q = Tensor::randn([1, h, sq, d], DType::F64, &mut rng);
        let k = Tensor::randn([1, hkv, skv, d], DType::F64, &mut rng);
        let v = Tensor::randn([1, hkv, skv, d], DType::F64, &mut rng);
        let name = format!("attention h{h} hkv{hkv} {sq}x{skv} d{d} causal {causal}");
        gradcheck(&name, &[q, k, v], |x| x[0].scaled_dot_product_attention(&x[1], &x[2], causal, Some(0.7)), 1e-6)
            .unwrap();
    }
}

#[test]
fn rows_that_see_no_key_are_zero_not_nan() {
    let mut rng = Tensor::rng(3);
    let q = Tensor::randn([1, 1, 5, 4], DType::F32, &mut rng).requires_grad();
    let k = Tensor::randn([1, 1, 2, 4], DType::F32, &mut rng).requires_grad();
    let out = q.scaled_dot_product_attention(&k, &k, true, None).unwrap();
    let o = out.to_vec_f64();
    // rows 0..3 see no key (bottom-right aligned: row i sees keys j <= i - 3)
    assert!(o[..3 * 4].iter().all(|x| *x == 0.0), "{o:?}");
    assert!(o.iter().all(|x| x.is_finite()));
    out.sum_all().unwrap().backward().unwrap();
    let g = q.grad().unwrap().to_vec_f64();
    assert!(g[..3 * 4].iter().all(|x| *x == 0.0) && g.iter().all(|x| x.is_finite()), "{g:?}");
}

#[test]
fn the_op_and_the_naive_path_agree_on_the_cpu() {
    let mut rng = Tensor::rng(11);
    let q = Tensor::randn([2, 4, 9, 8], DType::F32, &mut rng);
    let k = Tensor::randn([2, 2, 13, 8], DType::F32, &mut rng);
    let v = Tensor::randn([2, 2, 13, 8], DType::F32, &mut rng);
    for causal in [false, true] {
        let a = q.scaled_dot_product_attention(&k, &v, causal, Some(0.3)).unwrap().to_vec_f32();
        let b = q.naive_attention(&k, &v, causal, Some(0.3)).unwrap().to_vec_f32();
        assert_eq!(a, b);
    }
}

#[test]
fn refusals_are_typed_and_say_what_to_change() {
    attention_cases::refusals(&Device::Cpu).unwrap();
}

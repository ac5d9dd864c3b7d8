//! The GPT on the CPU: gradients against finite differences (f64), the key/value cache against
//! the full forward, AdamW's parameter groups, and a tiny model learning a small grammar.

use kiln::corpus::{Corpus, TokenKind, WindowRng, windows};
use kiln::nn::{Gpt, GptConfig, Module};
use kiln::optim::{Adam, Optimizer};
use kiln::tensor::{DType, Tensor};

fn tiny(vocab: usize, tie: bool) -> GptConfig {
    GptConfig { block: 8, width: 16, layers: 2, heads: 2, tie_weights: tie, ..GptConfig::tiny(vocab) }
}

/// Every parameter tensor's gradient, at a few elements, against central differences in f64.
#[test]
fn gradients_match_finite_differences() {
    for tie in [true, false] {
        let cfg = tiny(7, tie);
        let model = Gpt::new(&cfg, DType::F64, 3).unwrap();
        // LayerNorm parameters start at one and zero: move them so their gradients are generic.
        let mut rng = Tensor::rng(9);
        for (_, p) in model.named_parameters() {
            let noise = Tensor::randn(p.shape().clone(), DType::F64, &mut rng).mul_scalar(0.1).unwrap();
            p.set_data(&p.detach().add(&noise).unwrap()).unwrap();
        }
        let ids = [1, 4, 2, 6, 0, 3, 5, 5, 2, 1];
        let targets = [4, 2, 6, 0, 3, 5, 5, 2, 1, 0];
        let loss = |m: &Gpt| m.loss(&ids, &targets, 2).unwrap();
        model.parameters().iter().for_each(|p| p.zero_grad());
        loss(&model).backward().unwrap();
        let eps = 1e-6;
        for (name, p) in model.named_parameters() {
            let g = p.grad().unwrap_or_else(|| panic!("{name} has no gradient")).to_vec_f64();
            let n = p.elem_count();
            for &i in &[0, n / 3, n - 1] {
                let orig = p.to_vec_f64()[i];
                p.with_data_mut::<f64, _>(|d| d[i] = orig + eps).unwrap();
                let up = loss(&model).item().unwrap();
                p.with_data_mut::<f64, _>(|d| d[i] = orig - eps).unwrap();
                let down = loss(&model).item().unwrap();
                p.with_data_mut::<f64, _>(|d| d[i] = orig).unwrap();
                let fd = (up - down) / (2.0 * eps);
                let err = (g[i] - fd).abs() / (1e-6 + fd.abs().max(g[i].abs()));
                assert!(
                    err < 1e-5 || (g[i] - fd).abs() < 1e-9,
                    "tie {tie}: {name}[{i}]: analytic {} numeric {fd}",
                    g[i]
                );
            }
        }
    }
}

/// Prefill then one token at a time through the cache gives the full forward's logits.
#[test]
fn kv_cache_matches_full_forward() {
    let cfg = tiny(11, true);
    let model = Gpt::new(&cfg, DType::F64, 5).unwrap();
    let seq = [3, 1, 4, 1, 5, 9, 2, 6, 7, 10, 0, 8];
    let batch = 2;
    let t = seq.len() / batch; // 6 positions per row
    let full = model.logits(&seq, batch).unwrap().to_vec_f64();
    let mut cache = model.cache();
    let _g = kiln::tensor::no_grad();
    let prefill: Vec<usize> = (0..batch).flat_map(|b| seq[b * t..b * t + 3].to_vec()).collect();
    let mut got = vec![Vec::new(); batch];
    let out = model.logits_cached(&prefill, batch, &mut cache).unwrap().to_vec_f64();
    let v = cfg.vocab;
    for b in 0..batch {
        got[b].extend_from_slice(&out[b * 3 * v..(b + 1) * 3 * v]);
    }
    for pos in 3..t {
        let step: Vec<usize> = (0..batch).map(|b| seq[b * t + pos]).collect();
        let out = model.logits_cached(&step, batch, &mut cache).unwrap().to_vec_f64();
        for b in 0..batch {
            got[b].extend_from_slice(&out[b * v..(b + 1) * v]);
        }
    }
    assert_eq!(cache.len(), t);
    let got: Vec<f64> = got.concat();
    for (i, (a, b)) in got.iter().zip(&full).enumerate() {
        assert!((a - b).abs() < 1e-10, "logit {i}: cached {a}, full {b}");
    }
    // past the block: refused, naming the block
    let mut cache = model.cache();
    model.logits_cached(&[1; 8], 1, &mut cache).unwrap();
    assert!(model.logits_cached(&[1], 1, &mut cache).unwrap_err().to_string().contains("block size 8"));
}

/// AdamW's groups: an excluded parameter moves only by the Adam update, a decayed one also shrinks.
#[test]
fn adamw_groups_skip_decay() {
    let a = Tensor::from_f64(&[1.0, -2.0], [2], DType::F32).unwrap().requires_grad();
    let b = Tensor::from_f64(&[1.0, -2.0], [2], DType::F32).unwrap().requires_grad();
    let mut opt = Adam::adamw(vec![("a".into(), a.clone()), ("b".into(), b.clone())], 0.1, 0.5);
    opt.set_decay(&[true, false]).unwrap();
    assert!(opt.set_decay(&[true]).is_err());
    a.mul_scalar(0.0).unwrap().sum_all().unwrap().backward().unwrap();
    b.mul_scalar(0.0).unwrap().sum_all().unwrap().backward().unwrap();
    opt.step().unwrap();
    // zero gradients: the Adam step is 0, so only the decay moves a parameter
    assert_eq!(b.to_vec_f64(), vec![1.0, -2.0]);
    let av = a.to_vec_f64();
    assert!((av[0] - 0.95).abs() < 1e-6 && (av[1] + 1.9).abs() < 1e-6, "{av:?}");
}

/// The grammar: `the <noun> <verb> the <noun> .` with a few nouns and verbs; each sentence ends in
/// ". " and sentences follow each other.
const NOUNS: &[&str] = &["cat", "dog", "bird", "fox"];
const VERBS: &[&str] = &["sees", "likes", "hears"];

fn grammar_text(sentences: usize, seed: u64) -> String {
    let mut r = WindowRng::new(seed);
    let mut s = String::new();
    for _ in 0..sentences {
        let n1 = NOUNS[(r.next_u64() % NOUNS.len() as u64) as usize];
        let v = VERBS[(r.next_u64() % VERBS.len() as u64) as usize];
        let n2 = NOUNS[(r.next_u64() % NOUNS.len() as u64) as usize];
        s.push_str(&format!("the {n1} {v} the {n2}. "));
    }
    s
}

fn is_sentence(s: &str) -> bool {
    let w: Vec<&str> = s.split(' ').collect();
    w.len() == 5
        && w[0] == "the"
        && NOUNS.contains(&w[1])
        && VERBS.contains(&w[2])
        && w[3] == "the"
        && w[4].strip_suffix('.').is_some_and(|n| NOUNS.contains(&n))
}

/// Trains a tiny char model on the grammar until its validation loss is below 0.24 nats per
/// character (the grammar's own entropy is about 0.17: ln 48 per sentence of 23 characters; a
/// uniform guess over its characters is 3.0), then samples 20 sentences: at least 10 must be
/// sentences of the grammar, against a chance below 1e-25. About 40 s in a debug build (seeded:
/// the same run every time).
#[test]
fn learns_a_grammar() {
    let text = grammar_text(600, 1);
    let block = 32;
    let corpus = Corpus::from_bytes(text.as_bytes(), TokenKind::Chars, block, "grammar").unwrap();
    let v = corpus.vocab.len();
    let cfg = GptConfig { vocab: v, block, width: 32, layers: 1, heads: 2, ..GptConfig::tiny(v) };
    let model = Gpt::new(&cfg, DType::F32, 0).unwrap();
    let params = model.named_parameters();
    let decay: Vec<bool> = params.iter().map(|(n, _)| Gpt::decays(n)).collect();
    let mut opt = Adam::adamw(params, 2e-2, 0.01);
    opt.set_decay(&decay).unwrap();
    let mut rng = WindowRng::new(2);
    let mut val_loss = f64::INFINITY;
    let bound = 0.24;
    for step in 0..1500 {
        let (x, y) = windows(&corpus.train, 8, block, &mut rng);
        opt.zero_grad();
        model.loss(&x, &y, 8).unwrap().backward().unwrap();
        opt.step().unwrap();
        if step % 25 == 24 {
            let _g = kiln::tensor::no_grad();
            let (x, y) = windows(&corpus.val, 16, block, &mut WindowRng::new(99));
            val_loss = model.loss(&x, &y, 16).unwrap().item().unwrap();
            eprintln!("step {step}: validation loss {val_loss:.3}");
            if val_loss < bound {
                break;
            }
        }
    }
    assert!(val_loss < bound, "validation loss {val_loss} after 1500 steps");
    // Sample 20 sentences at temperature 1 after ". the " (the end of one sentence and the start
    // of the next).
    let _g = kiln::tensor::no_grad();
    let prompt = corpus.vocab.encode(". the ").unwrap();
    let mut r = WindowRng::new(5);
    let mut good = 0;
    let trials = 20;
    for _ in 0..trials {
        let mut ids = prompt.clone();
        let mut cache = model.cache();
        let mut logits = model.logits_cached(&ids, 1, &mut cache).unwrap();
        while ids.len() < block {
            let row = logits.to_vec_f64();
            let last = &row[row.len() - v..];
            let max = last.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = last.iter().map(|l| (l - max).exp()).collect();
            let total: f64 = w.iter().sum();
            let mut u = (r.next_u64() >> 11) as f64 / (1u64 << 53) as f64 * total;
            let mut next = v - 1;
            for (i, wi) in w.iter().enumerate() {
                if u < *wi {
                    next = i;
                    break;
                }
                u -= wi;
            }
            ids.push(next);
            if corpus.vocab.decode(&[next]) == "." {
                break;
            }
            logits = model.logits_cached(&[next], 1, &mut cache).unwrap();
        }
        let sentence = corpus.vocab.decode(&ids[2..]);
        eprintln!("sample: {sentence:?}");
        if is_sentence(&sentence) {
            good += 1;
        }
    }
    // Chance: a uniform string over the 21 characters is one of the 48 sentences with probability
    // below 1e-25; the trained model (within about 0.07 nats per character of the grammar's
    // entropy at the bound) gets half or more right.
    assert!(good >= trials / 2, "{good} of {trials} samples were sentences of the grammar");
}

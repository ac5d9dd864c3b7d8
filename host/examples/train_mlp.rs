//! Trains a small MLP on generated spirals through kiln's API, saves a checkpoint, loads it into a
//! fresh model and evaluates that model: `cargo run --example train_mlp` (on the CPU, about two
//! seconds in a debug build). `cargo test` runs this file as `kiln`'s crate-level doctest, and
//! `tests/library.rs` checks the accuracy it reaches.

use kiln::checkpoint;
use kiln::data::{self, Dataset};
use kiln::nn::{Activation, Module, mlp};
use kiln::optim::{Adam, Optimizer};
use kiln::rand::seq::SliceRandom; // kiln's own rand: no version to match by hand
use kiln::tensor::no_grad;
use kiln::{DType, Tensor};
use std::collections::HashMap;
use std::path::Path;

fn main() -> kiln::Result<()> {
    let path = std::env::temp_dir().join(format!("kiln-train-mlp-{}.safetensors", std::process::id()));
    let (trained, reloaded) = train_save_reload(&path, 20)?;
    println!(
        "test accuracy: {:.2}% trained, {:.2}% reloaded from {}",
        100.0 * trained,
        100.0 * reloaded,
        path.display()
    );
    std::fs::remove_file(&path).map_err(|e| kiln::Error::File { path: path.clone(), msg: e.to_string() })?;
    Ok(())
}

/// Trains for `epochs`, saves the model to `path`, loads it into a fresh model; returns the test
/// accuracy of the trained model and of the reloaded one.
pub fn train_save_reload(path: &Path, epochs: usize) -> kiln::Result<(f64, f64)> {
    // Data: three spiral arms of 200 points each, 80 % for training, 20 % held out (seeded).
    let mut rng = Tensor::rng(0);
    let (train, test) = data::spirals(200, 3, 0.2, &mut rng).split(0.2, &mut rng);

    // Model: 2 -> 64 -> 64 -> 3 with ReLU between the layers, f32 parameters; Adam.
    let (width, depth) = (64, 3);
    let model = mlp(train.features, width, depth, train.classes, Activation::Relu, DType::F32, &mut rng)?;
    let mut opt = Adam::adam(model.named_parameters(), 1e-2, 0.0);

    let mut order: Vec<usize> = (0..train.len()).collect();
    for epoch in 1..=epochs {
        order.shuffle(&mut rng);
        let mut loss_sum = 0.0;
        for batch in order.chunks(64) {
            let (x, y) = train.gather(batch);
            let x = Tensor::from_vec(x, [batch.len(), train.features])?;
            let loss = model.forward(&x)?.cross_entropy(&y)?;
            loss.backward()?;
            opt.step()?;
            opt.zero_grad();
            loss_sum += loss.item()? * batch.len() as f64;
        }
        if epoch % 5 == 0 {
            println!("epoch {epoch:>3}  loss {:.4}", loss_sum / train.len() as f64);
        }
    }
    let trained = accuracy(&model, &test)?;

    // Save the parameters by name, with the shape of the model as metadata.
    let meta = HashMap::from([("width".to_string(), width.to_string()), ("depth".to_string(), depth.to_string())]);
    checkpoint::save(path, &model.named_parameters(), meta)?;

    // A fresh model (other initial weights), rebuilt from the metadata, takes the saved values.
    let (saved, meta) = checkpoint::load(path)?;
    let size = |key: &str| -> kiln::Result<usize> {
        meta.get(key)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| kiln::Error::File { path: path.to_path_buf(), msg: format!("metadata `{key}` is missing") })
    };
    let fresh = mlp(2, size("width")?, size("depth")?, 3, Activation::Relu, DType::F32, &mut Tensor::rng(1))?;
    checkpoint::assign(&fresh.named_parameters(), &saved, "")?;
    Ok((trained, accuracy(&fresh, &test)?))
}

/// The fraction of `data` that `model` classifies right (no graph recorded).
fn accuracy(model: &impl Module, data: &Dataset) -> kiln::Result<f64> {
    let _no_grad = no_grad();
    let x = Tensor::from_vec(data.x.clone(), [data.len(), data.features])?;
    let predicted = model.forward(&x)?.argmax_last()?;
    let right = predicted.iter().zip(&data.y).filter(|(p, y)| p == y).count();
    Ok(right as f64 / data.len() as f64)
}

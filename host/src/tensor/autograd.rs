//! Reverse-mode autograd: topological sort, one backward rule per op (in `ops.rs`, next to the op's
//! record), gradient accumulation, `no_grad`, and a finite-difference gradient check in f64.

use super::{DType, Tensor, TensorId};
use crate::error::{Error, Result};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};

thread_local! {
    static NO_GRAD_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Whether ops record the graph on this thread (false inside [`no_grad`]).
pub fn is_grad_enabled() -> bool {
    NO_GRAD_DEPTH.with(|d| d.get() == 0)
}

/// While alive, ops on this thread record no graph.
pub struct NoGradGuard(());

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        NO_GRAD_DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// Starts a no-grad scope: `let _g = no_grad();`.
pub fn no_grad() -> NoGradGuard {
    NO_GRAD_DEPTH.with(|d| d.set(d.get() + 1));
    NoGradGuard(())
}

impl Tensor {
    /// The tracked tensors this one depends on, each after its inputs (inputs first).
    fn topo_order(&self) -> Vec<Tensor> {
        let mut order = Vec::new();
        let mut seen: HashSet<TensorId> = HashSet::new();
        // Iterative DFS (deep graphs must not overflow the stack): (node, inputs pushed?)
        let mut stack = vec![(self.clone(), false)];
        while let Some((node, expanded)) = stack.pop() {
            if expanded {
                order.push(node);
                continue;
            }
            if !seen.insert(node.id()) {
                continue;
            }
            stack.push((node.clone(), true));
            if let Some(op) = node.op() {
                for input in op.inputs() {
                    if input.is_tracked() && !seen.contains(&input.id()) {
                        stack.push((input.clone(), false));
                    }
                }
            }
        }
        order
    }

    /// Computes d(self)/d(leaf) for every leaf that requires gradients, adding it to the leaf's
    /// `grad()`. `self` must hold one element (a loss).
    pub fn backward(&self) -> Result<()> {
        self.backward_with(&mut |_| Ok(()))
    }

    /// [`Tensor::backward`], calling `on_final` with each leaf as soon as its gradient of this pass
    /// is final (added to its `grad()`), while the rest of the graph is still being
    /// differentiated: the hook of data-parallel training, which starts reducing a bucket of
    /// gradients across GPUs while the earlier layers' gradients are computed. Leaves come in
    /// reverse topological order (an MLP's last layer first). An error from `on_final` ends the
    /// pass with that error.
    pub fn backward_with(&self, on_final: &mut dyn FnMut(&Tensor) -> Result<()>) -> Result<()> {
        if self.elem_count() != 1 {
            return Err(Error::Autograd(format!("backward needs a scalar, this tensor has shape {}", self.shape())));
        }
        if !self.is_tracked() {
            return Err(Error::Autograd("this tensor does not depend on any tensor that requires gradients".into()));
        }
        let _guard = no_grad();
        let order = self.topo_order();
        let mut grads: HashMap<TensorId, Tensor> = HashMap::new();
        grads.insert(self.id(), self.ones_like()?);
        for node in order.iter().rev() {
            let Some(g) = grads.remove(&node.id()) else { continue };
            if node.is_requires_grad() {
                // every consumer of `node` came before it in this reverse order: `g` is complete
                node.accumulate_grad(g.clone())?;
                on_final(node)?;
            }
            if let Some(op) = node.op() {
                for (input, gi) in op.backward(node, &g)? {
                    if !input.is_tracked() {
                        continue;
                    }
                    if gi.shape() != input.shape() {
                        return Err(Error::Autograd(format!(
                            "{} produced a gradient of shape {} for an input of shape {} (a bug in its backward rule)",
                            op.name(),
                            gi.shape(),
                            input.shape()
                        )));
                    }
                    let entry = match grads.remove(&input.id()) {
                        Some(acc) => acc.add(&gi)?,
                        None => gi,
                    };
                    grads.insert(input.id(), entry);
                }
            }
        }
        Ok(())
    }
}

/// Checks `f`'s gradients against central finite differences, in f64 on the CPU.
///
/// `inputs` are converted to f64 leaves; `f` maps them to any tensor, which is reduced to a scalar
/// with fixed random weights (so every output element's gradient is exercised). Returns the largest
/// error found, or a message naming the input, element, analytic and numeric values.
pub fn gradcheck(
    name: &str,
    inputs: &[Tensor],
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
    tol: f64,
) -> std::result::Result<f64, String> {
    let e = |x: Error| format!("{name}: {x}");
    let leaves: Vec<Tensor> = inputs
        .iter()
        .map(|t| t.to_dtype(DType::F64).map(|t| t.detach().requires_grad()))
        .collect::<Result<_>>()
        .map_err(e)?;
    let out = f(&leaves).map_err(e)?;
    let mut rng = Tensor::rng(0x5eed);
    let weights = Tensor::rand(0.5, 1.5, out.shape().clone(), DType::F64, &mut rng);
    let loss = out.mul(&weights).and_then(|t| t.sum_all()).map_err(e)?;
    loss.backward().map_err(e)?;
    let eval = |xs: &[Tensor]| -> Result<f64> {
        let _g = no_grad();
        f(xs)?.mul(&weights)?.sum_all()?.item()
    };
    let h = 1e-6;
    let mut worst = 0.0f64;
    for (i, leaf) in leaves.iter().enumerate() {
        let analytic = match leaf.grad() {
            Some(g) => g.to_vec_f64(),
            None => vec![0.0; leaf.elem_count()],
        };
        let base = leaf.to_vec_f64();
        for j in 0..base.len() {
            let shifted = |delta: f64| -> Result<f64> {
                let mut v = base.clone();
                v[j] += delta;
                let mut xs: Vec<Tensor> = leaves.iter().map(|t| t.detach()).collect();
                xs[i] = Tensor::from_f64(&v, leaf.shape().clone(), DType::F64)?;
                eval(&xs)
            };
            let numeric = (shifted(h).map_err(e)? - shifted(-h).map_err(e)?) / (2.0 * h);
            let err = (analytic[j] - numeric).abs();
            worst = worst.max(err / (1.0 + numeric.abs()));
            // NaN on either side must fail, so no `>` here.
            #[allow(clippy::neg_cmp_op_on_partial_ord)]
            let bad = !(err <= tol * (1.0 + numeric.abs()));
            if bad {
                return Err(format!(
                    "{name}: input {i} element {j}: analytic gradient {:e}, numeric {numeric:e}, tolerance {tol:e}",
                    analytic[j]
                ));
            }
        }
    }
    Ok(worst)
}

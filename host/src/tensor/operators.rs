//! Arithmetic operators on tensors, beside the methods they call: `&a + &b`, `&a - &b`, `&a * &b`,
//! `&a / &b` (elementwise, broadcasting as [`Tensor::add`] and its siblings do), `-&a`, and a tensor
//! with an `f64` on either side. Every operator returns [`Result<Tensor>`], as the methods do: a shape,
//! dtype or device mismatch is an `Err`, never a panic.
//!
//! Each operand may be a `Tensor` or a `&Tensor` (a handle: taking one by value moves no data), and
//! one side of a tensor-tensor operator may be a `Result<Tensor>`, so `&a * &b + &c` chains with one
//! `?` at the end; an error on the way is the one returned. (Rust's orphan rule leaves out a `Result`
//! on both sides, and a `Result` beside an `f64`: put a `?` there, as in `(&a / &b)? * 2.0`.)
//!
//! ```
//! use kiln::{DType, Tensor};
//! let x = Tensor::from_f64(&[1.0, 2.0, 3.0, 4.0], [2, 2], DType::F32)?;
//! let b = Tensor::from_f64(&[10.0, 20.0], [2], DType::F32)?; // broadcast over the rows
//! let y = ((&x * 2.0 + &b)? - &x / 4.0)?;
//! assert_eq!(y.to_vec_f64(), [11.75, 23.5, 15.25, 27.0]);
//! assert!((&x + &Tensor::zeros([3], DType::F32)).is_err()); // [2, 2] and [3] do not broadcast
//! # Ok::<(), kiln::Error>(())
//! ```
//!
//! The scalar forms are the scalar methods: `t + s` is [`Tensor::add_scalar`], `t - s` is
//! `add_scalar(-s)`, `t * s` is [`Tensor::mul_scalar`], and `t / s` divides by `s` elementwise
//! ([`Tensor::div`] by a one-element tensor, so it rounds as division does, not as a multiplication
//! by `1 / s`). With the scalar on the left, `s - t` is `(-t) + s` and `s / t` is `s` divided by each
//! element. Gradients flow through every operator as through the method it calls.
//!
//! With `std::ops::Add` (or a sibling) imported, `a.add(&b)` on an owned `a` picks the operator,
//! which takes `a` by value; call the method on a reference (`(&a).add(&b)`) or leave the trait out.

use super::{Shape, Tensor};
use crate::error::Result;
use std::ops::{Add, Div, Mul, Neg, Sub};

/// A one-element tensor holding `s`, with `like`'s dtype and device (the divisor of `t / s`).
fn scalar_like(like: &Tensor, s: f64) -> Result<Tensor> {
    Tensor::full(s, Shape(vec![]), like.dtype()).to_device(&like.device())
}

/// Tensor-tensor operator `$op` calling the method `$method`, for every owned/borrowed pairing, and
/// with a `Result<Tensor>` on either side.
macro_rules! tensor_tensor {
    ($op:ident, $f:ident, $method:ident) => {
        impl $op<&Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $f(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$method(self, rhs)
            }
        }
        impl $op<Tensor> for &Tensor {
            type Output = Result<Tensor>;
            fn $f(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$method(self, &rhs)
            }
        }
        impl $op<&Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $f(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$method(&self, rhs)
            }
        }
        impl $op<Tensor> for Tensor {
            type Output = Result<Tensor>;
            fn $f(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$method(&self, &rhs)
            }
        }
        impl $op<&Tensor> for Result<Tensor> {
            type Output = Result<Tensor>;
            fn $f(self, rhs: &Tensor) -> Result<Tensor> {
                Tensor::$method(&self?, rhs)
            }
        }
        impl $op<Tensor> for Result<Tensor> {
            type Output = Result<Tensor>;
            fn $f(self, rhs: Tensor) -> Result<Tensor> {
                Tensor::$method(&self?, &rhs)
            }
        }
        impl $op<Result<Tensor>> for &Tensor {
            type Output = Result<Tensor>;
            fn $f(self, rhs: Result<Tensor>) -> Result<Tensor> {
                Tensor::$method(self, &rhs?)
            }
        }
        impl $op<Result<Tensor>> for Tensor {
            type Output = Result<Tensor>;
            fn $f(self, rhs: Result<Tensor>) -> Result<Tensor> {
                Tensor::$method(&self, &rhs?)
            }
        }
    };
}

tensor_tensor!(Add, add, add);
tensor_tensor!(Sub, sub, sub);
tensor_tensor!(Mul, mul, mul);
tensor_tensor!(Div, div, div);

/// Tensor-scalar operator `$op`: `t $op s` is `$right(t, s)`, `s $op t` is `$left(t, s)`, for an
/// owned or borrowed tensor.
macro_rules! tensor_scalar {
    ($op:ident, $f:ident, $right:path, $left:path) => {
        impl $op<f64> for &Tensor {
            type Output = Result<Tensor>;
            fn $f(self, s: f64) -> Result<Tensor> {
                $right(self, s)
            }
        }
        impl $op<f64> for Tensor {
            type Output = Result<Tensor>;
            fn $f(self, s: f64) -> Result<Tensor> {
                $right(&self, s)
            }
        }
        impl $op<&Tensor> for f64 {
            type Output = Result<Tensor>;
            fn $f(self, t: &Tensor) -> Result<Tensor> {
                $left(t, self)
            }
        }
        impl $op<Tensor> for f64 {
            type Output = Result<Tensor>;
            fn $f(self, t: Tensor) -> Result<Tensor> {
                $left(&t, self)
            }
        }
    };
}

/// `t - s`.
fn sub_scalar(t: &Tensor, s: f64) -> Result<Tensor> {
    t.add_scalar(-s)
}
/// `s - t`.
fn scalar_sub(t: &Tensor, s: f64) -> Result<Tensor> {
    t.neg()?.add_scalar(s)
}
/// `t / s`, rounded as a division.
fn div_scalar(t: &Tensor, s: f64) -> Result<Tensor> {
    t.div(&scalar_like(t, s)?)
}
/// `s / t`.
fn scalar_div(t: &Tensor, s: f64) -> Result<Tensor> {
    scalar_like(t, s)?.div(t)
}

tensor_scalar!(Add, add, Tensor::add_scalar, Tensor::add_scalar);
tensor_scalar!(Sub, sub, sub_scalar, scalar_sub);
tensor_scalar!(Mul, mul, Tensor::mul_scalar, Tensor::mul_scalar);
tensor_scalar!(Div, div, div_scalar, scalar_div);

impl Neg for &Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(self)
    }
}

impl Neg for Tensor {
    type Output = Result<Tensor>;
    fn neg(self) -> Result<Tensor> {
        Tensor::neg(&self)
    }
}

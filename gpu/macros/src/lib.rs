//! `#[kernel]`: write a kernel's signature once, get both sides of it.
//!
//! On the device (`target_arch = "nvptx64"`) the attribute turns
//!
//! ```ignore
//! #[kernel]
//! pub unsafe fn vector_add(a: DevicePtr<f32>, b: DevicePtr<f32>, out: DevicePtrMut<f32>, n: u32) { ... }
//! ```
//!
//! into an `extern "ptx-kernel"` entry point named `vector_add` (`.entry vector_add` in the PTX).
//!
//! On the host the body is dropped and the attribute emits a zero-sized descriptor, `VectorAdd`,
//! implementing `kiln_gpu::Kernel` with `Args = (DevicePtr<f32>, DevicePtr<f32>, DevicePtrMut<f32>, u32)`.
//! The host launches it with `launch(VectorAdd, config, (a, b, out, n))`: an argument of the wrong
//! type or a missing argument is a compile error, because both sides read the same declaration.
//!
//! Options:
//! - `#[kernel]`: the kernel is compiled into every architecture's module.
//! - `#[kernel(sm = 90)]`: only into modules for sm_90 and newer (portable Hopper features: TMA,
//!   mbarrier transaction counts, `stmatrix`).
//! - `#[kernel(arch = "sm_90a")]`: only into that exact architecture's module (arch-specific
//!   features such as `wgmma` and `setmaxnreg` on sm_90a, or `tcgen05` on sm_100a).
//! - `max_threads = N` (with either): the launch bound. ptxas then budgets registers for N threads
//!   per block (`.maxntid N, 1, 1`, written by the PTX builder from a marker the entry carries); a
//!   launch with more threads fails.
//! - `min_blocks = B` (with `max_threads`): ptxas keeps registers low enough for B blocks per SM
//!   (`.minnctapersm B`, from a marker like the launch bound's).
//! - `cluster = N` (sm_90 and newer): blocks launch in clusters of N along x (`.reqnctapercluster
//!   N, 1, 1`, from a marker like the launch bound's); the host descriptor's `CLUSTER` says N.
//!
//! Every parameter type must implement `kiln_gpu::KernelParam` (scalars, device pointers and
//! `#[repr(C)]` structs that opt in); the emitted code asserts this at compile time on both sides.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{Expr, ExprLit, FnArg, ItemFn, Lit, MetaNameValue, Token, parse_macro_input};

/// Where a kernel is compiled.
enum Target {
    Any,
    MinSm(u32),
    Arch(String),
}

struct Options {
    target: Target,
    max_threads: Option<u32>,
    min_blocks: Option<u32>,
    cluster: Option<u32>,
}

impl Parse for Options {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let items = Punctuated::<MetaNameValue, Token![,]>::parse_terminated(input)?;
        let mut target = Target::Any;
        let mut max_threads = None;
        let mut min_blocks = None;
        let mut cluster = None;
        for item in items {
            let key = item.path.get_ident().map(|i| i.to_string()).unwrap_or_default();
            let lit = match &item.value {
                Expr::Lit(ExprLit { lit, .. }) => lit.clone(),
                other => return Err(syn::Error::new_spanned(other, "expected a literal")),
            };
            match (key.as_str(), lit) {
                ("sm", Lit::Int(v)) => target = Target::MinSm(v.base10_parse()?),
                ("max_threads", Lit::Int(v)) => max_threads = Some(v.base10_parse()?),
                ("min_blocks", Lit::Int(v)) => min_blocks = Some(v.base10_parse::<u32>()?),
                ("cluster", Lit::Int(v)) => {
                    let n: u32 = v.base10_parse()?;
                    if !matches!(n, 1 | 2 | 4 | 8) {
                        return Err(syn::Error::new_spanned(v, "a portable cluster has 1, 2, 4 or 8 CTAs"));
                    }
                    cluster = Some(n);
                }
                ("arch", Lit::Str(s)) => {
                    let arch = s.value();
                    if !matches!(arch.as_str(), "sm_80" | "sm_90a" | "sm_100a") {
                        return Err(syn::Error::new_spanned(
                            s,
                            "kiln builds modules for \"sm_80\", \"sm_90a\" and \"sm_100a\"; name one of these",
                        ));
                    }
                    target = Target::Arch(arch);
                }
                _ => {
                    return Err(syn::Error::new_spanned(
                        &item.path,
                        "unknown #[kernel] option: use `sm = 90` (minimum architecture), `arch = \"sm_90a\"` (exact), `max_threads = 384` (launch bound), `min_blocks = 2` (blocks per SM, with max_threads) or `cluster = 2` (CTAs per cluster)",
                    ));
                }
            }
        }
        if min_blocks.is_some() && max_threads.is_none() {
            return Err(syn::Error::new(
                Span::call_site(),
                "`min_blocks` needs `max_threads` too (PTX's .minnctapersm goes with .maxntid)",
            ));
        }
        Ok(Options { target, max_threads, min_blocks, cluster })
    }
}

fn camel_case(snake: &str) -> String {
    snake
        .split('_')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let mut c = p.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

/// Marks a function as a GPU kernel entry point; see the crate documentation.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let options = parse_macro_input!(attr as Options);
    let func = parse_macro_input!(item as ItemFn);
    match expand(options, func) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn expand(options: Options, func: ItemFn) -> syn::Result<TokenStream2> {
    let sig = &func.sig;
    if !sig.generics.params.is_empty() {
        return Err(syn::Error::new_spanned(
            &sig.generics,
            "a kernel entry point cannot be generic: write a generic #[inline(always)] body and one #[kernel] per type",
        ));
    }
    if let syn::ReturnType::Type(_, ty) = &sig.output {
        return Err(syn::Error::new_spanned(ty, "a kernel returns nothing: write results through a DevicePtrMut"));
    }
    if sig.abi.is_some() {
        return Err(syn::Error::new_spanned(&sig.abi, "#[kernel] adds the ptx-kernel ABI itself: remove `extern`"));
    }
    let name = &sig.ident;
    let name_str = name.to_string();
    let host_ty = format_ident!("{}", camel_case(&name_str), span = name.span());
    let mut param_tys = Vec::new();
    let mut param_names = Vec::new();
    for arg in &sig.inputs {
        match arg {
            FnArg::Typed(pt) => {
                param_tys.push((*pt.ty).clone());
                param_names.push(match &*pt.pat {
                    syn::Pat::Ident(i) => i.ident.to_string(),
                    _ => "_".to_string(),
                });
            }
            FnArg::Receiver(r) => return Err(syn::Error::new_spanned(r, "a kernel takes no self")),
        }
    }
    let device_cfg = match &options.target {
        Target::Any => quote!(target_arch = "nvptx64"),
        Target::MinSm(sm) => {
            let feat = format!("sm_{sm}");
            quote!(all(target_arch = "nvptx64", target_feature = #feat))
        }
        Target::Arch(a) => quote!(all(target_arch = "nvptx64", target_feature = #a)),
    };
    let host_target = match &options.target {
        Target::Any => quote!(::kiln_gpu::KernelTarget::Any),
        Target::MinSm(sm) => quote!(::kiln_gpu::KernelTarget::MinSm(#sm)),
        Target::Arch(a) => {
            let v = match a.as_str() {
                "sm_80" => quote!(Sm80),
                "sm_90a" => quote!(Sm90a),
                _ => quote!(Sm100a),
            };
            quote!(::kiln_gpu::KernelTarget::Exact(::kiln_gpu::Arch::#v))
        }
    };
    let docs: Vec<_> = func.attrs.iter().filter(|a| a.path().is_ident("doc")).collect();
    let other_attrs: Vec<_> = func.attrs.iter().filter(|a| !a.path().is_ident("doc")).collect();
    let vis = &func.vis;
    let inputs = &sig.inputs;
    let block = &func.block;
    let bound = options.max_threads.map(|n| quote!(::kiln_gpu::thread::max_threads_marker::<#n>();));
    let min_blocks = options.min_blocks.map(|b| quote!(::kiln_gpu::thread::min_blocks_marker::<#b>();));
    let cluster_marker = options.cluster.map(|n| quote!(::kiln_gpu::cluster::cluster_marker::<#n>();));
    let cluster = options.cluster.unwrap_or(1);
    let unsafety = &sig.unsafety;
    let arity = param_tys.len();
    let assert_fn = syn::Ident::new(&format!("__kiln_assert_params_{name_str}"), Span::call_site());

    Ok(quote! {
        #[cfg(#device_cfg)]
        #(#docs)*
        #(#other_attrs)*
        #[unsafe(no_mangle)]
        #vis #unsafety extern "ptx-kernel" fn #name(#inputs) {
            #bound
            #min_blocks
            #cluster_marker
            #block
        }

        #[allow(non_snake_case, dead_code)]
        fn #assert_fn() {
            fn is_param<T: ::kiln_gpu::KernelParam>() {}
            #( is_param::<#param_tys>(); )*
        }

        #[cfg(not(target_arch = "nvptx64"))]
        #(#docs)*
        ///
        /// Host-side launch descriptor generated by `#[kernel]` from the same declaration as the
        /// device entry point.
        #[derive(Clone, Copy, Debug, Default)]
        #vis struct #host_ty;

        #[cfg(not(target_arch = "nvptx64"))]
        impl ::kiln_gpu::Kernel for #host_ty {
            const NAME: &'static str = #name_str;
            const TARGET: ::kiln_gpu::KernelTarget = #host_target;
            const PARAMS: &'static [&'static str] = &[#(#param_names),*];
            const CLUSTER: u32 = #cluster;
            type Args = (#(#param_tys,)*);
        }

        #[cfg(not(target_arch = "nvptx64"))]
        const _: () = assert!(<<#host_ty as ::kiln_gpu::Kernel>::Args as ::kiln_gpu::KernelArgs>::ARITY == #arity);
    })
}

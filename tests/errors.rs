//! Typed errors a user meets without a GPU: no driver, bad tensor-map specs.

use kiln::cuda::{Device, TensorMapSpec, TmaDtype};
use kiln::gpu::swizzle::Swizzle;

#[test]
fn device_discovery_never_panics() {
    // On a machine without a driver this is Error::NoDriver; with one, a device or NoDevice.
    match Device::new(usize::MAX) {
        Err(kiln::Error::NoDriver) | Err(kiln::Error::NoDevice { .. }) => {}
        other => panic!("opening device usize::MAX should fail with a typed error, got {other:?}"),
    }
}

fn spec() -> TensorMapSpec {
    TensorMapSpec {
        dtype: TmaDtype::F32,
        rows: 64,
        cols: 32,
        row_pitch: 32,
        box_rows: 64,
        box_cols: 32,
        swizzle: Swizzle::B128,
    }
}

#[test]
fn tensor_map_specs_are_validated_with_actionable_errors() {
    assert!(spec().validate(0x1000).is_ok());
    let cases: [(TensorMapSpec, u64, &str); 6] = [
        (spec(), 0x1004, "16-byte aligned"),
        (
            TensorMapSpec { row_pitch: 77, cols: 77, ..spec() },
            0x1000,
            "multiple of 16 bytes: pad rows to a multiple of 4",
        ),
        (TensorMapSpec { row_pitch: 16, ..spec() }, 0x1000, "smaller than the 32 columns"),
        (TensorMapSpec { box_rows: 300, ..spec() }, 0x1000, "1..=256"),
        (TensorMapSpec { box_cols: 64, row_pitch: 64, cols: 64, ..spec() }, 0x1000, "exceed the 128-byte swizzle span"),
        (TensorMapSpec { rows: 0, ..spec() }, 0x1000, "1..=2^32"),
    ];
    for (s, addr, needle) in cases {
        let e = s.validate(addr).expect_err(needle).to_string();
        assert!(e.contains(needle), "error `{e}` should say `{needle}`");
        assert!(e.starts_with("tensor map:"), "{e}");
    }
    assert_eq!(spec().box_bytes(), 8192);
}

/// The matmul precision: parsed from its command-line names (an unknown one is a typed error that
/// names the choices), set per thread by a scope that restores the previous setting, nested or not,
/// and invisible to other threads.
#[test]
fn matmul_precision_scopes_nest_and_stay_on_their_thread() {
    use kiln::cuda::{MatmulPrecision, matmul_precision, matmul_precision_scope};
    assert_eq!("bf16".parse::<MatmulPrecision>().ok(), Some(MatmulPrecision::Bf16));
    assert_eq!("f32".parse::<MatmulPrecision>().ok(), Some(MatmulPrecision::F32));
    let e = "fp8".parse::<MatmulPrecision>().unwrap_err().to_string();
    assert!(e.contains("f32") && e.contains("bf16") && e.contains("fp8"), "{e}");
    assert_eq!(matmul_precision(), MatmulPrecision::F32);
    {
        let _outer = matmul_precision_scope(MatmulPrecision::Bf16);
        assert_eq!(matmul_precision(), MatmulPrecision::Bf16);
        std::thread::spawn(|| assert_eq!(matmul_precision(), MatmulPrecision::F32)).join().unwrap();
        {
            let _inner = matmul_precision_scope(MatmulPrecision::F32);
            assert_eq!(matmul_precision(), MatmulPrecision::F32);
        }
        assert_eq!(matmul_precision(), MatmulPrecision::Bf16);
    }
    assert_eq!(matmul_precision(), MatmulPrecision::F32);
}

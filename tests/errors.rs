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

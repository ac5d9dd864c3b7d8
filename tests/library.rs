//! kiln used as a dependency: the crates its API exposes are reachable through it, at the versions
//! its signatures use; the crate's example (`host/examples/train_mlp.rs`, also the crate-level
//! doctest) trains, saves, reloads and evaluates; and a build on a cargo that is not a nightly is
//! told which toolchain kiln needs and how to get it (the build script's check, `host/build/`).

// The example's file, as a module: `main` is the example binary's, unused here.
#[allow(dead_code)]
#[path = "../host/examples/train_mlp.rs"]
mod train_mlp;

// The build script's toolchain check, as a module.
#[path = "../host/build/toolchain.rs"]
mod toolchain;

use kiln::nn::{Linear, Module};
use kiln::{DType, Tensor};

/// Every type below is named through kiln only, and each is passed to kiln's own functions: were a
/// re-export missing or of another version than the one kiln's signatures use, this would not
/// compile.
#[test]
fn the_crates_in_kilns_signatures_are_reexported_at_kilns_versions() {
    use kiln::rand::{Rng, SeedableRng};

    // rand: the generators that kiln's constructors and datasets take
    let mut rng = kiln::rand::rngs::StdRng::seed_from_u64(3);
    let layer = Linear::new(4, 2, true, DType::F32, &mut rng).unwrap();
    let x = Tensor::randn([5, 4], DType::F32, &mut rng);
    assert_eq!(layer.forward(&x).unwrap().dims(), [5, 2]);
    let spirals = kiln::data::spirals(10, 2, 0.1, &mut rng);
    assert_eq!(spirals.len(), 20);
    let _: f64 = rng.random();
    // the same generator as kiln's own seeding helper
    let (mut a, mut b) = (Tensor::rng(9), kiln::rand::rngs::StdRng::seed_from_u64(9));
    assert_eq!(a.random::<u64>(), b.random::<u64>());

    // half: the element types of bf16 and f16 host storage and of the typed GEMMs' operands
    fn hgemm_input<T: kiln::cuda::gemm::HgemmInput>(x: T) -> T {
        x
    }
    let h = hgemm_input(kiln::half::bf16::from_f32(1.5));
    let storage = kiln::tensor::CpuStorage::BF16(vec![h, hgemm_input(kiln::half::bf16::from_f32(-2.0))]);
    assert_eq!(storage.to_f64_vec(), [1.5, -2.0]);
    let _: kiln::half::f16 = hgemm_input(kiln::half::f16::ONE);

    // cudarc: the driver types in kiln::cuda's signatures (a launch configuration, a device attribute)
    let cfg: kiln::cudarc::driver::LaunchConfig = kiln::cuda::LaunchConfig::for_num_elems(1024);
    assert_eq!(cfg.block_dim.0 * cfg.grid_dim.0, 1024);
    let _attribute = kiln::cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
}

#[test]
fn the_example_trains_saves_reloads_and_evaluates() {
    let path = std::env::temp_dir().join(format!("kiln-test-example-{}.safetensors", std::process::id()));
    let (trained, reloaded) = train_mlp::train_save_reload(&path, 20).unwrap();
    assert!(trained >= 0.9, "the example's model reached only {:.1}% test accuracy", 100.0 * trained);
    // the reloaded model is the trained one: the same predictions, so the same accuracy
    assert_eq!(reloaded, trained);
    assert!(path.exists(), "the checkpoint was not written");
    std::fs::remove_file(&path).unwrap();
}

fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("host lives in the workspace").to_path_buf()
}

/// `cargo -vV` of a stable cargo, as a user without the nightly runs it.
const STABLE: &str = "cargo 1.95.0 (f2d3ce0bd 2026-03-21)\nrelease: 1.95.0\ncommit-hash: \
                      f2d3ce0bd7f24a49f8f72d9000448f8838c4e850\nhost: x86_64-unknown-linux-gnu\n";

#[test]
fn only_a_nightly_cargo_or_rustc_bootstrap_passes_the_build_scripts_toolchain_check() {
    assert!(!toolchain::accepts_z_flags(STABLE, false));
    assert!(!toolchain::accepts_z_flags("cargo 1.96.0-beta.3 (0123abc 2026-04-30)\nrelease: 1.96.0-beta.3\n", false));
    assert!(toolchain::accepts_z_flags(
        "cargo 1.97.0-nightly (4d1f98451 2026-05-15)\nrelease: 1.97.0-nightly\n",
        false
    ));
    assert!(toolchain::accepts_z_flags("cargo 1.98.0-dev\nrelease: 1.98.0-dev\n", false));
    assert!(toolchain::accepts_z_flags(STABLE, true), "RUSTC_BOOTSTRAP=1 lets a stable cargo take -Z flags");
}

#[test]
fn the_pinned_nightly_that_builds_kiln_passes_the_toolchain_check() {
    let cargo = env!("CARGO"); // the cargo that built this test, through rust-toolchain.toml
    if !std::path::Path::new(cargo).exists() {
        eprintln!("{cargo} is not on this machine (GPU bundle); checked where kiln is built");
        return;
    }
    let version = toolchain::cargo_version(cargo.as_ref()).expect("`cargo -vV` runs");
    assert!(version.starts_with("cargo "), "`cargo -vV` printed {version}");
    assert!(toolchain::accepts_z_flags(&version, false), "the check refuses the cargo that builds kiln:\n{version}");
}

#[test]
fn a_stable_build_is_told_which_nightly_kiln_pins_and_how_a_dependent_crate_gets_it() {
    if !workspace().join("rust-toolchain.toml").exists() {
        eprintln!("the sources are not beside this binary (GPU bundle); checked in the source tree by CI");
        return;
    }
    let file = workspace().join("rust-toolchain.toml");
    let pinned = toolchain::pinned_channel(&workspace()).expect("rust-toolchain.toml names a channel");
    assert!(pinned.starts_with("nightly-"), "the pinned channel is {pinned}");
    let msg = toolchain::not_nightly_message(STABLE, &pinned, &file);
    for needle in [
        "cargo 1.95.0 (f2d3ce0bd 2026-03-21)".to_string(),
        "-Zbuild-std=core".to_string(),
        file.display().to_string(),
        format!("rustup toolchain install {pinned} --component rust-src"),
        format!("rustup override set {pinned}"),
        "copy that rust-toolchain.toml into the crate's root".to_string(),
        "Using kiln as a library".to_string(),
    ] {
        assert!(msg.contains(&needle), "the message lacks `{needle}`:\n{msg}");
    }
    // the README section the message names exists, and gives the same commands for today's pin
    let readme = std::fs::read_to_string(workspace().join("README.md")).expect("README.md");
    assert!(readme.contains("## Using kiln as a library"), "README.md has no section \"Using kiln as a library\"");
    for command in
        [format!("rustup toolchain install {pinned} --component rust-src"), format!("rustup override set {pinned}")]
    {
        assert!(readme.contains(&command), "README.md does not say `{command}` (the pin moved?)");
    }
}

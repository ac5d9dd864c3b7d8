//! The cubins the build embeds beside the PTX (where it found ptxas): each is the ELF file of its
//! module's architecture, byte for byte what that ptxas makes of the embedded PTX, and `kiln info`
//! says which are embedded and which image the device loads. No GPU needed.

use kiln::gpu::Arch;
use kiln::ptx;
use std::path::Path;
use std::process::Command;

#[test]
fn embedded_cubins_are_cubins_of_their_architecture() {
    for arch in ptx::embedded_cubins() {
        let cubin = ptx::embedded_cubin(arch).expect("listed as embedded");
        let target =
            ptx::cubin_target(cubin).unwrap_or_else(|| panic!("the {} cubin is not a CUDA ELF file", arch.name()));
        assert!(target.is(arch), "the {} cubin was assembled for {target:?}", arch.name());
    }
}

#[test]
fn the_build_records_what_it_embedded() {
    let rejected: Vec<&str> = ptx::rejected_cubins().iter().map(|(a, _)| *a).collect();
    match ptx::cubin_assembler() {
        Some((path, _)) => {
            assert_eq!(ptx::cubins_not_assembled_because(), None);
            for arch in Arch::ALL {
                assert!(
                    ptx::embedded_cubin(arch).is_some() || rejected.contains(&arch.name()),
                    "{path} ran at build time, yet {} has neither a cubin nor a recorded rejection",
                    arch.name()
                );
            }
        }
        None => {
            assert!(ptx::embedded_cubins().is_empty(), "cubins embedded without an assembler");
            assert!(ptx::cubins_not_assembled_because().is_some(), "no ptxas ran and no reason recorded");
            eprintln!("no cubins embedded: {}", ptx::cubins_not_assembled_because().unwrap_or_default());
        }
    }
}

/// The embedded cubin of `arch` is what the build's ptxas makes of the embedded PTX now (with the
/// arguments `cargo xtask build-ptx` uses). Skipped, with a message, without an embedded cubin or
/// where that ptxas is not on this machine (the GPU bundle).
fn cubin_is_ptxas_output(arch: Arch) {
    let Some(cubin) = ptx::embedded_cubin(arch) else {
        eprintln!("no {} cubin embedded ({}): nothing to compare", arch.name(), ptx::cubin_summary());
        return;
    };
    let (ptxas, _) = ptx::cubin_assembler().expect("a cubin is embedded, so the build ran ptxas");
    if !Path::new(ptxas).is_file() {
        eprintln!("{ptxas} (which assembled the cubins) is not on this machine: not re-assembled");
        return;
    }
    let dir = std::env::temp_dir().join(format!("kiln-cubin-test-{}-{}", std::process::id(), arch.name()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let ptx_file = dir.join(ptx::file_name(arch));
    let out = dir.join(format!("kiln_{}.cubin", arch.name()));
    std::fs::write(&ptx_file, ptx::embedded(arch)).expect("writing the PTX");
    kiln_ptx_builder::assemble(Path::new(ptxas), &ptx_file, arch.name(), &out)
        .unwrap_or_else(|e| panic!("re-assembling {}: {e}", arch.name()));
    let fresh = std::fs::read(&out).expect("ptxas wrote the cubin");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        fresh == cubin,
        "the embedded {} cubin ({} bytes) is not what {ptxas} makes of the embedded PTX ({} bytes)",
        arch.name(),
        cubin.len(),
        fresh.len()
    );
}

#[test]
fn sm_80_cubin_is_ptxas_output_of_the_embedded_ptx() {
    cubin_is_ptxas_output(Arch::Sm80);
}

#[test]
fn sm_90a_cubin_is_ptxas_output_of_the_embedded_ptx() {
    cubin_is_ptxas_output(Arch::Sm90a);
}

#[test]
fn sm_100a_cubin_is_ptxas_output_of_the_embedded_ptx() {
    cubin_is_ptxas_output(Arch::Sm100a);
}

/// `kiln info` (and `kiln info --load-time`) run as a user runs them (`$KILN_BIN` in the GPU
/// bundle); `None` where no binary is here.
fn kiln(args: &[&str]) -> Option<std::process::Output> {
    let exe = kiln::testing::kiln_binary("kiln info", env!("CARGO_BIN_EXE_kiln"))?;
    // the child sees this process's environment (KILN_PTX_DIR, KILN_FORCE_PTX), so that what it
    // reports is what `Device::module_source` says here
    let out = Command::new(exe).args(args).output().expect("running kiln");
    Some(out)
}

#[test]
fn info_says_which_cubins_are_embedded_and_what_the_device_loads() {
    let Some(out) = kiln(&["info"]) else { return };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "kiln info failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let names: Vec<&str> = ptx::embedded_cubins().into_iter().map(Arch::name).collect();
    let expected = if names.is_empty() {
        "no cubins built into this binary (".to_string()
    } else {
        format!("cubins built into this binary: {} (assembled by ", names.join(", "))
    };
    assert!(stdout.contains(&expected), "`kiln info` does not say `{expected}`:\n{stdout}");
    if let Ok(dev) = kiln::cuda::Device::new(0) {
        let line = format!("loads the {} module: {}", dev.arch().name(), dev.module_source());
        assert!(stdout.contains(&line), "`kiln info` does not say `{line}`:\n{stdout}");
    }
}

#[test]
fn info_load_time_times_the_load_or_says_why_it_cannot() {
    let Some(out) = kiln(&["info", "--load-time"]) else { return };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    match kiln::cuda::Device::new(0) {
        Ok(dev) => {
            assert!(out.status.success(), "kiln info --load-time failed:\n{stdout}\n{stderr}");
            let line = format!("  loading {}: ", dev.module_source());
            assert!(stdout.contains(&line) && stdout.contains(" ms"), "no load time for `{line}`:\n{stdout}");
        }
        Err(e) => {
            assert!(!out.status.success(), "--load-time without a GPU must fail:\n{stdout}");
            assert!(stderr.contains(&format!("error: {e}")), "the error does not say why: {stderr}");
        }
    }
}

//! The `kiln` command line.

use clap::{Parser, Subcommand};
use kiln::cuda::Device;
use kiln::gpu::Arch;

#[derive(Parser)]
#[command(name = "kiln", version, about = "GPU kernels in Rust, and the engine that runs them")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Show the device, its compute capability, the PTX module it loads and the kernels in it.
    Info,
}

fn info() -> kiln::Result<()> {
    println!("kiln {}", env!("CARGO_PKG_VERSION"));
    println!("PTX modules built into this binary:");
    for arch in Arch::ALL {
        let text = kiln::ptx::embedded(arch);
        let entries = kiln::ptx::entries(text);
        println!("  {:8} {:3} kernels: {}", arch.name(), entries.len(), entries.join(", "));
    }
    match Device::new(0) {
        Ok(dev) => {
            let (major, minor) = dev.compute_capability();
            println!(
                "device 0: {} (compute capability {major}.{minor}), loads the {} module",
                dev.name(),
                dev.arch().name()
            );
        }
        Err(e) => println!("no usable GPU: {e}"),
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Info) {
        Command::Info => info(),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

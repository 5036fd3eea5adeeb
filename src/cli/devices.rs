//! `pipeline devices [--json]`: what this machine can run on, before a campaign is started on it.

use super::ExitStatus;
use super::args::Runtime;
use super::printer::{Printer, out};
use embedding_pipeline::ops::devices::devices;

/// `pipeline devices`'s arguments.
#[derive(Debug, clap::Args)]
pub struct DevicesArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    runtime: Runtime,
}

/// Print the report.
pub fn run(args: DevicesArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    args.runtime.apply();
    let d = devices();
    if args.json {
        out!(printer, "{}", serde_json::to_string_pretty(&d)?);
        return Ok(ExitStatus::Success);
    }
    match (&d.onnxruntime_library, &d.onnxruntime_error) {
        (Some(lib), _) => out!(
            printer,
            "ONNX Runtime {} from {lib}: {}",
            d.onnxruntime_version.as_deref().unwrap_or("(unknown version)"),
            if d.cuda_provider {
                "CPU and CUDA providers"
            } else {
                "CPU provider only (run scripts/setup --gpu for CUDA)"
            }
        ),
        (None, e) => out!(printer, "ONNX Runtime: {}", e.as_deref().unwrap_or("not loaded")),
    }
    out!(printer, "CUDA libraries from scripts/setup --gpu: {}", d.cuda_libraries.as_deref().unwrap_or("none"));
    match (&d.nvidia, &d.nvidia_error) {
        (Some(s), _) => {
            out!(
                printer,
                "NVIDIA driver {} (CUDA {}), {} GPU(s)",
                s.driver_version,
                s.cuda_driver_version,
                s.gpus.len()
            );
            for g in &s.gpus {
                out!(printer, "  {g}");
            }
        }
        (None, e) => out!(printer, "GPUs: none usable: {}", e.as_deref().unwrap_or("unknown")),
    }
    Ok(ExitStatus::Success)
}

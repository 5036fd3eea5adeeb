//! `pipeline devices [--json]`: what this machine can run on, before a campaign is started on it.

use embedding_pipeline::ops::devices::devices;

/// Print the report.
pub fn print(json: bool) -> anyhow::Result<()> {
    let d = devices();
    if json {
        println!("{}", serde_json::to_string_pretty(&d)?);
        return Ok(());
    }
    match (&d.onnxruntime_library, &d.onnxruntime_error) {
        (Some(lib), _) => println!(
            "ONNX Runtime {} from {lib}: {}",
            d.onnxruntime_version.as_deref().unwrap_or("(unknown version)"),
            if d.cuda_provider {
                "CPU and CUDA providers"
            } else {
                "CPU provider only (run scripts/setup --gpu for CUDA)"
            }
        ),
        (None, e) => println!("ONNX Runtime: {}", e.as_deref().unwrap_or("not loaded")),
    }
    println!("CUDA libraries from scripts/setup --gpu: {}", d.cuda_libraries.as_deref().unwrap_or("none"));
    match (&d.nvidia, &d.nvidia_error) {
        (Some(s), _) => {
            println!("NVIDIA driver {} (CUDA {}), {} GPU(s)", s.driver_version, s.cuda_driver_version, s.gpus.len());
            for g in &s.gpus {
                println!("  {g}");
            }
        }
        (None, e) => println!("GPUs: none usable: {}", e.as_deref().unwrap_or("unknown")),
    }
    Ok(())
}

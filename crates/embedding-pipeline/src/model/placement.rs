//! Which execution provider ran each node of a model, read from ONNX Runtime's own profile of one probe
//! batch.
//!
//! NOTE: ONNX Runtime's `session.disable_cpu_ep_fallback` refuses a session if any node is assigned
//! to the CPU, and its CUDA provider deliberately leaves shape arithmetic (Shape, Gather on shapes,
//! Concat of dims…) to the CPU, so that switch refuses ordinary transformer exports outright. What a
//! campaign must never do is run its heavy work on the CPU. So a CUDA session is probed once: one
//! batch under the profiler, and every node that the CUDA provider did not take and whose outputs are
//! larger than shape arithmetic ever makes is a fallback. A model with any is refused unless
//! `embed.allow_cpu_fallback = true`, and then the fallback nodes are named in the run record.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Output bytes above which a node is doing real work rather than shape arithmetic. The probe batch
/// (4 rows of 32 tokens) makes hidden states of 4 x 32 x dim floats, far above this; shape tensors
/// and the position ids stay far below.
pub const SHAPE_WORK_BYTES: u64 = 4096;

/// Rows and tokens of the probe batch.
pub const PROBE_SHAPE: [usize; 2] = [4, 32];

/// Node counts per provider, and the nodes doing real work on a provider other than the one asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct NodePlacement {
    /// Nodes each provider ran in the probe batch.
    pub nodes_per_provider: BTreeMap<String, u64>,
    /// `op (node name)` of each node with outputs above [`SHAPE_WORK_BYTES`] that did not run on the
    /// provider asked for.
    pub fallback_nodes: Vec<String>,
}

impl NodePlacement {
    /// Read an ONNX Runtime profile (Chrome trace JSON) and judge it against the provider asked for.
    pub fn from_profile(profile: &str, wanted_provider: &str) -> Result<Self, String> {
        let events: Vec<serde_json::Value> =
            serde_json::from_str(profile).map_err(|e| format!("the ONNX Runtime profile is not JSON: {e}"))?;
        let mut placement = NodePlacement::default();
        for e in events.iter().filter(|e| e["cat"] == "Node") {
            let args = &e["args"];
            let Some(provider) = args["provider"].as_str() else { continue };
            // Each node appears once per run as `<node>_kernel_time`; fence events carry no provider.
            let Some(node) = e["name"].as_str().and_then(|n| n.strip_suffix("_kernel_time")) else { continue };
            *placement.nodes_per_provider.entry(provider.to_string()).or_default() += 1;
            let output_bytes = match &args["output_size"] {
                serde_json::Value::String(s) => s.parse().unwrap_or(0),
                v => v.as_u64().unwrap_or(0),
            };
            if provider != wanted_provider && output_bytes > SHAPE_WORK_BYTES {
                let op = args["op_name"].as_str().unwrap_or("?");
                placement.fallback_nodes.push(format!("{op} ({node})"));
            }
        }
        if placement.nodes_per_provider.is_empty() {
            return Err("the ONNX Runtime profile lists no nodes".into());
        }
        Ok(placement)
    }

    /// `12 nodes on CUDAExecutionProvider, 9 on CPUExecutionProvider`.
    pub fn summary(&self) -> String {
        self.nodes_per_provider.iter().map(|(p, n)| format!("{n} nodes on {p}")).collect::<Vec<_>>().join(", ")
    }

    /// The refusal when work falls back: how many nodes, the first few, and how to accept it.
    pub fn refusal(&self, wanted_provider: &str) -> Option<String> {
        if self.fallback_nodes.is_empty() {
            return None;
        }
        let shown: Vec<&str> = self.fallback_nodes.iter().take(5).map(String::as_str).collect();
        let more = self.fallback_nodes.len().saturating_sub(shown.len());
        Some(format!(
            "{} nodes that compute on activations would run outside {wanted_provider} (on the CPU): {}{}. {}. SET \
             embed.allow_cpu_fallback = true to run them there anyway; the run record then lists them",
            self.fallback_nodes.len(),
            shown.join(", "),
            if more > 0 { format!(" and {more} more") } else { String::new() },
            self.summary()
        ))
    }
}

/// Run one probe batch through `session` (built with profiling into `dir`), end the profile and read
/// it. Every input the model takes is fed: ids of `pad_id` with a full attention mask.
pub fn probe(
    session: &mut ort::session::Session,
    pad_id: u32,
    wanted_provider: &str,
    dir: &Path,
) -> Result<NodePlacement, String> {
    use ort::value::Tensor;
    let n = PROBE_SHAPE[0] * PROBE_SHAPE[1];
    let names: Vec<String> = session.inputs().iter().map(|i| i.name().to_string()).collect();
    let mut inputs: Vec<(String, ort::session::SessionInputValue<'_>)> = Vec::new();
    for name in names {
        let value = match name.as_str() {
            "input_ids" => vec![pad_id as i64; n],
            "attention_mask" => vec![1i64; n],
            _ => vec![0i64; n],
        };
        let tensor = Tensor::from_array((PROBE_SHAPE, value)).map_err(|e| e.to_string())?;
        inputs.push((name, tensor.into()));
    }
    session.run(inputs).map_err(|e| format!("the probe batch failed: {e}"))?;
    let file = session.end_profiling().map_err(|e| format!("cannot end the ONNX Runtime profile: {e}"))?;
    let path = if Path::new(&file).is_absolute() { Path::new(&file).to_path_buf() } else { dir.join(&file) };
    let text = std::fs::read_to_string(&path)
        .or_else(|_| std::fs::read_to_string(&file))
        .map_err(|e| format!("cannot read the ONNX Runtime profile {file}: {e}"))?;
    NodePlacement::from_profile(&text, wanted_provider)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_arithmetic_on_the_cpu_is_allowed_real_work_is_not() {
        let profile = r#"[
            {"cat": "Session", "name": "model_run", "args": {}},
            {"cat": "Node", "name": "/Shape_kernel_time", "args": {"op_name": "Shape", "provider": "CPUExecutionProvider", "output_size": "16"}},
            {"cat": "Node", "name": "/Shape_fence_before", "args": {"op_name": "Shape"}},
            {"cat": "Node", "name": "/l0/MatMul_kernel_time", "args": {"op_name": "MatMul", "provider": "CUDAExecutionProvider", "output_size": "196608"}},
            {"cat": "Node", "name": "/l0/Erf_kernel_time", "args": {"op_name": "Erf", "provider": "CPUExecutionProvider", "output_size": "786432"}}
        ]"#;
        let p = NodePlacement::from_profile(profile, "CUDAExecutionProvider").unwrap();
        assert_eq!(
            p.nodes_per_provider,
            BTreeMap::from([("CPUExecutionProvider".into(), 2), ("CUDAExecutionProvider".into(), 1)])
        );
        assert_eq!(p.fallback_nodes, vec!["Erf (/l0/Erf)".to_string()]);
        let refusal = p.refusal("CUDAExecutionProvider").unwrap();
        assert!(refusal.starts_with("1 nodes that compute on activations would run outside CUDAExecutionProvider"));
        assert!(refusal.contains("Erf (/l0/Erf)") && refusal.contains("embed.allow_cpu_fallback = true"), "{refusal}");

        let only_shapes = profile.replace(
            r#""provider": "CPUExecutionProvider", "output_size": "786432""#,
            r#""provider": "CUDAExecutionProvider", "output_size": "786432""#,
        );
        let p = NodePlacement::from_profile(&only_shapes, "CUDAExecutionProvider").unwrap();
        assert!(p.refusal("CUDAExecutionProvider").is_none(), "{p:?}");

        assert!(NodePlacement::from_profile("[]", "CUDAExecutionProvider").unwrap_err().contains("no nodes"));
        assert!(NodePlacement::from_profile("{oops", "CUDAExecutionProvider").unwrap_err().contains("not JSON"));
    }
}

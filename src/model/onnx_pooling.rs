//! Mean pooling inside the model's own graph, so that a GPU hands back one vector per text instead of
//! every token's state: for a 2,048-token batch of a 384-dimensional model that is 3 MB of token states
//! against a few KB of vectors to copy back to the host.
//!
//! The graph gets one more output, [`POOLED_OUTPUT`] = sum(states x mask) / max(sum(mask), 1e-9) over the
//! tokens, in float32, exactly what [`crate::model::Pooling::Mean`] computes on the host. It is added by
//! appending a second `ModelProto.graph` field that holds only the new nodes, initializers and output:
//! protobuf parsers merge repeated occurrences of a message field, so the original bytes stay untouched.
//! Models whose weights live in external files are left alone (they must load from their path).
//!
//! Used on GPUs only: on the CPU there is nothing to save, and host pooling keeps vectors bit-identical
//! across batchings (the graph's ReduceSum over a padded length adds in another order: last-bit
//! differences, measured 1e-9, that would break the exact batch invariance the CPU path has).

use crate::model::protobuf::{Value, bytes_field, fields, int_field, string_field};

/// The added output's name.
pub const POOLED_OUTPUT: &str = "embedding_pipeline_mean_pooled";

/// The model bytes with [`POOLED_OUTPUT`] added, pooling `states` (a `[batch, tokens, dim]` output) under
/// the `attention_mask` input. `None` when the model cannot take it: weights in external files, or an
/// opset below 13 (ReduceSum takes its axes as an input from 13 on).
pub fn with_mean_pooling(model: &[u8], states: &str) -> Result<Option<Vec<u8>>, String> {
    if uses_external_data(model)? || default_opset(model)?.is_none_or(|v| v < 13) {
        return Ok(None);
    }
    let p = |s: &str| format!("embedding_pipeline_pool_{s}");
    let mut graph = Vec::new();
    let nodes = [
        node("Cast", &[states], &p("states"), &[int_attr("to", 1)]),
        node("Cast", &["attention_mask"], &p("mask"), &[int_attr("to", 1)]),
        node("Unsqueeze", &[&p("mask"), &p("last_axis")], &p("mask3"), &[]),
        node("Mul", &[&p("states"), &p("mask3")], &p("masked"), &[]),
        node("ReduceSum", &[&p("masked"), &p("token_axis")], &p("sum"), &[int_attr("keepdims", 0)]),
        node("ReduceSum", &[&p("mask3"), &p("token_axis")], &p("count"), &[int_attr("keepdims", 0)]),
        node("Max", &[&p("count"), &p("eps")], &p("count_clamped"), &[]),
        node("Div", &[&p("sum"), &p("count_clamped")], POOLED_OUTPUT, &[]),
    ];
    for n in nodes {
        graph.extend(bytes_field(1, &n));
    }
    graph.extend(bytes_field(5, &int64_tensor(&p("last_axis"), -1)));
    graph.extend(bytes_field(5, &int64_tensor(&p("token_axis"), 1)));
    graph.extend(bytes_field(5, &float_tensor(&p("eps"), 1e-9)));
    // ValueInfoProto { name, type: TypeProto { tensor_type: { elem_type: FLOAT } } }
    let tensor_type = int_field(1, 1);
    let type_proto = bytes_field(1, &tensor_type);
    graph.extend(bytes_field(12, &[string_field(1, POOLED_OUTPUT), bytes_field(2, &type_proto)].concat()));
    let mut out = Vec::with_capacity(model.len() + graph.len() + 16);
    out.extend_from_slice(model);
    out.extend(bytes_field(7, &graph));
    Ok(Some(out))
}

/// The names of the graph's outputs (`GraphProto.output[].name`).
pub fn output_names(model: &[u8]) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for field in fields(model) {
        let (7, Value::Bytes(graph)) = field? else { continue };
        for field in fields(graph) {
            let (12, Value::Bytes(info)) = field? else { continue };
            for field in fields(info) {
                if let (1, Value::Bytes(name)) = field? {
                    names.push(String::from_utf8_lossy(name).into_owned());
                }
            }
        }
    }
    Ok(names)
}

/// Whether any initializer keeps its data in an external file (`TensorProto.data_location` = EXTERNAL).
fn uses_external_data(model: &[u8]) -> Result<bool, String> {
    for field in fields(model) {
        let (7, Value::Bytes(graph)) = field? else { continue };
        for field in fields(graph) {
            let (5, Value::Bytes(tensor)) = field? else { continue };
            for field in fields(tensor) {
                if let (14, Value::Varint(1)) = field? {
                    return Ok(true);
                }
            }
        }
    }
    Ok(false)
}

/// The version of the default ONNX operator set the model imports.
fn default_opset(model: &[u8]) -> Result<Option<u64>, String> {
    for field in fields(model) {
        let (8, Value::Bytes(opset)) = field? else { continue };
        let (mut domain, mut version) = (Vec::new(), None);
        for field in fields(opset) {
            match field? {
                (1, Value::Bytes(d)) => domain = d.to_vec(),
                (2, Value::Varint(v)) => version = Some(v),
                _ => {}
            }
        }
        if domain.is_empty() || domain == b"ai.onnx" {
            return Ok(version);
        }
    }
    Ok(None)
}

fn node(op: &str, inputs: &[&str], output: &str, attributes: &[Vec<u8>]) -> Vec<u8> {
    let mut n: Vec<u8> = inputs.iter().flat_map(|i| string_field(1, i)).collect();
    n.extend(string_field(2, output));
    n.extend(string_field(3, output));
    n.extend(string_field(4, op));
    for a in attributes {
        n.extend(bytes_field(5, a));
    }
    n
}

/// AttributeProto { name, i, type: INT }.
fn int_attr(name: &str, value: i64) -> Vec<u8> {
    [string_field(1, name), int_field(3, value as u64), int_field(20, 2)].concat()
}

/// A one-element int64 TensorProto of shape [1].
fn int64_tensor(name: &str, value: i64) -> Vec<u8> {
    [int_field(1, 1), int_field(2, 7), string_field(8, name), bytes_field(9, &value.to_le_bytes())].concat()
}

/// A float32 scalar TensorProto (shape []).
fn float_tensor(name: &str, value: f32) -> Vec<u8> {
    [int_field(2, 1), string_field(8, name), bytes_field(9, &value.to_le_bytes())].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_opset_12_model_or_one_with_external_weights_is_left_alone() {
        let opset = |v: u64| bytes_field(8, &[string_field(1, ""), int_field(2, v)].concat());
        let graph = bytes_field(7, &bytes_field(5, &int64_tensor("w", 3)));
        assert!(with_mean_pooling(&[graph.clone(), opset(12)].concat(), "s").unwrap().is_none());
        let patched = with_mean_pooling(&[graph.clone(), opset(17)].concat(), "s").unwrap().unwrap();
        assert!(patched.starts_with(&[graph.clone(), opset(17)].concat()), "the original bytes stay as they were");
        let external = bytes_field(7, &bytes_field(5, &[int64_tensor("w", 3), int_field(14, 1)].concat()));
        assert!(with_mean_pooling(&[external, opset(17)].concat(), "s").unwrap().is_none());
        assert!(with_mean_pooling(&[0x0b], "s").is_err());
    }
}

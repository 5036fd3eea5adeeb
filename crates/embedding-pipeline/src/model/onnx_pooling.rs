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

use bytes::Bytes;
use prost::Message;

use crate::model::onnx_proto::{
    ATTRIBUTE_INT, AttributeProto, FLOAT, GraphProto, INT64, ModelProto, NodeProto, TensorProto, TensorTypeProto,
    TypeProto, ValueInfoProto, decode,
};

/// The added output's name.
pub const POOLED_OUTPUT: &str = "embedding_pipeline_mean_pooled";

/// The model bytes with [`POOLED_OUTPUT`] added, pooling `states` (a `[batch, tokens, dim]` output) under
/// the `attention_mask` input. `None` when the model cannot take it: weights in external files, or an
/// opset below 13 (ReduceSum takes its axes as an input from 13 on).
pub fn with_mean_pooling(model: &[u8], states: &str) -> Result<Option<Vec<u8>>, String> {
    let parsed = decode(Bytes::copy_from_slice(model))?;
    if uses_external_data(&parsed) || default_opset(&parsed).is_none_or(|v| v < 13) {
        return Ok(None);
    }
    let p = |s: &str| format!("embedding_pipeline_pool_{s}");
    let node = |op: &str, inputs: &[&str], output: &str, attribute: Vec<AttributeProto>| NodeProto {
        input: inputs.iter().map(|i| i.to_string()).collect(),
        output: vec![output.to_string()],
        name: Some(output.to_string()),
        op_type: Some(op.to_string()),
        attribute,
    };
    let int =
        |name: &str, i: i64| vec![AttributeProto { name: Some(name.into()), i: Some(i), r#type: Some(ATTRIBUTE_INT) }];
    let patch = GraphProto {
        node: vec![
            node("Cast", &[states], &p("states"), int("to", FLOAT.into())),
            node("Cast", &["attention_mask"], &p("mask"), int("to", FLOAT.into())),
            node("Unsqueeze", &[&p("mask"), &p("last_axis")], &p("mask3"), vec![]),
            node("Mul", &[&p("states"), &p("mask3")], &p("masked"), vec![]),
            node("ReduceSum", &[&p("masked"), &p("token_axis")], &p("sum"), int("keepdims", 0)),
            node("ReduceSum", &[&p("mask3"), &p("token_axis")], &p("count"), int("keepdims", 0)),
            node("Max", &[&p("count"), &p("eps")], &p("count_clamped"), vec![]),
            node("Div", &[&p("sum"), &p("count_clamped")], POOLED_OUTPUT, vec![]),
        ],
        initializer: vec![
            constant(&p("last_axis"), &[1], INT64, &(-1i64).to_le_bytes()),
            constant(&p("token_axis"), &[1], INT64, &1i64.to_le_bytes()),
            constant(&p("eps"), &[], FLOAT, &1e-9f32.to_le_bytes()),
        ],
        output: vec![ValueInfoProto {
            name: Some(POOLED_OUTPUT.into()),
            r#type: Some(TypeProto { tensor_type: Some(TensorTypeProto { elem_type: Some(FLOAT) }) }),
        }],
    };
    // A model holding only the patch graph: appended, its graph field merges into the original's.
    let patch = ModelProto { graph: Some(patch), opset_import: vec![] }.encode_to_vec();
    Ok(Some([model, &patch].concat()))
}

/// The names of the graph's outputs (`GraphProto.output[].name`).
pub fn output_names(model: &[u8]) -> Result<Vec<String>, String> {
    let graph = decode(Bytes::copy_from_slice(model))?.graph.unwrap_or_default();
    Ok(graph.output.into_iter().filter_map(|o| o.name).collect())
}

/// Whether any initializer keeps its data in an external file (`TensorProto.data_location` = EXTERNAL).
fn uses_external_data(model: &ModelProto) -> bool {
    model.graph.iter().flat_map(|g| &g.initializer).any(|t| t.data_location == Some(1))
}

/// The version of the default ONNX operator set the model imports.
fn default_opset(model: &ModelProto) -> Option<i64> {
    let default = |d: &Option<String>| d.as_deref().is_none_or(|d| d.is_empty() || d == "ai.onnx");
    model.opset_import.iter().find(|o| default(&o.domain)).and_then(|o| o.version)
}

/// A constant of the given shape, type and little-endian bytes.
fn constant(name: &str, dims: &[i64], data_type: i32, raw: &[u8]) -> TensorProto {
    TensorProto {
        dims: dims.to_vec(),
        data_type: Some(data_type),
        name: Some(name.into()),
        raw_data: Some(Bytes::copy_from_slice(raw)),
        external_data: vec![],
        data_location: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::onnx_proto::OperatorSetIdProto;

    fn model(opset: i64, external: bool) -> Vec<u8> {
        let mut weight = constant("w", &[1], INT64, &3i64.to_le_bytes());
        weight.data_location = external.then_some(1);
        let graph = GraphProto { initializer: vec![weight], ..Default::default() };
        let opset = OperatorSetIdProto { domain: Some(String::new()), version: Some(opset) };
        ModelProto { graph: Some(graph), opset_import: vec![opset] }.encode_to_vec()
    }

    #[test]
    fn an_opset_12_model_or_one_with_external_weights_is_left_alone() {
        assert!(with_mean_pooling(&model(12, false), "s").unwrap().is_none());
        let patched = with_mean_pooling(&model(17, false), "s").unwrap().unwrap();
        assert!(patched.starts_with(&model(17, false)), "the original bytes stay as they were");
        assert!(with_mean_pooling(&model(17, true), "s").unwrap().is_none());
        assert!(with_mean_pooling(&[0x0b], "s").is_err());
    }

    #[test]
    fn the_patch_merges_into_the_graph_with_its_explicit_zeros() {
        let patched = with_mean_pooling(&model(17, false), "s").unwrap().unwrap();
        let graph = decode(Bytes::from(patched.clone())).unwrap().graph.unwrap();
        assert_eq!(graph.initializer.len(), 4, "the original weight and the three constants");
        assert_eq!(graph.node.len(), 8);
        let keepdims = &graph.node[4].attribute[0];
        assert_eq!((keepdims.name.as_deref(), keepdims.i), (Some("keepdims"), Some(0)));
        assert_eq!(output_names(&patched).unwrap(), [POOLED_OUTPUT]);
    }
}

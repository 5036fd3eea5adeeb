//! The element type of a model's weights, read from the ONNX file itself: `float32`, `float16`,
//! `bfloat16` or a quantised `int8` / `uint8`. It goes into the campaign fingerprint, so that an fp16 or
//! int8 export of a model is never taken for its fp32 original.
//!
//! ONNX files are protobuf (`ModelProto`). Only the few fields needed are decoded, by hand
//! (`model::protobuf`): `ModelProto.graph` (7) → `GraphProto.initializer` (5) →
//! `TensorProto.dims` (1) and `TensorProto.data_type` (2). Weight bytes are skipped, never copied.

use std::collections::BTreeMap;
use std::path::Path;

use crate::model::protobuf::{Value, fields, read_varint};

/// Elements per weight type, over the graph's initializers of floating or small-integer type (shape
/// constants such as int64 initializers are not weights and are left out).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WeightTypes(pub BTreeMap<&'static str, u64>);

impl WeightTypes {
    /// The type that holds most weight elements, e.g. `int8` for a dynamically quantised model whose
    /// layer norms stay float32. `unknown` for a graph without initializers.
    pub fn dominant(&self) -> &'static str {
        self.0
            .iter()
            .max_by_key(|(name, n)| (**n, std::cmp::Reverse(**name)))
            .map(|(name, _)| *name)
            .unwrap_or("unknown")
    }
}

/// Read the weight types of an ONNX file. The error says what is wrong with the file.
pub fn weight_types(path: &Path) -> Result<WeightTypes, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    weight_types_of(&bytes)
}

fn weight_types_of(model: &[u8]) -> Result<WeightTypes, String> {
    let mut types = WeightTypes::default();
    for field in fields(model) {
        let (number, value) = field.map_err(|e| format!("not an ONNX model: {e}"))?;
        let (7, Value::Bytes(graph)) = (number, value) else { continue };
        for field in fields(graph) {
            let (number, value) = field.map_err(|e| format!("not an ONNX model (in its graph): {e}"))?;
            let (5, Value::Bytes(tensor)) = (number, value) else { continue };
            let (data_type, elements) = tensor_type_and_size(tensor)?;
            if let Some(name) = weight_type_name(data_type) {
                *types.0.entry(name).or_default() += elements;
            }
        }
    }
    Ok(types)
}

fn tensor_type_and_size(tensor: &[u8]) -> Result<(u64, u64), String> {
    let (mut data_type, mut elements) = (0, 1u64);
    for field in fields(tensor) {
        match field.map_err(|e| format!("not an ONNX model (in an initializer): {e}"))? {
            (1, Value::Varint(d)) => elements = elements.saturating_mul(d),
            (1, Value::Bytes(mut packed)) => {
                while !packed.is_empty() {
                    elements = elements.saturating_mul(read_varint(&mut packed)?);
                }
            }
            (2, Value::Varint(t)) => data_type = t,
            _ => {}
        }
    }
    Ok((data_type, elements))
}

/// ONNX `TensorProto.DataType` names of the types that weights come in.
fn weight_type_name(data_type: u64) -> Option<&'static str> {
    Some(match data_type {
        1 => "float32",
        2 => "uint8",
        3 => "int8",
        10 => "float16",
        11 => "float64",
        16 => "bfloat16",
        17..=20 => "float8",
        21 => "uint4",
        22 => "int4",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::protobuf::{bytes_field, int_field, write_varint};

    fn varint(v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        write_varint(v, &mut out);
        out
    }

    /// A TensorProto with unpacked dims, a data type, a name and raw data that must be skipped.
    fn tensor(dims: &[u64], data_type: u64) -> Vec<u8> {
        let mut t: Vec<u8> = dims.iter().flat_map(|d| int_field(1, *d)).collect();
        t.extend(int_field(2, data_type));
        t.extend(bytes_field(8, b"w"));
        t.extend(bytes_field(9, &[0u8; 40]));
        t
    }

    #[test]
    fn counts_weight_elements_per_type_and_picks_the_dominant_one() {
        let packed_dims = bytes_field(1, &[varint(300), varint(2)].concat());
        let packed = [packed_dims, int_field(2, 3)].concat();
        let graph = [
            bytes_field(1, b"a node"),
            bytes_field(5, &tensor(&[4, 100], 1)),
            bytes_field(5, &packed),
            bytes_field(5, &tensor(&[1000], 7)), // int64: a shape constant, not a weight
        ]
        .concat();
        // ir_version 8, a fixed32 field 3 (skipped unread), the graph.
        let model = [int_field(1, 8), vec![3 << 3 | 5, 0, 0, 0, 0], bytes_field(7, &graph)].concat();
        let types = weight_types_of(&model).unwrap();
        assert_eq!(types.0, BTreeMap::from([("float32", 400), ("int8", 600)]));
        assert_eq!(types.dominant(), "int8");
        assert_eq!(WeightTypes::default().dominant(), "unknown");
    }

    #[test]
    fn a_damaged_file_is_an_error_not_a_panic() {
        let graph = bytes_field(5, &tensor(&[4], 1));
        let model = bytes_field(7, &graph);
        for cut in 1..model.len() {
            assert!(weight_types_of(&model[..cut]).is_err(), "cut at {cut}");
        }
        assert!(weight_types_of(&[0xff; 12]).is_err());
        assert!(weight_types_of(&[0x0b]).unwrap_err().contains("wire type 3"));
    }
}

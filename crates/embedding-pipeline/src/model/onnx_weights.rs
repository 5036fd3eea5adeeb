//! The element type of a model's weights, read from the ONNX file itself: `float32`, `float16`,
//! `bfloat16` or a quantised `int8` / `uint8`. It goes into the campaign fingerprint, so that an fp16 or
//! int8 export of a model is never taken for its fp32 original.
//!
//! ONNX files are protobuf (`ModelProto`), decoded with prost ([`crate::model::onnx_proto`]): only
//! `ModelProto.graph` → `GraphProto.initializer` → `TensorProto.dims` and `TensorProto.data_type` are
//! read, and the weight bytes are shared with the file's buffer, never copied.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;

use crate::model::onnx_proto;

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

/// What an ONNX file's initializers say, read in one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraphWeights {
    /// Their element types.
    pub types: WeightTypes,
    /// Their bytes by element type (elements times the type's size; int4 and uint4 are half a byte), exact:
    /// what the weights take in memory once loaded.
    pub bytes: BTreeMap<&'static str, u64>,
    /// The files the graph keeps weights in besides itself (external data `location`s, relative to the
    /// graph's folder), each once, in order.
    pub external: Vec<String>,
}

/// Read an ONNX file's weights. The error says what is wrong with the file.
pub fn read_weights(path: &Path) -> Result<GraphWeights, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    weights_of(Bytes::from(bytes))
}

/// Read the weight types of an ONNX file. The error says what is wrong with the file.
pub fn weight_types(path: &Path) -> Result<WeightTypes, String> {
    read_weights(path).map(|w| w.types)
}

fn weights_of(model: Bytes) -> Result<GraphWeights, String> {
    let mut types = WeightTypes::default();
    let mut bytes = BTreeMap::new();
    let mut external = std::collections::BTreeSet::new();
    for tensor in onnx_proto::decode(model)?.graph.unwrap_or_default().initializer {
        let elements = tensor.dims.iter().fold(1u64, |n, d| n.saturating_mul(u64::try_from(*d).unwrap_or(0)));
        if let Some(name) = weight_type_name(tensor.data_type.unwrap_or(0)) {
            *types.0.entry(name).or_default() += elements;
            *bytes.entry(name).or_default() += elements.saturating_mul(bits_of(name)).div_ceil(8);
        }
        let locations = tensor.external_data.into_iter().filter(|e| e.key.as_deref() == Some("location"));
        external.extend(locations.filter_map(|e| e.value));
    }
    Ok(GraphWeights { types, bytes, external: external.into_iter().collect() })
}

/// Bits per element of a weight type named by [`weight_type_name`].
fn bits_of(name: &str) -> u64 {
    match name {
        "float64" => 64,
        "float32" => 32,
        "float16" | "bfloat16" => 16,
        "uint4" | "int4" => 4,
        _ => 8,
    }
}

/// ONNX `TensorProto.DataType` names of the types that weights come in.
fn weight_type_name(data_type: i32) -> Option<&'static str> {
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
pub(crate) mod tests {
    use prost::Message;

    use super::*;
    use crate::model::onnx_proto::{GraphProto, ModelProto, TensorProto};

    fn tensor(dims: &[i64], data_type: i32) -> TensorProto {
        TensorProto {
            dims: dims.to_vec(),
            data_type: Some(data_type),
            name: Some("w".into()),
            raw_data: Some(Bytes::from(vec![0u8; 40])),
            external_data: vec![],
            data_location: None,
        }
    }

    fn model(initializer: Vec<TensorProto>) -> Bytes {
        let graph = GraphProto { initializer, ..Default::default() };
        Bytes::from(ModelProto { graph: Some(graph), opset_import: vec![] }.encode_to_vec())
    }

    /// A graph whose weights `w` and `b` live in `files` (the second named twice, as a large model's tensors
    /// share one file).
    pub(crate) fn graph_with_external_data(files: [&str; 2]) -> Vec<u8> {
        use crate::model::onnx_proto::StringStringEntryProto;
        let outside = |name: &str, file: &str| TensorProto {
            name: Some(name.into()),
            raw_data: None,
            external_data: vec![StringStringEntryProto { key: Some("location".into()), value: Some(file.into()) }],
            data_location: Some(1),
            ..tensor(&[10], 1)
        };
        model(vec![outside("w", files[0]), outside("b", files[1]), outside("c", files[1]), tensor(&[2], 1)]).to_vec()
    }

    #[test]
    fn external_data_files_are_listed_once_each_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("model.onnx");
        std::fs::write(&path, graph_with_external_data(["z.data", "model.onnx_data"])).unwrap();
        assert_eq!(read_weights(&path).unwrap().external, ["model.onnx_data", "z.data"]);
        std::fs::write(&path, model(vec![tensor(&[2], 1)])).unwrap();
        assert!(read_weights(&path).unwrap().external.is_empty());
    }

    #[test]
    fn counts_weight_elements_per_type_and_picks_the_dominant_one() {
        // int64: a shape constant, not a weight.
        let weights =
            weights_of(model(vec![tensor(&[4, 100], 1), tensor(&[300, 2], 3), tensor(&[1000], 7), tensor(&[3], 22)]))
                .unwrap();
        let types = weights.types;
        assert_eq!(types.0, BTreeMap::from([("float32", 400), ("int4", 3), ("int8", 600)]));
        // Bytes: 4 a float32, 1 an int8, half an int4 (rounded up).
        assert_eq!(weights.bytes, BTreeMap::from([("float32", 1600), ("int4", 2), ("int8", 600)]));
        assert_eq!(types.dominant(), "int8");
        assert_eq!(WeightTypes::default().dominant(), "unknown");
    }

    #[test]
    fn dims_are_read_packed_as_well_as_unpacked() {
        // dims = [300, 2] packed (field 1, length-delimited), data_type = 3: the form some exporters write.
        let tensor = [vec![0x0a, 3, 0xac, 0x02, 2], vec![0x10, 3]].concat();
        let graph = [vec![0x2a, tensor.len() as u8], tensor].concat();
        let model = [vec![0x3a, graph.len() as u8], graph].concat();
        assert_eq!(weights_of(Bytes::from(model)).unwrap().types.0, BTreeMap::from([("int8", 600)]));
    }

    #[test]
    fn a_damaged_file_is_an_error_not_a_panic() {
        let model = model(vec![tensor(&[4], 1)]);
        for cut in 1..model.len() {
            let e = weights_of(model.slice(..cut)).unwrap_err();
            assert!(e.starts_with("not an ONNX model"), "cut at {cut}: {e}");
        }
        assert!(weights_of(Bytes::from(vec![0xff; 12])).is_err());
        assert!(weights_of(Bytes::from_static(&[0x0b])).is_err());
        assert!(weights_of(Bytes::new()).unwrap_err().contains("no graph"));
    }
}

//! The part of the ONNX protobuf schema that reading and patching model files needs, as prost messages.
//!
//! Names, field numbers and types are those of `onnx/onnx.proto` (ONNX, Apache-2.0), cut down to the
//! fields this tool reads or writes. Fields not declared here are skipped by prost when decoding, so
//! weight data (`TensorProto.float_data` and the like) is never copied. `optional` keeps proto2's
//! presence: a value written as 0 (`keepdims = 0`) is still written.

use bytes::Bytes;
use prost::Message;

/// `ModelProto`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ModelProto {
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
}

/// `OperatorSetIdProto`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct OperatorSetIdProto {
    #[prost(string, optional, tag = "1")]
    pub domain: Option<String>,
    #[prost(int64, optional, tag = "2")]
    pub version: Option<i64>,
}

/// `GraphProto`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct GraphProto {
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
}

/// `NodeProto`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct NodeProto {
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    #[prost(string, optional, tag = "3")]
    pub name: Option<String>,
    #[prost(string, optional, tag = "4")]
    pub op_type: Option<String>,
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
}

/// `AttributeProto`, integer attributes only.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct AttributeProto {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(int64, optional, tag = "3")]
    pub i: Option<i64>,
    /// `AttributeProto.AttributeType`.
    #[prost(int32, optional, tag = "20")]
    pub r#type: Option<i32>,
}

/// `AttributeProto.AttributeType.INT`.
pub(crate) const ATTRIBUTE_INT: i32 = 2;

/// `TensorProto`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct TensorProto {
    #[prost(int64, repeated, packed = "false", tag = "1")]
    pub dims: Vec<i64>,
    /// `TensorProto.DataType`.
    #[prost(int32, optional, tag = "2")]
    pub data_type: Option<i32>,
    #[prost(string, optional, tag = "8")]
    pub name: Option<String>,
    /// Decoded from a [`Bytes`] buffer, this shares the buffer instead of copying the weights.
    #[prost(bytes = "bytes", optional, tag = "9")]
    pub raw_data: Option<Bytes>,
    /// Where external data lives (`location`, `offset`, `length`, `checksum`), when `data_location` is EXTERNAL.
    #[prost(message, repeated, tag = "13")]
    pub external_data: Vec<StringStringEntryProto>,
    /// `TensorProto.DataLocation`: 1 is EXTERNAL (the data lives in another file).
    #[prost(int32, optional, tag = "14")]
    pub data_location: Option<i32>,
}

/// `StringStringEntryProto`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct StringStringEntryProto {
    #[prost(string, optional, tag = "1")]
    pub key: Option<String>,
    #[prost(string, optional, tag = "2")]
    pub value: Option<String>,
}

/// `TensorProto.DataType` FLOAT and INT64.
pub(crate) const FLOAT: i32 = 1;
pub(crate) const INT64: i32 = 7;

/// `ValueInfoProto`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ValueInfoProto {
    #[prost(string, optional, tag = "1")]
    pub name: Option<String>,
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// `TypeProto`, tensor types only (`tensor_type` is a member of a oneof, the same on the wire).
#[derive(Clone, PartialEq, Message)]
pub(crate) struct TypeProto {
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TensorTypeProto>,
}

/// `TypeProto.Tensor`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct TensorTypeProto {
    #[prost(int32, optional, tag = "1")]
    pub elem_type: Option<i32>,
}

/// Decode a model file's bytes. A file that is not protobuf, or holds no graph, is not an ONNX model.
pub(crate) fn decode(model: Bytes) -> Result<ModelProto, String> {
    let model = ModelProto::decode(model).map_err(|e| format!("not an ONNX model: {e}"))?;
    if model.graph.is_none() {
        return Err("not an ONNX model: it has no graph".into());
    }
    Ok(model)
}

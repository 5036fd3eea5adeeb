//! The model side: ONNX Runtime through `ort`, and `tokenizers`. Nothing here knows about DataFusion.
//!
//! - [`runtime`] finds and loads the ONNX Runtime shared library.
//! - [`spec`] reads a sentence-transformers model directory.
//! - [`tokenize`] turns texts into token ids, with truncation accounting.
//! - [`batching`] orders tokenised texts by length and cuts token-budget batches.
//! - [`device`] names where a model runs; [`gpu`] asks the NVIDIA driver what GPUs there are.
//! - [`placement`] checks from a profiled probe batch that a GPU run's real work stays on the GPU.
//! - [`onnx_pooling`] adds mean pooling to a model's graph, so a GPU returns vectors, not token states.
//! - [`onnx_weights`] reads the element type of a model's weights from its ONNX file.
//! - `onnx_proto` (crate-private) holds the ONNX protobuf messages those two read and write, for prost.
//! - [`feed`] binds a batch's inputs (pinned memory on a GPU) and its one output to a session.
//! - [`pooling`] turns token states into one vector per text; [`dense`] projects it (a Dense module).
//! - [`reference`] holds a model's reference vectors (its `probe.json`), checked when it loads.
//! - [`image`] decodes and prepares images as an image-text model's processor does; [`image_spec`] reads such a
//!   model's directory; [`vision`] runs its vision tower.
//! - [`fit`] divides a card's memory between a model and its calls (the 48 GB split).
//! - [`settings`] are what shapes each model call, resolved by the caller.
//! - [`sessions`] builds a model's ONNX Runtime sessions and checks its inputs and output; [`embedder`] runs the
//!   whole path over them; [`embedded`] is what a call returns, and the trait the DataFusion side asks;
//!   [`registry`] shares one embedder per model.

pub mod batching;
pub mod dense;
pub mod device;
pub mod embedded;
pub mod embedder;
pub mod feed;
pub mod fit;
pub mod gpu;
pub mod image;
pub mod image_spec;
pub mod onnx_pooling;
pub(crate) mod onnx_proto;
pub mod onnx_weights;
pub mod placement;
pub mod pooling;
pub mod reference;
pub mod registry;
pub mod runtime;
pub mod sessions;
pub mod settings;
pub mod spec;
mod st_files;
pub mod tokenize;
pub mod vision;

pub use device::{CudaInfo, Device, DeviceInfo, Placement};
pub use embedded::{EmbedStats, Embedded, TextEmbedder};
pub use embedder::Embedder;
pub use pooling::{Pooling, PoolingMode};
pub use sessions::node_placement;
pub use settings::{CallSettings, ORIGINAL_BATCH_ROWS, Order};
pub use spec::ModelSpec;
pub use tokenize::TruncationSide;

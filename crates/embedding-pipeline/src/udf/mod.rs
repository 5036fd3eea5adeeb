//! DataFusion functions. They reach the model only through [`crate::model::TextEmbedder`] and the
//! shared [`crate::model::registry`].

pub mod embed;
pub mod embed_image;
pub mod image_files;
pub mod image_source;
pub mod search;

pub use embed::{EmbedUdf, embed_udfs};
pub use embed_image::embed_image_udfs;
pub use image_files::ImageFilesFunc;
pub use search::EmbedSearchFunc;

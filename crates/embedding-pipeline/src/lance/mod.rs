//! Lance: reading datasets as SQL tables (`CREATE EXTERNAL TABLE … STORED AS LANCE`), and the
//! streaming sink behind `COPY … STORED AS LANCE` and `INSERT INTO` a Lance table.

pub mod format;
pub mod lock;
pub mod records;
pub mod sink;
pub mod table;
pub mod target;
pub mod verify;

pub use format::LanceFormatFactory;
pub use sink::LanceSink;
pub use table::{LanceTable, LanceTableFactory};

/// How vectors are compared: by a search, and by the vector index that serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Metric {
    /// 1 - cosine similarity (what normalised sentence embeddings are made for).
    #[default]
    Cosine,
    /// Squared Euclidean distance.
    L2,
    /// Negative dot product.
    Dot,
}

impl Metric {
    pub fn name(self) -> &'static str {
        match self {
            Self::Cosine => "cosine",
            Self::L2 => "l2",
            Self::Dot => "dot",
        }
    }

    pub(crate) fn lance(self) -> lance_linalg::distance::MetricType {
        use lance_linalg::distance::MetricType;
        match self {
            Self::Cosine => MetricType::Cosine,
            Self::L2 => MetricType::L2,
            Self::Dot => MetricType::Dot,
        }
    }
}

/// The columns of `schema` that hold vectors, by name.
pub fn vector_columns(schema: &lance::datatypes::Schema) -> Vec<String> {
    schema
        .fields
        .iter()
        .filter(|f| matches!(f.data_type(), datafusion::arrow::datatypes::DataType::FixedSizeList(_, _)))
        .map(|f| f.name.clone())
        .collect()
}

/// "no column `x`": what a command that reads vectors says about a column that is not there.
pub(crate) fn no_vector_column(schema: &lance::datatypes::Schema, column: &str) -> String {
    match vector_columns(schema).as_slice() {
        [] => format!("has no column `{column}`, and no column of vectors"),
        found => format!("has no column `{column}`; its vectors are in {}", found.join(", ")),
    }
}

/// A column name as a SQL identifier: double-quoted, inner quotes doubled, so any name reads as itself.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Turn a user's location into the URI Lance opens: a local path is made absolute (relative to the
/// working directory); anything with a scheme is kept as it is.
pub fn dataset_uri(location: &str) -> String {
    let path = match location.strip_prefix("file://") {
        Some(path) => path,
        None if location.contains("://") => return location.to_string(),
        None => location.strip_prefix("file:").unwrap_or(location),
    };
    std::path::absolute(path).map(|p| p.display().to_string()).unwrap_or_else(|_| path.to_string())
}

/// A scan of `columns` of the dataset with bounded reads (a pass over every vector: verify's, evaluate's):
/// Lance's defaults buffer up to 2 GiB of I/O ahead, more than such a pass needs to keep busy.
pub(crate) fn bounded_scan(ds: &lance::Dataset, columns: &[&str]) -> crate::Result<lance::dataset::scanner::Scanner> {
    const BUFFER_BYTES: u64 = 64 * 1024 * 1024;
    let mut scanner = ds.scan();
    scanner.project(columns).map_err(lance_err(ds.uri()))?;
    scanner.batch_size(4096).io_buffer_size(BUFFER_BYTES).batch_readahead(2).fragment_readahead(1);
    Ok(scanner)
}

/// A Lance error on the dataset at `uri`, in this crate's terms.
pub(crate) fn lance_err(uri: &str) -> impl Fn(lance::Error) -> crate::Error + '_ {
    move |e| crate::Error::lance_because(uri, lance_message(&e), e)
}

/// What went wrong with a Lance dataset, in the user's terms: Lance's own "not found" names the path
/// without its leading `/` and the source files of Lance.
pub(crate) fn lance_message(e: &lance::Error) -> String {
    match e {
        lance::Error::DatasetNotFound { .. } => {
            "not found (the path does not exist, or holds no _versions directory)".into()
        }
        e => e.to_string(),
    }
}

/// Open `location`, `location@version` or `location@tag` (the part after the last `@`, when it holds
/// no `/`: a number is a version, anything else a tag).
pub async fn open_dataset(location: &str) -> crate::Result<lance::Dataset> {
    use lance::dataset::builder::DatasetBuilder;
    let (path, at) = match location.rsplit_once('@') {
        Some((p, at)) if !at.is_empty() && !at.contains('/') => (p, Some(at)),
        _ => (location, None),
    };
    let uri = dataset_uri(path);
    let refuse = |message: String| crate::Error::lance(location, message);
    if !crate::uri::is_supported(&uri) {
        let scheme = uri.split_once("://").map(|(s, _)| s).unwrap_or_default();
        return Err(refuse(format!("{scheme}:// locations are not supported; this build reads local paths and s3://")));
    }
    if crate::uri::is_local(&uri) && std::path::Path::new(&uri).is_file() {
        return Err(refuse("is a file; a Lance dataset is a directory (one holding _versions)".into()));
    }
    let mut builder = DatasetBuilder::from_uri(&uri);
    match at {
        Some(v) if v.chars().all(|c| c.is_ascii_digit()) => builder = builder.with_version(v.parse().unwrap_or(0)),
        Some(tag) => builder = builder.with_tag(tag),
        None => {}
    }
    match builder.load().await {
        Ok(ds) => Ok(ds),
        Err(e) => {
            // The dataset is there and only the version or tag is not: say that.
            if let Some(at) = at
                && let Ok(latest) = DatasetBuilder::from_uri(&uri).load().await
            {
                let what = if at.chars().all(|c| c.is_ascii_digit()) { "version" } else { "tag" };
                return Err(crate::Error::lance_because(
                    path,
                    format!(
                        "has no {what} {at} (its latest version is {}; pipeline inspect {path} lists its versions and \
                         tags)",
                        latest.version().version
                    ),
                    e,
                ));
            }
            Err(crate::Error::lance_because(location, format!("cannot open: {}", lance_message(&e)), e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::dataset_uri;

    #[test]
    fn file_uris_are_local_paths() {
        // A file:// URI must resolve to the path that resume and the write lock look at.
        assert_eq!(dataset_uri("file:///data/out.lance"), "/data/out.lance");
        assert_eq!(dataset_uri("file:/data/out.lance"), "/data/out.lance");
        assert_eq!(dataset_uri("s3://bucket/out.lance"), "s3://bucket/out.lance");
        assert!(dataset_uri("out.lance").ends_with("/out.lance") && dataset_uri("out.lance").starts_with('/'));
    }
}

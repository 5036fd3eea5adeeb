//! Lance: reading datasets as SQL tables (`CREATE EXTERNAL TABLE … STORED AS LANCE`), and the
//! streaming sink behind `COPY … STORED AS LANCE` and `INSERT INTO` a Lance table.

pub mod format;
pub mod sink;
pub mod table;

pub use format::LanceFormatFactory;
pub use sink::LanceSink;
pub use table::{LanceTable, LanceTableFactory};

/// Turn a user's location into the URI Lance opens: a local path is made absolute (relative to the
/// working directory); anything with a scheme is kept as it is.
pub fn dataset_uri(location: &str) -> String {
    if location.contains("://") {
        return location.to_string();
    }
    let path = location.strip_prefix("file:").unwrap_or(location);
    std::path::absolute(path).map(|p| p.display().to_string()).unwrap_or_else(|_| path.to_string())
}

//! `image_files('folder')`: a folder of image files as a table of `id` (the file's path under the folder, with
//! `/`), `path` (where it is, for `embed_image(path, id)`) and `bytes` (its size), sorted by id. Files are listed
//! when the query is planned, and read only when they are embedded. Hidden files and folders (a name starting with
//! `.`) and files without an image extension (jpg, jpeg, png, webp, gif, bmp, tif, tiff) are left out and counted
//! in a warning, never embedded.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use datafusion::arrow::array::{RecordBatch, StringArray, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, plan_err};
use datafusion::datasource::MemTable;
use datafusion::logical_expr::Expr;

/// The extensions of the formats `embed_image` decodes.
pub const IMAGE_EXTENSIONS: [&str; 8] = ["jpg", "jpeg", "png", "webp", "gif", "bmp", "tif", "tiff"];

const USAGE: &str = "image_files('folder'): a folder of image files, as a constant";

/// The table function.
#[derive(Debug, Default)]
pub struct ImageFilesFunc;

impl TableFunctionImpl for ImageFilesFunc {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let folder = match args.exprs() {
            [Expr::Literal(v, _)] => match v.try_as_str() {
                Some(Some(t)) => t.to_string(),
                _ => return plan_err!("image_files: the folder must be a text constant (it is {v}); {USAGE}"),
            },
            other => return plan_err!("image_files: {} arguments given; {USAGE}", other.len()),
        };
        let listing = list(Path::new(&folder))
            .map_err(|e| datafusion::error::DataFusionError::Plan(format!("image_files('{folder}'): {e}")))?;
        if listing.hidden + listing.other > 0 {
            tracing::warn!(
                "image_files('{folder}'): left out {} hidden files or folders and {} files that are not images by \
                 their extension ({})",
                listing.hidden,
                listing.other,
                IMAGE_EXTENSIONS.join(", ")
            );
        }
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Utf8, false),
            Field::new("path", DataType::Utf8, false),
            Field::new("bytes", DataType::UInt64, false),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![
                Arc::new(StringArray::from_iter_values(listing.files.iter().map(|f| f.id.as_str()))),
                Arc::new(StringArray::from_iter_values(listing.files.iter().map(|f| f.path.to_string_lossy()))),
                Arc::new(UInt64Array::from_iter_values(listing.files.iter().map(|f| f.bytes))),
            ],
        )?;
        Ok(Arc::new(MemTable::try_new(schema, vec![vec![batch]])?))
    }
}

/// One image file of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageFile {
    pub id: String,
    pub path: PathBuf,
    pub bytes: u64,
}

/// A folder's image files, sorted by id, and what was left out.
#[derive(Debug, Default)]
pub struct Listing {
    pub files: Vec<ImageFile>,
    /// Hidden files and folders (a folder counts once, whatever it holds).
    pub hidden: u64,
    /// Files without an image extension.
    pub other: u64,
}

/// The image files under `folder`, through symbolic links, sorted by their path under it.
pub fn list(folder: &Path) -> std::result::Result<Listing, String> {
    if !folder.is_dir() {
        return Err(format!("{} is not a folder", folder.display()));
    }
    let mut listing = Listing::default();
    let mut pending = vec![(folder.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with('.') {
                listing.hidden += 1;
                continue;
            }
            let id = format!("{prefix}{name}");
            // Through a symbolic link, what it points at.
            let meta = std::fs::metadata(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            if meta.is_dir() {
                pending.push((path, format!("{id}/")));
                continue;
            }
            let extension = path.extension().map(|e| e.to_string_lossy().to_ascii_lowercase()).unwrap_or_default();
            if !IMAGE_EXTENSIONS.contains(&extension.as_str()) {
                listing.other += 1;
                continue;
            }
            let path = std::path::absolute(&path).unwrap_or(path);
            listing.files.push(ImageFile { id, path, bytes: meta.len() });
        }
    }
    listing.files.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(listing)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_listed_by_their_path_and_hidden_and_other_files_counted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("photos");
        std::fs::create_dir_all(root.join("b/c")).unwrap();
        std::fs::create_dir_all(root.join(".thumbs")).unwrap();
        for f in ["a.JPG", "b/c/d.png", "b/x.webp", ".hidden.png", ".thumbs/t.png", "notes.txt", "b/raw.cr2"] {
            std::fs::write(root.join(f), b"12345").unwrap();
        }
        std::os::unix::fs::symlink(root.join("b"), root.join("linked")).unwrap();
        let listing = list(&root).unwrap();
        let ids: Vec<&str> = listing.files.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(ids, ["a.JPG", "b/c/d.png", "b/x.webp", "linked/c/d.png", "linked/x.webp"]);
        assert!(listing.files.iter().all(|f| f.bytes == 5 && f.path.is_absolute()));
        assert_eq!((listing.hidden, listing.other), (2, 3), "two hidden entries; a text and a raw file, twice linked");
        let e = list(&root.join("a.JPG")).unwrap_err();
        assert!(e.ends_with("is not a folder"), "{e}");
    }
}

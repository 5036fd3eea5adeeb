//! An image write planned (`pipeline plan` of a write that calls `embed_image`): every image's header read (its
//! format, width and height) and its file's size, without decoding a pixel, so that the bad images and the sizes
//! the host will decode are known on a cheap machine, before a GPU is rented. Kept as `<output>.plan/images.json`.
//! An image write has no work units: the run needs no plan, and reads none.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::DataFrame;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use crate::campaign::Fingerprint;
use crate::error::{Error, Result};
use crate::lance::target::WriteTarget;
use crate::model::image::{Header, ImageError, header_of_bytes, header_of_file};
use crate::options::EmbedOptions;
use crate::session::EmbedSession;
use crate::udf::image_source::{Located, locate};

/// The file an image plan is kept in, in the plan directory.
pub const IMAGES_FILE: &str = "images.json";

/// The bands of decoded size images are counted in (megapixels, upper bounds): the host's cost.
pub const MEGAPIXEL_BANDS: [(f64, &str); 5] = [
    (0.25, "under 0.25 megapixels"),
    (1.0, "0.25-1 megapixels"),
    (4.0, "1-4 megapixels"),
    (16.0, "4-16 megapixels"),
    (f64::INFINITY, "16 megapixels and more"),
];

/// The largest images a plan names (for `pipeline probe`, which decodes them).
pub const LARGEST_KEPT: usize = 32;

/// The bad images a plan lists by id.
pub const BAD_LISTED: usize = 1000;

/// The band of an image of `pixels`.
pub fn band_of(pixels: u64) -> usize {
    let megapixels = pixels as f64 / 1e6;
    MEGAPIXEL_BANDS.iter().position(|(top, _)| megapixels < *top).unwrap_or(MEGAPIXEL_BANDS.len() - 1)
}

/// What an image write's corpus holds, from its images' headers.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ImagePlan {
    /// Always `images`: tells this plan from a text write's `plan.json`.
    pub kind: String,
    pub output: String,
    pub created: String,
    pub tool_version: String,
    pub fingerprint: Fingerprint,
    #[serde(flatten)]
    pub counts: ImageCounts,
    /// `embed.max_image_pixels` and `embed.bad_images` as the write has them.
    pub max_image_pixels: u64,
    pub bad_image_policy: String,
    pub seconds: f64,
}

/// The images of a write, counted from their headers.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ImageCounts {
    /// The write's rows, NULL images among them.
    pub rows: u64,
    pub null_images: u64,
    /// Images whose header reads, their files' bytes and the pixels they decode to.
    pub images: u64,
    pub bytes: u64,
    pub pixels: u64,
    /// Images per band of decoded size ([`MEGAPIXEL_BANDS`]).
    pub bands: Vec<Band>,
    /// Images per format (`Jpeg`, `Png`…).
    pub formats: BTreeMap<String, u64>,
    /// The largest images by pixels, largest first.
    pub largest: Vec<PlannedImage>,
    /// Images the run would refuse (empty, unreadable, not an image, a broken header, over the pixel limit), and
    /// the first [`BAD_LISTED`] by id with why. A broken body behind a sound header shows only when decoded.
    pub bad: u64,
    pub bad_images: Vec<BadImage>,
}

impl Default for ImageCounts {
    fn default() -> Self {
        Self {
            rows: 0,
            null_images: 0,
            images: 0,
            bytes: 0,
            pixels: 0,
            bands: MEGAPIXEL_BANDS
                .iter()
                .map(|(_, n)| Band { name: n.to_string(), images: 0, bytes: 0, pixels: 0 })
                .collect(),
            formats: BTreeMap::new(),
            largest: Vec::new(),
            bad: 0,
            bad_images: Vec::new(),
        }
    }
}

/// One band of decoded size.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Band {
    pub name: String,
    pub images: u64,
    pub bytes: u64,
    pub pixels: u64,
}

/// One image, as its header says.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, schemars::JsonSchema)]
pub struct PlannedImage {
    pub id: String,
    pub format: String,
    pub width: u32,
    pub height: u32,
    pub bytes: u64,
}

/// A bad image, by id.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct BadImage {
    pub id: String,
    pub why: String,
}

impl ImagePlan {
    /// The plan kept in `dir`.
    pub fn read(dir: &Path) -> Result<Self> {
        let file = dir.join(IMAGES_FILE);
        let text =
            std::fs::read_to_string(&file).map_err(|e| Error::file(format!("cannot read {}", file.display()), e))?;
        serde_json::from_str(&text)
            .map_err(|e| Error::Refused(format!("{}: not an image plan this version reads: {e}", file.display())))
    }
}

/// Read the headers of every image of `write` (its `id` and `embed_image` argument, `inputs`), and keep the plan
/// in `dir`, replacing what is there.
pub async fn plan_images(
    session: &EmbedSession,
    inputs: LogicalPlan,
    target: &WriteTarget,
    fingerprint: Fingerprint,
    dir: &Path,
) -> Result<ImagePlan> {
    let started = Instant::now();
    let options = EmbedOptions::from_config(session.context().state().config_options());
    let mut plan = ImagePlan {
        kind: "images".into(),
        output: target.uri.clone(),
        created: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        tool_version: env!("CARGO_PKG_VERSION").to_string(),
        fingerprint,
        counts: ImageCounts::default(),
        max_image_pixels: options.max_image_pixels,
        bad_image_policy: options.bad_images.clone(),
        seconds: 0.0,
    };
    let mut stream = DataFrame::new(session.context().state(), inputs).execute_stream().await?;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let ids = cast(batch.column(0), &DataType::Utf8)?;
        let ids: Vec<Option<String>> = ids.as_string::<i32>().iter().map(|i| i.map(str::to_string)).collect();
        let read = headers(batch.column(1), &options.image_base).await?;
        let counts = &mut plan.counts;
        for (i, (id, header)) in ids.into_iter().zip(read).enumerate() {
            let id = id.unwrap_or_else(|| format!("row {}", counts.rows + i as u64));
            counts.add(id, header, options.max_image_pixels);
        }
        counts.rows += batch.num_rows() as u64;
    }
    plan.seconds = started.elapsed().as_secs_f64();
    keep(&plan, dir)?;
    Ok(plan)
}

impl ImageCounts {
    /// One row counted: its header and file size (None: a NULL image), against the pixel limit.
    fn add(&mut self, id: String, header: Option<std::result::Result<(Header, u64), ImageError>>, max_pixels: u64) {
        let plan = self;
        let bad = |plan: &mut ImageCounts, why: String| {
            plan.bad += 1;
            if plan.bad_images.len() < BAD_LISTED {
                plan.bad_images.push(BadImage { id: id.clone(), why });
            }
        };
        match header {
            None => plan.null_images += 1,
            Some(Err(e)) => bad(plan, e.to_string()),
            Some(Ok((h, _))) if h.pixels() > max_pixels => {
                let e = ImageError::TooLarge { width: h.width, height: h.height, limit: max_pixels };
                bad(plan, e.to_string());
            }
            Some(Ok((h, bytes))) => {
                plan.images += 1;
                plan.bytes += bytes;
                plan.pixels += h.pixels();
                let band = &mut plan.bands[band_of(h.pixels())];
                (band.images, band.bytes, band.pixels) =
                    (band.images + 1, band.bytes + bytes, band.pixels + h.pixels());
                *plan.formats.entry(format!("{:?}", h.format)).or_default() += 1;
                let image =
                    PlannedImage { id, format: format!("{:?}", h.format), width: h.width, height: h.height, bytes };
                let pixels = |p: &PlannedImage| p.width as u64 * p.height as u64;
                if plan.largest.len() < LARGEST_KEPT || plan.largest.last().is_some_and(|l| pixels(l) < h.pixels()) {
                    let at = plan.largest.partition_point(|l| pixels(l) >= h.pixels());
                    plan.largest.insert(at, image);
                    plan.largest.truncate(LARGEST_KEPT);
                }
            }
        }
    }
}

/// The `n` largest images of `inputs` (id, then the `embed_image` argument) by pixels, within `max_pixels`, with
/// what to read them from (for `pipeline probe`, which decodes and embeds them): one pass over the headers.
pub async fn largest_images(
    session: &EmbedSession,
    inputs: LogicalPlan,
    options: &EmbedOptions,
    n: usize,
) -> Result<Vec<(PlannedImage, Located)>> {
    let mut largest: Vec<(PlannedImage, Located)> = Vec::new();
    let pixels = |p: &PlannedImage| p.width as u64 * p.height as u64;
    let mut stream = DataFrame::new(session.context().state(), inputs).execute_stream().await?;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let ids = cast(batch.column(0), &DataType::Utf8)?;
        let located = locate_column(batch.column(1), &options.image_base).await?;
        let read = read_headers(&located).await?;
        for (i, (l, header)) in located.into_iter().zip(read).enumerate() {
            let (Some(l), Some(Ok((h, bytes)))) = (l, header) else { continue };
            if h.pixels() > options.max_image_pixels
                || largest.len() >= n && largest.last().is_some_and(|(p, _)| pixels(p) >= h.pixels())
            {
                continue;
            }
            let id = ids.as_string::<i32>().iter().nth(i).flatten().unwrap_or_default().to_string();
            let image = PlannedImage { id, format: format!("{:?}", h.format), width: h.width, height: h.height, bytes };
            let at = largest.partition_point(|(p, _)| pixels(p) >= h.pixels());
            largest.insert(at, (image, l));
            largest.truncate(n);
        }
    }
    Ok(largest)
}

/// The images of `inputs` (id, then the `embed_image` argument) whose ids are `wanted`'s, in `wanted`'s order, with
/// what to read them from: only their rows' objects fetched, where [`largest_images`] reads every header. For a
/// trial, whose plan already names the largest images.
pub async fn images_by_id(
    session: &EmbedSession,
    inputs: LogicalPlan,
    options: &EmbedOptions,
    wanted: &[PlannedImage],
) -> Result<Vec<(PlannedImage, Located)>> {
    let ids: std::collections::HashSet<&str> = wanted.iter().map(|p| p.id.as_str()).collect();
    let mut found: std::collections::HashMap<String, Located> = std::collections::HashMap::new();
    let mut stream = DataFrame::new(session.context().state(), inputs).execute_stream().await?;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let column = cast(batch.column(0), &DataType::Utf8)?;
        let column = column.as_string::<i32>();
        let rows: Vec<u32> = (0..column.len())
            .filter(|r| column.is_valid(*r) && ids.contains(column.value(*r)))
            .map(|r| r as u32)
            .collect();
        let located = locate_rows(batch.column(1), &rows, &options.image_base).await?;
        for (r, l) in rows.iter().zip(located) {
            if let Some(l) = l {
                found.insert(column.value(*r as usize).to_string(), l);
            }
        }
    }
    Ok(wanted.iter().filter_map(|p| found.remove(&p.id).map(|l| (p.clone(), l))).collect())
}

/// Each row's header and file size (NULL: none): bytes read from the column, paths located against `image_base`
/// (objects fetched), read over the machine's cores.
async fn headers(
    column: &ArrayRef,
    image_base: &str,
) -> Result<Vec<Option<std::result::Result<(Header, u64), ImageError>>>> {
    read_headers(&locate_column(column, image_base).await?).await
}

/// The images of some `rows` of a column, located as [`locate_column`] does: only those rows' objects fetched.
pub(crate) async fn locate_rows(column: &ArrayRef, rows: &[u32], image_base: &str) -> Result<Vec<Option<Located>>> {
    let taken = datafusion::arrow::compute::take(
        column.as_ref(),
        &datafusion::arrow::array::UInt32Array::from(rows.to_vec()),
        None,
    )?;
    locate_column(&taken, image_base).await
}

/// A column's images: its bytes, or its paths located against `image_base` (objects fetched).
async fn locate_column(column: &ArrayRef, image_base: &str) -> Result<Vec<Option<Located>>> {
    Ok(match column.data_type() {
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
            let bytes = cast(column, &DataType::LargeBinary)?;
            let bytes = bytes.as_binary::<i64>();
            (0..bytes.len())
                .map(|i| bytes.is_valid(i).then(|| Located::Fetched(bytes::Bytes::copy_from_slice(bytes.value(i)))))
                .collect()
        }
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let paths = cast(column, &DataType::Utf8)?;
            let paths = paths.as_string::<i32>().iter().map(|p| p.map(str::to_string)).collect();
            locate(paths, image_base).await
        }
        DataType::Null => (0..column.len()).map(|_| None).collect(),
        other => return Err(Error::Refused(format!("embed_image() needs a binary or text argument, got {other}"))),
    })
}

/// The headers and file sizes of located images, read over the machine's cores.
pub(crate) async fn read_headers(
    located: &[Option<Located>],
) -> Result<Vec<Option<std::result::Result<(Header, u64), ImageError>>>> {
    let located = located.to_vec();
    let read = tokio::task::spawn_blocking(move || {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(located.len()).max(1);
        let per_thread = located.len().div_ceil(threads).max(1);
        std::thread::scope(|scope| {
            let handles: Vec<_> = located
                .chunks(per_thread)
                .map(|chunk| scope.spawn(move || chunk.iter().map(|l| l.as_ref().map(header)).collect::<Vec<_>>()))
                .collect();
            handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect::<Vec<_>>()
        })
    })
    .await?;
    Ok(read)
}

/// The header of one located image, and its file's size (also what verify groups its image sample by).
pub fn header(located: &Located) -> std::result::Result<(Header, u64), ImageError> {
    match located {
        Located::File(path) => {
            let size = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            header_of_file(Path::new(path)).map(|h| (h, size))
        }
        Located::Fetched(bytes) => header_of_bytes(bytes).map(|h| (h, bytes.len() as u64)),
        Located::Failed(e) => Err(e.clone()),
    }
}

/// Keep `plan` as `dir/images.json`, `dir` replaced whole (a folder that holds no plan is refused by the caller).
fn keep(plan: &ImagePlan, dir: &Path) -> Result<()> {
    let staging = PathBuf::from(format!("{}.partial", dir.display()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| Error::file(format!("cannot create {}", staging.display()), e))?;
    std::fs::write(staging.join(IMAGES_FILE), serde_json::to_string_pretty(plan)?)
        .map_err(|e| Error::file(format!("cannot write the plan into {}", staging.display()), e))?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| Error::file(format!("cannot replace {}", dir.display()), e))?;
    }
    std::fs::rename(&staging, dir).map_err(|e| Error::file(format!("cannot move the plan into {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_and_the_largest_images_are_kept_in_order() {
        assert_eq!((band_of(0), band_of(249_999), band_of(250_000), band_of(3_840_000)), (0, 0, 1, 2));
        assert_eq!((band_of(16_000_000), band_of(u64::MAX)), (4, 4));
        let mut plan = ImageCounts::default();
        let png = |w, h| Header { format: image::ImageFormat::Png, width: w, height: h };
        for i in 0..40u32 {
            plan.add(format!("i{i}"), Some(Ok((png(i + 1, 100), 10))), 5_000_000);
        }
        plan.add("bomb".into(), Some(Ok((png(5000, 5000), 10))), 5_000_000);
        plan.add("empty".into(), Some(Err(ImageError::Empty)), 5_000_000);
        plan.add("null".into(), None, 5_000_000);
        assert_eq!((plan.images, plan.bad, plan.null_images, plan.bytes), (40, 2, 1, 400));
        assert_eq!(plan.largest.len(), LARGEST_KEPT);
        assert_eq!((plan.largest[0].id.as_str(), plan.largest[LARGEST_KEPT - 1].id.as_str()), ("i39", "i8"));
        assert!(plan.bad_images[0].why.contains("more than embed.max_image_pixels = 5000000"));
        assert_eq!(plan.formats["Png"], 40);
    }
}

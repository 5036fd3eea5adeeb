//! The vision tower of an image-text model (CLIP, SigLIP): images' bytes in, one vector per image out, through
//! the model's `onnx/vision_model.onnx` (`pixel_values` in, `image_embeds` out) and its image processor
//! ([`super::image`]). Decoding and resizing run on all the threads the placement has, the model call after.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::Tensor;

use crate::error::{Error, Result};
use crate::model::image::{ImageError, ImageProcessing};
use crate::model::{Device, DeviceInfo, EmbedStats, ModelSpec, Placement, runtime};

/// Where an image-text model keeps its vision graph, beside the text graph (`onnx/model.onnx`).
pub const VISION_FILE: &str = "onnx/vision_model.onnx";

/// One vision session of a model, with the processing its images get.
#[derive(Debug)]
pub struct VisionEmbedder {
    dir: PathBuf,
    processing: ImageProcessing,
    session: Mutex<Session>,
    dim: usize,
    threads: usize,
    device: DeviceInfo,
}

/// Vectors for a call's images: `dim` floats per row (zeros where `valid` is false: a NULL image).
#[derive(Debug, Default)]
pub struct ImagesEmbedded {
    pub vectors: Vec<f32>,
    pub valid: Vec<bool>,
    /// The call's counters, its images' pixels and bytes among them.
    pub stats: EmbedStats,
    /// The bad images skipped, by row.
    pub bad: Vec<BadImage>,
}

/// Where an image comes from: its file's bytes, or the path of its file (read when it is embedded; a relative
/// path from the current directory).
#[derive(Debug, Clone, Copy)]
pub enum ImageSource<'a> {
    Bytes(&'a [u8]),
    Path(&'a str),
    /// The caller could not get its bytes (an object store's error): a bad image.
    Failed(&'a ImageError),
}

/// A bad image at a row of the call.
#[derive(Debug)]
pub struct BadImage {
    pub row: usize,
    pub error: ImageError,
}

impl VisionEmbedder {
    /// The vision session of the image-text model `spec`, on `placement`'s device.
    pub fn load(spec: &ModelSpec, placement: &Placement) -> Result<Self> {
        let Some(image) = &spec.image else {
            return Err(Error::model(
                &spec.dir,
                "modules.json",
                "is a text model's: embed_image() needs an image-text model (CLIP, SigLIP) exported by \
                 scripts/export-onnx",
            ));
        };
        let path = spec.dir.join(VISION_FILE);
        let bad = |m: String| Error::model(&spec.dir, VISION_FILE, m);
        if !path.is_file() {
            return Err(bad(
                "file not found: export the model with scripts/export-onnx, which writes both towers".into()
            ));
        }
        let env = runtime::environment()?;
        let library = runtime::loaded_library().unwrap_or(Path::new("")).to_path_buf();
        let threads = placement.intra_threads.max(1);
        let mut builder = Session::builder(env)
            .and_then(|b| Ok(b.with_optimization_level(GraphOptimizationLevel::All)?))
            .and_then(|b| Ok(b.with_intra_threads(threads)?))
            .map_err(|e: ort::Error| bad(format!("cannot load: {e}")).because(e))?;
        let mut device = DeviceInfo::cpu(&library, threads);
        if let Device::Cuda(ids) = &placement.device {
            let id = ids.first().copied().unwrap_or(0);
            let device_err = |m: String| Error::device(placement.device.name(), m, None);
            let system = crate::model::gpu::probe().map_err(device_err)?;
            device = DeviceInfo::cuda(&library, system.select(&[id]).map_err(device_err)?, &system);
            let cuda = ort::ep::CUDA::default().with_device_id(id).build().error_on_failure();
            builder = builder.with_execution_providers([cuda]).map_err(|e| {
                Error::device(
                    placement.device.name(),
                    format!("the CUDA execution provider could not start: {e}"),
                    None,
                )
            })?;
        }
        let session = builder.commit_from_file(&path).map_err(|e| bad(format!("cannot load: {e}")).because(e))?;
        let inputs: Vec<&str> = session.inputs().iter().map(|i| i.name()).collect();
        if inputs != ["pixel_values"] {
            return Err(bad(format!("takes {}; a vision graph takes pixel_values alone", inputs.join(", "))));
        }
        let output = session.outputs().iter().find(|o| o.name() == "image_embeds");
        let Some(output) = output else {
            return Err(bad("has no image_embeds output: export the model with scripts/export-onnx".into()));
        };
        let graph_dim = output.dtype().tensor_shape().and_then(|s| s.last().copied()).unwrap_or(-1);
        if graph_dim > 0 && graph_dim as usize != spec.dim {
            return Err(bad(format!(
                "gives {graph_dim}-dimensional vectors, but the text tower's are {}: the two towers must share a space",
                spec.dim
            )));
        }
        Ok(Self {
            dir: spec.dir.clone(),
            processing: image.processing.clone(),
            session: Mutex::new(session),
            dim: spec.dim,
            threads,
            device,
        })
    }

    /// Where it runs, as a run record says it.
    pub fn device(&self) -> &DeviceInfo {
        &self.device
    }

    /// The length of the vectors.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Embed `images` (NULL for a NULL row), `batch` per model call. A bad image stops the call, named by its row;
    /// with `skip_bad`, it gets no vector instead (`valid` false) and is listed in `bad`. Nothing is embedded once
    /// `stop` says so.
    pub fn embed(
        &self,
        images: &[Option<ImageSource<'_>>],
        batch: usize,
        max_pixels: u64,
        skip_bad: bool,
        stop: &dyn Fn() -> bool,
    ) -> std::result::Result<ImagesEmbedded, EmbedImageError> {
        let (height, width) = self.processing.input_size();
        let per_image = 3 * (height * width) as usize;
        let mut out = ImagesEmbedded {
            vectors: vec![0.0; images.len() * self.dim],
            valid: images.iter().map(Option::is_some).collect(),
            ..Default::default()
        };
        out.stats.nulls = images.iter().filter(|i| i.is_none()).count() as u64;
        let rows: Vec<usize> = (0..images.len()).filter(|r| images[*r].is_some()).collect();
        for chunk in rows.chunks(batch.max(1)) {
            if stop() {
                return Err(EmbedImageError::Other(Error::Stopped));
            }
            let started = Instant::now();
            let mut pixels = vec![0.0f32; chunk.len() * per_image];
            let prepared = self.prepare(images, chunk, &mut pixels, per_image, max_pixels);
            out.stats.tokenize_time += started.elapsed();
            // The good images' pixels, in order; the bad ones stop the call, or are left out.
            let mut good = Vec::with_capacity(chunk.len());
            let mut kept = 0;
            for (i, (row, result)) in chunk.iter().zip(prepared).enumerate() {
                match result {
                    Ok((p, bytes)) => {
                        out.stats.image_pixels += p.width as u64 * p.height as u64;
                        out.stats.image_bytes += bytes;
                        if kept != i {
                            pixels.copy_within(i * per_image..(i + 1) * per_image, kept * per_image);
                        }
                        kept += 1;
                        good.push(*row);
                    }
                    Err(error) if skip_bad => {
                        out.valid[*row] = false;
                        out.bad.push(BadImage { row: *row, error });
                    }
                    Err(error) => return Err(EmbedImageError::Bad(BadImage { row: *row, error })),
                }
            }
            if good.is_empty() {
                continue;
            }
            pixels.truncate(good.len() * per_image);
            out.stats.images += good.len() as u64;
            let started = Instant::now();
            let vectors = self.run(pixels, good.len(), height, width).map_err(EmbedImageError::Other)?;
            out.stats.model_time += started.elapsed();
            out.stats.run_time += started.elapsed();
            out.stats.model_calls += 1;
            out.stats.docs += good.len() as u64;
            for (i, row) in good.iter().enumerate() {
                out.vectors[row * self.dim..(row + 1) * self.dim]
                    .copy_from_slice(&vectors[i * self.dim..(i + 1) * self.dim]);
            }
        }
        out.stats.sessions = 1;
        Ok(out)
    }

    /// Decode and process `images` as a call does (over the embedder's threads), without the model: the wall time
    /// it took and, per image, its decoded size or why it is bad. What a probe measures the host by.
    pub fn prepare_only(
        &self,
        images: &[ImageSource<'_>],
        max_pixels: u64,
    ) -> (std::time::Duration, Vec<std::result::Result<crate::model::image::Prepared, ImageError>>) {
        let (height, width) = self.processing.input_size();
        let per_image = 3 * (height * width) as usize;
        let sources: Vec<Option<ImageSource<'_>>> = images.iter().copied().map(Some).collect();
        let rows: Vec<usize> = (0..images.len()).collect();
        let started = Instant::now();
        let mut pixels = vec![0.0f32; images.len() * per_image];
        let prepared = self.prepare(&sources, &rows, &mut pixels, per_image, max_pixels);
        (started.elapsed(), prepared.into_iter().map(|r| r.map(|(p, _)| p)).collect())
    }

    /// The threads a call decodes over.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Decode and process the images of `rows` into `pixels`, over the embedder's threads: per row, what it was
    /// (its decoded size and the bytes read), or why it is bad.
    fn prepare(
        &self,
        images: &[Option<ImageSource<'_>>],
        rows: &[usize],
        pixels: &mut [f32],
        per_image: usize,
        max_pixels: u64,
    ) -> Vec<std::result::Result<(crate::model::image::Prepared, u64), ImageError>> {
        let threads = self.threads.min(rows.len()).max(1);
        let per_thread = rows.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let handles: Vec<_> = rows
                .chunks(per_thread)
                .zip(pixels.chunks_mut(per_thread * per_image))
                .map(|(rows, out)| {
                    scope.spawn(move || {
                        rows.iter()
                            .zip(out.chunks_mut(per_image))
                            .map(|(row, out)| {
                                let read;
                                let bytes = match images[*row] {
                                    Some(ImageSource::Bytes(b)) => b,
                                    Some(ImageSource::Path(p)) => {
                                        read = std::fs::read(p).map_err(|e| ImageError::File(format!("{p}: {e}")))?;
                                        &read
                                    }
                                    Some(ImageSource::Failed(e)) => return Err(e.clone()),
                                    None => &[],
                                };
                                let prepared = self.processing.prepare(bytes, max_pixels, out)?;
                                Ok((prepared, bytes.len() as u64))
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            let panicked = |n: usize| vec![Err(ImageError::Unreadable("its decoder panicked".into())); n];
            handles
                .into_iter()
                .zip(rows.chunks(per_thread))
                .flat_map(|(h, rows)| h.join().unwrap_or_else(|_| panicked(rows.len())))
                .collect()
        })
    }

    fn run(&self, pixels: Vec<f32>, rows: usize, height: u32, width: u32) -> Result<Vec<f32>> {
        let bad =
            |e: ort::Error| Error::model(&self.dir, VISION_FILE, format!("the model call failed: {e}")).because(e);
        let input = Tensor::from_array(([rows, 3, height as usize, width as usize], pixels)).map_err(bad)?;
        let mut session = self.session.lock().unwrap_or_else(|e| e.into_inner());
        let outputs = session.run(ort::inputs!["pixel_values" => input]).map_err(bad)?;
        let (shape, data) = outputs["image_embeds"].try_extract_tensor::<f32>().map_err(bad)?;
        if shape.len() != 2 || shape[0] as usize != rows || shape[1] as usize != self.dim {
            return Err(Error::model(
                &self.dir,
                VISION_FILE,
                format!("gave a {shape:?} output for {rows} images of {} values", self.dim),
            ));
        }
        Ok(data.to_vec())
    }
}

/// Why a call's images were not embedded: a bad image (the caller names its row's id), or anything else.
#[derive(Debug)]
pub enum EmbedImageError {
    Bad(BadImage),
    Other(Error),
}

type Key = (PathBuf, Placement);
static VISION: OnceLock<Mutex<HashMap<Key, Arc<VisionEmbedder>>>> = OnceLock::new();

/// The shared vision embedder of a model directory and placement, loaded on first use.
pub fn get_or_load(dir: &Path, placement: Placement) -> Result<Arc<VisionEmbedder>> {
    let key = (dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf()), placement);
    let mut map = VISION.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(e) = map.get(&key) {
        return Ok(Arc::clone(e));
    }
    let embedder = Arc::new(VisionEmbedder::load(&ModelSpec::load(dir)?, &key.1)?);
    map.insert(key, Arc::clone(&embedder));
    Ok(embedder)
}

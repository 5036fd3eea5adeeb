//! Images as an image-text model (CLIP, SigLIP) sees them: decoded from a file's bytes, turned to RGB, resized,
//! cropped and normalised exactly as its processor config says, the way transformers' PIL image processor does
//! for an image sentence-transformers loads from a file path (`transformers.image_utils.load_image`: EXIF
//! orientation applied, then `convert("RGB")`).
//!
//! Decoding is the `image` crate's; resizing is `fast_image_resize`'s convolution with the bicubic filter
//! (Pillow's, a = -0.5), the algorithm Pillow runs.

use std::io::Cursor;
use std::path::Path;

use fast_image_resize::images::Image as ResizeImage;
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader};
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The most pixels an image may have by default: Pillow's own limit (twice its `MAX_IMAGE_PIXELS`, where it stops
/// with `DecompressionBombError`), so that an image Pillow refuses is refused here too.
pub const DEFAULT_MAX_PIXELS: u64 = 178_956_970;

/// The formats decoded; any other is refused by name.
const FORMATS: [ImageFormat; 6] =
    [ImageFormat::Jpeg, ImageFormat::Png, ImageFormat::WebP, ImageFormat::Gif, ImageFormat::Bmp, ImageFormat::Tiff];

/// How the processor sizes an image before the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum Resize {
    /// CLIP's: the shorter side to this many pixels, the longer in proportion (truncated, as transformers does).
    ShortestEdge(u32),
    /// SigLIP's: exactly this height and width, whatever the image's shape.
    Exact { height: u32, width: u32 },
}

/// An image processor config (`processor_config.json`'s `image_processor`, or `preprocessor_config.json`), as
/// far as it decides the pixels: everything else it could say is refused when it loads.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessing {
    /// `CLIPImageProcessor` or `SiglipImageProcessor`.
    pub processor: String,
    pub resize: Resize,
    /// The center crop (height, width), when the processor crops.
    pub crop: Option<(u32, u32)>,
    /// `rescale_factor` (1/255), when the processor rescales.
    pub rescale: Option<f64>,
    /// Per channel mean and standard deviation, when it normalises.
    pub normalize: Option<([f32; 3], [f32; 3])>,
}

/// What went wrong with one image; the caller names the row.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageError {
    /// No bytes at all.
    Empty,
    /// Its file cannot be read (missing, unreadable): the path and why.
    File(String),
    /// Not an image of a format this pipeline decodes, or a broken one: the reason in words.
    Unreadable(String),
    /// More pixels than the limit: a decompression bomb, or an image to shrink first.
    TooLarge { width: u32, height: u32, limit: u64 },
}

impl std::fmt::Display for ImageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Empty => write!(f, "is empty (0 bytes)"),
            Self::File(why) => write!(f, "cannot be read from its file: {why}"),
            Self::Unreadable(why) => write!(f, "cannot be read as an image: {why}"),
            Self::TooLarge { width, height, limit } => write!(
                f,
                "is {width}x{height} = {} pixels, more than embed.max_image_pixels = {limit} (a decompression bomb, \
                 or an image to shrink before embedding; raise the limit if it is genuine)",
                *width as u64 * *height as u64
            ),
        }
    }
}

/// What preparing one image found, for the run's accounting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prepared {
    pub width: u32,
    pub height: u32,
}

impl ImageProcessing {
    /// The processor config of the model folder `dir/folder`: transformers 5's `processor_config.json` (its
    /// `image_processor` object) or the older `preprocessor_config.json`.
    pub fn load(dir: &Path, folder: &str) -> Result<Self> {
        let at = |name: &str| if folder.is_empty() { name.to_string() } else { format!("{folder}/{name}") };
        let read = |file: &str| -> Result<Map<String, Value>> {
            let text = std::fs::read_to_string(dir.join(file))
                .map_err(|e| Error::model(dir, file, format!("cannot read: {e}")).because(e))?;
            match serde_json::from_str::<Value>(&text) {
                Ok(Value::Object(o)) => Ok(o),
                Ok(_) => Err(Error::model(dir, file, "is not a JSON object")),
                Err(e) => Err(Error::model(dir, file, format!("invalid: {e}")).because(e)),
            }
        };
        let (file, config) = if dir.join(at("processor_config.json")).is_file() {
            let file = at("processor_config.json");
            match read(&file)?.remove("image_processor") {
                Some(Value::Object(o)) => (format!("{file} (image_processor)"), o),
                _ => return Err(Error::model(dir, &file, "has no image_processor object: not an image model's")),
            }
        } else if dir.join(at("preprocessor_config.json")).is_file() {
            let file = at("preprocessor_config.json");
            (file.clone(), read(&file)?)
        } else {
            return Err(Error::model(
                dir,
                at("processor_config.json"),
                "file not found (nor preprocessor_config.json): an image model needs its image processor's settings",
            ));
        };
        Self::from_config(&config).map_err(|m| Error::model(dir, &file, m))
    }

    /// The settings of one processor config; an error in words for anything this pipeline does not compute.
    pub fn from_config(c: &Map<String, Value>) -> std::result::Result<Self, String> {
        const KNOWN: [&str; 17] = [
            "image_processor_type",
            "processor_class",
            "feature_extractor_type",
            "do_resize",
            "size",
            "resample",
            "do_center_crop",
            "crop_size",
            "do_rescale",
            "rescale_factor",
            "do_normalize",
            "image_mean",
            "image_std",
            "do_convert_rgb",
            "default_to_square",
            "do_pad",
            "input_data_format",
        ];
        if let Some(key) = c.keys().find(|k| !KNOWN.contains(&k.as_str())) {
            return Err(format!(
                "{key} = {} is a setting this pipeline does not apply; such a model cannot be embedded here",
                c[key]
            ));
        }
        let flag = |key: &str, default: bool| c.get(key).and_then(Value::as_bool).unwrap_or(default);
        let processor = c
            .get("image_processor_type")
            .or_else(|| c.get("feature_extractor_type"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .trim_end_matches("Pil")
            .to_string();
        let clip = match processor.as_str() {
            "CLIPImageProcessor" | "CLIPFeatureExtractor" => true,
            "SiglipImageProcessor" => false,
            "" => return Err("names no image_processor_type".into()),
            other => {
                return Err(format!(
                    "image_processor_type {other} is not one this pipeline computes (CLIPImageProcessor, \
                     SiglipImageProcessor, as transformers' PIL backend runs them)"
                ));
            }
        };
        if !flag("do_resize", true) {
            return Err("do_resize is false: the model would see each image at its own size; not supported".into());
        }
        if !flag("do_convert_rgb", true) {
            return Err("do_convert_rgb is false: images must reach the model as RGB here".into());
        }
        if flag("do_pad", false) {
            return Err("do_pad is true: padding images is not supported".into());
        }
        if let Some(r) = c.get("resample").filter(|r| r.as_u64() != Some(3)) {
            return Err(format!("resample {r} is not bicubic (3), the one resampling filter this pipeline applies"));
        }
        let (resize, crop) = sizes(c, clip)?;
        let (rescale, normalize) = values(c)?;
        Ok(Self { processor, resize, crop, rescale, normalize })
    }

    /// The height and width of what the model is fed.
    pub fn input_size(&self) -> (u32, u32) {
        match (&self.crop, &self.resize) {
            (Some(crop), _) => *crop,
            (None, Resize::Exact { height, width }) => (*height, *width),
            // Refused at load: a shortest-edge resize always comes with a crop.
            (None, Resize::ShortestEdge(n)) => (*n, *n),
        }
    }

    /// The floats of one image's model input (`3 x height x width`, channels first) into `out`.
    pub fn prepare(&self, bytes: &[u8], max_pixels: u64, out: &mut [f32]) -> std::result::Result<Prepared, ImageError> {
        let rgb = decode_rgb(bytes, max_pixels)?;
        let prepared = Prepared { width: rgb.width(), height: rgb.height() };
        let (height, width) = match self.resize {
            Resize::Exact { height, width } => (height, width),
            Resize::ShortestEdge(n) => shortest_edge(rgb.height(), rgb.width(), n),
        };
        let resized = resize_bicubic(rgb, width, height)?;
        let (out_h, out_w) = self.input_size();
        let (h, w) = (height as i64, width as i64);
        // transformers' center_crop: top and left (size - crop) // 2, zeros where the crop reaches past the image.
        let (top, left) = match self.crop {
            Some((ch, cw)) => ((h - ch as i64).div_euclid(2), (w - cw as i64).div_euclid(2)),
            None => (0, 0),
        };
        let plane = (out_h * out_w) as usize;
        for y in 0..out_h as i64 {
            for x in 0..out_w as i64 {
                let (sy, sx) = (y + top, x + left);
                let inside = (0..h).contains(&sy) && (0..w).contains(&sx);
                for ch in 0..3 {
                    let v = if inside { resized[((sy * w + sx) * 3) as usize + ch] } else { 0 };
                    out[ch * plane + (y * out_w as i64 + x) as usize] = self.value(v, ch);
                }
            }
        }
        Ok(prepared)
    }

    /// One channel value as transformers computes it: rescaled in float64, cast to float32, then normalised in
    /// float32.
    fn value(&self, v: u8, channel: usize) -> f32 {
        let x = match self.rescale {
            Some(scale) => (v as f64 * scale) as f32,
            None => v as f32,
        };
        match &self.normalize {
            Some((mean, std)) => (x - mean[channel]) / std[channel],
            None => x,
        }
    }
}

/// The rescale factor and the per-channel mean and standard deviation a processor config applies, where it does.
#[allow(clippy::type_complexity)]
fn values(c: &Map<String, Value>) -> std::result::Result<(Option<f64>, Option<([f32; 3], [f32; 3])>), String> {
    let flag = |key: &str, default: bool| c.get(key).and_then(Value::as_bool).unwrap_or(default);
    let rescale = match flag("do_rescale", true) {
        true => Some(
            c.get("rescale_factor").map_or(Some(1.0 / 255.0), Value::as_f64).ok_or("rescale_factor is not a number")?,
        ),
        false => None,
    };
    let triple = |key: &str| -> std::result::Result<[f32; 3], String> {
        match c.get(key) {
            Some(Value::Number(n)) => Ok([n.as_f64().unwrap_or_default() as f32; 3]),
            Some(Value::Array(a)) if a.len() == 3 && a.iter().all(Value::is_number) => {
                Ok([0, 1, 2].map(|i| a[i].as_f64().unwrap_or_default() as f32))
            }
            other => Err(format!("{key} {} is not three numbers", other.map_or("(none)".into(), Value::to_string))),
        }
    };
    let normalize = match flag("do_normalize", true) {
        true => {
            let std = triple("image_std")?;
            if std.contains(&0.0) {
                return Err("image_std has a 0".into());
            }
            Some((triple("image_mean")?, std))
        }
        false => None,
    };
    Ok((rescale, normalize))
}

/// The resize and the center crop a processor config asks for.
fn sizes(c: &Map<String, Value>, clip: bool) -> std::result::Result<(Resize, Option<(u32, u32)>), String> {
    let flag = |key: &str, default: bool| c.get(key).and_then(Value::as_bool).unwrap_or(default);
    let size = c.get("size").ok_or("has no size")?;
    let number = |v: &Value, key: &str| -> std::result::Result<u32, String> {
        v.get(key)
            .and_then(Value::as_u64)
            .filter(|n| *n > 0 && *n <= 8192)
            .map(|n| n as u32)
            .ok_or_else(|| format!("size {v}: {key} is not a size in pixels"))
    };
    let keys: Vec<&str> = size.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
    let resize = match keys.as_slice() {
        ["shortest_edge"] if !flag("default_to_square", !clip) => Resize::ShortestEdge(number(size, "shortest_edge")?),
        ["height", "width"] | ["width", "height"] => {
            Resize::Exact { height: number(size, "height")?, width: number(size, "width")? }
        }
        _ => {
            return Err(format!(
                "size {size} is not one this pipeline applies ({{\"shortest_edge\": N}} or {{\"height\": H, \"width\": W}})"
            ));
        }
    };
    let crop = match flag("do_center_crop", false) {
        true => {
            let crop = c.get("crop_size").ok_or("do_center_crop is true but there is no crop_size")?;
            Some((number(crop, "height")?, number(crop, "width")?))
        }
        false => None,
    };
    if matches!(resize, Resize::ShortestEdge(_)) && crop.is_none() {
        return Err(
            "resizes by the shortest edge without a center crop: images would reach the model at many sizes".into()
        );
    }
    Ok((resize, crop))
}

/// transformers' `get_resize_output_image_size(default_to_square=False)`: (height, width).
fn shortest_edge(height: u32, width: u32, size: u32) -> (u32, u32) {
    let (short, long) = if width <= height { (width, height) } else { (height, width) };
    let new_long = ((size as f64 * long as f64) / short as f64) as u32;
    if width <= height { (new_long, size) } else { (size, new_long) }
}

/// What an image's header says, read without decoding its pixels: its format and its size as stored (before the
/// EXIF orientation, which does not change the pixel count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub format: ImageFormat,
    pub width: u32,
    pub height: u32,
}

impl Header {
    /// The pixels the image decodes to.
    pub fn pixels(&self) -> u64 {
        self.width as u64 * self.height as u64
    }
}

/// The header of an image of `reader`, refused as [`decode_rgb`] refuses it: not an image, a format this pipeline
/// does not decode, or a broken header.
pub fn header<R: std::io::BufRead + std::io::Seek>(reader: R) -> std::result::Result<Header, ImageError> {
    let reader = ImageReader::new(reader).with_guessed_format().map_err(|e| ImageError::Unreadable(e.to_string()))?;
    let format = known_format(reader.format())?;
    let mut reader = reader;
    reader.no_limits();
    let (width, height) = reader.into_dimensions().map_err(|e| ImageError::Unreadable(format!("{format:?}: {e}")))?;
    Ok(Header { format, width, height })
}

/// The header of an image's bytes (see [`header`]); an empty one is [`ImageError::Empty`].
pub fn header_of_bytes(bytes: &[u8]) -> std::result::Result<Header, ImageError> {
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    header(Cursor::new(bytes))
}

/// The header of an image file, reading only as far as its header (see [`header`]).
pub fn header_of_file(path: &Path) -> std::result::Result<Header, ImageError> {
    let file = std::fs::File::open(path).map_err(|e| ImageError::File(format!("{}: {e}", path.display())))?;
    if file.metadata().is_ok_and(|m| m.len() == 0) {
        return Err(ImageError::Empty);
    }
    header(std::io::BufReader::new(file))
}

/// A format this pipeline decodes, or why not.
fn known_format(format: Option<ImageFormat>) -> std::result::Result<ImageFormat, ImageError> {
    match format {
        Some(f) if FORMATS.contains(&f) => Ok(f),
        Some(f) => Err(ImageError::Unreadable(format!(
            "{f:?} is not a format this pipeline decodes (JPEG, PNG, WebP, GIF, BMP, TIFF)"
        ))),
        None => Err(ImageError::Unreadable("not an image of a known format (its first bytes say none)".into())),
    }
}

/// The image's pixels as Pillow's `Image.open`, `ImageOps.exif_transpose` and `convert("RGB")` give them: the
/// EXIF orientation applied, alpha dropped (not composited), 16-bit colour cut to its high byte and 16-bit grey
/// clipped at 255, as Pillow reads and converts them.
pub fn decode_rgb(bytes: &[u8], max_pixels: u64) -> std::result::Result<image::RgbImage, ImageError> {
    if bytes.is_empty() {
        return Err(ImageError::Empty);
    }
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Unreadable(e.to_string()))?;
    let format = known_format(reader.format())?;
    let unreadable = |e: image::ImageError| ImageError::Unreadable(format!("{format:?}: {e}"));
    let mut reader = reader;
    // The pixel limit is checked from the header, before any pixel is decoded; the decoder's own byte limit
    // is lifted so that the two do not disagree.
    reader.no_limits();
    let mut decoder = reader.into_decoder().map_err(unreadable)?;
    let (width, height) = decoder.dimensions();
    if width as u64 * height as u64 > max_pixels {
        return Err(ImageError::TooLarge { width, height, limit: max_pixels });
    }
    let orientation = decoder.orientation().unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut decoded = DynamicImage::from_decoder(decoder).map_err(unreadable)?;
    decoded.apply_orientation(orientation);
    // A palette image's transparent colours: transformers' processor composites such an image (Pillow keeps its
    // `transparency`) on white, where a true alpha channel was dropped by `convert("RGB")` before it.
    let palette = match format {
        // The PNG header's colour type (byte 25): 3 is indexed.
        ImageFormat::Png => bytes.get(25) == Some(&3),
        ImageFormat::Gif => true,
        _ => false,
    };
    match (palette, decoded) {
        (true, DynamicImage::ImageRgba8(rgba)) => Ok(on_white(&rgba)),
        (_, decoded) => Ok(to_rgb(decoded)),
    }
}

/// Pillow's `alpha_composite` of an RGBA image over white, as RGB.
fn on_white(rgba: &image::RgbaImage) -> image::RgbImage {
    let blend = |c: u8, a: u8| ((c as u32 * a as u32 + 255 * (255 - a as u32) + 127) / 255) as u8;
    let pixels = rgba.pixels().flat_map(|p| [blend(p[0], p[3]), blend(p[1], p[3]), blend(p[2], p[3])]).collect();
    image::RgbImage::from_raw(rgba.width(), rgba.height(), pixels)
        .unwrap_or_else(|| image::RgbImage::new(rgba.width(), rgba.height()))
}

/// Pillow's `convert("RGB")` of what it would have opened.
fn to_rgb(image: DynamicImage) -> image::RgbImage {
    let (w, h) = (image.width(), image.height());
    let from = |pixels: Vec<u8>| image::RgbImage::from_raw(w, h, pixels).unwrap_or_else(|| image::RgbImage::new(w, h));
    match image {
        DynamicImage::ImageRgb8(rgb) => rgb,
        DynamicImage::ImageRgba8(rgba) => from(rgba.pixels().flat_map(|p| [p[0], p[1], p[2]]).collect()),
        DynamicImage::ImageLuma8(l) => from(l.pixels().flat_map(|p| [p[0]; 3]).collect()),
        DynamicImage::ImageLumaA8(la) => from(la.pixels().flat_map(|p| [p[0]; 3]).collect()),
        // Pillow opens 16-bit grey as mode I;16, whose conversion to RGB clips at 255.
        DynamicImage::ImageLuma16(l) => from(l.pixels().flat_map(|p| [p[0].min(255) as u8; 3]).collect()),
        DynamicImage::ImageLumaA16(la) => from(la.pixels().flat_map(|p| [(p[0] >> 8) as u8; 3]).collect()),
        // 16-bit colour Pillow reads as 8-bit, keeping each sample's high byte.
        DynamicImage::ImageRgb16(rgb) => from(rgb.pixels().flat_map(|p| p.0.map(|v| (v >> 8) as u8)).collect()),
        DynamicImage::ImageRgba16(rgba) => {
            from(rgba.pixels().flat_map(|p| [p[0], p[1], p[2]].map(|v| (v >> 8) as u8)).collect())
        }
        other => other.to_rgb8(),
    }
}

/// Pillow's bicubic resize (`Image.resize(size, BICUBIC)`), by fast_image_resize's convolution.
fn resize_bicubic(rgb: image::RgbImage, width: u32, height: u32) -> std::result::Result<Vec<u8>, ImageError> {
    if (rgb.width(), rgb.height()) == (width, height) {
        return Ok(rgb.into_raw());
    }
    let failed = |e: String| ImageError::Unreadable(format!("cannot be resized: {e}"));
    let src = ResizeImage::from_vec_u8(rgb.width(), rgb.height(), rgb.into_raw(), PixelType::U8x3)
        .map_err(|e| failed(e.to_string()))?;
    let mut dst = ResizeImage::new(width, height, PixelType::U8x3);
    let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::CatmullRom));
    Resizer::new().resize(&src, &mut dst, &options).map_err(|e| failed(e.to_string()))?;
    Ok(dst.into_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(json: &str) -> std::result::Result<ImageProcessing, String> {
        ImageProcessing::from_config(serde_json::from_str::<Value>(json).unwrap().as_object().unwrap())
    }

    const CLIP: &str = r#"{"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 40},
        "do_center_crop": true, "crop_size": {"height": 32, "width": 32}, "resample": 3,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "rescale_factor": 0.00392156862745098}"#;

    #[test]
    fn clip_and_siglip_configs_read_and_others_are_refused_by_name() {
        let clip = config(CLIP).unwrap();
        assert_eq!(clip.resize, Resize::ShortestEdge(40));
        assert_eq!(clip.input_size(), (32, 32));
        let siglip = config(
            r#"{"image_processor_type": "SiglipImageProcessor", "size": {"height": 24, "width": 32},
                "image_mean": 0.5, "image_std": [0.5, 0.5, 0.5]}"#,
        )
        .unwrap();
        assert_eq!(siglip.input_size(), (24, 32));
        assert_eq!(siglip.normalize, Some(([0.5; 3], [0.5; 3])));
        for (json, named) in [
            (
                r#"{"image_processor_type": "ViTImageProcessor", "size": {"height": 2, "width": 2}}"#,
                "ViTImageProcessor",
            ),
            (&CLIP.replace("\"resample\": 3", "\"resample\": 2"), "resample 2"),
            (&CLIP.replace("\"rescale_factor\"", "\"crop_pct\": 0.9, \"rescale_factor\""), "crop_pct"),
            (&CLIP.replace("\"do_center_crop\": true", "\"do_center_crop\": false"), "without a center crop"),
            (&CLIP.replace("{\"shortest_edge\": 40}", "{\"longest_edge\": 40}"), "longest_edge"),
        ] {
            let e = config(json).unwrap_err();
            assert!(e.contains(named), "{e}");
        }
    }

    #[test]
    fn the_shortest_edge_sets_the_size_and_the_longer_side_is_truncated() {
        assert_eq!(shortest_edge(50, 70, 40), (40, 56));
        assert_eq!(shortest_edge(70, 50, 40), (56, 40));
        assert_eq!(shortest_edge(3, 3, 224), (224, 224));
        assert_eq!(shortest_edge(10, 1000, 32), (32, 3200));
    }

    #[test]
    fn bad_bytes_are_named_and_a_bomb_is_refused_from_its_header() {
        assert_eq!(decode_rgb(b"", 100).unwrap_err(), ImageError::Empty);
        let e = decode_rgb(b"plain text, not a picture", 100).unwrap_err().to_string();
        assert!(e.contains("not an image of a known format"), "{e}");
        let mut png = Vec::new();
        image::RgbImage::new(20, 10).write_to(&mut Cursor::new(&mut png), ImageFormat::Png).unwrap();
        assert_eq!(decode_rgb(&png, 199).unwrap_err(), ImageError::TooLarge { width: 20, height: 10, limit: 199 });
        assert_eq!(decode_rgb(&png, 200).unwrap().dimensions(), (20, 10));
        let e = decode_rgb(&png[..png.len() / 2], 200).unwrap_err().to_string();
        assert!(e.starts_with("cannot be read as an image: Png"), "{e}");
        // The header alone: the size without the pixels, from bytes or from a file; a header cut short is named.
        let want = Header { format: ImageFormat::Png, width: 20, height: 10 };
        assert_eq!((header_of_bytes(&png), want.pixels()), (Ok(want), 200));
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.png"), &png).unwrap();
        assert_eq!(header_of_file(&dir.path().join("a.png")), Ok(want));
        assert_eq!(header_of_bytes(b""), Err(ImageError::Empty));
        assert!(header_of_bytes(&png[..12]).unwrap_err().to_string().starts_with("cannot be read as an image: Png"));
        let e = header_of_file(&dir.path().join("gone.png")).unwrap_err().to_string();
        assert!(e.starts_with("cannot be read from its file: ") && e.contains("gone.png"), "{e}");
    }

    #[test]
    fn alpha_is_dropped_and_grey_is_repeated_as_pillow_converts() {
        let rgba = image::RgbaImage::from_raw(2, 1, vec![10, 20, 30, 0, 10, 20, 30, 255]).unwrap();
        assert_eq!(to_rgb(DynamicImage::ImageRgba8(rgba.clone())).into_raw(), [10, 20, 30, 10, 20, 30]);
        assert_eq!(on_white(&rgba).into_raw(), [255, 255, 255, 10, 20, 30], "a palette's transparent colour: white");
        let grey16 = DynamicImage::ImageLuma16(image::ImageBuffer::from_raw(2, 1, vec![100u16, 40000]).unwrap());
        assert_eq!(to_rgb(grey16).into_raw(), [100, 100, 100, 255, 255, 255]);
        let rgb16 =
            DynamicImage::ImageRgb16(image::ImageBuffer::from_raw(1, 1, vec![0x1234u16, 0xff00, 0x00ff]).unwrap());
        assert_eq!(to_rgb(rgb16).into_raw(), [0x12, 0xff, 0x00]);
    }
}

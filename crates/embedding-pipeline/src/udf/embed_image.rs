//! `embed_image(image [, id])`: a column of image files' bytes (Binary, LargeBinary, BinaryView) or paths (text;
//! `image_files('folder')` lists a folder's) in, the vision
//! tower's `FixedSizeList<Float32, dim>` vector out, with the same fingerprint as `embed(text)` of the same
//! image-text model (CLIP, SigLIP): its text and image vectors share one space.
//!
//! An async function, as `embed` is; `embed_image_dim()` keeps it in step with `SET embed.model` (see
//! [`super::embed::EmbedDimUdf`] for why a second function is needed).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::{Result, ScalarValue, exec_datafusion_err, plan_err};
use datafusion::logical_expr::async_udf::{AsyncScalarUDF, AsyncScalarUDFImpl};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature, Volatility,
};

use super::embed::{vector_array, vector_type};
use super::image_source::Located;
use crate::campaign::metrics::RunMetrics;
use crate::campaign::{FINGERPRINT_KEY, Fingerprint};
use crate::model::vision::{EmbedImageError, ImageSource};
use crate::options::EmbedOptions;

/// Both functions for a session with these options: `embed_image(image)` and `embed_image_dim()`.
pub fn embed_image_udfs(options: &EmbedOptions, metrics: Arc<RunMetrics>) -> [ScalarUDF; 2] {
    [
        EmbedImageUdf::for_options(options, Arc::clone(&metrics)),
        EmbedImageDimUdf { signature: Signature::nullary(Volatility::Stable), metrics }.into(),
    ]
}

/// The `embed_image(image [, id])` function, fixed to the `embed.*` options in force when it was planned.
#[derive(Debug)]
pub struct EmbedImageUdf {
    signature: Signature,
    options: EmbedOptions,
    /// The fingerprint these options give, or why they give none.
    fingerprint: std::result::Result<Fingerprint, String>,
    metrics: Arc<RunMetrics>,
}

impl PartialEq for EmbedImageUdf {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for EmbedImageUdf {}
impl Hash for EmbedImageUdf {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl EmbedImageUdf {
    /// The function for these options: the model's small files are read (and hashed) here, its vision session
    /// loads on the first call.
    pub fn for_options(options: &EmbedOptions, metrics: Arc<RunMetrics>) -> ScalarUDF {
        let fingerprint = Self::resolve(options).map_err(|e| e.to_string());
        let udf = Self {
            signature: Signature::one_of(vec![TypeSignature::Any(1), TypeSignature::Any(2)], Volatility::Stable),
            options: options.clone(),
            fingerprint,
            metrics,
        };
        AsyncScalarUDF::new(Arc::new(udf)).into_scalar_udf()
    }

    fn resolve(options: &EmbedOptions) -> crate::Result<Fingerprint> {
        let spec = crate::model::ModelSpec::load(options.model_dir())?;
        if spec.image.is_none() {
            return Err(crate::Error::model(
                &spec.dir,
                "modules.json",
                "is a text model's: embed_image() needs an image-text model (CLIP, SigLIP) exported by \
                 scripts/export-onnx; SET embed.model to one",
            ));
        }
        if options.truncate_dim != 0 {
            return Err(crate::Error::Option {
                key: "truncate_dim".into(),
                value: options.truncate_dim.to_string(),
                message: "embed_image() keeps every dimension of the vision tower; leave it at 0".into(),
            });
        }
        Ok(Fingerprint::for_options(options)?.1)
    }

    fn key(&self) -> String {
        format!("{:?}{:?}", self.options, self.fingerprint)
    }

    fn fingerprint(&self) -> Result<&Fingerprint> {
        self.fingerprint.as_ref().map_err(|e| exec_datafusion_err!("embed_image: {e}"))
    }
}

impl ScalarUDFImpl for EmbedImageUdf {
    fn name(&self) -> &str {
        "embed_image"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(vector_type(self.fingerprint()?))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let arg = &args.arg_fields[0];
        match arg.data_type() {
            DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::Null => {}
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {}
            other => {
                return plan_err!(
                    "embed_image() needs the images' bytes (a binary column) or their files' paths (a text column), \
                     but `{}` is {other}",
                    arg.name()
                );
            }
        }
        let fingerprint = self.fingerprint()?;
        let metadata = HashMap::from([(FINGERPRINT_KEY.to_string(), fingerprint.to_json())]);
        Ok(Arc::new(Field::new(self.name(), vector_type(fingerprint), true).with_metadata(metadata)))
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        Err(exec_datafusion_err!("embed_image() runs only inside a query"))
    }
}

#[async_trait]
impl AsyncScalarUDFImpl for EmbedImageUdf {
    async fn invoke_async_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let fingerprint = self.fingerprint()?.clone();
        let images = args.args[0].to_array(args.number_rows)?;
        let ids = args.args.get(1).map(|a| a.to_array(args.number_rows)).transpose()?;
        let options = self.options.clone();
        // Paths are resolved against embed.image_base, and objects in a store fetched, before the call.
        let images = match paths(&images)? {
            Some(paths) => Images::Located(super::image_source::locate(paths, &options.image_base).await),
            None => Images::Bytes(images),
        };
        let metrics = Arc::clone(&self.metrics);
        let (vectors, stats) =
            tokio::task::spawn_blocking(move || embed_array(&images, ids.as_ref(), &options, &fingerprint, &metrics))
                .await
                .map_err(|e| exec_datafusion_err!("embedding task failed: {e}"))??;
        super::embed::count_call(&stats);
        Ok(ColumnarValue::Array(vectors))
    }
}

/// A call's images: a binary array's bytes, or the images its paths name, located.
enum Images {
    Bytes(ArrayRef),
    Located(Vec<Option<Located>>),
}

/// The paths of a text array (none for a binary one).
fn paths(images: &ArrayRef) -> Result<Option<Vec<Option<String>>>> {
    let owned = |p: Option<&str>| p.map(str::to_string);
    Ok(Some(match images.data_type() {
        DataType::Utf8 => images.as_string::<i32>().iter().map(owned).collect(),
        DataType::LargeUtf8 => images.as_string::<i64>().iter().map(owned).collect(),
        DataType::Utf8View => images.as_string_view().iter().map(owned).collect(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::Null => return Ok(None),
        other => return Err(exec_datafusion_err!("embed_image() needs a binary or text argument, got {other}")),
    }))
}

/// Embed one array's images with the shared vision tower, off the async runtime.
fn embed_array(
    images: &Images,
    ids: Option<&ArrayRef>,
    options: &EmbedOptions,
    fingerprint: &Fingerprint,
    metrics: &RunMetrics,
) -> Result<(ArrayRef, crate::model::EmbedStats)> {
    let embedder = options.vision_embedder()?;
    let values: Vec<Option<ImageSource>> = match images {
        Images::Located(located) => located.iter().map(|l| l.as_ref().map(Located::source)).collect(),
        Images::Bytes(images) => match images.data_type() {
            DataType::Binary => images.as_binary::<i32>().iter().map(|b| b.map(ImageSource::Bytes)).collect(),
            DataType::LargeBinary => images.as_binary::<i64>().iter().map(|b| b.map(ImageSource::Bytes)).collect(),
            DataType::BinaryView => images.as_binary_view().iter().map(|b| b.map(ImageSource::Bytes)).collect(),
            DataType::Null => vec![None; images.len()],
            other => return Err(exec_datafusion_err!("embed_image() needs a binary or text argument, got {other}")),
        },
    };
    let stop = || metrics.stop().requested();
    if values.iter().any(Option::is_some) {
        metrics.record_call_started();
    }
    metrics.record_device(embedder.device());
    let skip = options.skip_bad_images()?;
    let id_of = |row: usize| ids.and_then(|ids| ScalarValue::try_from_array(ids, row).ok()).filter(|v| !v.is_null());
    let mut out =
        embedder.embed(&values, options.batch_images, options.max_image_pixels, skip, &stop).map_err(|e| match e {
            EmbedImageError::Bad(bad) => {
                let who = match id_of(bad.row) {
                    Some(id) => format!("the image of id {id}"),
                    None => {
                        format!("the image at row {} (pass the id as embed_image(image, id) to have it named)", bad.row)
                    }
                };
                exec_datafusion_err!(
                    "{who} {}; leave it out of the query, replace the file, or SET embed.bad_images = 'skip'",
                    bad.error
                )
            }
            EmbedImageError::Other(e) => e.into(),
        })?;
    for bad in &out.bad {
        let id = id_of(bad.row).map_or_else(|| format!("row {}", bad.row), |id| id.to_string());
        out.stats.skipped_images.push((id, bad.error.to_string()));
    }
    metrics.record_embed(&out.stats);
    metrics.record_images_done(out.stats.images);
    Ok((vector_array(out.vectors, out.valid, fingerprint)?, out.stats))
}

/// `embed_image_dim()`: the length of the vectors `embed_image` makes with `embed.model`; also how `embed_image`
/// follows `SET embed.model` (its `with_updated_config`).
#[derive(Debug)]
pub struct EmbedImageDimUdf {
    signature: Signature,
    metrics: Arc<RunMetrics>,
}

impl PartialEq for EmbedImageDimUdf {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}
impl Eq for EmbedImageDimUdf {}
impl Hash for EmbedImageDimUdf {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl ScalarUDFImpl for EmbedImageDimUdf {
    fn name(&self) -> &str {
        "embed_image_dim"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int32)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let options = EmbedOptions::from_config(&args.config_options);
        let fingerprint = EmbedImageUdf::resolve(&options)?;
        Ok(ColumnarValue::Scalar(ScalarValue::Int32(Some(fingerprint.dim as i32))))
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        Some(EmbedImageUdf::for_options(&EmbedOptions::from_config(config), Arc::clone(&self.metrics)))
    }
}

/// `embed_image` in a cluster's session: refused when the query is planned, naming what to do (a cluster's
/// executors run `embed` only, for now).
pub fn refused_on_cluster() -> ScalarUDF {
    ScalarUDF::new_from_impl(RefusedOnCluster { signature: Signature::variadic_any(Volatility::Stable) })
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct RefusedOnCluster {
    signature: Signature,
}

impl ScalarUDFImpl for RefusedOnCluster {
    fn name(&self) -> &str {
        "embed_image"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        plan_err!(
            "embed_image() does not run on a cluster yet: its executors embed texts only. Run this job without \
             --cluster (one machine decodes and embeds the images)"
        )
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        plan_err!("embed_image() does not run on a cluster yet")
    }
}

#[cfg(test)]
mod tests {
    use datafusion::prelude::SessionContext;

    #[tokio::test]
    async fn on_a_cluster_embed_image_is_refused_when_planned() {
        let ctx = SessionContext::new();
        ctx.register_udf(super::refused_on_cluster());
        let e = ctx.sql("SELECT embed_image(X'00') AS v").await.unwrap_err().to_string();
        assert!(e.contains("embed_image() does not run on a cluster yet") && e.contains("without --cluster"), "{e}");
    }
}

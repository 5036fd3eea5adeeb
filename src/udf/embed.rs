//! `embed(text)`: a text column in, a `FixedSizeList<Float32, dim>` vector column out.
//!
//! It is an async DataFusion function, so each call's tokenising and inference run on tokio's
//! blocking pool rather than on the query's workers. Its return type depends on `embed.model`,
//! which DataFusion only shows a function through `with_updated_config`; see [`EmbedDimUdf`].

use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::{exec_datafusion_err, plan_err, Result, ScalarValue};
use datafusion::logical_expr::async_udf::{AsyncScalarUDF, AsyncScalarUDFImpl};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use crate::metrics::RunMetrics;
use crate::model::{registry, ModelSpec, TextEmbedder};
use crate::options::EmbedOptions;

/// The vector type for a model of `dim` dimensions.
pub fn vector_type(dim: usize) -> DataType {
    DataType::FixedSizeList(Arc::new(Field::new_list_field(DataType::Float32, true)), dim as i32)
}

/// Both functions for a session with these options: `embed(text)` and `embed_dim()`.
pub fn embed_udfs(options: &EmbedOptions, metrics: Arc<RunMetrics>) -> [ScalarUDF; 2] {
    [EmbedUdf::for_options(options, Arc::clone(&metrics)), EmbedDimUdf::new(metrics).into()]
}

/// The `embed(text)` function, fixed to the model that `embed.model` named when it was planned.
#[derive(Debug)]
pub struct EmbedUdf {
    signature: Signature,
    model: String,
    /// The model's dimension, or why its directory could not be read.
    dim: std::result::Result<usize, String>,
    metrics: Arc<RunMetrics>,
}

impl PartialEq for EmbedUdf {
    fn eq(&self, other: &Self) -> bool {
        self.model == other.model && self.dim == other.dim
    }
}
impl Eq for EmbedUdf {}
impl Hash for EmbedUdf {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.model.hash(state);
        self.dim.hash(state);
    }
}

impl EmbedUdf {
    /// The `embed` function for the model these options name. Only the model's small JSON files are
    /// read here; the ONNX session loads on the first call.
    pub fn for_options(options: &EmbedOptions, metrics: Arc<RunMetrics>) -> ScalarUDF {
        let dim = ModelSpec::load(&options.model).map(|s| s.dim).map_err(|e| e.to_string());
        let udf = Self {
            signature: Signature::any(1, Volatility::Stable),
            model: options.model.clone(),
            dim,
            metrics,
        };
        AsyncScalarUDF::new(Arc::new(udf)).into_scalar_udf()
    }

    fn dim(&self) -> Result<usize> {
        self.dim.clone().map_err(|e| exec_datafusion_err!("embed.model: {e}"))
    }
}

impl ScalarUDFImpl for EmbedUdf {
    fn name(&self) -> &str {
        "embed"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(vector_type(self.dim()?))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let arg = &args.arg_fields[0];
        match arg.data_type() {
            DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8 | DataType::Null => {}
            other => {
                return plan_err!(
                    "embed() needs a text argument, but `{}` is {other}; embed a string column, or cast it with CAST({} AS VARCHAR)",
                    arg.name(),
                    arg.name()
                );
            }
        }
        Ok(Arc::new(Field::new(self.name(), vector_type(self.dim()?), true)))
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        // NOTE: DataFusion calls invoke_async_with_args for async functions; this is only reached when
        // something tries to evaluate embed() eagerly, such as constant folding, which then keeps the call.
        Err(exec_datafusion_err!("embed() runs only inside a query"))
    }
}

#[async_trait]
impl AsyncScalarUDFImpl for EmbedUdf {
    async fn invoke_async_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let options = args.config_options.extensions.get::<EmbedOptions>().cloned().unwrap_or_default();
        let dim = self.dim()?;
        let texts = args.args[0].to_array(args.number_rows)?;
        let metrics = Arc::clone(&self.metrics);
        let vectors = tokio::task::spawn_blocking(move || embed_array(&texts, &options, dim, &metrics))
            .await
            .map_err(|e| exec_datafusion_err!("embedding task failed: {e}"))??;
        Ok(ColumnarValue::Array(vectors))
    }
}

/// Embed one string array with the shared model, off the async runtime.
fn embed_array(texts: &ArrayRef, options: &EmbedOptions, dim: usize, metrics: &RunMetrics) -> Result<ArrayRef> {
    let embedder = registry::get_or_load(Path::new(&options.model), options.resolved_intra_threads())?;
    let spec = embedder.spec();
    if spec.dim != dim {
        return Err(exec_datafusion_err!(
            "embed.model changed from a {dim}-dimensional model to {} ({} dimensions) after the query was planned",
            options.model,
            spec.dim
        ));
    }
    let settings = options.call_settings(spec.max_seq_length, spec.pooling, spec.normalize)?;
    let values = string_values(texts)?;
    let out = embedder.embed(&values, &settings)?;
    metrics.record_embed(&out.stats);
    let nulls = NullBuffer::from(out.valid);
    let field = Arc::new(Field::new_list_field(DataType::Float32, true));
    let array = FixedSizeListArray::try_new(
        field,
        dim as i32,
        Arc::new(Float32Array::from(out.vectors)),
        (nulls.null_count() > 0).then_some(nulls),
    )?;
    Ok(Arc::new(array))
}

fn string_values(array: &ArrayRef) -> Result<Vec<Option<&str>>> {
    Ok(match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().iter().collect(),
        DataType::LargeUtf8 => array.as_string::<i64>().iter().collect(),
        DataType::Utf8View => array.as_string_view().iter().collect(),
        DataType::Null => vec![None; array.len()],
        other => return Err(exec_datafusion_err!("embed() needs a text argument, got {other}")),
    })
}

/// `embed_dim()`: the dimension of the model `embed.model` names.
///
/// NOTE: it also keeps `embed` in step with `SET embed.model`. DataFusion re-plans functions after a
/// `SET` through `with_updated_config`, but its `AsyncScalarUDF` wrapper, which `embed` must be to run
/// off the query's workers, never answers that call. This function answers it with a new `embed`
/// for the new model; DataFusion registers the result under its own name, replacing `embed`.
#[derive(Debug)]
pub struct EmbedDimUdf {
    signature: Signature,
    metrics: Arc<RunMetrics>,
}

impl PartialEq for EmbedDimUdf {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}
impl Eq for EmbedDimUdf {}
impl Hash for EmbedDimUdf {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl EmbedDimUdf {
    fn new(metrics: Arc<RunMetrics>) -> Self {
        Self { signature: Signature::nullary(Volatility::Stable), metrics }
    }
}

impl ScalarUDFImpl for EmbedDimUdf {
    fn name(&self) -> &str {
        "embed_dim"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Int32)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let options = args.config_options.extensions.get::<EmbedOptions>().cloned().unwrap_or_default();
        let spec = ModelSpec::load(&options.model)?;
        Ok(ColumnarValue::Scalar(ScalarValue::Int32(Some(spec.dim as i32))))
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        let options = config.extensions.get::<EmbedOptions>().cloned().unwrap_or_default();
        Some(EmbedUdf::for_options(&options, Arc::clone(&self.metrics)))
    }
}

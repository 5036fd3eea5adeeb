//! `embed(text [, id])`: a text column in, a `FixedSizeList<Float32, dim>` vector column out
//! (`Float16` under `embed.precision = 'float16'`).
//!
//! It is an async DataFusion function, so each call's tokenising and inference run on tokio's
//! blocking pool rather than on the query's workers. Its return type depends on `embed.model`,
//! which DataFusion only shows a function through `with_updated_config`; see [`EmbedDimUdf`].

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use datafusion::arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Float16Array, Float32Array};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::{Result, ScalarValue, exec_datafusion_err, plan_err};
use datafusion::logical_expr::async_udf::{AsyncScalarUDF, AsyncScalarUDFImpl};
use datafusion::logical_expr::{
    ColumnarValue, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TypeSignature, Volatility,
};

use crate::campaign::metrics::RunMetrics;
use crate::campaign::{FINGERPRINT_KEY, Fingerprint};
use crate::model::CallSettings;
use crate::model::tokenize::Tokenized;
use crate::model::{EmbedStats, TextEmbedder};
use crate::options::EmbedOptions;

/// The vector type a fingerprint describes: `dim` elements of its `dtype` (float32 or float16).
pub fn vector_type(fingerprint: &Fingerprint) -> DataType {
    DataType::FixedSizeList(Arc::new(Field::new_list_field(element_type(fingerprint), true)), fingerprint.dim as i32)
}

fn element_type(fingerprint: &Fingerprint) -> DataType {
    if fingerprint.dtype == "float16" { DataType::Float16 } else { DataType::Float32 }
}

/// Both functions for a session with these options: `embed(text)` and `embed_dim()`.
pub fn embed_udfs(options: &EmbedOptions, metrics: Arc<RunMetrics>) -> [ScalarUDF; 2] {
    [EmbedUdf::for_options(options, Arc::clone(&metrics)), EmbedDimUdf::new(metrics).into()]
}

/// The `embed(text [, id])` function, fixed to the `embed.*` options in force when it was planned.
#[derive(Debug)]
pub struct EmbedUdf {
    signature: Signature,
    options: EmbedOptions,
    /// The settings and fingerprint these options resolve to, or why they do not.
    resolved: std::result::Result<Resolved, String>,
    metrics: Arc<RunMetrics>,
    /// On a cluster's scheduler and executors: the job's own options, read from each call's session.
    cluster: Option<ClusterSide>,
}

/// What an executor sets for its own machine over a job's `embed.*` options: its device, and its threads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct HostOptions {
    /// `embed.device` on this host (`pipeline executor --device`).
    pub device: Option<String>,
    /// `embed.intra_threads` on this host (`pipeline executor --intra-threads`).
    pub intra_threads: Option<usize>,
    /// The executor, as messages name it (`HOST:PORT`).
    pub name: Option<String>,
}

impl HostOptions {
    /// The job's options as this host runs them.
    pub fn apply(&self, options: &mut EmbedOptions) {
        if let Some(device) = &self.device {
            options.device = device.clone();
        }
        if let Some(threads) = self.intra_threads {
            options.intra_threads = threads;
        }
    }
}

/// `embed` where a cluster runs it: the fingerprint the client planned with, which every call checks the
/// host's own model against, and the host's settings.
#[derive(Debug)]
struct ClusterSide {
    planned: Fingerprint,
    host: HostOptions,
    /// The options of the last call, and what they resolved to on this host.
    last: Mutex<Option<(String, Resolved)>>,
}

impl ClusterSide {
    /// The options of the job this call belongs to (`embed.*` in its session), with this host's settings, and
    /// their settings; an error when this host's model makes other vectors than the client planned.
    fn resolve(&self, config: &ConfigOptions) -> Result<(EmbedOptions, Resolved)> {
        let mut options = EmbedOptions::from_config(config);
        self.host.apply(&mut options);
        let key = format!("{options:?}");
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((k, resolved)) = last.as_ref()
            && *k == key
        {
            return Ok((options, resolved.clone()));
        }
        let here = self.host.name.as_deref().map_or("this executor".to_string(), |n| format!("executor {n}"));
        let resolved = EmbedUdf::resolve(&options).map_err(|e| exec_datafusion_err!("embed on {here}: {e}"))?;
        let differences = self.planned.differences(&resolved.fingerprint);
        if !differences.is_empty() {
            let list: Vec<String> = differences
                .iter()
                .map(|(field, planned, here)| format!("{field}: {planned} planned, {here} here"))
                .collect();
            return Err(exec_datafusion_err!(
                "{here}: its model ({}) makes other vectors than the job was planned with ({}); install the same \
                 model files at the same path on every host of the cluster",
                options.model_dir().display(),
                list.join("; ")
            ));
        }
        *last = Some((key, resolved.clone()));
        Ok((options, resolved))
    }
}

#[derive(Debug, Clone)]
struct Resolved {
    settings: CallSettings,
    fingerprint: Fingerprint,
}

impl PartialEq for EmbedUdf {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}
impl Eq for EmbedUdf {}
impl Hash for EmbedUdf {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl EmbedUdf {
    /// The `embed` function for these options. Only the model's small files are read here (and the
    /// model hashed for the fingerprint, once per file); the ONNX session loads on the first call.
    pub fn for_options(options: &EmbedOptions, metrics: Arc<RunMetrics>) -> ScalarUDF {
        let resolved = Self::resolve(options).map_err(|e| e.to_string());
        let udf = Self {
            signature: Signature::one_of(vec![TypeSignature::Any(1), TypeSignature::Any(2)], Volatility::Stable),
            options: options.clone(),
            resolved,
            metrics,
            cluster: None,
        };
        AsyncScalarUDF::new(Arc::new(udf)).into_scalar_udf()
    }

    /// The `embed` function on a cluster's scheduler or executor: it returns the vectors `planned` describes
    /// (the client's fingerprint), and each call embeds with its job's `embed.*` options as the session hands
    /// them over, `host`'s settings applied, after checking that this host's model gives that fingerprint.
    pub fn on_cluster(planned: Fingerprint, host: HostOptions, metrics: Arc<RunMetrics>) -> ScalarUDF {
        let udf = Self {
            signature: Signature::one_of(vec![TypeSignature::Any(1), TypeSignature::Any(2)], Volatility::Stable),
            options: EmbedOptions::default(),
            resolved: Err("embed on a cluster takes its options from the job".into()),
            metrics,
            cluster: Some(ClusterSide { planned, host, last: Mutex::new(None) }),
        };
        AsyncScalarUDF::new(Arc::new(udf)).into_scalar_udf()
    }

    /// The fingerprint of the vectors an `embed` function returns (from its return field), however it was made.
    pub fn planned_fingerprint(udf: &ScalarUDF) -> Result<Fingerprint> {
        let text: FieldRef = Arc::new(Field::new("text", DataType::Utf8, true));
        let field = udf.return_field_from_args(ReturnFieldArgs { arg_fields: &[text], scalar_arguments: &[None] })?;
        let json = field
            .metadata()
            .get(FINGERPRINT_KEY)
            .ok_or_else(|| exec_datafusion_err!("embed() returned a field without its fingerprint"))?;
        Fingerprint::from_json(json).map_err(|e| exec_datafusion_err!("embed()'s fingerprint does not read: {e}"))
    }

    fn resolve(options: &EmbedOptions) -> crate::Result<Resolved> {
        let (settings, fingerprint) = Fingerprint::for_options(options)?;
        Ok(Resolved { settings, fingerprint })
    }

    fn key(&self) -> String {
        let cluster = self.cluster.as_ref().map(|c| (&c.planned, &c.host));
        format!("{:?}{:?}{cluster:?}", self.options, self.resolved.as_ref().map(|r| &r.fingerprint))
    }

    /// The fingerprint of the vectors this function returns.
    fn fingerprint(&self) -> Result<&Fingerprint> {
        match &self.cluster {
            Some(c) => Ok(&c.planned),
            None => Ok(&self.resolved()?.fingerprint),
        }
    }

    fn resolved(&self) -> Result<&Resolved> {
        self.resolved.as_ref().map_err(|e| exec_datafusion_err!("embed: {e}"))
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
        Ok(vector_type(self.fingerprint()?))
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
        let fingerprint = self.fingerprint()?;
        let metadata = HashMap::from([(FINGERPRINT_KEY.to_string(), fingerprint.to_json())]);
        Ok(Arc::new(Field::new(self.name(), vector_type(fingerprint), true).with_metadata(metadata)))
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
        let (options, resolved) = match &self.cluster {
            Some(cluster) => cluster.resolve(&args.config_options)?,
            None => (self.options.clone(), self.resolved()?.clone()),
        };
        let texts = args.args[0].to_array(args.number_rows)?;
        let ids = args.args.get(1).map(|a| a.to_array(args.number_rows)).transpose()?;
        let metrics = Arc::clone(&self.metrics);
        let given = GIVEN_TOKENS
            .try_with(|given| given.lock().unwrap_or_else(|e| e.into_inner()).take())
            .ok()
            .flatten()
            .filter(|g| g.tokens.len() == args.number_rows && g.fit(&resolved.settings))
            .map(|g| g.tokens);
        let (vectors, stats) = tokio::task::spawn_blocking(move || {
            embed_array(&texts, ids.as_ref(), given, &options, &resolved, &metrics)
        })
        .await
        .map_err(|e| exec_datafusion_err!("embedding task failed: {e}"))??;
        count_call(&stats);
        Ok(ColumnarValue::Array(vectors))
    }
}

tokio::task_local! {
    /// Where the `embed` calls made inside [`counting_calls`] add their counters.
    static CALL_STATS: Arc<Mutex<EmbedStats>>;
    /// The tokens of the rows of the `embed` call made inside [`with_tokens`].
    static GIVEN_TOKENS: Mutex<Option<GivenTokens>>;
}

/// The tokens the ordering stage made for a chunk's texts (one per row, `None` for a NULL text), and the settings
/// they were made under.
#[derive(Debug)]
pub struct GivenTokens {
    pub tokens: Vec<Option<Tokenized>>,
    pub made_under: CallSettings,
}

impl GivenTokens {
    /// Whether these tokens are what `settings` would make of the same texts.
    fn fit(&self, settings: &CallSettings) -> bool {
        let made = &self.made_under;
        made.prefix == settings.prefix
            && made.max_tokens == settings.max_tokens
            && made.truncation == settings.truncation
    }
}

/// Add a call's counters to those of the [`counting_calls`] it runs in, if any.
pub(crate) fn count_call(stats: &EmbedStats) {
    let _ = CALL_STATS.try_with(|counted| counted.lock().unwrap_or_else(|e| e.into_inner()).add(stats));
}

/// Run `fut`, in which the first `embed` call over `rows` rows uses `tokens` instead of tokenising its texts: how
/// the write path ([`crate::exec::EmbedExec`]) hands the ordering stage's tokens on, so that each text is tokenised
/// once. A call over another number of rows, or under other tokenising settings, tokenises as usual.
pub async fn with_tokens<F: std::future::Future>(tokens: GivenTokens, fut: F) -> F::Output {
    GIVEN_TOKENS.scope(Mutex::new(Some(tokens)), fut).await
}

/// Run `fut`, and return with its output the counters of the `embed` calls it made: how the write path
/// ([`crate::exec::EmbedExec`]) learns what each chunk of rows cost, to send the counters on with the rows.
pub async fn counting_calls<F: std::future::Future>(fut: F) -> (F::Output, EmbedStats) {
    let counted = Arc::new(Mutex::new(EmbedStats::default()));
    let out = CALL_STATS.scope(Arc::clone(&counted), fut).await;
    let stats = counted.lock().unwrap_or_else(|e| e.into_inner()).clone();
    (out, stats)
}

/// Embed one string array with the shared model, off the async runtime; no model call starts once a
/// stop was asked for (ctrl-C, SIGTERM).
fn embed_array(
    texts: &ArrayRef,
    ids: Option<&ArrayRef>,
    given: Option<Vec<Option<Tokenized>>>,
    options: &EmbedOptions,
    resolved: &Resolved,
    metrics: &RunMetrics,
) -> Result<(ArrayRef, EmbedStats)> {
    let embedder = options.embedder()?;
    let dim = resolved.fingerprint.dim;
    let values = string_values(texts)?;
    let progress = |docs, tokens| metrics.record_progress(docs, tokens);
    let stop = || metrics.stop().requested();
    metrics.record_call_started();
    let out = embedder.embed_tokenized(&values, given, &resolved.settings, &progress, &stop).map_err(|e| match e {
        crate::Error::BlankText { row } => {
            let who = match ids.and_then(|ids| ScalarValue::try_from_array(ids, row).ok()) {
                Some(id) => format!("the text of id {id}"),
                None => format!("the text at row {row} (pass the id as embed(text, id) to have it named)"),
            };
            exec_datafusion_err!(
                "{who} is blank (empty, or only whitespace or zero-width characters), and embed.blank_texts = 'error'; \
                 leave it out (WHERE trim(text) <> ''), or SET embed.blank_texts = 'embed'"
            )
        }
        crate::Error::TooLong { row, tokens, max_tokens } => {
            let who = match ids.and_then(|ids| ScalarValue::try_from_array(ids, row).ok()) {
                Some(id) => format!("id {id}"),
                None => format!(
                    "the text starting {:?} (pass the id as embed(text, id) to have it named)",
                    prefix_of(values[row])
                ),
            };
            exec_datafusion_err!(
                "{who} has {tokens} tokens, more than embed.max_tokens = {max_tokens}, and embed.truncation = 'error'; \
                 shorten it, or SET embed.truncation = 'right'"
            )
        }
        other => other.into(),
    })?;
    metrics.record_embed(&out.stats);
    metrics.record_device(embedder.device());
    debug_assert_eq!(out.vectors.len(), out.valid.len() * dim);
    Ok((vector_array(out.vectors, out.valid, &resolved.fingerprint)?, out.stats))
}

/// The vector column of a call: `dim` floats per row (NULL where `valid` is false), in the fingerprint's element
/// type ([`vector_type`]).
pub(crate) fn vector_array(vectors: Vec<f32>, valid: Vec<bool>, fingerprint: &Fingerprint) -> Result<ArrayRef> {
    let nulls = NullBuffer::from(valid);
    let element = element_type(fingerprint);
    let values: ArrayRef = match element {
        DataType::Float16 => Arc::new(Float16Array::from_iter_values(vectors.iter().map(|v| half::f16::from_f32(*v)))),
        _ => Arc::new(Float32Array::from(vectors)),
    };
    let field = Arc::new(Field::new_list_field(element, true));
    let dim = fingerprint.dim as i32;
    Ok(Arc::new(FixedSizeListArray::try_new(field, dim, values, (nulls.null_count() > 0).then_some(nulls))?))
}

fn prefix_of(text: Option<&str>) -> String {
    text.unwrap_or_default().chars().take(40).collect()
}

/// The texts of a string array (Utf8, LargeUtf8, Utf8View; a Null array is all NULL).
pub(crate) fn string_values(array: &ArrayRef) -> Result<Vec<Option<&str>>> {
    Ok(match array.data_type() {
        DataType::Utf8 => array.as_string::<i32>().iter().collect(),
        DataType::LargeUtf8 => array.as_string::<i64>().iter().collect(),
        DataType::Utf8View => array.as_string_view().iter().collect(),
        DataType::Null => vec![None; array.len()],
        other => return Err(exec_datafusion_err!("embed() needs a text argument, got {other}")),
    })
}

/// `embed_dim()`: the length of the vectors `embed` makes: the dimension of the model `embed.model` names, or
/// `embed.truncate_dim` when that cuts it.
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
        let options = EmbedOptions::from_config(&args.config_options);
        // The settings a call of embed() resolves and checks: the model's own pooling counts as there, and a
        // cut wider than the model's vectors is refused as embed() refuses it.
        let (spec, settings, _) = crate::campaign::Fingerprint::settings_for(&options)?;
        let dim = settings.out_dim(&spec);
        Ok(ColumnarValue::Scalar(ScalarValue::Int32(Some(dim as i32))))
    }

    fn with_updated_config(&self, config: &ConfigOptions) -> Option<ScalarUDF> {
        let options = EmbedOptions::from_config(config);
        Some(EmbedUdf::for_options(&options, Arc::clone(&self.metrics)))
    }
}

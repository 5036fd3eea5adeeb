//! The campaign fingerprint: every setting that decides what a vector is. Vectors are comparable
//! exactly when their fingerprints are equal.
//!
//! It is stored as JSON under the key [`FINGERPRINT_KEY`], in the `embed` output field's metadata while
//! a query runs, and in the Lance dataset's schema metadata once written (pylance:
//! `ds.schema.metadata[b"embedding_pipeline.fingerprint"]`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::digest::model_digest;
use super::lineage;
use crate::error::{Error, Result};
use crate::model::CallSettings;
use crate::model::ModelSpec;
use crate::model::onnx_weights::read_weights;
use crate::options::EmbedOptions;

/// Metadata key of the fingerprint, in field metadata and in Lance schema metadata.
pub const FINGERPRINT_KEY: &str = "embedding_pipeline.fingerprint";

/// What made a set of vectors. Field order is the JSON order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Fingerprint {
    /// The model directory's name.
    pub model: String,
    /// sha256 of the ONNX graph file; for a graph with its weights in external data files, of the graph's and
    /// every one of those files' digests together ([`model_sha256`]).
    pub model_sha256: String,
    /// Element type of most of the model's weights: `float32`, `float16`, `int8`… (read from the ONNX
    /// file; empty in fingerprints written before it was recorded).
    #[serde(default)]
    pub model_dtype: String,
    /// sha256 of tokenizer.json.
    pub tokenizer_sha256: String,
    /// Most tokens per text, special tokens included.
    pub max_tokens: usize,
    /// 'right', 'left' or 'error'.
    pub truncation: String,
    /// 'mean', 'cls' or 'max'.
    pub pooling: String,
    /// Whether vectors are L2-normalised.
    pub normalize: bool,
    /// Text put before every input: `embed.prefix`, or the model's prompt.
    pub prefix: String,
    /// Element type of the stored vectors: `float32`, or `float16` under `embed.precision = 'float16'`.
    pub dtype: String,
    /// Vector length.
    pub dim: usize,
    /// The Matryoshka cut (`embed.truncate_dim`): the first this many of the model's dimensions, then
    /// normalised. Absent from the JSON when the vectors keep every dimension.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub truncate_dim: usize,
    /// The name of the model's prompt that `prefix` holds (`embed.prompt_name`, or the model's
    /// `default_prompt_name`). A label: the text in `prefix` is what is compared. Absent when none applies.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prompt_name: String,
    /// The digest of the model directory's `lineage.json` (scripts/export-onnx), when it has one: what made
    /// the model, from its training data on, without when or where it was exported (see
    /// [`super::lineage::digest`]). Absent from the JSON otherwise.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lineage_sha256: String,
    /// The model's Dense modules after its pooling, when it has any: the sha256 of one line per module, in
    /// modules.json order, holding its folder and the digests of its config.json and model.safetensors
    /// ([`dense_sha256`]). Absent from the JSON for a model without them.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dense_sha256: String,
    /// The prefix's tokens were left out of the pooling (the model's `include_prompt: false`, with a prompt or
    /// `embed.prefix` applied). Absent from the JSON when false, as before it was recorded.
    #[serde(default, skip_serializing_if = "is_false")]
    pub prompt_unpooled: bool,
    /// An image-text model's (CLIP's, SigLIP's) vision tower: sha256 of `onnx/vision_model.onnx`. Its text and
    /// image vectors share one fingerprint, since they share one space. Absent for a text model.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vision_sha256: String,
    /// sha256 of that model's image processor config (how images are resized and normalised). Absent for a text
    /// model.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image_processor_sha256: String,
}

impl Fingerprint {
    /// The fingerprint of embedding with this model and these settings. Hashes the model files
    /// (once per file version per process).
    pub fn new(spec: &ModelSpec, settings: &CallSettings) -> Result<Self> {
        let lineage = lineage::read(&spec.dir)?;
        let fingerprint = Self {
            model: spec.name(),
            model_sha256: model_sha256(&spec.onnx_path)?,
            model_dtype: model_dtype(&spec.onnx_path)?,
            tokenizer_sha256: sha256_file(&spec.tokenizer_path)?,
            max_tokens: settings.max_tokens,
            truncation: settings.truncation.as_str().to_string(),
            pooling: settings.pooling.name(),
            normalize: settings.normalize,
            prefix: settings.prefix.clone(),
            dtype: "float32".to_string(),
            dim: settings.out_dim(spec),
            truncate_dim: settings.truncate_dim,
            prompt_name: String::new(),
            lineage_sha256: lineage.as_ref().map(|l| l.sha256.clone()).unwrap_or_default(),
            dense_sha256: dense_sha256(spec)?,
            prompt_unpooled: !settings.pool_prefix && !settings.prefix.is_empty(),
            vision_sha256: match &spec.image {
                Some(_) => sha256_file(&spec.dir.join(crate::model::vision::VISION_FILE))?,
                None => String::new(),
            },
            image_processor_sha256: match &spec.image {
                Some(image) => sha256_file(&spec.dir.join(&image.processor_file))?,
                None => String::new(),
            },
        };
        let dir = std::path::absolute(&spec.dir).unwrap_or_else(|_| spec.dir.clone());
        lineage::remember(
            &fingerprint.model_sha256,
            &fingerprint.lineage_sha256,
            lineage::ModelOrigin { dir, lineage },
        );
        Ok(fingerprint)
    }

    /// The settings and fingerprint that `embed.*` options give, resolved against their model.
    pub fn for_options(options: &EmbedOptions) -> Result<(CallSettings, Self)> {
        let (spec, settings, prompt_name) = Self::settings_for(options)?;
        let mut fingerprint = Self::new(&spec, &settings)?;
        fingerprint.prompt_name = prompt_name;
        fingerprint.dtype = options.vector_dtype()?.to_string();
        Ok((settings, fingerprint))
    }

    /// The model `embed.*` options name and the call settings they give, refused when the model cannot make
    /// what they ask (a pooling its Dense module does not take, a cut wider than its vectors, more tokens
    /// than its positions); and the prompt chosen by name. No file is hashed.
    pub fn settings_for(options: &EmbedOptions) -> Result<(ModelSpec, CallSettings, String)> {
        let spec = ModelSpec::load(options.model_dir())?;
        let mut settings = options.call_settings(&spec.defaults())?;
        let prompt_name = options.apply_model_prompt(&spec, &mut settings)?;
        // An image-text model pools inside its graph, and only such a model does.
        let tower = settings.pooling.modes().contains(&crate::model::PoolingMode::Tower);
        if tower != spec.image.is_some() || (tower && settings.pooling != spec.pooling) {
            return Err(Error::Option {
                key: "pooling".into(),
                value: settings.pooling.name(),
                message: match spec.image {
                    Some(_) => format!(
                        "the model {} is an image-text model, whose graph pools and projects by itself                          (pooler_output); leave embed.pooling empty",
                        spec.name()
                    ),
                    None => format!(
                        "pooler_output is an image-text model's own pooling; the model {} pools with {}",
                        spec.name(),
                        spec.pooling.name()
                    ),
                },
            });
        }
        let pooled = settings.pooling.out_dim(spec.token_dim);
        if let Some(dense) = spec.dense.first().filter(|d| d.in_features != pooled) {
            return Err(Error::Option {
                key: "pooling".into(),
                value: settings.pooling.name(),
                message: format!(
                    "gives {pooled} values, but the model {}'s Dense module ({}) takes {}; leave embed.pooling \
                     empty for the model's own ({})",
                    spec.name(),
                    dense.folder,
                    dense.in_features,
                    spec.pooling.name()
                ),
            });
        }
        let dim = spec.vector_dim(settings.pooling);
        if settings.truncate_dim > dim {
            return Err(Error::Option {
                key: "truncate_dim".into(),
                value: settings.truncate_dim.to_string(),
                message: format!(
                    "the model {} makes {dim}-dimensional vectors; cut to at most {dim}, or 0 to keep them all",
                    spec.name(),
                ),
            });
        }
        if let Some(positions) = spec.max_positions.filter(|p| settings.max_tokens > *p) {
            return Err(Error::Option {
                key: "max_tokens".into(),
                value: settings.max_tokens.to_string(),
                message: format!(
                    "the model {} takes at most {positions} tokens ({}); use at most {positions}",
                    spec.name(),
                    spec.positions_from
                ),
            });
        }
        Ok((spec, settings, prompt_name))
    }

    /// The stored form.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a fingerprint always serialises")
    }

    /// Read the stored form.
    pub fn from_json(s: &str) -> std::result::Result<Self, serde_json::Error> {
        serde_json::from_str(s)
    }

    /// Fields that differ, as (field, value in `self`, value in `other`), in field order, values as
    /// plain text. Models are compared by their files' hashes: the directory's name is a label, so a
    /// campaign can move its model to a directory of another name (or another machine). A `model_dtype`
    /// that one side lacks (a fingerprint written before it was recorded) is not a difference either:
    /// `model_sha256` already pins the file it is read from.
    pub fn differences(&self, other: &Fingerprint) -> Vec<(String, String, String)> {
        let mut this = self.clone();
        if other.model_dtype.is_empty() || self.model_dtype.is_empty() {
            this.model_dtype = other.model_dtype.clone();
        }
        if this.model_sha256 == other.model_sha256 && this.tokenizer_sha256 == other.tokenizer_sha256 {
            this.model = other.model.clone();
        }
        // The prompt's name is a label of the text in `prefix`, which is compared.
        this.prompt_name = other.prompt_name.clone();
        let (a, b) = (serde_json::to_value(&this).unwrap_or_default(), serde_json::to_value(other).unwrap_or_default());
        let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return Vec::new() };
        // Fields left out of the JSON when empty (lineage_sha256) are on one side only: compare the union.
        let empty = serde_json::Value::String(String::new());
        let keys = a.keys().chain(b.keys().filter(|k| !a.contains_key(*k)));
        keys.filter_map(|k| {
            let (x, y) = (a.get(k).unwrap_or(&empty), b.get(k).unwrap_or(&empty));
            (x != y).then(|| (k.clone(), plain_value(x), plain_value(y)))
        })
        .collect()
    }

    /// Each field and its value as [`plain_value`] writes it, in field order.
    pub fn fields(&self) -> Vec<(String, String)> {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(map)) => map.iter().map(|(k, v)| (k.clone(), plain_value(v))).collect(),
            _ => Vec::new(),
        }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A fingerprint value as a person reads it: text as typed (not a JSON string in quotes), `(empty)` for an
/// empty one, and quotes only around text with leading or trailing blanks, which would not show otherwise. A
/// line break or other control character (an instruction prompt's "\nQuery: ") is written escaped, as `\n`,
/// so that the value stays on its line.
pub fn plain_value(v: &serde_json::Value) -> String {
    match v.as_str() {
        None => v.to_string(),
        Some("") => "(empty)".into(),
        Some(s) => {
            let shown = s.escape_debug().to_string().replace("\\'", "'").replace("\\\"", "\"");
            if s.trim() != s { format!("'{shown}'") } else { shown }
        }
    }
}

/// sha256 of a file, hex. Cached by path, size and modification time.
pub fn sha256_file(path: &Path) -> Result<String> {
    cached_file_fact(path, "sha256", || {
        let mut file = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
        let mut hasher = Sha256::new();
        std::io::copy(&mut file, &mut hasher).map_err(|e| format!("cannot read: {e}"))?;
        Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
    })
}

/// The digest of a model's Dense modules (empty for none): sha256 of a line `<folder> <config.json sha256>
/// <model.safetensors sha256>` for each, in modules.json order. Their weights and settings shape every vector.
pub fn dense_sha256(spec: &ModelSpec) -> Result<String> {
    if spec.dense.is_empty() {
        return Ok(String::new());
    }
    let mut lines = String::new();
    for d in &spec.dense {
        let config = sha256_file(&spec.dir.join(&d.folder).join("config.json"))?;
        lines.push_str(&format!("{} {config} {}\n", d.folder, sha256_file(&d.weights)?));
    }
    Ok(format!("{:x}", Sha256::digest(lines.as_bytes())))
}

/// The digest of everything an ONNX model's vectors depend on: the graph file's sha256 when it holds its
/// weights (as before external data was counted, so existing fingerprints stay valid); otherwise the sha256 of
/// the lines `onnx <graph sha256>` and `<location> <sha256>` for each external data file, in name order. (A
/// model over 2 GB keeps its weights in external data: with the graph's digest alone, two models that differ
/// only in their weights had one fingerprint and could share a dataset.)
pub fn model_sha256(onnx: &Path) -> Result<String> {
    let graph = sha256_file(onnx)?;
    let weights = weights_fact(onnx)?;
    let mut files = weights.lines().skip(1).peekable();
    if files.peek().is_none() {
        return Ok(graph);
    }
    let folder = onnx.parent().unwrap_or(Path::new("."));
    let hashed = files.map(|f| Ok((f.to_string(), sha256_file(&folder.join(f))?))).collect::<Result<Vec<_>>>()?;
    Ok(model_digest(&graph, hashed))
}

/// The dominant element type of an ONNX file's weights. Cached like [`sha256_file`].
pub fn model_dtype(path: &Path) -> Result<String> {
    Ok(weights_fact(path)?.lines().next().unwrap_or_default().to_string())
}

/// What the graph's initializers say, from one read of the file per file version: the dominant weight type,
/// then each external data file, a line each.
fn weights_fact(path: &Path) -> Result<String> {
    cached_file_fact(path, "weights", || {
        let weights = read_weights(path)?;
        Ok(std::iter::once(weights.types.dominant().to_string()).chain(weights.external).collect::<Vec<_>>().join("\n"))
    })
}

/// A fact about a file, computed once per file version (path, size, modification time) per process.
/// The error names the file.
fn cached_file_fact(
    path: &Path,
    fact: &'static str,
    compute: impl FnOnce() -> std::result::Result<String, String>,
) -> Result<String> {
    type Key = (PathBuf, u64, Option<SystemTime>, &'static str);
    static CACHE: OnceLock<Mutex<HashMap<Key, String>>> = OnceLock::new();
    let err = |message: String| Error::Model {
        dir: path.parent().map(Path::to_path_buf).unwrap_or_default(),
        file: path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
        message,
        source: None,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(format!("cannot read: {e}")))?;
    let key = (path.to_path_buf(), meta.len(), meta.modified().ok(), fact);
    let cache = CACHE.get_or_init(Default::default);
    if let Some(h) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(h.clone());
    }
    let value = compute().map_err(err)?;
    cache.lock().unwrap_or_else(|e| e.into_inner()).insert(key, value.clone());
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two models that differ only in the weights their graph keeps in external data have different digests;
    /// a graph holding its own weights keeps its file's sha256, as fingerprints written before had it.
    #[test]
    fn the_model_digest_covers_external_weights() {
        let tmp = tempfile::tempdir().unwrap();
        let digest = |name: &str, weights: &[u8]| {
            let dir = tmp.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(
                dir.join("model.onnx"),
                crate::model::onnx_weights::tests::graph_with_external_data(["model.onnx_data", "more.data"]),
            )
            .unwrap();
            std::fs::write(dir.join("model.onnx_data"), weights).unwrap();
            std::fs::write(dir.join("more.data"), b"shared").unwrap();
            model_sha256(&dir.join("model.onnx")).unwrap()
        };
        let (a, b) = (digest("a", b"first weights"), digest("b", b"other weights"));
        assert_ne!(a, b);
        assert_eq!(a, digest("a2", b"first weights"), "the same files, the same digest, wherever they are");
        assert_ne!(a, sha256_file(&tmp.path().join("a/model.onnx")).unwrap());

        let dir = tmp.path().join("a");
        std::fs::write(dir.join("model.onnx"), b"").unwrap(); // a new version of the graph file
        assert!(model_sha256(&dir.join("model.onnx")).is_err(), "not an ONNX graph");
        let plain = tmp.path().join("plain.onnx");
        std::fs::write(&plain, crate::model::onnx_weights::tests::graph_with_external_data(["x", "y"])).unwrap();
        let e = model_sha256(&plain).unwrap_err().to_string();
        assert!(e.contains("cannot read"), "an external data file that is not there is named: {e}");
    }

    fn sample() -> Fingerprint {
        Fingerprint {
            model: "m".into(),
            model_sha256: "aa".into(),
            model_dtype: "int8".into(),
            tokenizer_sha256: "bb".into(),
            max_tokens: 256,
            truncation: "right".into(),
            pooling: "mean".into(),
            normalize: true,
            prefix: String::new(),
            dtype: "float32".into(),
            dim: 384,
            truncate_dim: 0,
            prompt_name: String::new(),
            lineage_sha256: String::new(),
            dense_sha256: String::new(),
            prompt_unpooled: false,
            vision_sha256: String::new(),
            image_processor_sha256: String::new(),
        }
    }

    #[test]
    fn prompts_cuts_and_precision_are_recorded_and_old_fingerprints_unchanged() {
        let json = sample().to_json();
        assert!(!json.contains("truncate_dim") && !json.contains("prompt_name"), "{json}");
        let cut = Fingerprint { truncate_dim: 128, dim: 128, dtype: "float16".into(), ..sample() };
        let mut d: Vec<String> = sample().differences(&cut).into_iter().map(|(k, _, _)| k).collect();
        d.sort();
        assert_eq!(d, ["dim", "dtype", "truncate_dim"]);
        assert_eq!(Fingerprint::from_json(&cut.to_json()).unwrap(), cut);
        // The prompt's name labels the prefix it put there: the same text by either road is one campaign.
        let named = Fingerprint { prompt_name: "query".into(), prefix: "query: ".into(), ..sample() };
        let typed = Fingerprint { prefix: "query: ".into(), ..sample() };
        assert!(named.differences(&typed).is_empty() && typed.differences(&named).is_empty());
        assert_eq!(named.differences(&sample()).len(), 1);
    }

    #[test]
    fn round_trips_and_lists_differences_in_order() {
        let a = sample();
        assert_eq!(Fingerprint::from_json(&a.to_json()).unwrap(), a);
        let b = Fingerprint { normalize: false, max_tokens: 128, ..sample() };
        let d = a.differences(&b);
        assert_eq!(
            d,
            vec![
                ("max_tokens".into(), "256".into(), "128".into()),
                ("normalize".into(), "true".into(), "false".into())
            ]
        );
        assert!(a.differences(&a).is_empty());
        // The model directory's name is a label: the same files under another name are the same model.
        let moved = Fingerprint { model: "my-copy-of-minilm".into(), ..sample() };
        assert!(a.differences(&moved).is_empty());
        let other = Fingerprint { model: "other".into(), model_sha256: "dd".into(), prefix: "q: ".into(), ..sample() };
        let d = a.differences(&other);
        assert_eq!(d[0], ("model".into(), a.model.clone(), "other".into()));
        assert_eq!(d.last().unwrap(), &("prefix".into(), "(empty)".into(), "'q: '".into()));
        // An instruction prompt's line break stays on the value's line.
        let v = serde_json::Value::from("Instruct: find it\nQuery: ");
        assert_eq!(plain_value(&v), "'Instruct: find it\\nQuery: '");
        assert_eq!(plain_value(&serde_json::Value::from("it's \"quoted\"")), "it's \"quoted\"");
        // A fingerprint from before model_dtype was recorded still matches on everything else.
        let old = Fingerprint::from_json(&a.to_json().replace(r#""model_dtype":"int8","#, "")).unwrap();
        assert_eq!(old.model_dtype, "");
        assert!(old.differences(&a).is_empty() && a.differences(&old).is_empty());
        assert_eq!(old.differences(&Fingerprint { model_sha256: "cc".into(), ..a.clone() }).len(), 1);
        // Without lineage the JSON has no lineage_sha256 (fingerprints stored before it read the same);
        // with one, the same model file under another lineage is another fingerprint.
        assert!(!a.to_json().contains("lineage_sha256"));
        let traced = Fingerprint { lineage_sha256: "ee".into(), ..sample() };
        assert_eq!(Fingerprint::from_json(&traced.to_json()).unwrap(), traced);
        assert_eq!(a.differences(&traced), vec![("lineage_sha256".into(), "(empty)".into(), "ee".into())]);
    }

    #[test]
    fn hashes_files() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        std::fs::write(&p, "abc").unwrap();
        assert_eq!(sha256_file(&p).unwrap(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    }
}

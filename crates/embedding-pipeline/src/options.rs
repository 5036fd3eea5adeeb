//! `embed.*` session options: a DataFusion config extension, set with `SET embed.<key> = …`
//! and read by the `embed` function when it executes.

use std::path::PathBuf;

use datafusion::common::config::{ConfigEntry, ConfigExtension, ConfigField, ConfigOptions, ExtensionOptions};
use datafusion::common::extensions_options;
use datafusion::error::DataFusionError;

use crate::error::{Error, Result};
use crate::model::spec::ModelDefaults;
use crate::model::{CallSettings, Device, Embedder, Order, Placement, Pooling, TruncationSide, registry};

extensions_options! {
    /// Options of an embedding campaign. Every key is settable from SQL as `SET embed.<key> = <value>`.
    pub struct EmbedOptions {
        /// Sentence-transformers model directory (tokenizer.json, modules.json, 1_Pooling/, onnx/model.onnx).
        pub model: String, default = DEFAULT_MODEL.to_string()
        /// Most tokens per text, special tokens included. 0 uses the model's `max_seq_length`.
        pub max_tokens: usize, default = 0
        /// What happens to an over-long text: 'right' cuts its end, 'left' its start, 'error' fails the
        /// query and names the row. Empty: the model's own (`truncation_side` in its tokenizer_config.json,
        /// else right).
        pub truncation: String, default = String::new()
        /// Text put before every input, for models trained with one (e5: 'passage: ').
        pub prefix: String, default = String::new()
        /// The model's prompt to put before every input (`prompts` in config_sentence_transformers.json):
        /// '' its `default_prompt_name` (none when it has none), 'none' no prompt, or a name ('query').
        pub prompt_name: String, default = String::new()
        /// Keep the first this many dimensions of each vector, then normalise (Matryoshka models). 0 keeps all.
        pub truncate_dim: usize, default = 0
        /// Element type of the vectors: 'float32', or 'float16' (half the storage; Lance keeps it as is).
        pub precision: String, default = "float32".to_string()
        /// Tag the version a write ends on with this name (empty: no tag).
        pub tag: String, default = String::new()
        /// The id column: present, non-NULL and unique in a campaign's input; the key that resume uses.
        pub id_column: String, default = "id".to_string()
        /// A Lance write commits a new version every this many rows...
        pub commit_rows: usize, default = 50_000
        /// ...or every this many seconds...
        pub commit_seconds: u64, default = 120
        /// ...or when the rows it holds reach this many bytes, whichever comes first.
        pub commit_bytes: usize, default = 64 * 1024 * 1024
        /// Start the output over: embed every row and make the first commit replace the dataset's rows
        /// (a new version; the older versions stay readable). Set by `pipeline run --restart`.
        pub restart: bool, default = false
        /// What a blank text (empty, or only whitespace or zero-width characters) gets: 'embed' gives it the
        /// vector of no text (one and the same for all; the run counts them and warns), 'error' fails the query
        /// and names the row.
        pub blank_texts: String, default = "embed".to_string()
        /// Let a COPY into a file format (Parquet, CSV, JSON, Arrow) replace an existing file, or write into a
        /// folder that holds files; off, such a COPY is refused before it runs. (Lance outputs are appended to,
        /// never replaced: see `restart`.)
        pub overwrite: bool, default = false
        /// Pooling override: 'mean', 'cls', 'max', 'mean_sqrt_len_tokens', 'weightedmean', 'lasttoken', or
        /// several joined by '+' (concatenated). Empty uses the model's 1_Pooling/config.json.
        pub pooling: String, default = String::new()
        /// Normalisation override: 'true' or 'false'. Empty uses the model's modules.json.
        pub normalize: String, default = String::new()
        /// 'length' orders rows by token count ahead of embed() (less padding); 'original' keeps the input
        /// order in fixed batches of 32 rows, as a baseline.
        pub order: String, default = "length".to_string()
        /// Rows ordered together (fewer when they reach 64 MiB or the session's memory limit). 0 orders
        /// the whole input with DataFusion's sort, which spills to disk beyond datafusion.runtime.memory_limit.
        pub order_window: usize, default = 65_536
        /// Deprecated, and ignored: the ordering's memory is the session's, `datafusion.runtime.memory_limit`.
        pub order_memory: usize, default = 64 * 1024 * 1024
        /// Most padded tokens (rows x padded length) in one model call.
        pub batch_tokens: usize, default = 2048
        /// Most rows in one model call.
        pub max_batch_rows: usize, default = 256
        /// Where the model runs: 'cpu', 'cuda' (GPU 0), 'cuda:N', or 'cuda:N,M,…' (one session per GPU at
        /// least, sharing the batches).
        pub device: String, default = "cpu".to_string()
        /// ONNX Runtime sessions per device, which take batches from one queue, so that one session's host
        /// work (building inputs, copying, pooling) overlaps another's model run. 0: 1 on the CPU, 2 per GPU.
        pub sessions_per_device: usize, default = 0
        /// On a GPU, let nodes the CUDA provider cannot run fall back to the CPU (off: such a model is refused).
        pub allow_cpu_fallback: bool, default = false
        /// ONNX Runtime intra-op threads. 0 uses one per available core.
        pub intra_threads: usize, default = 0
        /// Images (`embed_image`): most images in one model call.
        pub batch_images: usize, default = 32
        /// Images: what a bad image (empty, unreadable, not an image, broken, over `max_image_pixels`) gets:
        /// 'error' stops the query naming its id; 'skip' writes no row for it, counts it and lists its id (with
        /// why) in the run record, so a rerun tries it again.
        pub bad_images: String, default = "error".to_string()
        /// Images: where `embed_image` reads relative paths from: a folder, or an object store prefix such as
        /// 's3://bucket/photos/'. Empty: the current directory. Absolute paths and `s3://` URIs are read as they are.
        pub image_base: String, default = String::new()
        /// Images: the most pixels an image may have (width x height, read from its header before it is decoded);
        /// a larger one is refused by its id, as a decompression bomb. The default is Pillow's own limit.
        pub max_image_pixels: u64, default = crate::model::image::DEFAULT_MAX_PIXELS
        /// The memory a run may use (e.g. '8GiB'), as `pipeline probe` assumed it: the run records its peak
        /// and warns when it comes within 10%. Empty: none assumed.
        pub memory_budget: String, default = String::new()
    }
}

/// [`EmbedOptions`] as the session holds them: `SET embed.<key> = …` goes through here, which refuses an
/// unknown key (listing the valid ones) or an unusable value (naming the key) at the `SET` itself, so a
/// mistake is never found first by the `COPY` an hour later.
#[derive(Debug, Clone, Default)]
pub(crate) struct EmbedConfig(pub(crate) EmbedOptions);

impl ConfigExtension for EmbedConfig {
    const PREFIX: &'static str = "embed";
}

impl ExtensionOptions for EmbedConfig {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> datafusion::error::Result<()> {
        let external = |e: Error| DataFusionError::External(Box::new(e));
        let defaults = EmbedOptions::default().entries();
        let Some(default) = defaults.iter().find(|e| e.key == key) else {
            return Err(external(unknown_key(key, &defaults)));
        };
        let value = if is_bool(default) || key == "normalize" { spell_bool(value) } else { value.to_string() };
        let mut next = self.0.clone();
        ConfigField::set(&mut next, key, &value).map_err(|_| external(bad(key, &value, expected(default))))?;
        next.check(key).map_err(external)?;
        // Warned only when set to another value: a cluster's processes are handed every key, defaults included.
        if key == "order_memory" && value != default.value.clone().unwrap_or_default() {
            tracing::warn!("{ORDER_MEMORY_DEPRECATED}");
        }
        self.0 = next;
        Ok(())
    }

    /// Keyed `embed.<key>`, as `SET` names them: DataFusion lists an extension's entries under exactly these
    /// keys (in `SHOW ALL` and `information_schema.df_settings`) and adds no prefix of its own.
    fn entries(&self) -> Vec<ConfigEntry> {
        self.0
            .entries()
            .into_iter()
            .map(|mut e| {
                e.key = format!("{}.{}", Self::PREFIX, e.key);
                e
            })
            .collect()
    }
}

fn is_bool(entry: &ConfigEntry) -> bool {
    matches!(entry.value.as_deref(), Some("true" | "false"))
}

/// What a key's values look like, from its default.
/// What a key takes, for a value that is not even of its type (`SET embed.batch_tokens = -1`): the same range
/// [`EmbedOptions::check`] holds a value of the right type to.
fn expected(default: &ConfigEntry) -> &'static str {
    let key = default.key.as_str();
    match default.value.as_deref() {
        _ if is_bool(default) => "use 'true' or 'false'",
        _ if POSITIVE.contains(&key) => "use a whole number, 1 or more",
        _ if key == "max_tokens" => "use 0 (the model's max_seq_length) or a whole number of at least 2",
        _ if key == "sessions_per_device" => "use 0 (automatic) or 1 to 16",
        Some(v) if v.parse::<u64>().is_ok() => "use a whole number, 0 or more",
        _ => "not a usable value",
    }
}

/// What `embed.pooling` takes.
const POOLING_HELP: &str = "use 'mean', 'cls', 'max', 'mean_sqrt_len_tokens', 'weightedmean' or 'lasttoken', several \
                            joined by '+', or '' for the model's own";

/// The whole-number keys that must be at least 1.
const POSITIVE: [&str; 6] =
    ["commit_rows", "commit_seconds", "commit_bytes", "order_memory", "batch_tokens", "max_batch_rows"];

/// 'on', 'yes', '1' (any case) as 'true'; 'off', 'no', '0' as 'false'; anything else as it is.
fn spell_bool(value: &str) -> String {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "yes" | "1" => "true".into(),
        "false" | "off" | "no" | "0" => "false".into(),
        _ => value.to_string(),
    }
}

fn unknown_key(key: &str, known: &[ConfigEntry]) -> Error {
    let closest = known
        .iter()
        .map(|e| (strsim::damerau_levenshtein(key, &e.key), &e.key))
        .min()
        .filter(|(distance, _)| *distance <= 2)
        .map(|(_, k)| format!(" Did you mean embed.{k}?"))
        .unwrap_or_default();
    let all = known.iter().map(|e| e.key.as_str()).collect::<Vec<_>>().join(", ");
    Error::UnknownOption { key: key.to_string(), message: format!("the embed.* options are {all}.{closest}") }
}

/// What `SET embed.order_memory` is told.
pub const ORDER_MEMORY_DEPRECATED: &str = "embed.order_memory is deprecated and has no effect: the ordering holds \
     its rows against the session's memory pool. Use SET datafusion.runtime.memory_limit = '4G' (for example): \
     embed.order_window = 0 then spills its sort to disk beyond it, and a window is passed on early at it";

/// `embed.model`'s default: where `scripts/setup` puts the default model in the repository. Outside the
/// repository, the copy setup also puts in the install home is used (see [`EmbedOptions::model_dir`]).
pub const DEFAULT_MODEL: &str = "models/all-MiniLM-L6-v2";

/// The default model on a GPU, when `embed.model` is left at [`DEFAULT_MODEL`]: the float16 export that
/// `scripts/setup --gpu` makes. The int8 default's quantisation nodes have no CUDA kernels, so the placement
/// check refuses it there.
pub const DEFAULT_GPU_MODEL: &str = "models/all-MiniLM-L6-v2-fp16";

impl EmbedOptions {
    /// The `embed.*` options of a session's configuration (the defaults when it has none).
    pub fn from_config(config: &ConfigOptions) -> Self {
        config.extensions.get::<EmbedConfig>().map(|c| c.0.clone()).unwrap_or_default()
    }

    /// Refuse an unusable value of `key` (without the `embed.` prefix), as `SET` does.
    pub fn check(&self, key: &str) -> Result<()> {
        let positive = |v: u64| if v == 0 { Err(bad(key, v, "use a whole number, 1 or more")) } else { Ok(()) };
        match key {
            "model" if self.model.trim().is_empty() => Err(bad(key, &self.model, "name a model directory")),
            "id_column" if self.id_column.is_empty() => Err(bad(key, "", "name the id column")),
            "max_tokens" if self.max_tokens == 1 => Err(bad(
                key,
                1,
                "use 0 (the model's max_seq_length) or a whole number of at least 2 (room for the special tokens)",
            )),
            "truncation" if !self.truncation.is_empty() => TruncationSide::parse(&self.truncation)
                .map(|_| ())
                .ok_or_else(|| bad(key, &self.truncation, "use 'right', 'left' or 'error', or '' for the model's own")),
            "pooling" if !self.pooling.is_empty() => {
                Pooling::parse(&self.pooling).map(|_| ()).ok_or_else(|| bad(key, &self.pooling, POOLING_HELP))
            }
            "normalize" => self.normalize_override().map(|_| ()),
            "precision" => self.vector_dtype().map(|_| ()),
            "blank_texts" => self.refuse_blank().map(|_| ()),
            "bad_images" => self.skip_bad_images().map(|_| ()),
            "order" => self.resolved_order().map(|_| ()),
            "commit_rows" => positive(self.commit_rows as u64),
            "commit_seconds" => positive(self.commit_seconds),
            "commit_bytes" => positive(self.commit_bytes as u64),
            "order_memory" => positive(self.order_memory as u64),
            "batch_tokens" => positive(self.batch_tokens as u64),
            "max_batch_rows" => positive(self.max_batch_rows as u64),
            "batch_images" => positive(self.batch_images as u64),
            "max_image_pixels" => positive(self.max_image_pixels),
            "image_base" if !crate::uri::is_supported(&self.image_base) => {
                Err(bad(key, &self.image_base, "use a folder, or an s3:// prefix such as 's3://bucket/photos/'"))
            }
            "device" => self.resolved_device().map(|_| ()),
            "memory_budget" if !self.memory_budget.is_empty() => self.memory_budget_bytes().map(|_| ()),
            "sessions_per_device" if self.sessions_per_device > 16 => {
                Err(bad(key, self.sessions_per_device, "use 0 (automatic) or 1 to 16"))
            }
            _ => Ok(()),
        }
    }

    /// Every key checked as [`Self::check`] checks one.
    pub fn check_all(&self) -> Result<()> {
        self.entries().iter().try_for_each(|e| self.check(&e.key))
    }

    /// `memory_budget` in bytes, if one is set.
    pub fn memory_budget_bytes(&self) -> Result<Option<u64>> {
        if self.memory_budget.trim().is_empty() {
            return Ok(None);
        }
        crate::process::memory::parse_size(&self.memory_budget)
            .map(Some)
            .map_err(|e| bad("memory_budget", &self.memory_budget, &e))
    }

    fn normalize_override(&self) -> Result<Option<bool>> {
        match spell_bool(&self.normalize).as_str() {
            "" => Ok(None),
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            _ => Err(bad("normalize", &self.normalize, "use 'true' or 'false', or '' for the model's own")),
        }
    }

    fn resolved_order(&self) -> Result<Order> {
        match self.order.to_ascii_lowercase().as_str() {
            "length" => Ok(Order::Length),
            "original" => Ok(Order::Original),
            _ => Err(bad("order", &self.order, "use 'length' or 'original'")),
        }
    }

    /// The model directory to load: `embed.model`, except for the default. On a CUDA device the default is
    /// [`DEFAULT_GPU_MODEL`]. When the working directory has no such folder, the copy `scripts/setup`
    /// installed in the install home (`$EMBED_PIPELINE_HOME`, by default `~/.local/share/embedding-pipeline`)
    /// is used, so that a job runs from any directory.
    pub fn model_dir(&self) -> PathBuf {
        if self.model != DEFAULT_MODEL {
            return PathBuf::from(&self.model);
        }
        let default = if self.uses_gpu_default() { DEFAULT_GPU_MODEL } else { DEFAULT_MODEL };
        let given = PathBuf::from(default);
        if !given.is_dir()
            && let Some(home) = crate::model::runtime::install_home().map(|h| h.join(default))
            && home.is_dir()
        {
            return home;
        }
        given
    }

    /// Whether the model is the GPU's default ([`DEFAULT_GPU_MODEL`]): `embed.model` left at its default
    /// and a CUDA device.
    pub fn uses_gpu_default(&self) -> bool {
        self.model == DEFAULT_MODEL && matches!(Device::parse(&self.device), Some(Device::Cuda(_)))
    }

    /// These options with another model directory.
    pub fn with_model(mut self, dir: impl Into<String>) -> Self {
        self.model = dir.into();
        self
    }

    /// Resolve overrides against the model defaults, rejecting values that cannot be used.
    pub fn call_settings(&self, model: &ModelDefaults) -> Result<CallSettings> {
        let max_tokens = match self.max_tokens {
            0 => model.max_tokens,
            n => {
                self.check("max_tokens")?;
                n
            }
        };
        let truncation = match self.truncation.as_str() {
            "" => model.truncation,
            t => TruncationSide::parse(t).ok_or_else(|| bad("truncation", t, "use 'right', 'left' or 'error'"))?,
        };
        let pooling = match self.pooling.as_str() {
            "" => model.pooling,
            p => Pooling::parse(p).ok_or_else(|| bad("pooling", p, POOLING_HELP))?,
        };
        let normalize = self.normalize_override()?.unwrap_or(model.normalize);
        self.check("batch_tokens")?;
        self.check("max_batch_rows")?;
        let order = self.resolved_order()?;
        Ok(CallSettings {
            order,
            max_tokens,
            truncation,
            pooling,
            normalize,
            batch_tokens: self.batch_tokens,
            max_batch_rows: self.max_batch_rows,
            pool_prefix: true,
            prefix: self.prefix.clone(),
            truncate_dim: self.truncate_dim,
            refuse_blank: self.refuse_blank()?,
        })
    }

    /// Whether `embed.bad_images` skips bad images (else a bad image stops the query).
    pub fn skip_bad_images(&self) -> Result<bool> {
        match self.bad_images.to_ascii_lowercase().as_str() {
            "error" => Ok(false),
            "skip" => Ok(true),
            _ => Err(bad("bad_images", &self.bad_images, "use 'error' or 'skip'")),
        }
    }

    /// Whether `embed.blank_texts` refuses blank texts.
    fn refuse_blank(&self) -> Result<bool> {
        match self.blank_texts.to_ascii_lowercase().as_str() {
            "embed" => Ok(false),
            "error" => Ok(true),
            _ => Err(bad("blank_texts", &self.blank_texts, "use 'embed' or 'error'")),
        }
    }

    /// The vectors' element type, from `embed.precision`.
    pub fn vector_dtype(&self) -> Result<&'static str> {
        match self.precision.to_ascii_lowercase().as_str() {
            "float32" | "fp32" => Ok("float32"),
            "float16" | "fp16" | "half" => Ok("float16"),
            _ => Err(bad("precision", &self.precision, "use 'float32' or 'float16'")),
        }
    }

    /// Put the model's prompt (`embed.prompt_name`, else its default) into `settings.prefix`, and return its
    /// name (empty when none applies). `embed.prefix` alone stays when no prompt applies; both at once are
    /// refused unless they are the same text.
    pub fn apply_model_prompt(&self, spec: &crate::model::ModelSpec, settings: &mut CallSettings) -> Result<String> {
        // Whatever puts text before each input (the model's prompt or embed.prefix, which is how a prompt is
        // given by hand), the model's Pooling config says whether its tokens are pooled.
        settings.pool_prefix = spec.include_prompt;
        let (name, text) = spec.prompt(&self.prompt_name).map_err(|m| bad("prompt_name", &self.prompt_name, &m))?;
        if text.is_empty() {
            return Ok(String::new());
        }
        if !settings.prefix.is_empty() && settings.prefix != text {
            return Err(bad(
                "prefix",
                &settings.prefix,
                &format!(
                    "the model's prompt '{name}' ({text:?}) already goes before each input; leave embed.prefix \
                     empty, or SET embed.prompt_name = 'none' to use embed.prefix alone"
                ),
            ));
        }
        settings.prefix = text;
        Ok(name)
    }

    /// The device these options ask for.
    pub fn resolved_device(&self) -> Result<Device> {
        Device::parse(&self.device)
            .ok_or_else(|| bad("device", &self.device, "use 'cpu', 'cuda', 'cuda:N' or 'cuda:N,M,…' (each GPU once)"))
    }

    /// Intra-op threads to give ONNX Runtime: the option, or one per available core.
    pub fn resolved_intra_threads(&self) -> usize {
        match self.intra_threads {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            n => n,
        }
    }

    /// Where and how the model runs: device, sessions, threads, fallback.
    pub fn placement(&self) -> Result<Placement> {
        let device = self.resolved_device()?;
        let sessions_per_device = match (self.sessions_per_device, &device) {
            (0, Device::Cpu) => 1,
            (0, Device::Cuda(_)) => {
                crate::model::device::auto_sessions_per_gpu(crate::model::spec::weight_file_bytes(&self.model_dir()))
            }
            (n, _) if n > 16 => return Err(bad("sessions_per_device", n, "use 0 (automatic) or 1 to 16")),
            (n, _) => n,
        };
        Ok(Placement {
            device,
            sessions_per_device,
            intra_threads: self.resolved_intra_threads(),
            allow_cpu_fallback: self.allow_cpu_fallback,
        })
    }

    /// The process's shared embedder for the model and placement these options name, loaded on first use.
    pub fn embedder(&self) -> Result<std::sync::Arc<Embedder>> {
        registry::get_or_load(&self.model_dir(), self.placement()?)
    }

    /// The shared vision tower of the image-text model these options name, loaded on first use.
    pub fn vision_embedder(&self) -> Result<std::sync::Arc<crate::model::vision::VisionEmbedder>> {
        crate::model::vision::get_or_load(&self.model_dir(), self.placement()?)
    }
}

fn bad(key: &str, value: impl ToString, message: &str) -> Error {
    Error::Option { key: key.to_string(), value: value.to_string(), message: message.to_string() }
}

/// Where the options' reference page is kept, from the repository's root.
pub const OPTIONS_PAGE: &str = "docs/reference/options.md";

impl EmbedOptions {
    /// The `embed.*` options as a Markdown page: each key, its default and what it does, from these definitions
    /// ([`OPTIONS_PAGE`], which a test keeps equal to it).
    pub fn reference_page() -> String {
        let mut page = String::from(
            "# `embed.*` options\n\nWhat a job or a session sets with `SET embed.<key> = <value>;` (or `pipeline run \
             --set key=value`). Generated from `EmbedOptions` by `scripts/reference`; a test fails when this page is not \
             what the code defines, so do not edit it by hand. The commands are in [commands.md](commands.md).\n\n\
             | option | default | what it does |\n|---|---|---|\n",
        );
        for e in Self::default().entries() {
            let default = match e.value.as_deref() {
                None | Some("") => "(empty)".to_string(),
                Some(v) => format!("`{v}`"),
            };
            let what = e.description.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|");
            page.push_str(&format!("| `embed.{}` | {default} | {what} |\n", e.key));
        }
        page
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The options' page is what the definitions say (`PIPELINE_WRITE_REFERENCE=1` writes it: `scripts/reference`).
    #[test]
    fn the_options_reference_is_what_the_options_define() {
        let page = EmbedOptions::reference_page();
        assert!(
            page.contains("| `embed.batch_images` | `32` |") && page.contains("| `embed.model` | `models/"),
            "{page}"
        );
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(OPTIONS_PAGE);
        if std::env::var_os("PIPELINE_WRITE_REFERENCE").is_some() {
            std::fs::write(&path, &page).unwrap();
        }
        let kept = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            kept == page,
            "{OPTIONS_PAGE} is not what the options define: run scripts/reference and commit the page"
        );
        // An option added without writing the page again is caught.
        let added = format!("{page}| `embed.new_option` | `1` | Something new. |\n");
        assert_ne!(kept, added);
    }

    #[test]
    fn a_gpu_takes_the_float16_default_unless_a_model_is_set() {
        let cuda = EmbedOptions { device: "cuda:1".into(), ..Default::default() };
        assert!(cuda.uses_gpu_default());
        assert!(EmbedOptions { device: "CUDA".into(), ..Default::default() }.uses_gpu_default());
        assert!(cuda.model_dir().ends_with(DEFAULT_GPU_MODEL), "{}", cuda.model_dir().display());
        let cpu = EmbedOptions::default();
        assert!(!cpu.uses_gpu_default() && cpu.model_dir().ends_with(DEFAULT_MODEL));
        let chosen = EmbedOptions { device: "cuda".into(), ..Default::default() }.with_model("my/model");
        assert!(!chosen.uses_gpu_default());
        assert_eq!(chosen.model_dir(), PathBuf::from("my/model"));
    }

    /// Left automatic, a GPU gets two sessions of a small model and one of a model past 4 GiB on disk (its
    /// external data counted: a sparse file here), since each session holds its own copy of the weights; a set
    /// number is kept, and the CPU gets one.
    #[test]
    fn a_gpu_gets_one_session_of_a_large_model() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("onnx")).unwrap();
        std::fs::write(dir.path().join("onnx/model.onnx"), b"graph").unwrap();
        let on = |device: &str, n: usize| {
            let o = EmbedOptions { device: device.into(), sessions_per_device: n, ..Default::default() };
            o.with_model(dir.path().display().to_string()).placement().unwrap().sessions_per_device
        };
        assert_eq!((on("cuda", 0), on("cpu", 0)), (2, 1));
        let data = std::fs::File::create(dir.path().join("onnx/model.onnx_data")).unwrap();
        data.set_len(5 << 30).unwrap();
        assert_eq!(crate::model::spec::weight_file_bytes(dir.path()), (5 << 30) + 5);
        assert_eq!((on("cuda:0", 0), on("cuda", 2), on("cpu", 0)), (1, 2, 1));
    }

    fn model(truncation: TruncationSide) -> ModelDefaults {
        ModelDefaults { max_tokens: 256, pooling: Pooling::MEAN, normalize: true, truncation }
    }

    #[test]
    fn defaults_follow_the_model() {
        let s = EmbedOptions::default().call_settings(&model(TruncationSide::Right)).unwrap();
        assert_eq!(s.max_tokens, 256);
        assert_eq!(s.pooling, Pooling::MEAN);
        assert!(s.normalize);
        assert_eq!(s.truncation, TruncationSide::Right);
        let s = EmbedOptions::default().call_settings(&model(TruncationSide::Left)).unwrap();
        assert_eq!(s.truncation, TruncationSide::Left, "the tokenizer's truncation_side");
    }

    #[test]
    fn overrides_apply() {
        let o = EmbedOptions {
            max_tokens: 16,
            pooling: "cls".into(),
            normalize: "false".into(),
            truncation: "left".into(),
            ..Default::default()
        };
        let s = o.call_settings(&model(TruncationSide::Right)).unwrap();
        assert_eq!(
            (s.max_tokens, s.pooling, s.normalize, s.truncation),
            (16, Pooling::CLS, false, TruncationSide::Left)
        );
        let o = EmbedOptions { pooling: "mean+weightedmean".into(), truncation: "right".into(), ..Default::default() };
        let s = o.call_settings(&model(TruncationSide::Left)).unwrap();
        assert_eq!((s.pooling.name(), s.truncation), ("mean+weightedmean".into(), TruncationSide::Right));
    }

    #[test]
    fn bad_values_name_the_key() {
        for (o, key) in [
            (EmbedOptions { pooling: "median".into(), ..Default::default() }, "embed.pooling"),
            (EmbedOptions { normalize: "maybe".into(), ..Default::default() }, "embed.normalize"),
            (EmbedOptions { truncation: "middle".into(), ..Default::default() }, "embed.truncation"),
            (EmbedOptions { max_tokens: 1, ..Default::default() }, "embed.max_tokens"),
            (EmbedOptions { batch_tokens: 0, ..Default::default() }, "embed.batch_tokens"),
            (EmbedOptions { order: "random".into(), ..Default::default() }, "embed.order"),
        ] {
            let err = o.call_settings(&model(TruncationSide::Right)).unwrap_err().to_string();
            assert!(err.contains(key), "{err}");
        }
    }
}

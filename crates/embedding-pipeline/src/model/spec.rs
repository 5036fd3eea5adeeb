//! Reading a sentence-transformers model directory: which files hold the tokenizer, the ONNX graph,
//! the pooling mode, the normalisation step and the sequence limit, checked against each other.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::st_files::{Module, read_json, read_tokenizer_config};
use crate::error::{Error, Result};
use crate::model::pooling::PoolingMode;
use crate::model::{Pooling, TruncationSide};

/// What a sentence-transformers directory says about its model. Loading it reads only small JSON
/// files, so it is cheap enough to do while a query is planned.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    /// The directory as given.
    pub dir: PathBuf,
    /// The ONNX graph: `onnx/model.onnx`, or `model.onnx` at the top of the directory.
    pub onnx_path: PathBuf,
    /// `tokenizer.json`.
    pub tokenizer_path: PathBuf,
    /// `max_seq_length` from `sentence_bert_config.json`.
    pub max_seq_length: usize,
    /// The pooling modes from the Pooling module's `config.json`.
    pub pooling: Pooling,
    /// The Dense modules after the pooling, in modules.json order: each a linear projection and activation.
    pub dense: Vec<DenseSpec>,
    /// Whether modules.json ends in a Normalize module.
    pub normalize: bool,
    /// The token states' dimension (`word_embedding_dimension`, the transformer's hidden size).
    pub token_dim: usize,
    /// The vectors' dimension: the pooled vector's (the token dimension times the pooling modes), or the
    /// last Dense module's `out_features`.
    pub dim: usize,
    /// `truncation_side` in tokenizer_config.json: which end of an over-long text the model's tokenizer cuts
    /// (right when it says none).
    pub truncation_side: TruncationSide,
    /// Padding token id (`pad_token_id` in config.json, 0 when absent).
    pub pad_id: u32,
    /// Rows of the model's token embedding table (`vocab_size` in config.json), when it says.
    pub vocab_size: Option<usize>,
    /// The most tokens a text can have, from the positions the model has embeddings for (see
    /// [`usable_positions`]), when config.json says; with where the number comes from, in words.
    pub max_positions: Option<usize>,
    pub positions_from: String,
    /// Named prompts (`prompts` in `config_sentence_transformers.json`): text put before an input, e5-, bge- and
    /// nomic-style (`{"query": "query: ", "document": "passage: "}`).
    pub prompts: BTreeMap<String, String>,
    /// The prompt sentence-transformers applies when none is named (`default_prompt_name`), if any.
    pub default_prompt_name: Option<String>,
    /// Whether the pooling takes in a prompt's tokens (`include_prompt` in the Pooling config; true unless it
    /// says false, which this pipeline does not support with a prompt).
    pub include_prompt: bool,
    /// An image-text model's vision side (CLIP, SigLIP); None for a text model.
    pub image: Option<super::image_spec::ImageSpec>,
}

/// `1_Pooling/config.json`, as sentence-transformers up to 5 writes it (`word_embedding_dimension` and one
/// `pooling_mode_*` flag) or as 6 does (`embedding_dimension` and `pooling_mode: "mean"`).
#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(alias = "embedding_dimension")]
    word_embedding_dimension: usize,
    #[serde(default)]
    pooling_mode: Option<OneOrMany>,
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
    #[serde(default = "included")]
    include_prompt: bool,
}

fn included() -> bool {
    true
}

/// `pooling_mode`: one mode's name, or a list of them (concatenated).
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A Dense module: `nn.Linear(in_features, out_features, bias)` then an activation, as sentence-transformers'
/// Dense computes it, with its weights in the module folder's `model.safetensors`.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseSpec {
    /// The module's folder within the model directory (`2_Dense`).
    pub folder: String,
    pub in_features: usize,
    pub out_features: usize,
    pub bias: bool,
    pub activation: Activation,
    /// Adds the input back to the output (`use_residual`), through a projection when the sizes differ.
    pub residual: bool,
    /// `model.safetensors` in the folder.
    pub weights: PathBuf,
}

/// The activation functions a Dense module can name (`torch.nn.<Name>`) that this pipeline computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Identity,
    Tanh,
    Relu,
    Sigmoid,
    /// The exact GELU (erf), torch's default.
    Gelu,
    /// SiLU (swish).
    Silu,
}

impl Activation {
    /// From a Dense config's `activation_function`: a torch class path, e.g.
    /// `torch.nn.modules.activation.Tanh`. Absent is sentence-transformers' default, Tanh.
    fn parse(path: Option<&str>) -> Option<Self> {
        let Some(path) = path else { return Some(Self::Tanh) };
        if !path.starts_with("torch.") {
            return None;
        }
        match path.rsplit('.').next()? {
            "Identity" => Some(Self::Identity),
            "Tanh" => Some(Self::Tanh),
            "ReLU" => Some(Self::Relu),
            "Sigmoid" => Some(Self::Sigmoid),
            "GELU" => Some(Self::Gelu),
            "SiLU" => Some(Self::Silu),
            _ => None,
        }
    }

    /// torch's name for it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Identity => "Identity",
            Self::Tanh => "Tanh",
            Self::Relu => "ReLU",
            Self::Sigmoid => "Sigmoid",
            Self::Gelu => "GELU",
            Self::Silu => "SiLU",
        }
    }
}

/// A Dense module's `config.json`.
#[derive(Deserialize)]
struct DenseConfig {
    in_features: usize,
    out_features: usize,
    #[serde(default = "included")]
    bias: bool,
    #[serde(default)]
    activation_function: Option<String>,
    #[serde(default)]
    module_input_name: Option<String>,
    #[serde(default)]
    module_output_name: Option<String>,
    #[serde(default)]
    use_residual: bool,
}

/// `config_sentence_transformers.json`: the parts of it that change a vector.
#[derive(Deserialize, Default)]
struct StConfig {
    #[serde(default)]
    prompts: BTreeMap<String, String>,
    #[serde(default)]
    default_prompt_name: Option<String>,
    /// Vectors cut to their first `truncate_dim` values: not applied here, so refused.
    #[serde(default)]
    truncate_dim: Option<usize>,
    /// sentence-transformers 5 and later: which of its model classes saved the directory (`SentenceTransformer`,
    /// the default; `CrossEncoder`, `SparseEncoder`, `MultiVectorEncoder`).
    #[serde(default)]
    model_type: Option<String>,
}

/// config_sentence_transformers.json, or its defaults when there is none; a directory another of
/// sentence-transformers' model classes saved (a reranker, a sparse or a multi-vector encoder) is refused as such,
/// before its module chain is read (issue 54: a CrossEncoder was refused as having "no Pooling module").
fn read_st_config(dir: &Path) -> Result<StConfig> {
    let st: StConfig = match dir.join(ST_CONFIG).is_file() {
        true => read_json(dir, ST_CONFIG)?,
        false => StConfig::default(),
    };
    let what = match st.model_type.as_deref() {
        None | Some("SentenceTransformer") => return Ok(st),
        Some("CrossEncoder") => "a CrossEncoder: a reranker, which scores pairs of texts and makes no embeddings",
        Some("SparseEncoder") => {
            "a SparseEncoder: it makes sparse vectors (SPLADE's kind), which this pipeline does not"
        }
        Some("MultiVectorEncoder") => {
            "a MultiVectorEncoder: it makes one vector per token (ColBERT's kind), which this pipeline does not"
        }
        Some(_) => "not a SentenceTransformer, the one kind of sentence-transformers model this pipeline runs",
    };
    Err(Error::model(
        dir,
        ST_CONFIG,
        format!(
            "model_type {:?} says this is {what}; use a SentenceTransformer (embedding) model",
            st.model_type.as_deref().unwrap_or_default()
        ),
    ))
}

#[derive(Deserialize)]
struct SbertConfig {
    max_seq_length: Option<usize>,
    /// sentence-transformers lowercases every text (Python's `str.lower`) before the tokenizer when set.
    #[serde(default)]
    do_lower_case: bool,
    /// sentence-transformers 6: arguments it passes to the tokenizer, per modality
    /// (`{"text": {"add_special_tokens": false}}`).
    #[serde(default)]
    processing_kwargs: serde_json::Map<String, serde_json::Value>,
    /// sentence-transformers 6: the transformers class the Transformer module loads (`feature-extraction`, the
    /// default, is the bare model whose token states the graph gives).
    #[serde(default)]
    transformer_task: Option<String>,
    /// sentence-transformers 6: per modality, the model's method and which of its outputs is the module's.
    #[serde(default)]
    modality_config: Option<serde_json::Map<String, serde_json::Value>>,
}

/// What sentence_bert_config.json asks of the text that this pipeline does not do, refused by name (issue 54: such
/// a directory, made by hand, gave vectors at cosine 0.33 to 0.41 of sentence-transformers' without a word):
/// tokenizer arguments (`processing_kwargs`), and `do_lower_case` where the tokenizer does not lowercase anyway.
fn refuse_text_settings(dir: &Path, sbert: &SbertConfig) -> Result<()> {
    const FILE: &str = "sentence_bert_config.json";
    refuse_other_outputs(dir, sbert)?;
    let asked: Vec<String> = sbert
        .processing_kwargs
        .iter()
        .filter(|(_, v)| !(v.is_null() || v.as_object().is_some_and(|o| o.is_empty())))
        .map(|(modality, v)| format!("{modality}: {v}"))
        .collect();
    if !asked.is_empty() {
        return Err(Error::model(
            dir,
            FILE,
            format!(
                "processing_kwargs ({}) are arguments sentence-transformers passes to the tokenizer, which this \
                 pipeline does not apply: its vectors would not be the model's. Such a model cannot be embedded here",
                asked.join("; ")
            ),
        ));
    }
    if sbert.do_lower_case && !tokenizer_lowercases(dir)? {
        return Err(Error::model(
            dir,
            FILE,
            "do_lower_case is true: sentence-transformers lowercases every text before the tokenizer, which this \
             pipeline does not, and this tokenizer (tokenizer.json) does not lowercase either, so the vectors would \
             not be the model's. Lowercase in the job instead (embed(lower(text))) and set do_lower_case to false \
             in the file",
        ));
    }
    Ok(())
}

/// A Transformer module that gives anything but the bare model's token states (`last_hidden_state`), which is what
/// an exported graph gives: another `transformer_task` (a classifier's logits, a masked or causal language
/// model's), or a `modality_config` whose text comes from another method or output.
fn refuse_other_outputs(dir: &Path, sbert: &SbertConfig) -> Result<()> {
    const FILE: &str = "sentence_bert_config.json";
    let task = sbert.transformer_task.as_deref().unwrap_or("feature-extraction");
    if task != "feature-extraction" {
        let kind = match task {
            "sequence-classification" | "text-generation" | "any-to-any" => " (a CrossEncoder's: a reranker's scores)",
            "fill-mask" => " (a SparseEncoder's: SPLADE's vocabulary logits)",
            "retrieval" => " (a MultiVectorEncoder's: one vector per token)",
            _ => "",
        };
        return Err(Error::model(
            dir,
            FILE,
            format!(
                "transformer_task {task:?}{kind} is not the one this pipeline runs: it embeds with                  \"feature-extraction\", the bare model's token states, then the module chain's pooling"
            ),
        ));
    }
    let Some(modalities) = &sbert.modality_config else { return Ok(()) };
    let text = modalities.get("text").and_then(|t| t.as_object());
    let field = |key: &str, default: &str| {
        text.and_then(|t| t.get(key)).map_or(Some(default.to_string()), |v| v.as_str().map(str::to_string))
    };
    let method = field("method", "forward");
    let output = field("method_output_name", "last_hidden_state");
    if text.is_none() || method.as_deref() != Some("forward") || output.as_deref() != Some("last_hidden_state") {
        let said = modalities.get("text").map_or("nothing".to_string(), |t| t.to_string());
        return Err(Error::model(
            dir,
            FILE,
            format!(
                "modality_config gives text {said}; this pipeline embeds text with the model's forward method and \
                 its last_hidden_state, as the exported graph gives them"
            ),
        ));
    }
    Ok(())
}

/// Whether tokenizer.json's normalizer lowercases every text (a `BertNormalizer` with `lowercase`, or `Lowercase`,
/// alone or in a `Sequence`).
fn tokenizer_lowercases(dir: &Path) -> Result<bool> {
    fn lowercases(n: &serde_json::Value) -> bool {
        match n.get("type").and_then(|t| t.as_str()) {
            Some("BertNormalizer") => n.get("lowercase").and_then(|l| l.as_bool()).unwrap_or(false),
            Some("Lowercase") => true,
            Some("Sequence") => {
                n.get("normalizers").and_then(|l| l.as_array()).is_some_and(|l| l.iter().any(lowercases))
            }
            _ => false,
        }
    }
    if !dir.join("tokenizer.json").is_file() {
        return Ok(false);
    }
    let tokenizer: serde_json::Value = read_json(dir, "tokenizer.json")?;
    Ok(tokenizer.get("normalizer").is_some_and(lowercases))
}

/// The tokenizer classes that transformers 5 builds with no normalizer and a `Metaspace` pre-tokenizer, whatever
/// tokenizer.json says (transformers' `models/llama/tokenization_llama.py`, `code_llama`).
const METASPACE_CLASSES: [&str; 4] =
    ["LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer", "CodeLlamaTokenizerFast"];

/// A tokenizer.json in the layout transformers 4 saved Llama and Mistral tokenizers in (a `Prepend("▁")`
/// normalizer, no pre-tokenizer) under a class that transformers 5, which sentence-transformers loads through,
/// rebuilds as a `Metaspace` pre-tokenizer: the two cut leading and repeated spaces differently (issue 54: a
/// minimum cosine of 0.456 on a text with leading spaces), so such a directory is refused, saying how to re-save it.
fn refuse_legacy_tokenizer_layout(dir: &Path, class: Option<&str>) -> Result<()> {
    let Some(class) = class.filter(|c| METASPACE_CLASSES.contains(c)) else { return Ok(()) };
    if !dir.join("tokenizer.json").is_file() {
        return Ok(());
    }
    let tokenizer: serde_json::Value = read_json(dir, "tokenizer.json")?;
    if !tokenizer.get("normalizer").is_some_and(|n| normalizer_has(n, "Prepend")) {
        return Ok(());
    }
    Err(Error::model(
        dir,
        "tokenizer.json",
        format!(
            "is in the older {class} layout (a Prepend normalizer), which transformers 5, and so sentence-transformers, \
             replaces with a Metaspace pre-tokenizer that treats leading spaces differently; the vectors would not be \
             the model's. Save the tokenizer again with transformers 5 (AutoTokenizer.from_pretrained(dir)\
             .save_pretrained(dir)) to write the layout it uses"
        ),
    ))
}

/// Whether a tokenizer.json normalizer is, or holds in a `Sequence`, one of type `kind`.
fn normalizer_has(n: &serde_json::Value, kind: &str) -> bool {
    match n.get("type").and_then(|t| t.as_str()) {
        Some("Sequence") => {
            n.get("normalizers").and_then(|l| l.as_array()).is_some_and(|l| l.iter().any(|n| normalizer_has(n, kind)))
        }
        Some(t) => t == kind,
        None => false,
    }
}

#[derive(Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    hidden_size: Option<usize>,
    max_position_embeddings: Option<usize>,
    pad_token_id: Option<u32>,
    vocab_size: Option<usize>,
}

/// The model types whose position ids start at `pad_token_id + 1` (transformers' `create_position_ids_from_input_ids`,
/// computed inside their graphs): RoBERTa and its kin.
const POSITION_OFFSET_TYPES: [&str; 8] =
    ["roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "mpnet", "longformer", "data2vec-text", "ibert"];

/// The most tokens a text can have, and why, when config.json gives `max_position_embeddings`: all of them, or,
/// where positions are numbered from `pad_token_id + 1` (issue 54: 514 embeddings take 512 tokens, and 513 failed
/// mid-run on the CPU and would read out of range on a GPU), that many fewer.
fn usable_positions(hf: &HfConfig) -> Option<(usize, String)> {
    let table = hf.max_position_embeddings?;
    Some(match hf.model_type.as_deref().filter(|t| POSITION_OFFSET_TYPES.contains(t)) {
        Some(kind) => {
            let offset = hf.pad_token_id.unwrap_or(1) as usize + 1;
            let why = format!(
                "max_position_embeddings {table} in config.json, less pad_token_id + 1 = {offset}: {kind} numbers its \
                 positions from pad_token_id + 1"
            );
            (table.saturating_sub(offset), why)
        }
        None => (table, format!("max_position_embeddings {table} in config.json")),
    })
}

/// The tokenizer's truncation side (tokenizer_config.json) and the longest text in tokens
/// (sentence_bert_config.json's max_seq_length, else the tokenizer's model_max_length).
fn read_lengths(dir: &Path) -> Result<(TruncationSide, usize)> {
    let (tokenizer_cfg, truncation_side) = read_tokenizer_config(dir, "tokenizer_config.json")?;

    refuse_legacy_tokenizer_layout(dir, tokenizer_cfg.tokenizer_class.as_deref())?;
    let sbert: SbertConfig = read_json(dir, "sentence_bert_config.json")?;
    refuse_text_settings(dir, &sbert)?;
    // sentence-transformers 6 no longer writes max_seq_length there: the tokenizer's model_max_length is
    // it (transformers writes 1e30 for "no limit", which is no use as one).
    let max_seq_length = match sbert.max_seq_length {
        Some(n) => Some(n),
        None => tokenizer_cfg.model_max_length.filter(|n| *n >= 2.0 && *n <= 1e6).map(|n| n as usize),
    }
    .filter(|n| *n >= 2)
    .ok_or_else(|| {
        Error::model(
            dir,
            "sentence_bert_config.json",
            "needs a max_seq_length of at least 2 (or tokenizer_config.json a model_max_length)",
        )
    })?;
    Ok((truncation_side, max_seq_length))
}

/// The prompts of config_sentence_transformers.json and its default one; refused when it asks to cut the
/// vectors (`truncate_dim`, which the pipeline does by `embed.truncate_dim`) or names a default it lacks.
/// `dim` is the width of the vectors the directory makes.
fn read_prompts(dir: &Path, st: StConfig, dim: usize) -> Result<(BTreeMap<String, String>, Option<String>)> {
    if let Some(n) = st.truncate_dim {
        return Err(Error::model(
            dir,
            ST_CONFIG,
            format!(
                "truncate_dim {n} is not read by this pipeline (its vectors would have {dim} values, not {n}); \
                 remove it from the file to embed at the full dimension, then SET embed.truncate_dim = {n} to \
                 cut them (normalised after the cut)"
            ),
        ));
    }
    let default_prompt_name = st.default_prompt_name.filter(|n| !n.is_empty());
    if let Some(name) = default_prompt_name.as_ref().filter(|n| !st.prompts.contains_key(*n)) {
        return Err(Error::model(
            dir,
            ST_CONFIG,
            format!("default_prompt_name '{name}' is not one of its prompts ({})", prompt_names(&st.prompts)),
        ));
    }
    Ok((st.prompts, default_prompt_name))
}

/// What a model directory says about the settings, before a campaign's options override them.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelDefaults {
    /// `max_seq_length`.
    pub max_tokens: usize,
    pub pooling: Pooling,
    pub normalize: bool,
    /// The tokenizer's `truncation_side`.
    pub truncation: TruncationSide,
}

impl ModelSpec {
    /// Read and cross-check the directory. Every error names the file at fault.
    pub fn load(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(Error::model(
                &dir,
                "",
                "model directory not found. Run `scripts/setup` for the default model (`scripts/setup --gpu` for \
                 the float16 one a GPU uses), or `SET embed.model` to a sentence-transformers directory",
            ));
        }
        let st = read_st_config(&dir)?;
        let modules: Vec<Module> = read_json(&dir, "modules.json")?;
        if let Some(module) = super::image_spec::image_module(&dir, &modules) {
            let model = super::image_spec::load(&dir, module)?;
            return Self::image_text(dir, model, st);
        }
        let chain = read_chain(&dir, &modules)?;
        let pooling_file = format!("{}/config.json", chain.pooling.path.trim_end_matches('/'));
        let pooling_cfg: PoolingConfig = read_json(&dir, &pooling_file)?;
        let pooling = pooling_mode(&dir, &pooling_file, &pooling_cfg)?;
        let token_dim = pooling_cfg.word_embedding_dimension;
        let mut dim = pooling.out_dim(token_dim);
        let mut dense = Vec::new();
        for module in &chain.dense {
            let spec = read_dense(&dir, module, dim)?;
            dim = spec.out_features;
            dense.push(spec);
        }
        let (truncation_side, max_seq_length) = read_lengths(&dir)?;

        let hf: HfConfig = read_json(&dir, "config.json")?;
        if let Some(hidden) = hf.hidden_size
            && hidden != token_dim
        {
            return Err(Error::model(
                &dir,
                &pooling_file,
                format!(
                    "word_embedding_dimension is {} but config.json has hidden_size {hidden}",
                    pooling_cfg.word_embedding_dimension
                ),
            ));
        }
        let (max_positions, positions_from) = usable_positions(&hf).unzip();
        if let Some(positions) = max_positions.filter(|p| max_seq_length > *p) {
            let why = positions_from.as_deref().unwrap_or_default();
            return Err(Error::model(
                &dir,
                "sentence_bert_config.json",
                format!("max_seq_length {max_seq_length} exceeds the {positions} tokens the model can take ({why})"),
            ));
        }

        let (prompts, default_prompt_name) = read_prompts(&dir, st, dim)?;

        let tokenizer_path = dir.join("tokenizer.json");
        if !tokenizer_path.is_file() {
            return Err(Error::model(&dir, "tokenizer.json", "file not found"));
        }
        let onnx_path =
            onnx_file(&dir).ok_or_else(|| Error::model(&dir, "onnx/model.onnx", "file not found (nor model.onnx)"))?;

        Ok(Self {
            dir,
            onnx_path,
            tokenizer_path,
            max_seq_length,
            pooling,
            dense,
            normalize: chain.normalize,
            token_dim,
            dim,
            truncation_side,
            pad_id: hf.pad_token_id.unwrap_or(0),
            vocab_size: hf.vocab_size,
            max_positions,
            positions_from: positions_from.unwrap_or_default(),
            prompts,
            default_prompt_name,
            include_prompt: pooling_cfg.include_prompt,
            image: None,
        })
    }

    /// The spec of an image-text model (CLIP, SigLIP): its text tower pools and projects inside its graph.
    fn image_text(dir: PathBuf, t: super::image_spec::ImageTextModel, st: StConfig) -> Result<Self> {
        let (prompts, default_prompt_name) = read_prompts(&dir, st, t.dim)?;
        Ok(Self {
            dir,
            onnx_path: t.onnx_path,
            tokenizer_path: t.tokenizer_path,
            max_seq_length: t.max_seq_length,
            pooling: Pooling::one(PoolingMode::Tower),
            dense: Vec::new(),
            // sentence-transformers does not normalise CLIP's or SigLIP's vectors.
            normalize: false,
            token_dim: t.dim,
            dim: t.dim,
            truncation_side: t.truncation_side,
            pad_id: t.pad_id,
            vocab_size: t.vocab_size,
            max_positions: t.max_positions,
            positions_from: t.positions_from,
            prompts,
            default_prompt_name,
            include_prompt: true,
            image: Some(t.image),
        })
    }

    /// The settings the directory gives, before a campaign's options override them.
    pub fn defaults(&self) -> ModelDefaults {
        ModelDefaults {
            max_tokens: self.max_seq_length,
            pooling: self.pooling,
            normalize: self.normalize,
            truncation: self.truncation_side,
        }
    }

    /// The length of the vectors the model's chain makes when its tokens are pooled with `pooling`: the last
    /// Dense module's `out_features`, or else the pooled vector's length.
    pub fn vector_dim(&self, pooling: Pooling) -> usize {
        match self.dense.last() {
            Some(d) => d.out_features,
            None => pooling.out_dim(self.token_dim),
        }
    }

    /// The text a prompt name stands for: `''` the model's default prompt (none when it has no default),
    /// `'none'` no prompt, anything else one of the model's prompts. Returns the name applied (empty for
    /// none) and its text.
    pub fn prompt(&self, name: &str) -> std::result::Result<(String, String), String> {
        let name = match name {
            "" => match &self.default_prompt_name {
                Some(default) => default.as_str(),
                None => return Ok((String::new(), String::new())),
            },
            "none" => return Ok((String::new(), String::new())),
            name => name,
        };
        match self.prompts.get(name) {
            Some(text) => Ok((name.to_string(), text.clone())),
            None if self.prompts.is_empty() => {
                Err(format!("the model {} has no prompts ({ST_CONFIG} names none)", self.name()))
            }
            None => Err(format!(
                "the model {} has no prompt '{name}'; its prompts are {}",
                self.name(),
                prompt_names(&self.prompts)
            )),
        }
    }

    /// An error about the ONNX file, naming the directory and the file within it.
    pub fn onnx_error(&self, message: impl Into<String>) -> crate::error::Error {
        let file = self.onnx_path.strip_prefix(&self.dir).unwrap_or(&self.onnx_path).display().to_string();
        crate::error::Error::model(&self.dir, file, message)
    }

    /// The directory's last component, used as the model's name in records.
    pub fn name(&self) -> String {
        self.dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| self.dir.display().to_string())
    }
}

fn pooling_mode(dir: &Path, file: &str, cfg: &PoolingConfig) -> Result<Pooling> {
    let bad = |m: String| Error::model(dir, file, m);
    let names: Vec<&str> = match &cfg.pooling_mode {
        Some(OneOrMany::One(mode)) => vec![mode.as_str()],
        Some(OneOrMany::Many(modes)) => modes.iter().map(String::as_str).collect(),
        // The older config: one flag per mode, concatenated in sentence-transformers' order when several are on.
        None => {
            let flags = [
                cfg.pooling_mode_cls_token,
                cfg.pooling_mode_max_tokens,
                cfg.pooling_mode_mean_tokens,
                cfg.pooling_mode_mean_sqrt_len_tokens,
                cfg.pooling_mode_weightedmean_tokens,
                cfg.pooling_mode_lasttoken,
            ];
            let on: Vec<PoolingMode> =
                PoolingMode::ALL.into_iter().zip(flags).filter(|(_, on)| *on).map(|(m, _)| m).collect();
            return Pooling::of(&on).ok_or_else(|| {
                let flags: Vec<&str> = PoolingMode::ALL.iter().map(|m| m.flag()).collect();
                bad(format!("sets no pooling mode; set pooling_mode, or one of {}", flags.join(", ")))
            });
        }
    };
    let modes = names
        .iter()
        .map(|name| {
            PoolingMode::parse(name).ok_or_else(|| {
                let known: Vec<&str> = PoolingMode::ALL.iter().map(|m| m.as_str()).collect();
                bad(format!("pooling_mode {name:?} is not a sentence-transformers pooling mode ({})", known.join(", ")))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Pooling::of(&modes).ok_or_else(|| bad(format!("pooling_mode names {} modes; 1 to 6 are possible", modes.len())))
}

/// The module chain of modules.json, in the order sentence-transformers runs it.
struct Chain<'a> {
    pooling: &'a Module,
    dense: Vec<&'a Module>,
    normalize: bool,
}

/// The chains this pipeline runs: a Transformer (the ONNX graph), one Pooling, any Dense modules, and a
/// Normalize at the end, in that order. Any other module (LayerNorm, WordWeights, a CLIP model, a Router, …)
/// or order would give vectors it does not compute, so the model is refused at load, naming the module and
/// its folder.
fn read_chain<'a>(dir: &Path, modules: &'a [Module]) -> Result<Chain<'a>> {
    let bad = |m: String| Error::model(dir, "modules.json", m);
    let kind = |m: &Module| m.kind.rsplit('.').next().unwrap_or(&m.kind).to_string();
    let folder = |m: &Module| if m.path.is_empty() { String::from("the top folder") } else { m.path.clone() };
    // A Dropout module is the identity at inference (sentence-transformers encodes in eval mode): left out.
    let modules: Vec<&Module> = modules.iter().filter(|m| kind(m) != "Dropout").collect();
    for module in modules.iter().copied() {
        let why = match kind(module).as_str() {
            "Transformer" | "Pooling" | "Dense" | "Normalize" => continue,
            "CLIPModel" => "an image-text model's module is read alone (modules.json with it and nothing else)",
            _ => "this pipeline runs Transformer, Pooling, Dense and Normalize modules",
        };
        return Err(bad(format!("module {} ({}) is not supported: {why}", module.kind, folder(module))));
    }
    let poolings = modules.iter().filter(|m| kind(m) == "Pooling").count();
    if poolings > 1 {
        return Err(bad(format!("has {poolings} Pooling modules; one is supported")));
    }
    let order: Vec<String> = modules.iter().map(|m| kind(m)).collect();
    let (Some("Transformer"), Some("Pooling")) = (order.first().map(String::as_str), order.get(1).map(String::as_str))
    else {
        if poolings == 0 {
            return Err(bad("has no sentence_transformers.models.Pooling module".into()));
        }
        return Err(bad(format!(
            "runs {}; the chains this pipeline runs are Transformer, Pooling, any Dense modules, then Normalize",
            order.join(" → ")
        )));
    };
    let rest = &modules[2..];
    let normalize = rest.last().is_some_and(|m| kind(m) == "Normalize");
    let dense: Vec<&Module> = rest[..rest.len() - normalize as usize].to_vec();
    if let Some(m) = dense.iter().find(|m| kind(m) != "Dense") {
        return Err(bad(format!(
            "has {} ({}) before the end of the chain; the chains this pipeline runs are Transformer, Pooling, any \
             Dense modules, then Normalize",
            m.kind,
            folder(m)
        )));
    }
    Ok(Chain { pooling: modules[1], dense, normalize })
}

/// A Dense module's config and weights file, checked against the dimension it takes in.
fn read_dense(dir: &Path, module: &Module, in_dim: usize) -> Result<DenseSpec> {
    let folder = module.path.trim_end_matches('/').to_string();
    let file = format!("{folder}/config.json");
    let cfg: DenseConfig = read_json(dir, &file)?;
    let bad = |m: String| Error::model(dir, &file, m);
    if cfg.in_features != in_dim {
        return Err(bad(format!("in_features is {} but the module before it gives {in_dim} values", cfg.in_features)));
    }
    for (key, name) in [("module_input_name", &cfg.module_input_name), ("module_output_name", &cfg.module_output_name)]
    {
        if let Some(name) = name.as_deref().filter(|n| *n != "sentence_embedding") {
            return Err(bad(format!("{key} {name:?} is not supported: the pipeline projects the sentence embedding")));
        }
    }
    let activation = Activation::parse(cfg.activation_function.as_deref()).ok_or_else(|| {
        bad(format!(
            "activation_function {:?} is not one this pipeline computes (torch.nn Identity, Tanh, ReLU, Sigmoid, \
             GELU or SiLU)",
            cfg.activation_function.as_deref().unwrap_or_default()
        ))
    })?;
    let weights = dir.join(&folder).join("model.safetensors");
    if !weights.is_file() {
        let why = if dir.join(&folder).join("pytorch_model.bin").is_file() {
            "holds pytorch_model.bin, a pickle this pipeline does not read; save the model again with \
             sentence-transformers (it writes model.safetensors)"
        } else {
            "has no model.safetensors with the projection's weights"
        };
        return Err(Error::model(dir, &folder, why));
    }
    Ok(DenseSpec {
        folder,
        in_features: cfg.in_features,
        out_features: cfg.out_features,
        bias: cfg.bias,
        activation,
        residual: cfg.use_residual,
        weights,
    })
}

/// Where sentence-transformers keeps its prompts.
const ST_CONFIG: &str = "config_sentence_transformers.json";

fn prompt_names(prompts: &BTreeMap<String, String>) -> String {
    prompts.keys().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(", ")
}

/// The model directory's ONNX file: `onnx/model.onnx`, else `model.onnx`.
fn onnx_file(dir: &Path) -> Option<PathBuf> {
    ["onnx/model.onnx", "model.onnx"].iter().map(|f| dir.join(f)).find(|p| p.is_file())
}

/// The bytes of a model directory's weights on disk, cheaply: its ONNX file and the external data beside it
/// (`model.onnx_data`, `model.onnx.data`, `model.data`), from their sizes alone. 0 without an ONNX file.
pub fn weight_file_bytes(dir: &Path) -> u64 {
    let Some(onnx) = onnx_file(dir) else { return 0 };
    let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
    let external = ["model.onnx_data", "model.onnx.data", "model.data"].iter().map(|f| onnx.with_file_name(f));
    size(&onnx) + external.map(|p| size(&p)).sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_minimal(dir: &Path) {
        std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
        std::fs::create_dir_all(dir.join("onnx")).unwrap();
        std::fs::write(
            dir.join("modules.json"),
            r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
               {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
               {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
        )
        .unwrap();
        std::fs::write(
            dir.join("1_Pooling/config.json"),
            r#"{"word_embedding_dimension": 8, "pooling_mode_mean_tokens": true}"#,
        )
        .unwrap();
        std::fs::write(dir.join("sentence_bert_config.json"), r#"{"max_seq_length": 16}"#).unwrap();
        std::fs::write(dir.join("config.json"), r#"{"hidden_size": 8, "max_position_embeddings": 32}"#).unwrap();
        std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
        std::fs::write(dir.join("onnx/model.onnx"), b"").unwrap();
    }

    /// What this pipeline cannot compute is refused at load, by name: a module it does not run (an image
    /// model, a LayerNorm), a Dense module out of place or with an activation or input it does not compute, a
    /// pooling mode sentence-transformers does not have, truncate_dim (applied after Normalize without a second
    /// normalisation, which `embed.truncate_dim` does not do), a second Pooling module.
    #[test]
    fn modules_and_settings_it_does_not_compute_are_refused_by_name() {
        let chain = |kinds: &[(&str, &str)]| {
            let modules: Vec<String> = kinds
                .iter()
                .map(|(path, kind)| format!(r#"{{"path":"{path}","type":"sentence_transformers.models.{kind}"}}"#))
                .collect();
            format!("[{}]", modules.join(","))
        };
        let dense_after_normalize =
            chain(&[("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize"), ("3_Dense", "Dense")]);
        let layer_norm = chain(&[("", "Transformer"), ("1_Pooling", "Pooling"), ("2_LayerNorm", "LayerNorm")]);
        let two_poolings = chain(&[("", "Transformer"), ("1_Pooling", "Pooling"), ("1_Pooling", "Pooling")]);
        let cases: Vec<(&str, &str, &str, &[&str])> = vec![
            (
                "modules.json",
                &dense_after_normalize,
                "modules.json",
                &["sentence_transformers.models.Normalize", "2_Normalize", "then Normalize"],
            ),
            (
                "modules.json",
                &layer_norm,
                "modules.json",
                &["sentence_transformers.models.LayerNorm", "2_LayerNorm", "not supported"],
            ),
            (
                "modules.json",
                r#"[{"path":"","type":"sentence_transformers.models.CLIPModel"},{"path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#,
                "modules.json",
                &["CLIPModel", "an image-text model's module is read alone"],
            ),
            ("modules.json", &two_poolings, "modules.json", &["2 Pooling modules"]),
            (
                "1_Pooling/config.json",
                r#"{"embedding_dimension": 8, "pooling_mode": ["mean", "median"]}"#,
                "1_Pooling/config.json",
                &["pooling_mode \"median\" is not a sentence-transformers pooling mode", "lasttoken"],
            ),
            (
                "1_Pooling/config.json",
                r#"{"word_embedding_dimension": 8, "pooling_mode_mean_tokens": false}"#,
                "1_Pooling/config.json",
                &["sets no pooling mode", "pooling_mode_lasttoken"],
            ),
            (
                "config_sentence_transformers.json",
                r#"{"truncate_dim": 4}"#,
                "config_sentence_transformers.json",
                &["truncate_dim 4 is not read", "8 values", "SET embed.truncate_dim = 4"],
            ),
            (
                "tokenizer_config.json",
                r#"{"truncation_side": "middle"}"#,
                "tokenizer_config.json",
                &["truncation_side \"middle\""],
            ),
        ];
        for (file, text, named, says) in cases {
            let tmp = tempfile::tempdir().unwrap();
            write_minimal(tmp.path());
            std::fs::write(tmp.path().join(file), text).unwrap();
            let e = ModelSpec::load(tmp.path()).unwrap_err().to_string();
            assert!(e.contains(named) && says.iter().all(|s| e.contains(s)), "{file}: {e}");
        }
    }

    /// A Dense module with the model's chain: its config read, its in_features checked against the pooled
    /// vector (modes x token dimension), and refused by name when it cannot be run as written.
    #[test]
    fn reads_dense_modules_and_refuses_what_it_cannot_run() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write_minimal(d);
        std::fs::write(
            d.join("modules.json"),
            r#"[{"path":"","type":"sentence_transformers.models.Transformer"},
               {"path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
               {"path":"2_Dense","type":"sentence_transformers.models.Dense"},
               {"path":"3_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
        )
        .unwrap();
        std::fs::write(
            d.join("1_Pooling/config.json"),
            r#"{"embedding_dimension": 8, "pooling_mode": ["cls", "lasttoken"]}"#,
        )
        .unwrap();
        std::fs::create_dir_all(d.join("2_Dense")).unwrap();
        let dense = |config: &str| std::fs::write(d.join("2_Dense/config.json"), config).unwrap();
        dense(r#"{"in_features": 16, "out_features": 4, "activation_function": "torch.nn.modules.activation.Tanh"}"#);
        let e = ModelSpec::load(d).unwrap_err().to_string();
        assert!(e.contains("2_Dense") && e.contains("no model.safetensors"), "{e}");
        std::fs::write(d.join("2_Dense/pytorch_model.bin"), b"pickle").unwrap();
        let e = ModelSpec::load(d).unwrap_err().to_string();
        assert!(e.contains("pytorch_model.bin") && e.contains("save the model again"), "{e}");
        std::fs::write(d.join("2_Dense/model.safetensors"), b"").unwrap();
        let spec = ModelSpec::load(d).unwrap();
        assert_eq!(
            (spec.token_dim, spec.dim, spec.pooling.name(), spec.normalize),
            (8, 4, "cls+lasttoken".into(), true)
        );
        assert_eq!((spec.dense[0].activation, spec.dense[0].bias), (Activation::Tanh, true));
        assert_eq!(spec.vector_dim(Pooling::MEAN), 4, "the last Dense module decides the length");

        for (config, says) in [
            (r#"{"in_features": 8, "out_features": 4}"#, "in_features is 8 but the module before it gives 16"),
            (
                r#"{"in_features": 16, "out_features": 4, "activation_function": "torch.nn.modules.activation.Softmax"}"#,
                "Softmax",
            ),
            (r#"{"in_features": 16, "out_features": 4, "activation_function": "mypkg.Swish"}"#, "mypkg.Swish"),
            (r#"{"in_features": 16, "out_features": 4, "module_input_name": "token_embeddings"}"#, "module_input_name"),
        ] {
            dense(config);
            let e = ModelSpec::load(d).unwrap_err().to_string();
            assert!(e.contains("2_Dense/config.json") && e.contains(says), "{config}: {e}");
        }
        // Without an activation named, sentence-transformers' default: tanh.
        dense(r#"{"in_features": 16, "out_features": 4}"#);
        assert_eq!(ModelSpec::load(d).unwrap().dense[0].activation, Activation::Tanh);
    }

    #[test]
    fn reads_a_complete_directory() {
        let tmp = tempfile::tempdir().unwrap();
        write_minimal(tmp.path());
        let spec = ModelSpec::load(tmp.path()).unwrap();
        assert_eq!((spec.dim, spec.max_seq_length, spec.pooling, spec.normalize), (8, 16, Pooling::MEAN, true));
        assert!(spec.onnx_path.ends_with("onnx/model.onnx"));
    }

    #[test]
    fn each_missing_or_inconsistent_file_is_named() {
        type Break = Box<dyn Fn(&Path)>;
        let cases: [(&str, Break); 7] = [
            ("modules.json", Box::new(|d| std::fs::remove_file(d.join("modules.json")).unwrap())),
            ("1_Pooling/config.json", Box::new(|d| std::fs::remove_file(d.join("1_Pooling/config.json")).unwrap())),
            (
                "sentence_bert_config.json",
                Box::new(|d| std::fs::write(d.join("sentence_bert_config.json"), "{}").unwrap()),
            ),
            (
                "1_Pooling/config.json",
                Box::new(|d| std::fs::write(d.join("config.json"), r#"{"hidden_size": 9}"#).unwrap()),
            ),
            ("tokenizer.json", Box::new(|d| std::fs::remove_file(d.join("tokenizer.json")).unwrap())),
            ("onnx/model.onnx", Box::new(|d| std::fs::remove_file(d.join("onnx/model.onnx")).unwrap())),
            (
                "1_Pooling/config.json",
                Box::new(|d| {
                    std::fs::write(
                        d.join("1_Pooling/config.json"),
                        r#"{"word_embedding_dimension": 8, "pooling_mode": 3}"#,
                    )
                    .unwrap()
                }),
            ),
        ];
        for (file, break_it) in cases {
            let tmp = tempfile::tempdir().unwrap();
            write_minimal(tmp.path());
            break_it(tmp.path());
            let err = ModelSpec::load(tmp.path()).unwrap_err().to_string();
            assert!(err.contains(file), "expected {file} in: {err}");
        }
    }

    #[test]
    fn roberta_kin_take_two_fewer_tokens_than_their_position_table() {
        // Issue 54: RoBERTa, XLM-R, MPNet and CamemBERT number positions from pad_token_id + 1.
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write_minimal(d);
        for kind in ["roberta", "xlm-roberta", "mpnet", "camembert"] {
            let config = format!(
                r#"{{"model_type": "{kind}", "hidden_size": 8, "max_position_embeddings": 514, "pad_token_id": 1}}"#
            );
            std::fs::write(d.join("config.json"), config).unwrap();
            std::fs::write(d.join("sentence_bert_config.json"), r#"{"max_seq_length": 512}"#).unwrap();
            let spec = ModelSpec::load(d).unwrap();
            assert_eq!(spec.max_positions, Some(512), "{kind}");
            assert!(spec.positions_from.contains("pad_token_id + 1"), "{}", spec.positions_from);
            std::fs::write(d.join("sentence_bert_config.json"), r#"{"max_seq_length": 513}"#).unwrap();
            let err = ModelSpec::load(d).unwrap_err().to_string();
            assert!(err.contains("exceeds the 512 tokens the model can take"), "{err}");
        }
        // BERT numbers them from 0: its table is its limit.
        std::fs::write(
            d.join("config.json"),
            r#"{"model_type": "bert", "hidden_size": 8, "max_position_embeddings": 512}"#,
        )
        .unwrap();
        std::fs::write(d.join("sentence_bert_config.json"), r#"{"max_seq_length": 512}"#).unwrap();
        assert_eq!(ModelSpec::load(d).unwrap().max_positions, Some(512));
    }

    #[test]
    fn text_settings_it_does_not_apply_are_refused_by_name() {
        // Issue 54: do_lower_case with a cased tokenizer, and sentence-transformers 6's processing_kwargs, made
        // vectors at cosine 0.33 and 0.41 of the model's, silently.
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write_minimal(d);
        let sbert = |extra: &str| {
            std::fs::write(d.join("sentence_bert_config.json"), format!(r#"{{"max_seq_length": 16{extra}}}"#)).unwrap()
        };
        sbert(r#", "do_lower_case": true"#);
        let err = ModelSpec::load(d).unwrap_err().to_string();
        assert!(err.contains("sentence_bert_config.json") && err.contains("do_lower_case is true"), "{err}");
        assert!(err.contains("embed(lower(text))"), "{err}");
        // A tokenizer that lowercases anyway makes the same tokens.
        for normalizer in [
            r#"{"type": "BertNormalizer", "lowercase": true, "strip_accents": null}"#,
            r#"{"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "Lowercase"}]}"#,
        ] {
            std::fs::write(d.join("tokenizer.json"), format!(r#"{{"normalizer": {normalizer}}}"#)).unwrap();
            ModelSpec::load(d).unwrap();
        }
        let cased = r#"{"normalizer": {"type": "BertNormalizer", "lowercase": false}}"#;
        std::fs::write(d.join("tokenizer.json"), cased).unwrap();
        assert!(ModelSpec::load(d).unwrap_err().to_string().contains("do_lower_case"));

        sbert(r#", "do_lower_case": false, "processing_kwargs": {"text": {"add_special_tokens": false}}"#);
        let err = ModelSpec::load(d).unwrap_err().to_string();
        assert!(err.contains("processing_kwargs") && err.contains("add_special_tokens"), "{err}");
        // Empty arguments ask nothing.
        sbert(r#", "processing_kwargs": {"text": {}, "image": null}"#);
        ModelSpec::load(d).unwrap();
    }

    #[test]
    fn other_model_classes_and_outputs_are_refused_by_name_and_dropout_is_left_out() {
        // Issue 54: a CrossEncoder was refused as having "no Pooling module"; another transformer_task or output
        // would embed logits; a Dropout (the identity at inference) was refused.
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write_minimal(d);
        std::fs::write(
            d.join("modules.json"),
            r#"[{"path":"","type":"sentence_transformers.base.modules.transformer.Transformer"},
               {"path":"1_CausalScoreHead","type":"sentence_transformers.cross_encoder.modules.CausalScoreHead"}]"#,
        )
        .unwrap();
        for (kind, says) in [
            ("CrossEncoder", "a reranker"),
            ("SparseEncoder", "sparse vectors"),
            ("MultiVectorEncoder", "one vector per token"),
            ("Florence", "not a SentenceTransformer"),
        ] {
            std::fs::write(d.join(ST_CONFIG), format!(r#"{{"model_type": "{kind}"}}"#)).unwrap();
            let err = ModelSpec::load(d).unwrap_err().to_string();
            assert!(err.contains(ST_CONFIG) && err.contains(kind) && err.contains(says), "{err}");
        }
        write_minimal(d);
        std::fs::write(d.join(ST_CONFIG), r#"{"model_type": "SentenceTransformer"}"#).unwrap();
        ModelSpec::load(d).unwrap();

        let sbert = |extra: &str| {
            std::fs::write(d.join("sentence_bert_config.json"), format!(r#"{{"max_seq_length": 16{extra}}}"#)).unwrap()
        };
        for (extra, says) in [
            (r#", "transformer_task": "fill-mask""#, "SPLADE"),
            (r#", "transformer_task": "sequence-classification""#, "reranker"),
            (r#", "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}}"#, "logits"),
            (r#", "modality_config": {"image": {"method": "forward"}}"#, "gives text nothing"),
        ] {
            sbert(extra);
            let err = ModelSpec::load(d).unwrap_err().to_string();
            assert!(err.contains("sentence_bert_config.json") && err.contains(says), "{extra}: {err}");
        }
        sbert(
            r#", "transformer_task": "feature-extraction", "modality_config": {"text": {"method": "forward",
               "method_output_name": "last_hidden_state"}, "image": {"method": "get_image_features"}}"#,
        );
        ModelSpec::load(d).unwrap();

        for dropout in [
            "sentence_transformers.models.Dropout",
            "sentence_transformers.sentence_transformer.modules.dropout.Dropout",
        ] {
            std::fs::write(
                d.join("modules.json"),
                format!(
                    r#"[{{"path":"","type":"sentence_transformers.models.Transformer"}},
                       {{"path":"1_Pooling","type":"sentence_transformers.models.Pooling"}},
                       {{"path":"2_Dropout","type":"{dropout}"}},
                       {{"path":"3_Normalize","type":"sentence_transformers.models.Normalize"}}]"#
                ),
            )
            .unwrap();
            let spec = ModelSpec::load(d).unwrap();
            assert!(spec.normalize && spec.dense.is_empty(), "{dropout}");
        }
    }

    #[test]
    fn a_llama_tokenizer_in_the_older_layout_is_refused_saying_how_to_save_it_again() {
        // Issue 54: transformers 5 rebuilds a LlamaTokenizer's normalizer and pre-tokenizer from the class; a
        // tokenizer.json in transformers 4's layout tokenised leading spaces otherwise (cosine 0.456).
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write_minimal(d);
        let legacy = r#"{"normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
            "pre_tokenizer": null}"#;
        std::fs::write(d.join("tokenizer.json"), legacy).unwrap();
        // Under another class (or none), the file is what transformers uses.
        ModelSpec::load(d).unwrap();
        std::fs::write(d.join("tokenizer_config.json"), r#"{"tokenizer_class": "GemmaTokenizer"}"#).unwrap();
        ModelSpec::load(d).unwrap();
        std::fs::write(d.join("tokenizer_config.json"), r#"{"tokenizer_class": "LlamaTokenizerFast"}"#).unwrap();
        let err = ModelSpec::load(d).unwrap_err().to_string();
        assert!(
            err.contains("tokenizer.json") && err.contains("LlamaTokenizerFast") && err.contains("Metaspace"),
            "{err}"
        );
        assert!(err.contains("save_pretrained"), "{err}");
        // transformers 5's own layout: no normalizer, a Metaspace pre-tokenizer.
        let current = r#"{"normalizer": null, "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581",
            "prepend_scheme": "first", "split": false}}"#;
        std::fs::write(d.join("tokenizer.json"), current).unwrap();
        ModelSpec::load(d).unwrap();
    }

    #[test]
    fn reads_the_sentence_transformers_6_layout() {
        // What SentenceTransformer.save() writes from sentence-transformers 6: the pooling as one string, the
        // dimension as embedding_dimension, and max_seq_length as the tokenizer's model_max_length.
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        write_minimal(d);
        std::fs::write(d.join("1_Pooling/config.json"), r#"{"embedding_dimension": 8, "pooling_mode": "cls"}"#)
            .unwrap();
        std::fs::write(d.join("sentence_bert_config.json"), r#"{"transformer_task": "feature-extraction"}"#).unwrap();
        std::fs::write(d.join("tokenizer_config.json"), r#"{"model_max_length": 12}"#).unwrap();
        let spec = ModelSpec::load(d).unwrap();
        assert_eq!((spec.dim, spec.max_seq_length, spec.pooling), (8, 12, Pooling::CLS));
        // transformers' 1e30 means "no limit", which is no max_seq_length.
        std::fs::write(d.join("tokenizer_config.json"), r#"{"model_max_length": 1e30}"#).unwrap();
        let err = ModelSpec::load(d).unwrap_err().to_string();
        assert!(err.contains("sentence_bert_config.json") && err.contains("model_max_length"), "{err}");
        std::fs::write(d.join("tokenizer_config.json"), r#"{"model_max_length": 12}"#).unwrap();
        std::fs::write(
            d.join("1_Pooling/config.json"),
            r#"{"embedding_dimension": 8, "pooling_mode": ["weightedmean", "mean"]}"#,
        )
        .unwrap();
        std::fs::write(d.join("tokenizer_config.json"), r#"{"model_max_length": 12, "truncation_side": "left"}"#)
            .unwrap();
        let spec = ModelSpec::load(d).unwrap();
        assert_eq!(
            (spec.pooling.name(), spec.dim, spec.truncation_side),
            ("weightedmean+mean".into(), 16, TruncationSide::Left)
        );
    }

    #[test]
    fn prompts_resolve_by_name_default_or_none() {
        let tmp = tempfile::tempdir().unwrap();
        write_minimal(tmp.path());
        let spec = ModelSpec::load(tmp.path()).unwrap();
        assert_eq!(spec.prompt("").unwrap(), (String::new(), String::new()), "no config, no prompt");
        assert!(spec.prompt("query").unwrap_err().contains("has no prompts"));

        let config = tmp.path().join(ST_CONFIG);
        std::fs::write(
            &config,
            r#"{"prompts": {"query": "query: ", "document": "passage: "}, "default_prompt_name": null}"#,
        )
        .unwrap();
        let spec = ModelSpec::load(tmp.path()).unwrap();
        assert_eq!(spec.prompt("").unwrap().1, "", "no default: none");
        assert_eq!(spec.prompt("document").unwrap(), ("document".into(), "passage: ".into()));
        let err = spec.prompt("passage").unwrap_err();
        assert!(err.contains("no prompt 'passage'") && err.contains("'document', 'query'"), "{err}");

        std::fs::write(&config, r#"{"prompts": {"query": "query: "}, "default_prompt_name": "query"}"#).unwrap();
        let spec = ModelSpec::load(tmp.path()).unwrap();
        assert_eq!(spec.prompt("").unwrap(), ("query".into(), "query: ".into()), "the default applies");
        assert_eq!(spec.prompt("none").unwrap(), (String::new(), String::new()));

        std::fs::write(&config, r#"{"prompts": {"query": "query: "}, "default_prompt_name": "search"}"#).unwrap();
        let err = ModelSpec::load(tmp.path()).unwrap_err().to_string();
        assert!(err.contains(ST_CONFIG) && err.contains("default_prompt_name 'search'"), "{err}");
    }

    #[test]
    fn missing_directory_says_what_to_do() {
        let err = ModelSpec::load("/nonexistent/model").unwrap_err().to_string();
        assert!(err.contains("/nonexistent/model") && err.contains("scripts/setup"), "{err}");
    }
}

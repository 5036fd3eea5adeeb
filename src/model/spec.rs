//! Reading a sentence-transformers model directory: which files hold the tokenizer, the ONNX graph,
//! the pooling mode, the normalisation step and the sequence limit, checked against each other.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::model::Pooling;

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
    /// The pooling mode from the Pooling module's `config.json`.
    pub pooling: Pooling,
    /// Whether modules.json ends in a Normalize module.
    pub normalize: bool,
    /// Embedding dimension (`word_embedding_dimension`).
    pub dim: usize,
    /// Padding token id (`pad_token_id` in config.json, 0 when absent).
    pub pad_id: u32,
    /// Rows of the model's token embedding table (`vocab_size` in config.json), when it says.
    pub vocab_size: Option<usize>,
    /// Positions the model has embeddings for (`max_position_embeddings` in config.json), when it says:
    /// the most tokens a text can have.
    pub max_positions: Option<usize>,
    /// Named prompts (`prompts` in `config_sentence_transformers.json`): text put before an input, e5-, bge- and
    /// nomic-style (`{"query": "query: ", "document": "passage: "}`).
    pub prompts: BTreeMap<String, String>,
    /// The prompt sentence-transformers applies when none is named (`default_prompt_name`), if any.
    pub default_prompt_name: Option<String>,
    /// Whether the pooling takes in a prompt's tokens (`include_prompt` in the Pooling config; true unless it
    /// says false, which this pipeline does not support with a prompt).
    pub include_prompt: bool,
}

#[derive(Deserialize)]
struct Module {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    path: String,
}

/// `1_Pooling/config.json`, as sentence-transformers up to 5 writes it (`word_embedding_dimension` and one
/// `pooling_mode_*` flag) or as 6 does (`embedding_dimension` and `pooling_mode: "mean"`).
#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(alias = "embedding_dimension")]
    word_embedding_dimension: usize,
    #[serde(default)]
    pooling_mode: Option<String>,
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
}

#[derive(Deserialize)]
struct SbertConfig {
    max_seq_length: Option<usize>,
}

/// `tokenizer_config.json`, where sentence-transformers 6 keeps the max_seq_length (as `model_max_length`).
#[derive(Deserialize)]
struct TokenizerConfig {
    model_max_length: Option<f64>,
}

#[derive(Deserialize)]
struct HfConfig {
    hidden_size: Option<usize>,
    max_position_embeddings: Option<usize>,
    pad_token_id: Option<u32>,
    vocab_size: Option<usize>,
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
        let modules: Vec<Module> = read_json(&dir, "modules.json")?;
        refuse_other_modules(&dir, &modules)?;
        let normalize = modules.iter().any(|m| m.kind.ends_with("Normalize"));
        let pooling_module = modules
            .iter()
            .find(|m| m.kind.ends_with("Pooling"))
            .ok_or_else(|| Error::model(&dir, "modules.json", "has no sentence_transformers.models.Pooling module"))?;
        let pooling_file = format!("{}/config.json", pooling_module.path.trim_end_matches('/'));
        let pooling_cfg: PoolingConfig = read_json(&dir, &pooling_file)?;
        let pooling = pooling_mode(&dir, &pooling_file, &pooling_cfg)?;

        let sbert: SbertConfig = read_json(&dir, "sentence_bert_config.json")?;
        // sentence-transformers 6 no longer writes max_seq_length there: the tokenizer's model_max_length is
        // it (transformers writes 1e30 for "no limit", which is no use as one).
        let max_seq_length = match sbert.max_seq_length {
            Some(n) => Some(n),
            None if dir.join("tokenizer_config.json").is_file() => {
                read_json::<TokenizerConfig>(&dir, "tokenizer_config.json")?
                    .model_max_length
                    .filter(|n| *n >= 2.0 && *n <= 1e6)
                    .map(|n| n as usize)
            }
            None => None,
        }
        .filter(|n| *n >= 2)
        .ok_or_else(|| {
            Error::model(
                &dir,
                "sentence_bert_config.json",
                "needs a max_seq_length of at least 2 (or tokenizer_config.json a model_max_length)",
            )
        })?;

        let hf: HfConfig = read_json(&dir, "config.json")?;
        if let Some(hidden) = hf.hidden_size
            && hidden != pooling_cfg.word_embedding_dimension
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
        if let Some(positions) = hf.max_position_embeddings
            && max_seq_length > positions
        {
            return Err(Error::model(
                &dir,
                "sentence_bert_config.json",
                format!("max_seq_length {max_seq_length} exceeds max_position_embeddings {positions} in config.json"),
            ));
        }

        let st: StConfig = match dir.join(ST_CONFIG).is_file() {
            true => read_json(&dir, ST_CONFIG)?,
            false => StConfig::default(),
        };
        if let Some(n) = st.truncate_dim {
            return Err(Error::model(
                &dir,
                ST_CONFIG,
                format!(
                    "truncate_dim {n} is not read by this pipeline (its vectors would have {} values, not {n}); \
                     remove it from the file to embed at the full dimension, then SET embed.truncate_dim = {n} to \
                     cut them (normalised after the cut)",
                    pooling_cfg.word_embedding_dimension
                ),
            ));
        }
        let default_prompt_name = st.default_prompt_name.filter(|n| !n.is_empty());
        if let Some(name) = default_prompt_name.as_ref().filter(|n| !st.prompts.contains_key(*n)) {
            return Err(Error::model(
                &dir,
                ST_CONFIG,
                format!("default_prompt_name '{name}' is not one of its prompts ({})", prompt_names(&st.prompts)),
            ));
        }

        let tokenizer_path = dir.join("tokenizer.json");
        if !tokenizer_path.is_file() {
            return Err(Error::model(&dir, "tokenizer.json", "file not found"));
        }
        let onnx_path = ["onnx/model.onnx", "model.onnx"]
            .iter()
            .map(|f| dir.join(f))
            .find(|p| p.is_file())
            .ok_or_else(|| Error::model(&dir, "onnx/model.onnx", "file not found (nor model.onnx)"))?;

        Ok(Self {
            dir,
            onnx_path,
            tokenizer_path,
            max_seq_length,
            pooling,
            normalize,
            dim: pooling_cfg.word_embedding_dimension,
            pad_id: hf.pad_token_id.unwrap_or(0),
            vocab_size: hf.vocab_size,
            max_positions: hf.max_position_embeddings,
            prompts: st.prompts,
            default_prompt_name,
            include_prompt: pooling_cfg.include_prompt,
        })
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
    if let Some(mode) = &cfg.pooling_mode {
        return match mode.as_str() {
            "mean" => Ok(Pooling::Mean),
            "cls" => Ok(Pooling::Cls),
            "max" => Ok(Pooling::Max),
            other => {
                Err(Error::model(dir, file, format!("pooling_mode {other:?} is not supported; use mean, cls or max")))
            }
        };
    }
    // Modes this pipeline does not compute: refused by name, alone or beside another (sentence-transformers
    // concatenates several; a mode left unread here would have been dropped from the vector silently).
    for (set, flag) in [
        (cfg.pooling_mode_mean_sqrt_len_tokens, "pooling_mode_mean_sqrt_len_tokens"),
        (cfg.pooling_mode_weightedmean_tokens, "pooling_mode_weightedmean_tokens"),
        (cfg.pooling_mode_lasttoken, "pooling_mode_lasttoken"),
    ] {
        if set {
            return Err(Error::model(dir, file, format!("{flag} is not supported; use mean, cls or max")));
        }
    }
    let modes = [
        (cfg.pooling_mode_mean_tokens, Pooling::Mean),
        (cfg.pooling_mode_cls_token, Pooling::Cls),
        (cfg.pooling_mode_max_tokens, Pooling::Max),
    ];
    let mut on = modes.iter().filter(|(set, _)| *set).map(|(_, p)| *p);
    match (on.next(), on.next()) {
        (Some(p), None) => Ok(p),
        (None, _) => Err(Error::model(
            dir,
            file,
            "sets no pooling mode; set one of pooling_mode_mean_tokens, _cls_token, _max_tokens",
        )),
        (Some(_), Some(_)) => {
            Err(Error::model(dir, file, "sets more than one pooling mode; concatenated poolings are not supported"))
        }
    }
}

/// The sentence-transformers modules this pipeline runs: the transformer (the ONNX graph), one Pooling and a
/// Normalize. Any other (Dense, LayerNorm, WordWeights, a CLIP model, a Router, …) would change the vectors in
/// a way it does not compute, so the model is refused at load, naming the module and its folder.
fn refuse_other_modules(dir: &Path, modules: &[Module]) -> Result<()> {
    const RUN: [&str; 3] = ["Transformer", "Pooling", "Normalize"];
    for module in modules {
        let name = module.kind.rsplit('.').next().unwrap_or(&module.kind);
        if RUN.contains(&name) {
            continue;
        }
        let folder = if module.path.is_empty() { String::from("the top folder") } else { module.path.clone() };
        let why = match name {
            "CLIPModel" => "images are not supported; this pipeline embeds text with text models",
            "Dense" => "its projection is not applied by this pipeline, which would give other vectors",
            _ => "this pipeline runs only Transformer, Pooling and Normalize modules",
        };
        return Err(Error::model(
            dir,
            "modules.json",
            format!("module {} ({folder}) is not supported: {why}", module.kind),
        ));
    }
    let poolings = modules.iter().filter(|m| m.kind.ends_with("Pooling")).count();
    if poolings > 1 {
        return Err(Error::model(dir, "modules.json", format!("has {poolings} Pooling modules; one is supported")));
    }
    Ok(())
}

/// Where sentence-transformers keeps its prompts.
const ST_CONFIG: &str = "config_sentence_transformers.json";

fn prompt_names(prompts: &BTreeMap<String, String>) -> String {
    prompts.keys().map(|k| format!("'{k}'")).collect::<Vec<_>>().join(", ")
}

fn read_json<T: for<'de> Deserialize<'de>>(dir: &Path, file: &str) -> Result<T> {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| Error::model(dir, file, format!("cannot read: {e}")))?;
    serde_json::from_str(&text).map_err(|e| Error::model(dir, file, format!("invalid: {e}")))
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

    /// What sentence-transformers would compute and this pipeline does not is refused at load, by name: a
    /// Dense module (its projection was silently left out), an image model, pooling modes it does not compute
    /// (weighted mean beside mean was silently dropped), last-token pooling in its older flag form (which was
    /// told it set no mode), truncate_dim (read by nothing).
    #[test]
    fn modules_and_settings_it_does_not_compute_are_refused_by_name() {
        let cases: [(&str, &str, &str, &[&str]); 6] = [
            (
                "modules.json",
                r#"[{"path":"","type":"sentence_transformers.models.Transformer"},
                   {"path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
                   {"path":"2_Dense","type":"sentence_transformers.models.Dense"},
                   {"path":"3_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
                "modules.json",
                &["sentence_transformers.models.Dense", "2_Dense", "projection"],
            ),
            (
                "modules.json",
                r#"[{"path":"","type":"sentence_transformers.models.CLIPModel"}]"#,
                "modules.json",
                &["CLIPModel", "images are not supported"],
            ),
            (
                "1_Pooling/config.json",
                r#"{"word_embedding_dimension": 8, "pooling_mode_mean_tokens": true,
                    "pooling_mode_weightedmean_tokens": true}"#,
                "1_Pooling/config.json",
                &["pooling_mode_weightedmean_tokens is not supported"],
            ),
            (
                "1_Pooling/config.json",
                r#"{"word_embedding_dimension": 8, "pooling_mode_lasttoken": true}"#,
                "1_Pooling/config.json",
                &["pooling_mode_lasttoken is not supported"],
            ),
            (
                "config_sentence_transformers.json",
                r#"{"truncate_dim": 4}"#,
                "config_sentence_transformers.json",
                &["truncate_dim 4 is not read", "8 values", "SET embed.truncate_dim = 4"],
            ),
            (
                "modules.json",
                r#"[{"path":"","type":"sentence_transformers.models.Transformer"},
                   {"path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
                   {"path":"1_Pooling","type":"sentence_transformers.models.Pooling"}]"#,
                "modules.json",
                &["2 Pooling modules"],
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

    #[test]
    fn reads_a_complete_directory() {
        let tmp = tempfile::tempdir().unwrap();
        write_minimal(tmp.path());
        let spec = ModelSpec::load(tmp.path()).unwrap();
        assert_eq!((spec.dim, spec.max_seq_length, spec.pooling, spec.normalize), (8, 16, Pooling::Mean, true));
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
                        r#"{"word_embedding_dimension": 8, "pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true}"#,
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
        assert_eq!((spec.dim, spec.max_seq_length, spec.pooling), (8, 12, Pooling::Cls));
        // transformers' 1e30 means "no limit", which is no max_seq_length.
        std::fs::write(d.join("tokenizer_config.json"), r#"{"model_max_length": 1e30}"#).unwrap();
        let err = ModelSpec::load(d).unwrap_err().to_string();
        assert!(err.contains("sentence_bert_config.json") && err.contains("model_max_length"), "{err}");
        std::fs::write(d.join("tokenizer_config.json"), r#"{"model_max_length": 12}"#).unwrap();
        std::fs::write(
            d.join("1_Pooling/config.json"),
            r#"{"embedding_dimension": 8, "pooling_mode": "weightedmean"}"#,
        )
        .unwrap();
        let err = ModelSpec::load(d).unwrap_err().to_string();
        assert!(err.contains("1_Pooling/config.json") && err.contains("weightedmean"), "{err}");
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

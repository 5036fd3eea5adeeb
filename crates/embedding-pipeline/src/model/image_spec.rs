//! Reading an image-text model's directory (CLIP, SigLIP) as sentence-transformers saves it: one module, either a
//! `Transformer` whose `modality_config` routes text to `get_text_features` and images to `get_image_features`
//! (sentence-transformers 5.4 and later) or the older `CLIPModel`, in the top folder or a folder of its own. Its
//! text tower is `onnx/model.onnx` (a `sentence_embedding` output: the graph pools and projects), its vision tower
//! `onnx/vision_model.onnx`, both written by `scripts/export-onnx`.

use std::path::Path;

use serde::Deserialize;

use super::image::ImageProcessing;
use super::st_files::{Module, read_json, read_tokenizer_config};
use super::tokenize::TruncationSide;
use crate::error::{Error, Result};

/// What an image-text model adds to its spec.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageSpec {
    /// The module's folder in the directory ("" for the top folder).
    pub folder: String,
    /// `clip` or `siglip` (config.json's model_type).
    pub model_type: String,
    /// How its images are decoded, resized and normalised.
    pub processing: ImageProcessing,
    /// The processor config's file, relative to the directory (hashed into the fingerprint).
    pub processor_file: String,
    /// SigLIP's texts: padded to this many tokens whatever their length (processing_kwargs' `max_length` with
    /// `padding: "max_length"`), as the model was trained; its text graph then takes no attention mask.
    pub text_length: Option<usize>,
}

#[derive(Deserialize)]
struct HfConfig {
    model_type: Option<String>,
    projection_dim: Option<usize>,
    #[serde(default)]
    text_config: TowerConfig,
    #[serde(default)]
    vision_config: TowerConfig,
}

#[derive(Deserialize, Default)]
struct TowerConfig {
    hidden_size: Option<usize>,
    projection_size: Option<usize>,
    max_position_embeddings: Option<usize>,
    pad_token_id: Option<u32>,
    vocab_size: Option<usize>,
}

#[derive(Deserialize, Default)]
struct Sbert {
    #[serde(default)]
    modality_config: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    processing_kwargs: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    transformer_task: Option<String>,
}

/// The module of an image-text model, when `modules` is one: its folder.
pub(super) fn image_module<'a>(dir: &Path, modules: &'a [Module]) -> Option<&'a Module> {
    let [module] = modules else { return None };
    let kind = module.kind.rsplit('.').next().unwrap_or(&module.kind);
    let folder = module.path.trim_end_matches('/');
    let sbert = || -> Option<Sbert> {
        let file = if folder.is_empty() {
            "sentence_bert_config.json".into()
        } else {
            format!("{folder}/sentence_bert_config.json")
        };
        serde_json::from_str(&std::fs::read_to_string(dir.join(file)).ok()?).ok()
    };
    match kind {
        "CLIPModel" => Some(module),
        "Transformer" => sbert()?.modality_config?.contains_key("image").then_some(module),
        _ => None,
    }
}

/// What the model spec of an image-text model takes from its files (its text tower's, and the vision side).
pub(super) struct ImageTextModel {
    pub(super) onnx_path: std::path::PathBuf,
    pub(super) tokenizer_path: std::path::PathBuf,
    pub(super) max_seq_length: usize,
    pub(super) dim: usize,
    pub(super) truncation_side: TruncationSide,
    pub(super) pad_id: u32,
    pub(super) vocab_size: Option<usize>,
    pub(super) max_positions: Option<usize>,
    pub(super) positions_from: String,
    pub(super) image: ImageSpec,
}

/// The image-text model in `module`.
pub(super) fn load(dir: &Path, module: &Module) -> Result<ImageTextModel> {
    let folder = module.path.trim_end_matches('/').to_string();
    let at = |name: &str| if folder.is_empty() { name.to_string() } else { format!("{folder}/{name}") };
    let sbert: Sbert = match dir.join(at("sentence_bert_config.json")).is_file() {
        true => read_json(dir, &at("sentence_bert_config.json"))?,
        false => Sbert::default(),
    };
    let bad = |file: String, m: String| Error::model(dir, file, m);
    if let Some(task) = sbert.transformer_task.as_deref().filter(|t| *t != "feature-extraction") {
        return Err(bad(
            at("sentence_bert_config.json"),
            format!("transformer_task {task:?} is not feature-extraction"),
        ));
    }
    check_routing(dir, &at("sentence_bert_config.json"), &sbert)?;
    let hf: HfConfig = read_json(dir, &at("config.json"))?;
    let (model_type, dim) = dimension(dir, &at("config.json"), &hf)?;
    let text_length = text_length(dir, &at("sentence_bert_config.json"), &sbert)?;
    let processing = ImageProcessing::load(dir, &folder)?;
    let processor_file = if dir.join(at("processor_config.json")).is_file() {
        at("processor_config.json")
    } else {
        at("preprocessor_config.json")
    };
    let (tokenizer_cfg, truncation_side) = read_tokenizer_config(dir, &at("tokenizer_config.json"))?;
    let positions = hf.text_config.max_position_embeddings;
    let max_seq_length = tokenizer_cfg
        .model_max_length
        .filter(|n| *n >= 2.0 && *n <= 1e6)
        .map(|n| n as usize)
        .or(positions)
        .ok_or_else(|| bad(at("tokenizer_config.json"), "needs a model_max_length".into()))?;
    // Padded to a fixed length, a text is cut there too.
    let max_seq_length = text_length.map_or(max_seq_length, |n| max_seq_length.min(n));
    if let Some(p) = positions.filter(|p| max_seq_length > *p) {
        return Err(bad(
            at("tokenizer_config.json"),
            format!("model_max_length {max_seq_length} exceeds the {p} positions of the text tower (config.json)"),
        ));
    }
    let tokenizer_path = dir.join(at("tokenizer.json"));
    if !tokenizer_path.is_file() {
        return Err(bad(at("tokenizer.json"), "file not found".into()));
    }
    let onnx_path = dir.join("onnx/model.onnx");
    if !onnx_path.is_file() {
        return Err(bad(
            "onnx/model.onnx".into(),
            "file not found: export the model with scripts/export-onnx, which writes both towers".into(),
        ));
    }
    Ok(ImageTextModel {
        onnx_path,
        tokenizer_path,
        max_seq_length,
        dim,
        truncation_side,
        pad_id: hf.text_config.pad_token_id.unwrap_or(0),
        vocab_size: hf.text_config.vocab_size,
        max_positions: positions,
        positions_from: positions
            .map(|p| format!("text_config.max_position_embeddings {p} in config.json"))
            .unwrap_or_default(),
        image: ImageSpec { folder, model_type, processing, processor_file, text_length },
    })
}

/// What each modality is routed to (the older CLIPModel's defaults when the file says nothing): both towers'
/// pooled output, as scripts/export-onnx exports them, and nothing else.
fn check_routing(dir: &Path, file: &str, sbert: &Sbert) -> Result<()> {
    let bad = |m: String| Error::model(dir, file, m);
    if let Some(routing) = &sbert.modality_config {
        for (modality, method) in [("text", "get_text_features"), ("image", "get_image_features")] {
            let said = routing.get(modality);
            let field = |k: &str| said.and_then(|s| s.get(k)).and_then(|v| v.as_str());
            if field("method") != Some(method) || field("method_output_name") != Some("pooler_output") {
                return Err(bad(format!(
                    "modality_config routes {modality} to {}; this pipeline runs {method}'s pooler_output, as \
                         scripts/export-onnx exports it",
                    said.map_or("nothing".to_string(), |s| s.to_string())
                )));
            }
        }
        if let Some(other) = routing.keys().find(|k| *k != "text" && *k != "image") {
            return Err(bad(format!(
                "modality_config also routes {other}; this pipeline embeds texts and images, one at a time"
            )));
        }
    }
    Ok(())
}

/// The model type and the width of both towers' vectors, which must agree.
fn dimension(dir: &Path, file: &str, hf: &HfConfig) -> Result<(String, usize)> {
    let bad = |m: String| Error::model(dir, file, m);
    let model_type = hf.model_type.clone().unwrap_or_default();
    let dim = match model_type.as_str() {
        "clip" => hf.projection_dim.unwrap_or(512),
        "siglip" => hf.vision_config.hidden_size.unwrap_or(768),
        other => {
            return Err(bad(format!(
                "model_type {other:?} is not an image-text model this pipeline runs (clip, siglip)"
            )));
        }
    };
    let text_dim = match model_type.as_str() {
        "clip" => dim,
        _ => hf.text_config.projection_size.or(hf.text_config.hidden_size).unwrap_or(768),
    };
    if text_dim != dim {
        return Err(bad(format!(
            "its text tower gives {text_dim} values and its vision tower {dim}: they share no space"
        )));
    }
    Ok((model_type, dim))
}

/// The fixed length SigLIP's texts are padded to (processing_kwargs `{"text": {"padding": "max_length",
/// "max_length": N}}`), or None; any other tokenizer argument is refused.
fn text_length(dir: &Path, file: &str, sbert: &Sbert) -> Result<Option<usize>> {
    let bad = |m: String| Error::model(dir, file, m);
    if let Some(other) = sbert.processing_kwargs.keys().find(|k| *k != "text") {
        return Err(bad(format!(
            "processing_kwargs {other} {} are processor arguments this pipeline does not apply",
            sbert.processing_kwargs[other]
        )));
    }
    let Some(kwargs) = sbert.processing_kwargs.get("text") else { return Ok(None) };
    let object = kwargs.as_object().cloned().unwrap_or_default();
    let length = object.get("max_length").and_then(|n| n.as_u64()).filter(|n| *n >= 2);
    match (object.get("padding").and_then(|p| p.as_str()), length, object.len()) {
        (Some("max_length"), Some(n), 2) => Ok(Some(n as usize)),
        _ => Err(bad(format!(
            "processing_kwargs text {kwargs} are tokenizer arguments this pipeline does not apply (it applies \
             {{\"padding\": \"max_length\", \"max_length\": N}}, SigLIP's)"
        ))),
    }
}

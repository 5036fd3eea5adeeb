//! Texts embedded directly, as a campaign with the same model directory embeds them: the directory's own
//! settings (or the defaults), its fingerprint, one vector per text in order (`pipeline embed`, and a
//! program's `embed(texts)`).

use crate::campaign::Fingerprint;
use crate::model::TextEmbedder;
use crate::options::EmbedOptions;
use crate::process::interrupt::StopToken;
use crate::{Error, Result};

/// The vectors of some texts and the fingerprint they were made under.
#[derive(Debug, Clone)]
pub struct Embeddings {
    pub fingerprint: Fingerprint,
    /// One vector of `fingerprint.dim` values per text, row after row.
    pub vectors: Vec<f32>,
}

impl Embeddings {
    /// The vectors, one slice per text, in the texts' order.
    pub fn rows(&self) -> impl Iterator<Item = &[f32]> {
        self.vectors.chunks(self.fingerprint.dim.max(1))
    }
}

/// Embed `texts` under `options` (its model directory, device and settings); refused with no texts. A stop
/// asked for through `stop` ends it before its next model call, with [`Error::Stopped`].
pub async fn embed_texts(texts: Vec<String>, options: &EmbedOptions, stop: &StopToken) -> Result<Embeddings> {
    if texts.is_empty() {
        return Err(Error::Refused("no texts to embed".into()));
    }
    let (settings, fingerprint) = Fingerprint::for_options(options)?;
    let (embedder, stop) = (options.embedder()?, stop.clone());
    let embedded = tokio::task::spawn_blocking(move || {
        let refs: Vec<Option<&str>> = texts.iter().map(|t| Some(t.as_str())).collect();
        // A stop asked for (ctrl-C in a program) ends it before its next model call.
        embedder.embed_with_progress(&refs, &settings, &|_, _| {}, &|| stop.requested())
    })
    .await??;
    Ok(Embeddings { fingerprint, vectors: embedded.vectors })
}

/// Embed image files' bytes under `options` with the vision tower of its image-text model (CLIP, SigLIP), one
/// vector per image in order; `names` name the images in errors (their paths). A bad image stops it, named.
pub async fn embed_images(
    images: Vec<Vec<u8>>,
    names: Vec<String>,
    options: &EmbedOptions,
    stop: &StopToken,
) -> Result<Embeddings> {
    if images.is_empty() {
        return Err(Error::Refused("no images to embed".into()));
    }
    let spec = crate::model::ModelSpec::load(options.model_dir())?;
    if spec.image.is_none() {
        return Err(Error::model(
            &spec.dir,
            "modules.json",
            "is a text model's: images need an image-text model (CLIP, SigLIP)",
        ));
    }
    let (_, fingerprint) = Fingerprint::for_options(options)?;
    let (embedder, stop, options) = (options.vision_embedder()?, stop.clone(), options.clone());
    let embedded = tokio::task::spawn_blocking(move || {
        let refs: Vec<_> = images.iter().map(|i| Some(crate::model::vision::ImageSource::Bytes(i))).collect();
        embedder.embed(&refs, options.batch_images, options.max_image_pixels, false, &|| stop.requested())
    })
    .await?
    .map_err(|e| match e {
        crate::model::vision::EmbedImageError::Bad(bad) => {
            Error::Refused(format!("image {} {}", names.get(bad.row).cloned().unwrap_or_default(), bad.error))
        }
        crate::model::vision::EmbedImageError::Other(e) => e,
    })?;
    Ok(Embeddings { fingerprint, vectors: embedded.vectors })
}

//! `pipeline embed [TEXT]… [--file FILE] [--model DIR] [--device D]`: the vectors of a few texts, one JSON
//! object per line, made exactly as a campaign with that model directory's own settings makes them. For
//! scripts: `scripts/export-onnx` verifies an export with it, through the pipeline's own tokenising and
//! pooling rather than a copy of them.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;

use super::ExitStatus;
use super::args::Runtime;
use super::printer::{Printer, err};

use embedding_pipeline::ops::embed::{embed_images, embed_texts};
use embedding_pipeline::options::EmbedOptions;
use embedding_pipeline::process::interrupt::StopToken;

/// One line of output.
#[derive(Serialize)]
struct Line<'a> {
    /// Position of the text among all texts given (command line first, then the file's).
    index: usize,
    vector: &'a [f32],
}

/// Texts from a JSON lines file: each line a JSON string, or an object with a string `text` field.
/// Blank lines are skipped; any other line is an error that names the file and line.
pub fn read_texts(file: &Path) -> anyhow::Result<Vec<String>> {
    let reader =
        std::io::BufReader::new(std::fs::File::open(file).with_context(|| format!("cannot open {}", file.display()))?);
    let mut texts = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("{} line {}: not valid UTF-8", file.display(), i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let text = match serde_json::from_str::<serde_json::Value>(&line) {
            Ok(serde_json::Value::String(s)) => s,
            Ok(serde_json::Value::Object(mut o)) => match o.remove("text") {
                Some(serde_json::Value::String(s)) => s,
                _ => bail!("{} line {}: the object has no string field \"text\"", file.display(), i + 1),
            },
            Ok(_) | Err(_) => bail!(
                "{} line {}: expected a JSON string or an object with a \"text\" field (JSON lines)",
                file.display(),
                i + 1
            ),
        };
        texts.push(text);
    }
    Ok(texts)
}

/// `pipeline embed`'s arguments.
#[derive(Debug, clap::Args)]
pub struct EmbedArgs {
    /// Texts to embed.
    texts: Vec<String>,
    /// More texts, from a JSON lines file: each line a JSON string or an object with a "text" field.
    #[arg(long, value_name = "FILE")]
    file: Option<PathBuf>,
    /// An image file to embed with an image-text model's vision tower (CLIP, SigLIP); repeat for more. Images
    /// and texts are not mixed in one call.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["texts", "file"])]
    image: Vec<PathBuf>,
    /// The model directory (default: the default model, as embed.model).
    #[arg(long, value_name = "DIR")]
    model: Option<String>,
    /// Where the model runs: cpu, cuda or cuda:N (as embed.device).
    #[arg(long, value_name = "DEVICE")]
    device: Option<String>,
    #[command(flatten)]
    runtime: Runtime,
}

/// Embed the texts and print one `{"index": i, "vector": […]}` line per text, in order, after the
/// fingerprint they were made under (on standard error).
pub async fn run(args: EmbedArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let EmbedArgs { mut texts, file, image, model, device, runtime } = args;
    runtime.apply();
    if let Some(file) = file {
        texts.extend(read_texts(&file)?);
    }
    if texts.is_empty() && image.is_empty() {
        bail!("no texts: give them as arguments, or --file FILE (JSON lines); or images with --image FILE");
    }
    let mut options = EmbedOptions::default();
    if let Some(model) = model {
        options = options.with_model(model);
    }
    if let Some(device) = device {
        options.device = device;
    }
    // No signal handler: ctrl-C ends `pipeline embed` at once, as nothing is written.
    let embedded = if image.is_empty() {
        embed_texts(texts, &options, &StopToken::new()).await?
    } else {
        let bytes = image
            .iter()
            .map(|p| std::fs::read(p).with_context(|| format!("cannot read {}", p.display())))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let names = image.iter().map(|p| p.display().to_string()).collect();
        embed_images(bytes, names, &options, &StopToken::new()).await?
    };
    err!(printer, "fingerprint: {}", embedded.fingerprint.to_json());
    let mut out = std::io::BufWriter::new(printer.stdout());
    for (index, vector) in embedded.rows().enumerate() {
        serde_json::to_writer(&mut out, &Line { index, vector })?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(ExitStatus::Success)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_strings_or_text_fields_and_a_bad_line_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t.jsonl");
        std::fs::write(&f, "\"one\"\n\n{\"text\": \"two\", \"id\": 3}\n").unwrap();
        assert_eq!(read_texts(&f).unwrap(), ["one", "two"]);
        std::fs::write(&f, "\"one\"\n{\"id\": 3}\n").unwrap();
        let e = read_texts(&f).unwrap_err().to_string();
        assert!(e.contains("t.jsonl line 2") && e.contains("\"text\""), "{e}");
        std::fs::write(&f, "plain words\n").unwrap();
        let e = read_texts(&f).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("JSON lines"), "{e}");
    }
}

//! The 48 GB split: how a card's memory divides between the model (its weights, and what its session holds
//! after load) and the working memory of its calls, and whether a model fits a 48 GB or an 80 GB card at all.
//!
//! The weights' bytes are exact, from the graph's initializers. The working memory per padded token is
//! measured by `pipeline probe` on the device it runs on. On a GPU the model's share is measured (the GPU's
//! memory in use once the sessions are loaded); on the CPU it is the weights' bytes times the sessions a GPU
//! would get ([`auto_sessions_per_gpu`]) plus a CUDA context, and the working memory per token is the CPU's
//! times [`GPU_WORKING_PER_CPU`], so the statement is an estimate and says so.

use crate::model::device::auto_sessions_per_gpu;

use serde::{Deserialize, Serialize};

/// Bytes in a GiB.
const GIB: u64 = 1 << 30;
/// The share of a card's memory planned for: the rest is headroom for the allocator's fragmentation and
/// other processes. (`pipeline probe`'s own steps stop at 80% of its budget, which also leaves room for what a
/// run holds besides its model calls; a card's share is counted before that.)
pub const MARGIN: f64 = 0.9;
/// What a CUDA context and ONNX Runtime's CUDA libraries (cuBLAS, cuDNN workspaces) hold on a card before any
/// weight, where it has not been measured: about 1 GiB on an A100 or an RTX A6000.
pub const CUDA_CONTEXT_BYTES: u64 = GIB;

/// A GPU's working memory a padded token over the CPU's, for the same model and calls: on an H200 (ONNX Runtime
/// 1.31.1, CUDA 13) a 0.6B Qwen3 decoder in float32 took 261 KiB a padded token in its calls, against 80 KiB on
/// this project's CPU (ONNX Runtime's CUDA arena grows in large steps and keeps them). One model measured, so
/// the CPU's statements stay estimates; a probe on the card replaces them.
pub const GPU_WORKING_PER_CPU: f64 = 3.3;

/// The cards campaigns rent, by memory size.
pub const CARDS: [(&str, u64); 2] =
    [("48 GB (RTX A6000, RTX 6000 Ada, A40)", 48 * GIB), ("80 GB (A100 80GB, H100)", 80 * GIB)];

/// Whether a model fits one card, and what it leaves for calls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CardFit {
    pub card: String,
    pub memory_bytes: u64,
    /// What the model takes on it: measured on a GPU; otherwise the weights once per session a GPU would get,
    /// plus [`CUDA_CONTEXT_BYTES`].
    pub model_bytes: u64,
    /// [`MARGIN`] of the card, less the model.
    pub left_for_calls_bytes: u64,
    /// Padded tokens one call can take in what is left (0 when the model does not fit).
    pub batch_tokens: u64,
    /// Whether the model and one call of the longest text fit.
    pub fits: bool,
}

/// How a card's memory divides for one model, as `pipeline probe` measured it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MemorySplit {
    /// The graph's weights, bytes, by element type (exact, from its initializers).
    pub weights: Vec<(String, u64)>,
    pub weights_bytes: u64,
    /// What loading the job and its model added to the memory measured (the process's resident set since the
    /// command started on the CPU, the GPU's memory in use on a GPU), bytes.
    pub session_bytes: u64,
    /// Working memory per padded token of a call, bytes, from the largest call that fitted.
    pub working_bytes_per_token: u64,
    /// Where the figures were measured, and so how far the card statements are measured or estimated.
    pub measured_on: String,
    /// Whether the model's share of a card was measured on that kind of device (a GPU).
    pub measured_on_gpu: bool,
    /// Padded tokens of a call of the longest text.
    pub longest_tokens: u64,
    /// Sessions a GPU gets for this model when left automatic; the estimate counts the weights that often.
    /// (Absent in trial.json files written before it: 0, shown as 1.)
    #[serde(default)]
    pub sessions_per_gpu: usize,
    pub cards: Vec<CardFit>,
}

impl MemorySplit {
    /// The split for a model of `weights` (bytes by element type) whose loading added `session_bytes` and
    /// whose calls took `working_bytes_per_token`, measured on a GPU or not.
    pub fn new(
        weights: Vec<(String, u64)>,
        session_bytes: u64,
        working_bytes_per_token: u64,
        longest_tokens: u64,
        measured_on: String,
        measured_on_gpu: bool,
    ) -> Self {
        let weights_bytes = weights.iter().map(|(_, b)| b).sum();
        let sessions_per_gpu = auto_sessions_per_gpu(weights_bytes);
        let (model_bytes, per_token) = match measured_on_gpu {
            true => (session_bytes, working_bytes_per_token),
            false => (
                weights_bytes * sessions_per_gpu as u64 + CUDA_CONTEXT_BYTES,
                (working_bytes_per_token as f64 * GPU_WORKING_PER_CPU) as u64,
            ),
        };
        let cards = CARDS
            .iter()
            .map(|(card, memory)| {
                let usable = (*memory as f64 * MARGIN) as u64;
                let left = usable.saturating_sub(model_bytes);
                let batch_tokens = if model_bytes >= usable { 0 } else { left / per_token.max(1) };
                CardFit {
                    card: card.to_string(),
                    memory_bytes: *memory,
                    model_bytes,
                    left_for_calls_bytes: left,
                    batch_tokens,
                    fits: model_bytes < usable && batch_tokens >= longest_tokens.max(1),
                }
            })
            .collect();
        Self {
            weights,
            weights_bytes,
            session_bytes,
            working_bytes_per_token,
            measured_on,
            measured_on_gpu,
            longest_tokens,
            sessions_per_gpu,
            cards,
        }
    }

    /// One line per card, and which card to rent.
    pub fn statements(&self) -> Vec<String> {
        let how = match self.measured_on_gpu {
            true => "measured".to_string(),
            false => format!(
                "estimated from the CPU: {} session(s) of the weights and a CUDA context, the CPU's working memory \
                 times {GPU_WORKING_PER_CPU}, as a decoder measured on an H200",
                self.sessions_per_gpu.max(1)
            ),
        };
        let mut lines: Vec<String> = self
            .cards
            .iter()
            .map(|c| match c.fits {
                true => format!(
                    "{}: fits; the model takes {}, {} ({}%) is left for calls: about {} padded tokens a call ({how})",
                    c.card,
                    gib(c.model_bytes),
                    gib(c.left_for_calls_bytes),
                    (MARGIN * 100.0) as u32,
                    thousands(c.batch_tokens)
                ),
                false if c.batch_tokens == 0 => format!(
                    "{}: does not fit; the model alone takes {} of its {} ({}% of it)",
                    c.card,
                    gib(c.model_bytes),
                    gib(c.memory_bytes),
                    (MARGIN * 100.0) as u32
                ),
                false => format!(
                    "{}: does not fit; after the model's {}, a call of the longest text ({} tokens) needs more than \
                     the {} left",
                    c.card,
                    gib(c.model_bytes),
                    self.longest_tokens,
                    gib(c.left_for_calls_bytes)
                ),
            })
            .collect();
        match (self.cards.first().map(|c| c.fits), self.cards.get(1).map(|c| c.fits)) {
            (Some(false), Some(true)) => {
                lines.push("48 GB is not enough for this model: rent an A100 80GB (or an H100)".to_string())
            }
            (Some(false), Some(false)) => lines.push(
                "no single card here holds this model: a smaller dtype (float16), a smaller max_tokens or a \
                 smaller model"
                    .to_string(),
            ),
            _ => {}
        }
        lines
    }
}

/// `1.23 GiB`, or MiB below one GiB.
pub fn gib(bytes: u64) -> String {
    if bytes >= GIB { format!("{:.2} GiB", bytes as f64 / GIB as f64) } else { format!("{} MiB", bytes >> 20) }
}

/// A count with thousands separators: `1,234,567`.
pub(crate) fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_grouped_by_thousands() {
        let shown: Vec<String> = [0, 7, 999, 1_000, 12_345, 999_999, 1_234_567, u64::MAX].map(thousands).into();
        assert_eq!(shown, ["0", "7", "999", "1,000", "12,345", "999,999", "1,234,567", "18,446,744,073,709,551,615"]);
    }

    fn split(weights_bytes: u64, per_token: u64, gpu: bool, session: u64) -> MemorySplit {
        MemorySplit::new(vec![("float32".into(), weights_bytes)], session, per_token, 512, "test".into(), gpu)
    }

    /// A 12B model in float32 (48 GB of weights) with 2 MiB of working memory a token on the CPU: the weights
    /// alone pass 90% of a 48 GB card, an 80 GB card holds them with room for calls, and the statement names the
    /// A100. (An 8B decoder in float32, 32 GB in one session, does fit a 48 GB card: about 1,900 tokens a call at
    /// 2 MiB a token on the CPU, 6.6 on a GPU.)
    #[test]
    fn a_model_past_48_gb_names_the_80_gb_card() {
        let s = split(48_000_000_000, 2 << 20, false, 0);
        let (c48, c80) = (&s.cards[0], &s.cards[1]);
        assert_eq!(c48.model_bytes, 48_000_000_000 + CUDA_CONTEXT_BYTES);
        assert_eq!(c48.batch_tokens, 0);
        assert!(!c48.fits && c80.fits, "{s:?}");
        let usable80 = (80.0 * GIB as f64 * MARGIN) as u64;
        assert_eq!(c80.batch_tokens, (usable80 - c80.model_bytes) / ((2u64 << 20) as f64 * GPU_WORKING_PER_CPU) as u64);
        let text = s.statements().join("\n");
        assert!(text.contains("rent an A100 80GB") && text.contains("estimated from the CPU"), "{text}");

        assert!(text.contains("the model alone takes"), "{text}");
        // A 20B model in float32 fits neither; an 8B one fits both.
        assert!(split(80_000_000_000, 2 << 20, false, 0).statements().join("\n").contains("no single card"));
        let eight = split(32_000_000_000, 2 << 20, false, 0);
        assert!(eight.cards.iter().all(|c| c.fits) && eight.cards[0].batch_tokens > 1_900, "{eight:?}");
        // Room for the weights but not for one call of the longest text.
        let tight = split(45_000_000_000, 1 << 20, false, 0);
        assert!(!tight.cards[0].fits && tight.cards[0].batch_tokens > 0, "{tight:?}");
        assert!(tight.statements()[0].contains("a call of the longest text (512 tokens) needs more"), "{tight:?}");
    }

    /// Estimated from the CPU, a model small enough for two sessions a GPU counts its weights twice; one past
    /// 4 GiB once.
    #[test]
    fn the_estimate_counts_the_weights_once_per_session_a_gpu_gets() {
        let small = split(1 << 30, 1 << 10, false, 0);
        assert_eq!(small.sessions_per_gpu, 2);
        assert_eq!(small.cards[0].model_bytes, 2 * (1 << 30) + CUDA_CONTEXT_BYTES);
        assert!(small.statements()[0].contains("2 session(s) of the weights"), "{:?}", small.statements());
        let large = split(5 << 30, 1 << 10, false, 0);
        assert_eq!((large.sessions_per_gpu, large.cards[0].model_bytes), (1, (5 << 30) + CUDA_CONTEXT_BYTES));
        // Measured on a GPU, the share is what the sessions loaded took, however many there were.
        assert_eq!(split(1 << 30, 1 << 10, true, 3 << 30).cards[0].model_bytes, 3 << 30);
    }

    #[test]
    fn on_a_gpu_the_measured_session_is_the_models_share() {
        let s = split(1_000, 1 << 10, true, 3 * GIB);
        assert_eq!(s.cards[0].model_bytes, 3 * GIB);
        assert!(s.statements()[0].contains("fits; the model takes 3.00 GiB") && s.statements()[0].contains("measured"));
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(gib(512 << 20), "512 MiB");
    }
}

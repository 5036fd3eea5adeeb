//! The command line's words for the library's choices: clap's value enums, each turned into the library's type.

use embedding_pipeline::lance::Metric;
use embedding_pipeline::lance::maintain::IndexKind;

/// How vectors are compared (`--metric`): [`Metric`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum MetricArg {
    /// 1 - cosine similarity (what normalised sentence embeddings are made for).
    #[default]
    Cosine,
    /// Squared Euclidean distance.
    L2,
    /// Negative dot product.
    Dot,
}

impl From<MetricArg> for Metric {
    fn from(m: MetricArg) -> Self {
        match m {
            MetricArg::Cosine => Metric::Cosine,
            MetricArg::L2 => Metric::L2,
            MetricArg::Dot => Metric::Dot,
        }
    }
}

/// The kind of vector index `pipeline index` builds (`--kind`): [`IndexKind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum IndexKindArg {
    /// IVF partitions of product-quantised vectors: small, fast, approximate; needs 256 rows to train.
    IvfPq,
    /// IVF partitions holding HNSW graphs over scalar-quantised vectors: more recall, more memory.
    IvfHnswSq,
}

impl From<IndexKindArg> for IndexKind {
    fn from(k: IndexKindArg) -> Self {
        match k {
            IndexKindArg::IvfPq => IndexKind::IvfPq,
            IndexKindArg::IvfHnswSq => IndexKind::IvfHnswSq,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::ValueEnum;

    use super::*;

    /// The command's words are the library's names, which the run records and `--json` outputs use.
    #[test]
    fn the_words_are_the_library_names() {
        for m in MetricArg::value_variants() {
            assert_eq!(m.to_possible_value().unwrap().get_name(), Metric::from(*m).name());
        }
        for k in IndexKindArg::value_variants() {
            assert_eq!(k.to_possible_value().unwrap().get_name(), IndexKind::from(*k).name());
        }
    }
}

//! Evaluate representations: how well
//! each representation retrieves the judged documents of held-out queries, side by side. Each dataset's queries
//! are embedded with its own model directory under its own fingerprint (as `pipeline search` does), every
//! stored vector is scored against every query (exact cosine, no index: the representation is measured, not the
//! index), and recall@k, MRR@10 and nDCG@10 are reported as BEIR and trec_eval define them.
//!
//! `--overlap K` with two datasets of the same ids: for a seeded sample of ids, how many of each one's K
//! nearest neighbours under the first representation are still among its K nearest under the second (how much
//! a new representation moves the corpus).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float32Type};
use futures::TryStreamExt;
use serde::Serialize;

use super::sample::{Lowest, seeded_rank};
use crate::lance::records::fingerprint_of_dataset;
use crate::lance::{lance_err, open_dataset};
use crate::model::TextEmbedder;
use crate::{Error, Result};

/// The cut-off of MRR and nDCG (as BEIR and MTEB report them).
pub const CUTOFF: usize = 10;

/// What to evaluate, and how.
#[derive(Debug, Clone)]
pub struct EvaluateOptions {
    /// Lance datasets: `path`, `path@version` or `path@tag`.
    pub datasets: Vec<String>,
    /// The judged queries, as queries and relevance judgements or as (query, id) pairs.
    pub judgements: Option<Judgements>,
    /// The cut-offs of recall.
    pub ks: Vec<usize>,
    /// The model directory, where the run records do not name it (one dataset only).
    pub model: Option<PathBuf>,
    /// Embed the queries with this prompt of each model (e5's `query`) instead of the documents' own.
    pub query_prompt: Option<String>,
    /// The id column (default: each dataset's own, as it was written, else `id`).
    pub id_column: Option<String>,
    pub column: String,
    /// Neighbours compared between two datasets, and how many ids are sampled for it.
    pub overlap: Option<usize>,
    pub overlap_sample: usize,
    pub seed: u64,
}

/// Held-out queries and the documents judged relevant to each.
#[derive(Debug, Clone, Default)]
pub struct Judgements {
    /// (query id, text), in file order.
    pub queries: Vec<(String, String)>,
    /// Query id → document id → gain (above 0: relevant).
    pub relevant: HashMap<String, HashMap<String, f64>>,
    /// Where they were read from, for the report.
    pub source: String,
}

/// What `pipeline evaluate` measured.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct EvaluateReport {
    /// Where the queries and judgements came from.
    pub judgements: Option<String>,
    /// Queries read, and those with at least one relevant document (the others are not scored).
    pub queries: u64,
    pub judged: u64,
    pub ks: Vec<usize>,
    pub datasets: Vec<DatasetScores>,
    pub overlap: Option<Overlap>,
}

/// One dataset's retrieval quality.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct DatasetScores {
    pub dataset: String,
    pub version: u64,
    pub rows: u64,
    /// The fingerprint's model and its checksum, to tell the representations apart.
    pub model: String,
    pub model_sha256: String,
    /// The fingerprint's fields that differ from the first dataset's, in words (none for the first).
    pub differs: Vec<String>,
    #[serde(skip)]
    fingerprint: Option<crate::campaign::Fingerprint>,
    /// (k, mean recall@k) over the judged queries.
    pub recall: Vec<(usize, f64)>,
    pub mrr_at_10: f64,
    pub ndcg_at_10: f64,
    /// Relevant documents that the dataset does not hold (they count as not retrieved).
    pub relevant_missing: u64,
    pub seconds: f64,
}

/// How much the neighbourhoods of the first dataset's ids move in the second.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Overlap {
    pub k: usize,
    pub seed: u64,
    /// Ids sampled (held by both datasets) and sampled ids the second lacks (skipped).
    pub sampled: u64,
    pub not_in_second: u64,
    /// Mean and smallest share of an id's k nearest neighbours in the first that are among its k nearest in the
    /// second (1: the same neighbours).
    pub mean: f64,
    pub min: f64,
}

/// Read queries (JSON lines: `id` or `_id`, and `text` or `query`) and relevance judgements (BEIR's
/// `query-id corpus-id score` or TREC's `query-id 0 corpus-id score`, tab- or space-separated, a header allowed).
pub fn read_queries_and_qrels(queries: &Path, qrels: &Path) -> Result<Judgements> {
    let mut out =
        Judgements { source: format!("{} with {}", queries.display(), qrels.display()), ..Default::default() };
    for (line, v) in json_lines(queries)? {
        let id = field(&v, &["id", "_id", "query-id", "query_id"])
            .ok_or_else(|| Error::Refused(format!("{}:{line}: a query needs an `id` (or `_id`)", queries.display())))?;
        let text = field(&v, &["text", "query"]).ok_or_else(|| {
            Error::Refused(format!("{}:{line}: a query needs a `text` (or `query`)", queries.display()))
        })?;
        out.queries.push((id, text));
    }
    let text =
        std::fs::read_to_string(qrels).map_err(|e| Error::file(format!("cannot read {}", qrels.display()), e))?;
    for (i, l) in text.lines().enumerate() {
        let cols: Vec<&str> = l.split_whitespace().collect();
        let (q, d, gain) = match cols.as_slice() {
            [] => continue,
            [q, d, g] | [q, _, d, g] => (q, d, g),
            _ => {
                return Err(Error::Refused(format!(
                    "{}:{}: a judgement is `query-id corpus-id score` (or TREC's `query-id 0 corpus-id score`), not {l:?}",
                    qrels.display(),
                    i + 1
                )));
            }
        };
        let Ok(gain) = gain.parse::<f64>() else {
            if i == 0 {
                continue; // a header
            }
            return Err(Error::Refused(format!("{}:{}: the score {gain:?} is not a number", qrels.display(), i + 1)));
        };
        out.relevant.entry(q.to_string()).or_default().insert(d.to_string(), gain);
    }
    Ok(out)
}

/// Read (query, relevant document id) pairs, JSON lines: `query` (or `anchor`, `text`) and `id` (or `positive_id`,
/// `corpus_id`); each line one query, its id its line number.
pub fn read_pairs(pairs: &Path) -> Result<Judgements> {
    let mut out = Judgements { source: pairs.display().to_string(), ..Default::default() };
    for (line, v) in json_lines(pairs)? {
        let text = field(&v, &["query", "anchor", "text"]).ok_or_else(|| {
            Error::Refused(format!("{}:{line}: a pair needs a `query` (or `anchor`)", pairs.display()))
        })?;
        let id = field(&v, &["id", "positive_id", "corpus_id"]).ok_or_else(|| {
            Error::Refused(format!("{}:{line}: a pair needs the relevant document's `id`", pairs.display()))
        })?;
        let q = line.to_string();
        out.relevant.entry(q.clone()).or_default().insert(id, 1.0);
        out.queries.push((q, text));
    }
    Ok(out)
}

/// The non-empty lines of a JSON-lines file, parsed, with their line numbers.
fn json_lines(path: &Path) -> Result<Vec<(usize, serde_json::Value)>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::file(format!("cannot read {}", path.display()), e))?;
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        if l.trim().is_empty() {
            continue;
        }
        let v = serde_json::from_str(l)
            .map_err(|e| Error::from(e).context(format!("{}:{}: not a JSON object", path.display(), i + 1)))?;
        out.push((i + 1, v));
    }
    if out.is_empty() {
        return Err(Error::Refused(format!("{} holds no lines", path.display())));
    }
    Ok(out)
}

/// The first of `names` present, a string or a number, as a string.
fn field(v: &serde_json::Value, names: &[&str]) -> Option<String> {
    names.iter().find_map(|n| match v.get(*n)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    })
}

/// Score each dataset on the judged queries, and compare the neighbourhoods of two when asked.
pub async fn evaluate(args: &EvaluateOptions) -> Result<EvaluateReport> {
    if args.datasets.is_empty() {
        return Err(Error::Refused("name at least one dataset".into()));
    }
    if args.model.is_some() && args.datasets.len() > 1 {
        return Err(Error::Refused(
            "--model names the model of one dataset; with several, each one's run records name its own".into(),
        ));
    }
    if args.judgements.is_none() && args.overlap.is_none() {
        return Err(Error::Refused(
            "nothing to evaluate: give --queries and --qrels, or --pairs, or --overlap K with two datasets".into(),
        ));
    }
    if args.overlap.is_some() && args.datasets.len() != 2 {
        return Err(Error::Refused(format!("--overlap compares two datasets; {} given", args.datasets.len())));
    }
    let mut ks = args.ks.clone();
    ks.sort_unstable();
    ks.dedup();
    if ks.first() == Some(&0) {
        return Err(Error::Refused("-k 0: a cut-off is at least 1".into()));
    }
    let mut report = EvaluateReport {
        judgements: args.judgements.as_ref().map(|j| j.source.clone()),
        queries: 0,
        judged: 0,
        ks: ks.clone(),
        datasets: Vec::new(),
        overlap: None,
    };
    if let Some(j) = &args.judgements {
        let judged: Vec<&(String, String)> =
            j.queries.iter().filter(|(q, _)| j.relevant.get(q).is_some_and(|r| r.values().any(|g| *g > 0.0))).collect();
        (report.queries, report.judged) = (j.queries.len() as u64, judged.len() as u64);
        if judged.is_empty() {
            return Err(Error::Refused(format!(
                "{}: no query has a document judged relevant (a score above 0)",
                j.source
            )));
        }
        let depth = ks.last().copied().unwrap_or(CUTOFF).max(CUTOFF);
        for dataset in &args.datasets {
            let mut scores = score_dataset(args, dataset, j, &judged, &ks, depth).await?;
            if let (Some(first), Some(this)) =
                (report.datasets.first().and_then(|d: &DatasetScores| d.fingerprint.as_ref()), &scores.fingerprint)
            {
                scores.differs =
                    first.differences(this).into_iter().map(|(k, a, b)| format!("{k} {a} -> {b}")).collect();
            }
            report.datasets.push(scores);
        }
    }
    if let Some(k) = args.overlap {
        report.overlap = Some(overlap(args, k).await?);
    }
    Ok(report)
}

/// Embed the judged queries under the dataset's fingerprint, rank its vectors for each, and score the rankings.
async fn score_dataset(
    args: &EvaluateOptions,
    dataset: &str,
    j: &Judgements,
    judged: &[&(String, String)],
    ks: &[usize],
    depth: usize,
) -> Result<DatasetScores> {
    let started = Instant::now();
    let ds = open_dataset(dataset).await?;
    let fp = fingerprint_of_dataset(&ds)?.ok_or_else(|| {
        Error::Refused(format!("{dataset}: the dataset holds no fingerprint (it was not written by embed()), so its queries cannot be embedded as its vectors were"))
    })?;
    let (embedder, settings) =
        crate::search::query_model(&ds, &fp, dataset, args.model.as_deref(), args.query_prompt.as_deref())
            .await
            .map_err(|e| e.context(format!("cannot evaluate {dataset}")))?;
    let texts: Vec<String> = judged.iter().map(|(_, t)| t.clone()).collect();
    let embedded = tokio::task::spawn_blocking(move || {
        let refs: Vec<Option<&str>> = texts.iter().map(|t| Some(t.as_str())).collect();
        embedder.embed(&refs, &settings)
    })
    .await??;
    let dim = embedded.vectors.len() / judged.len();
    let queries: Vec<Vec<f32>> = embedded.vectors.chunks_exact(dim).map(<[f32]>::to_vec).collect();
    let relevant_ids: HashSet<&str> = judged
        .iter()
        .flat_map(|(q, _)| j.relevant[q].iter().filter(|(_, g)| **g > 0.0).map(|(d, _)| d.as_str()))
        .collect();
    let id_column = crate::lance::records::id_column_of(&ds, args.id_column.as_deref());
    let ranked = nearest_all(&ds, &id_column, &args.column, &queries, depth, &relevant_ids).await?;

    let mut recall = vec![0f64; ks.len()];
    let (mut mrr, mut ndcg) = (0f64, 0f64);
    for ((q, _), hits) in judged.iter().zip(&ranked.hits) {
        let m = metrics(hits, &j.relevant[q], ks);
        recall.iter_mut().zip(&m.recall).for_each(|(sum, r)| *sum += r);
        mrr += m.mrr;
        ndcg += m.ndcg;
    }
    let n = judged.len() as f64;
    Ok(DatasetScores {
        dataset: dataset.trim_end_matches('/').to_string(),
        version: ds.version().version,
        rows: ranked.rows,
        model: fp.model.clone(),
        model_sha256: fp.model_sha256.clone(),
        differs: Vec::new(),
        fingerprint: Some(fp.clone()),
        recall: ks.iter().copied().zip(recall.into_iter().map(|r| r / n)).collect(),
        mrr_at_10: mrr / n,
        ndcg_at_10: ndcg / n,
        relevant_missing: (relevant_ids.len() - ranked.present.len()) as u64,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// One query's scores.
#[derive(Debug, Clone, PartialEq)]
struct QueryMetrics {
    recall: Vec<f64>,
    mrr: f64,
    ndcg: f64,
}

/// Recall at each of `ks`, reciprocal rank of the first relevant hit within the first 10, and nDCG@10 with the
/// judgement's score as the gain (trec_eval's `ndcg_cut`, which BEIR reports).
fn metrics(hits: &[String], gains: &HashMap<String, f64>, ks: &[usize]) -> QueryMetrics {
    let relevant = gains.values().filter(|g| **g > 0.0).count().max(1) as f64;
    let gain = |id: &String| gains.get(id).copied().filter(|g| *g > 0.0);
    let recall =
        ks.iter().map(|&k| hits.iter().take(k).filter(|h| gain(h).is_some()).count() as f64 / relevant).collect();
    let mrr = hits.iter().take(CUTOFF).position(|h| gain(h).is_some()).map_or(0.0, |i| 1.0 / (i + 1) as f64);
    let discount = |i: usize| 1.0 / ((i + 2) as f64).log2();
    let dcg: f64 = hits.iter().take(CUTOFF).enumerate().filter_map(|(i, h)| gain(h).map(|g| g * discount(i))).sum();
    let mut ideal: Vec<f64> = gains.values().copied().filter(|g| *g > 0.0).collect();
    ideal.sort_by(|a, b| b.total_cmp(a));
    let idcg: f64 = ideal.iter().take(CUTOFF).enumerate().map(|(i, g)| g * discount(i)).sum();
    QueryMetrics { recall, mrr, ndcg: if idcg > 0.0 { dcg / idcg } else { 0.0 } }
}

/// A hit in a ranking: higher score first, then the smaller id (so ties rank the same on every run).
#[derive(Debug, Clone, PartialEq)]
struct Hit {
    score: f32,
    id: String,
}

impl Eq for Hit {}

impl Ord for Hit {
    /// Better hits are smaller, so that a max-heap keeps the worst of the best on top.
    fn cmp(&self, other: &Self) -> Ordering {
        other.score.total_cmp(&self.score).then_with(|| self.id.cmp(&other.id))
    }
}

impl PartialOrd for Hit {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Each query's ranking, and what the pass saw.
struct Ranked {
    /// Per query, the ids of its `k` nearest vectors, nearest first.
    hits: Vec<Vec<String>>,
    rows: u64,
    /// The ids of `watch` that the dataset holds.
    present: HashSet<String>,
}

/// The `k` stored vectors nearest each query by cosine, in one streaming pass over the dataset (every vector
/// scored: exact), spread over the cores. Rows with a NULL or zero vector are never hits. Ids named in
/// `watch` are noted when present.
async fn nearest_all(
    ds: &lance::Dataset,
    id_column: &str,
    column: &str,
    queries: &[Vec<f32>],
    k: usize,
    watch: &HashSet<&str>,
) -> Result<Ranked> {
    let label = ds.uri();
    for c in [id_column, column] {
        if ds.schema().field(c).is_none() {
            return Err(Error::Refused(format!("{label}: has no column `{c}`")));
        }
    }
    let queries: Vec<Vec<f32>> = queries.iter().map(|q| unit(q)).collect();
    let mut heaps: Vec<BinaryHeap<Hit>> = vec![BinaryHeap::with_capacity(k + 1); queries.len()];
    let mut out = Ranked { hits: Vec::new(), rows: 0, present: HashSet::new() };
    let scanner = crate::lance::bounded_scan(ds, &[id_column, column])?;
    let mut stream = scanner.try_into_stream().await.map_err(lance_err(label))?;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(queries.len().max(1));
    while let Some(batch) = stream.try_next().await.map_err(lance_err(label))? {
        out.rows += batch.num_rows() as u64;
        let ids = cast(batch.column(0), &DataType::Utf8)?;
        let ids = ids.as_string::<i32>();
        let list = batch.column(1).as_fixed_size_list_opt().ok_or_else(|| {
            Error::Refused(format!("{label}: column `{column}` holds no vectors ({})", batch.column(1).data_type()))
        })?;
        let dim = list.value_length() as usize;
        if queries.first().is_some_and(|q| q.len() != dim) {
            return Err(Error::Refused(format!(
                "{label}: its vectors have {dim} values, the queries {}",
                queries[0].len()
            )));
        }
        let values = cast(list.values(), &DataType::Float32)?;
        let values = values.as_primitive::<Float32Type>().values();
        // The rows that can be hits, with their vectors made unit length.
        let mut rows: Vec<(usize, Vec<f32>)> = Vec::with_capacity(batch.num_rows());
        for i in 0..batch.num_rows() {
            if ids.is_null(i) {
                continue;
            }
            if watch.contains(ids.value(i)) {
                out.present.insert(ids.value(i).to_string());
            }
            if list.is_null(i) {
                continue;
            }
            let v = &values[i * dim..(i + 1) * dim];
            if v.iter().all(|x| *x == 0.0) || v.iter().any(|x| !x.is_finite()) {
                continue;
            }
            rows.push((i, unit(v)));
        }
        let per = queries.len().div_ceil(threads);
        std::thread::scope(|s| {
            for (qs, hs) in queries.chunks(per.max(1)).zip(heaps.chunks_mut(per.max(1))) {
                let rows = &rows;
                s.spawn(move || {
                    for (q, heap) in qs.iter().zip(hs) {
                        for (i, v) in rows {
                            let score = dot(q, v);
                            if heap.len() < k || heap.peek().is_some_and(|worst| score > worst.score) {
                                heap.push(Hit { score, id: ids.value(*i).to_string() });
                                if heap.len() > k {
                                    heap.pop();
                                }
                            }
                        }
                    }
                });
            }
        });
    }
    out.hits = heaps.into_iter().map(|h| h.into_sorted_vec().into_iter().map(|hit| hit.id).collect()).collect();
    Ok(out)
}

/// `v` scaled to length 1 (a zero vector stays zero).
fn unit(v: &[f32]) -> Vec<f32> {
    let norm = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
    if norm == 0.0 { v.to_vec() } else { v.iter().map(|x| (f64::from(*x) / norm) as f32).collect() }
}

/// The dot product, in eight lanes the compiler vectorises.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// The neighbourhoods of a seeded sample of the first dataset's ids, under each representation.
async fn overlap(args: &EvaluateOptions, k: usize) -> Result<Overlap> {
    if k == 0 {
        return Err(Error::Refused("--overlap 0: compare at least 1 neighbour".into()));
    }
    let (a, b) = (open_dataset(&args.datasets[0]).await?, open_dataset(&args.datasets[1]).await?);
    // The sample: the ids of the first lowest in the seeded order.
    let id_column = crate::lance::records::id_column_of(&a, args.id_column.as_deref());
    let mut lowest = Lowest::new(args.overlap_sample);
    let scanner = crate::lance::bounded_scan(&a, &[id_column.as_str()])?;
    let mut stream = scanner.try_into_stream().await.map_err(lance_err(a.uri()))?;
    while let Some(batch) = stream.try_next().await.map_err(lance_err(a.uri()))? {
        let ids = cast(batch.column(0), &DataType::Utf8)?;
        let ids = ids.as_string::<i32>();
        for id in ids.iter().flatten() {
            lowest.offer(seeded_rank(args.seed, id), || id.to_string());
        }
    }
    let sample: HashSet<String> = lowest.into_vec().into_iter().map(|(_, id)| id).collect();
    let vectors_a = stored_vectors(&a, &id_column, &args.column, &sample).await?;
    let vectors_b = stored_vectors(&b, &id_column, &args.column, &sample).await?;
    let mut both: Vec<&String> =
        sample.iter().filter(|id| vectors_a.contains_key(*id) && vectors_b.contains_key(*id)).collect();
    both.sort();
    if both.is_empty() {
        return Err(Error::Refused(format!(
            "{} and {} hold none of the same ids with vectors: nothing to compare",
            args.datasets[0], args.datasets[1]
        )));
    }
    let none = HashSet::new();
    // k + 1: each id is its own nearest neighbour, and is left out.
    let qa: Vec<Vec<f32>> = both.iter().map(|id| vectors_a[*id].clone()).collect();
    let qb: Vec<Vec<f32>> = both.iter().map(|id| vectors_b[*id].clone()).collect();
    let na = nearest_all(&a, &id_column, &args.column, &qa, k + 1, &none).await?;
    let nb = nearest_all(&b, &id_column, &args.column, &qb, k + 1, &none).await?;
    let mut shares = Vec::new();
    for ((id, ha), hb) in both.iter().zip(&na.hits).zip(&nb.hits) {
        let ha: HashSet<&String> = ha.iter().filter(|h| h != id).take(k).collect();
        let same = hb.iter().filter(|h| h != id).take(k).filter(|h| ha.contains(h)).count();
        shares.push(same as f64 / k as f64);
    }
    Ok(Overlap {
        k,
        seed: args.seed,
        sampled: both.len() as u64,
        not_in_second: (sample.len() - both.len()) as u64,
        mean: shares.iter().sum::<f64>() / shares.len() as f64,
        min: shares.iter().copied().fold(f64::INFINITY, f64::min),
    })
}

/// The vectors of the `wanted` ids (as float32), read in one bounded pass: verify's pass over the vectors,
/// whose findings are not needed here.
async fn stored_vectors(
    ds: &lance::Dataset,
    id_column: &str,
    column: &str,
    wanted: &HashSet<String>,
) -> Result<HashMap<String, Vec<f32>>> {
    let scan = crate::lance::verify::scan_vectors(ds, id_column, column, false, wanted).await?;
    Ok(scan.stored.into_iter().filter_map(|(id, v)| Some((id, v?))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gains(pairs: &[(&str, f64)]) -> HashMap<String, f64> {
        pairs.iter().map(|(d, g)| (d.to_string(), *g)).collect()
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn one_relevant_document_at_rank_two() {
        let m = metrics(&ids(&["x", "r", "y"]), &gains(&[("r", 1.0)]), &[1, 2, 10]);
        assert_eq!(m.recall, [0.0, 1.0, 1.0]);
        assert_eq!(m.mrr, 0.5);
        // 1/log2(3) against an ideal of 1/log2(2) = 1.
        assert!((m.ndcg - 1.0 / 3f64.log2()).abs() < 1e-12, "{m:?}");
    }

    #[test]
    fn graded_gains_and_a_judged_irrelevant_document() {
        // Gains 2 and 1 relevant, 0 judged but not relevant; found at ranks 3 and 1.
        let m = metrics(&ids(&["b", "z", "a", "c"]), &gains(&[("a", 2.0), ("b", 1.0), ("c", 0.0)]), &[1, 3]);
        assert_eq!(m.recall, [0.5, 1.0]);
        assert_eq!(m.mrr, 1.0);
        let dcg = 1.0 + 2.0 / 4f64.log2();
        let idcg = 2.0 + 1.0 / 3f64.log2();
        assert!((m.ndcg - dcg / idcg).abs() < 1e-12, "{m:?}");
        // Nothing relevant retrieved.
        let m = metrics(&ids(&["z"]), &gains(&[("a", 1.0)]), &[10]);
        assert_eq!((m.recall[0], m.mrr, m.ndcg), (0.0, 0.0, 0.0));
    }

    #[test]
    fn a_ranking_keeps_the_best_and_breaks_ties_by_id() {
        let mut heap = BinaryHeap::new();
        for (score, id) in [(0.5, "c"), (0.9, "a"), (0.5, "b"), (0.1, "d")] {
            heap.push(Hit { score, id: id.into() });
            if heap.len() > 3 {
                heap.pop();
            }
        }
        let order: Vec<String> = heap.into_sorted_vec().into_iter().map(|h| h.id).collect();
        assert_eq!(order, ["a", "b", "c"]);
        assert!((dot(&[1.0; 19], &[2.0; 19]) - 38.0).abs() < 1e-6);
    }
}

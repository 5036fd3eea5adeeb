//! `pipeline trial` and `pipeline cost`: a sample stratified by token length embedded through the run's own
//! write path, the whole corpus's time extrapolated from it, the sample's vectors compared with a
//! reference, and trials priced against each other. On the tiny model; the figures a trial gives on the
//! default model are in BENCHMARKS.md.

use std::path::Path;

use embedding_pipeline::ops::trial::TrialReport;
use serde_json::Value;

use crate::common::{assert_text, docs_job_on, pipeline, refusal, text, tiny_model_dir, write_jsonl};

/// The job `name` on the tiny model: a trial's sampling, timing, prediction, comparison and pricing are the same
/// whatever the model computes.
fn job(dir: &Path, name: &str, extra: &str) {
    docs_job_on(&tiny_model_dir(), dir, name, extra);
}

/// 400 texts of 5 to about 250 tokens, in no particular order.
fn corpus(dir: &Path) {
    let rows: Vec<(String, String)> = (0..400)
        .map(|i| {
            let words = 3 + (i * 37 % 400) * 245 / 400;
            (format!("d{i:03}"), format!("text {i}: {}", "campaign tokens ".repeat(words / 2)))
        })
        .collect();
    let rows: Vec<(&str, Option<&str>)> = rows.iter().map(|(i, t)| (i.as_str(), Some(t.as_str()))).collect();
    write_jsonl(&dir.join("docs.jsonl"), &rows);
}

fn json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn a_trial_predicts_from_a_stratified_sample_and_cost_prices_two_trials() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d);
    job(d, "job.sql", "SET embed.batch_tokens = 1024;");

    let o = pipeline(&["trial", "job.sql", "--sample", "200", "--save", "t/a.json", "--name", "cpu-a"], d);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("predicted for the whole corpus from its plan"), "{out}");
    assert!(out.contains("settings (from the job): embed.batch_tokens = 1024"), "{out}");
    assert!(!d.join("out/docs.lance").exists(), "a trial does not write the campaign's output");
    assert!(!d.join("out/docs.lance.plan").exists(), "nor leave a plan of its own there");

    // trial.json round-trips through the program's own type.
    let a = TrialReport::read(&d.join("t/a.json")).unwrap();
    assert_eq!(serde_json::to_value(&a).unwrap(), json(&d.join("t/a.json")));
    assert_eq!(a.name, "cpu-a");
    assert_eq!(a.corpus.rows, 400);
    assert!(a.device.device.starts_with("cpu"), "{}", a.device.device);

    // The sample: 200 rows spread over 8 strata of equal tokens, with the corpus's length mix.
    assert_eq!(a.strata.len(), 8);
    assert_eq!(a.strata.iter().map(|s| s.corpus_tokens).sum::<u64>(), a.corpus.useful_tokens);
    assert_eq!(a.strata.iter().map(|s| s.corpus_rows).sum::<u64>(), 400);
    assert_eq!(a.strata.iter().map(|s| s.sample_rows).sum::<u64>(), a.sample.rows);
    assert!((a.sample.rows as i64 - 200).abs() <= 8, "{}", a.sample.rows);
    assert!(a.strata.windows(2).all(|w| w[0].shortest >= w[1].longest), "strata in length order");
    assert!(a.sample.largest_bin_difference < 0.03, "length mix: {}", a.sample.largest_bin_difference);
    assert_eq!(a.sample.histogram.bins.iter().sum::<u64>(), a.sample.rows);

    // Every stratum has a rate, and the prediction its range.
    for s in &a.strata {
        assert!(s.useful_tokens_per_second > 0.0 && s.predicted_seconds > 0.0, "{s:?}");
        assert!(s.timed_calls > 0 || s.rate_from_stratum.is_some(), "{s:?}");
    }
    let p = &a.prediction;
    assert!(p.low_seconds <= p.seconds && p.seconds <= p.high_seconds, "{p:?}");
    let parts = p.model_load_seconds + p.startup_seconds + p.finish_seconds + p.embedding_seconds;
    assert!((p.seconds - parts).abs() < 1e-6, "{p:?}");
    assert!(p.model_load_seconds > 0.0);

    // How busy the model was while the sample was embedded; on the CPU no core count (the model runs on them).
    let h = a.host.as_ref().expect("the trial says how busy the model was");
    assert!(h.model_busy > 0.0 && h.model_busy <= 1.0 && h.sessions >= 1 && h.cores >= 1, "{h:?}");
    assert_eq!(h.cores_to_keep_busy, None, "{h:?}");
    assert!(out.contains(&format!("while the sample was embedded: model busy {:.0}%", h.model_busy * 100.0)), "{out}");

    // A smaller trial, compared with the first's vectors: all its rows are among the first's, cosine 1.
    let o = pipeline(
        &["trial", "job.sql", "--sample", "100", "--save", "t/b.json", "--name", "cpu-b", "--reference", "t/a.lance"],
        d,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("the vectors match"), "{out}");
    let b = TrialReport::read(&d.join("t/b.json")).unwrap();
    let c = b.comparison.as_ref().unwrap();
    assert!(b.sample.rows < a.sample.rows && (b.sample.step, a.sample.step) == (4, 2), "{:?}", b.sample);
    assert!(c.passed && c.matched == b.sample.rows, "{c:?}");
    assert!(c.min_cosine.unwrap() >= 0.999_999, "{c:?}");

    // Priced: cost is hours times the hourly price; the cheaper one meeting the deadline is chosen.
    std::fs::write(d.join("prices.toml"), "placeholder = true\n[per_hour]\n\"cpu-a\" = 1.0\n\"CPU-B\" = 2.5\n")
        .unwrap();
    let o = pipeline(
        &[
            "cost",
            "t/a.json",
            "t/b.json",
            "--prices",
            "prices.toml",
            "--deadline",
            "7d",
            "--json",
            "--chart",
            "t/c.svg",
        ],
        d,
    );
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["placeholder_prices"], true);
    assert_eq!(r["deadline_hours"], 168.0);
    let rows = r["rows"].as_array().unwrap();
    for (row, (t, price)) in rows.iter().zip([(&a, 1.0), (&b, 2.5)]) {
        let hours = t.prediction.seconds / 3600.0;
        assert!((row["hours"].as_f64().unwrap() - hours).abs() < 1e-9, "{row}");
        assert!((row["cost"].as_f64().unwrap() - hours * price).abs() < 1e-9, "{row}");
        let per_million = hours * price / (a.corpus.useful_tokens as f64 / 1e6);
        assert!((row["per_million_tokens"].as_f64().unwrap() - per_million).abs() < 1e-9, "{row}");
        assert_eq!(row["meets_deadline"], true);
    }
    assert_eq!(rows[0]["vectors_match"], Value::Null, "the first trial was not compared");
    assert_eq!(rows[1]["vectors_match"], true);
    let cheaper = if rows[0]["cost"].as_f64() <= rows[1]["cost"].as_f64() { "cpu-a" } else { "cpu-b" };
    assert_eq!(r["choice"], cheaper, "{r}");
    let svg = std::fs::read_to_string(d.join("t/c.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("cpu-b") && svg.contains("deadline"), "{svg}");

    // A deadline nobody meets: no choice, and why.
    let o = pipeline(&["cost", "t/a.json", "t/b.json", "--prices", "prices.toml", "--deadline", "1ms"], d);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("no choice") && out.contains("would not finish in time"), "{out}");
    assert!(out.contains("PLACEHOLDERS"), "{out}");
    assert!(out.contains("memory split: no trial probed"), "{out}");
}

#[test]
fn a_trial_under_another_fingerprint_than_its_reference_fails_after_probing() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d);
    job(d, "job.sql", "SET embed.batch_tokens = 1024;");
    job(d, "short.sql", "SET embed.max_tokens = 32;");
    // No batch setting in the job: the trial probes first.
    let o = pipeline(&["trial", "short.sql", "--sample", "40", "--save", "short.json", "--json"], d);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let short: Value = serde_json::from_str(&out).unwrap();
    // The probe's settings, with the default layout unless the probe found the other faster in every round by
    // more than 3% (on this machine it may: calls of 32 tokens), which the trial then says it adopted.
    let from = short["settings"]["from"].as_str().unwrap();
    let layouts = short["probe"]["layouts"].as_array().unwrap();
    let spread = |l: &Value| {
        let rates: Vec<f64> = l["rates"].as_array().unwrap().iter().map(|r| r.as_f64().unwrap()).collect();
        (rates.iter().copied().fold(f64::MAX, f64::min), rates.iter().copied().fold(0.0, f64::max))
    };
    if from == "the probe" {
        if let Some(default) = layouts.first() {
            assert_eq!(short["settings"]["sessions_per_device"], default["sessions_per_device"], "{short}");
        }
    } else {
        assert_eq!(from, "the probe, with the session layout it found faster in every round", "{short}");
        assert!(spread(&layouts[1]).0 > spread(&layouts[0]).1 * 1.03, "{short}");
        assert_eq!(short["settings"]["sessions_per_device"], layouts[1]["sessions_per_device"], "{short}");
    }
    assert!(!short["probe"]["steps"].as_array().unwrap().is_empty(), "{short}");
    assert_eq!(short["probe"]["longest_tokens"], 32);
    // The probe's 48 GB split reaches cost: whether the model fits each card, and what it leaves for calls.
    let o = pipeline(&["cost", "short.json", "--json"], d);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["memory"], short["probe"]["split"], "{r}");
    assert_eq!(r["memory"]["cards"][0]["fits"], true, "{r}");
    let (out, _) = text(&pipeline(&["cost", "short.json"], d));
    assert!(out.contains("memory split, measured on cpu") && out.contains("80 GB (A100 80GB, H100): fits"), "{out}");

    let o = pipeline(&["trial", "job.sql", "--sample", "40", "--save", "long.json", "--reference", "short.lance"], d);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{err}");
    assert!(out.contains("NO MATCH") && err.contains("do not match short.lance"), "{out}\n{err}");
    assert!(err.contains("max_tokens"), "the fingerprint difference is named: {err}");
    let long = TrialReport::read(&d.join("long.json")).unwrap();
    assert!(!long.comparison.unwrap().passed, "saved, with the failed comparison");

    // Trials of different corpora are not priced against each other.
    let o = pipeline(&["cost", "short.json", "long.json"], d);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("another corpus") && err.contains("short.json"), "{err}");
}

#[test]
fn bad_trial_and_cost_arguments_are_refused_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let mut said = String::new();
    let mut refused = |args: &[&str]| said += &refusal(args, &pipeline(args, d));
    refused(&["trial", "job.sql", "--minutes", "0"]);
    refused(&["trial", "job.sql", "--save", "x.lance"]);
    refused(&["trial", "job.sql", "--minutes", "1", "--sample", "5"]);
    refused(&["cost", "missing.json"]);
    refused(&["cost", "t.json", "--deadline", "soon"]);
    std::fs::write(d.join("t.json"), "{}").unwrap();
    refused(&["cost", "t.json"]);
    std::fs::write(d.join("prices.toml"), "[per_hour]\nA40 = -1\n").unwrap();
    refused(&["cost", "t.json", "--prices", "prices.toml"]);
    assert_text("trial_and_cost_refusals", d, &said);
}

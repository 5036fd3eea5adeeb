//! `pipeline probe`: real model calls on the corpus's longest texts, a recommendation that a run then
//! keeps under the memory budget, and the refusals.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::common::{assert_text, docs_job as job, model_dir, pipeline, refusal, text, write_jsonl};

/// 300 texts, short ones around 40 texts past the 256-token limit in the middle (not first: the probe
/// must find them).
fn corpus(dir: &Path) {
    let long = "embedding campaigns need their longest texts measured before they start ".repeat(30);
    let rows: Vec<(String, String)> = (0..300)
        .map(|i| {
            let text = if (130..170).contains(&i) { format!("{i} {long}") } else { format!("short text number {i}") };
            (format!("d{i:03}"), text)
        })
        .collect();
    let rows: Vec<(&str, Option<&str>)> = rows.iter().map(|(i, t)| (i.as_str(), Some(t.as_str()))).collect();
    write_jsonl(&dir.join("docs.jsonl"), &rows);
}

/// Peak resident memory of a `pipeline` run, read from /proc while it runs, and whether it succeeded.
fn run_peak(dir: &Path, args: &[&str]) -> (u64, bool) {
    let mut child = crate::common::command(args, dir).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let mut peak = 0;
    loop {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", child.id())) {
            let kib =
                status.lines().find_map(|l| l.strip_prefix("VmHWM:")).map(|v| v.trim().trim_end_matches("kB").trim());
            peak = peak.max(kib.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 1024);
        }
        if let Some(status) = child.try_wait().unwrap() {
            return (peak, status.success());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_probe_recommends_a_setting_that_keeps_a_run_under_its_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d);
    job(d, "job.sql", "");
    // First without a budget, to learn what the loaded model holds here.
    let o = pipeline(&["probe", "job.sql", "--json", "--max-batch-tokens", "4096"], d);
    assert!(o.status.success(), "{}", text(&o).1);
    let free: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(free["longest_tokens"], 256, "the longest texts, from the middle of the corpus, cut at the limit");
    let steps = free["steps"].as_array().unwrap();
    assert!(!steps.is_empty() && steps.iter().all(|s| s["useful_tokens_per_second"].as_f64().unwrap() > 0.0), "{free}");
    assert_eq!(steps[0]["batch_tokens"], 512);
    assert_eq!(free["longest_from"], "a tokenising pass over the corpus");
    assert!(steps.windows(2).all(|w| w[1]["batch_tokens"].as_u64() == w[0]["batch_tokens"].as_u64().map(|b| b * 2)));
    // The session layouts (two where the CPU has two threads or more), each timed in turn three times.
    for l in free["layouts"].as_array().unwrap() {
        let rates = l["rates"].as_array().unwrap();
        assert!(rates.len() == 3 && rates.iter().all(|r| r.as_f64().unwrap() > 0.0), "{l}");
        assert!(l["working_bytes"].as_u64().unwrap() <= l["peak_bytes"].as_u64().unwrap(), "{l}");
    }

    // The 48 GB split: the weights' bytes from the graph (the int8 model's file is its weights and a little
    // graph), the working memory per step, and a statement per card.
    let split = &free["split"];
    let weights = split["weights_bytes"].as_u64().unwrap();
    let file = std::fs::metadata(model_dir().join("onnx/model.onnx")).unwrap().len();
    assert!(weights <= file && weights > file * 9 / 10, "weights {weights} of a {file}-byte file: {split}");
    let by_type: u64 = split["weights"].as_array().unwrap().iter().map(|w| w[1].as_u64().unwrap()).sum();
    assert_eq!(by_type, weights);
    assert_eq!(split["weights"][0][0], "float32", "{split}");
    assert!(split["weights"].as_array().unwrap().iter().any(|w| w[0] == "int8"), "{split}");
    assert!(split["working_bytes_per_token"].as_u64().unwrap() > 0, "{split}");
    // What loading added since the command started holds the model's weights (it read 0 when the model was
    // loaded before the probe's own measurement).
    assert!(split["session_bytes"].as_u64().unwrap() > weights / 2, "{split}");
    assert!(steps.iter().all(|s| s["working_bytes"].as_u64().unwrap() <= s["peak_bytes"].as_u64().unwrap()));
    let cards = split["cards"].as_array().unwrap();
    assert_eq!(cards.len(), 2);
    assert!(cards.iter().all(|c| c["fits"] == true && c["batch_tokens"].as_u64().unwrap() > 256), "{split}");
    assert_eq!(split["measured_on_gpu"], false);

    // A budget the larger steps pass: the probe stops at it, and a run at its setting stays under it.
    let loaded = free["loaded_bytes"].as_u64().unwrap();
    let budget = (loaded + 256 * 1024 * 1024) * 5 / 4;
    let o = pipeline(&["probe", "job.sql", "--json", "--memory-budget", &budget.to_string()], d);
    assert!(o.status.success(), "{}", text(&o).1);
    let probed: Value = serde_json::from_slice(&o.stdout).unwrap();
    let rec = &probed["recommended"];
    let set: Vec<&str> = rec["set"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    assert!(set[0].starts_with("SET embed.batch_tokens = "), "{rec}");
    let chosen = probed["steps"].as_array().unwrap().iter().find(|s| s["batch_tokens"] == rec["batch_tokens"]).unwrap();
    assert!(chosen["fits"].as_bool().unwrap() && chosen["peak_bytes"].as_u64().unwrap() <= budget, "{probed}");
    // Issue 53: the session layouts keep to the budget too: each is either left untimed, saying why, or peaked
    // within the budget's margin; one that did not fit is never advised.
    for l in probed["layouts"].as_array().unwrap() {
        let within = l["peak_bytes"].as_u64().unwrap() <= budget * 4 / 5;
        assert!(within || l["skipped"].as_str().is_some_and(|w| w.contains("past")), "{l}");
        if l["skipped"].is_string() {
            assert_ne!(probed["advised_layout"][0], l["sessions_per_device"], "{probed}");
        }
    }
    job(d, "run.sql", &set.join("\n"));
    let (peak, ok) = run_peak(d, &["run", "run.sql"]);
    assert!(ok, "the run at the recommended setting succeeds");
    assert!(peak > 0 && peak <= budget, "the run peaked at {peak} bytes, over the budget of {budget}: {probed}");

    // The human form: the table, the reason and the line to paste.
    let o = pipeline(&["probe", "job.sql", "--memory-budget", &budget.to_string()], d);
    let shown = text(&o).0;
    assert!(shown.contains("batch_tokens   rows") && shown.contains("recommended: embed.batch_tokens = "), "{shown}");
    // (Its choice may differ from the run above's: rates within noise of each other.)
    assert!(shown.contains("  SET embed.batch_tokens = ") && shown.contains("stopped: "), "{shown}");
    assert!(shown.contains("memory split, measured on cpu") && shown.contains("exact from the graph"), "{shown}");
    assert!(
        shown.contains("48 GB (RTX A6000, RTX 6000 Ada, A40): fits") && shown.contains("estimated from the CPU"),
        "{shown}"
    );

    // With a current plan, the longest texts come from its work list, the same ones.
    assert!(pipeline(&["plan", "job.sql"], d).status.success());
    let o = pipeline(&["probe", "job.sql", "--json", "--max-batch-tokens", "1024"], d);
    assert!(o.status.success(), "{}", text(&o).1);
    let planned: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(planned["longest_from"].as_str().unwrap().starts_with("the plan "), "{planned}");
    assert_eq!(planned["longest_tokens"], 256);
}

#[test]
fn a_budget_nothing_fits_and_a_bad_size_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d);
    job(d, "job.sql", "");
    let o = pipeline(&["probe", "job.sql", "--memory-budget", "10MB"], d);
    let (stdout, stderr) = text(&o);
    assert!(!o.status.success(), "{stdout}");
    assert!(
        stderr.contains("no setting fits the memory budget") && stderr.contains("raise --memory-budget"),
        "{stderr}"
    );
    assert!(stdout.contains("past the budget's margin"), "the table still shows what was measured: {stdout}");
    let args = ["probe", "job.sql", "--memory-budget", "lots"];
    let mut said = refusal(&args, &pipeline(&args, d));
    std::fs::write(d.join("read.sql"), "SELECT 1;").unwrap();
    said += &refusal(&["probe", "read.sql"], &pipeline(&["probe", "read.sql"], d));
    assert_text("probe_refusals", d, &said);
}

#[test]
fn a_run_records_its_peak_memory_and_warns_near_the_budget_a_probe_assumed() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    corpus(d);
    // A budget every run passes: the warning says so.
    job(d, "job.sql", "SET embed.memory_budget = '64MiB';");
    let o = pipeline(&["run", "job.sql"], d);
    let (_, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(stderr.contains("warning: this run's memory peaked at") && stderr.contains("64 MiB"), "{stderr}");
    assert!(stderr.contains("and passed it"), "{stderr}");
    let o = pipeline(&["inspect", "out/docs.lance", "--json"], d);
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    let peak = j["versions"][0]["run"]["peak_memory_bytes"].as_u64().unwrap();
    assert!(peak > 64 << 20, "{j}");
    // A roomy budget: no warning.
    job(d, "roomy.sql", "SET embed.memory_budget = '1TiB'; SET embed.restart = true;");
    let o = pipeline(&["run", "roomy.sql"], d);
    assert!(o.status.success() && !text(&o).1.contains("warning"), "{}", text(&o).1);
    // A budget that is not a size is refused at the SET.
    job(d, "bad.sql", "SET embed.memory_budget = 'lots';");
    let o = pipeline(&["run", "bad.sql"], d);
    let stderr = text(&o).1;
    assert!(!o.status.success() && stderr.contains("memory_budget") && stderr.contains("such as 900MB"), "{stderr}");
}

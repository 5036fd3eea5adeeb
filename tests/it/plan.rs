//! `pipeline plan`: exact totals, work units in length order, the plan directory, and refusals at plan
//! time with the run's own messages.

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;

use crate::common::{assert_text, model_dir, pipeline, refusal, session, sql, strings, text, write_jsonl};

/// Texts of many lengths, some past a 16-token limit, and one NULL.
fn texts(n: usize) -> Vec<(String, Option<String>)> {
    (0..n)
        .map(|i| {
            let words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs", "again", "tomorrow"];
            let text = (0..1 + (i * 7) % 23).map(|w| words[(i + w) % words.len()]).collect::<Vec<_>>().join(" ");
            (format!("r{i:03}"), (i != 5).then_some(text))
        })
        .collect()
}

/// (tokens before truncation, tokens kept) of a text, by the model's own tokenizer.json (without its
/// padding and truncation), special tokens included, cut at `limit`.
fn tokens(tokenizer: &tokenizers::Tokenizer, text: &str, limit: usize) -> (u64, u64) {
    let n = tokenizer.encode(text, true).unwrap().get_ids().len();
    (n as u64, n.min(limit) as u64)
}

#[tokio::test]
async fn a_plan_counts_exactly_and_cuts_units_that_cover_every_row_once_in_length_order() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let rows = texts(90);
    // The same corpus in three formats, one third each.
    let as_ref: Vec<(&str, Option<&str>)> = rows.iter().map(|(i, t)| (i.as_str(), t.as_deref())).collect();
    write_jsonl(&dir.join("a.jsonl"), &as_ref[..30]);
    let mut csv = String::from("id,text\n");
    for (id, t) in &as_ref[30..60] {
        csv.push_str(&format!("{id},{}\n", t.unwrap_or_default()));
    }
    std::fs::write(dir.join("b.csv"), csv).unwrap();
    write_jsonl(&dir.join("c.jsonl"), &as_ref[60..]);
    let s = session();
    sql(
        &s,
        &format!(
            "CREATE EXTERNAL TABLE c STORED AS JSON LOCATION '{0}/c.jsonl'; \
             COPY (SELECT * FROM c) TO '{0}/c.parquet' STORED AS PARQUET",
            dir.display()
        ),
    )
    .await
    .unwrap();
    std::fs::remove_file(dir.join("c.jsonl")).unwrap();
    let job = format!(
        "SET embed.model = '{}';\nSET embed.max_tokens = 16;\n\
         CREATE EXTERNAL TABLE a STORED AS JSON LOCATION 'a.jsonl';\n\
         CREATE EXTERNAL TABLE b STORED AS CSV LOCATION 'b.csv' OPTIONS ('format.has_header' 'true');\n\
         CREATE EXTERNAL TABLE c STORED AS PARQUET LOCATION 'c.parquet';\n\
         COPY (SELECT id, embed(text) AS v FROM (SELECT id, text FROM a UNION ALL SELECT id, text FROM b \
         UNION ALL SELECT id, text FROM c)) TO 'out/docs.lance' STORED AS LANCE;\n\
         CREATE EXTERNAL TABLE back STORED AS LANCE LOCATION 'out/docs.lance';\n\
         SELECT count(*) FROM back;\n",
        model_dir().display()
    );
    std::fs::write(dir.join("job.sql"), job).unwrap();
    let o = pipeline(&["plan", "job.sql", "--json", "--unit-tokens", "200"], dir);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    let plans: Value = serde_json::from_str(&stdout).unwrap();
    let plan = &plans[0];

    // Totals, against the tokenizer run here. The CSV reads an empty text as NULL.
    let mut tokenizer = tokenizers::Tokenizer::from_file(model_dir().join("tokenizer.json")).unwrap();
    tokenizer.with_padding(None).with_truncation(None).unwrap();
    let (mut before, mut kept, mut truncated, mut documents) = (0, 0, 0, 0);
    for (_, t) in &rows {
        if let Some(t) = t {
            let (b, k) = tokens(&tokenizer, t, 16);
            (before, kept, truncated, documents) = (before + b, kept + k, truncated + u64::from(b > k), documents + 1);
        }
    }
    let totals = &plan["totals"];
    assert_eq!(totals["rows"], 90);
    assert_eq!((totals["documents"].as_u64(), totals["null_texts"].as_u64()), (Some(documents), Some(90 - documents)));
    assert_eq!(totals["tokens_before_truncation"].as_u64(), Some(before));
    assert_eq!(totals["useful_tokens"].as_u64(), Some(kept));
    assert_eq!(totals["truncated_documents"].as_u64(), Some(truncated));
    assert_eq!(totals["dropped_tokens"].as_u64(), Some(before - kept));
    assert!(truncated > 0 && truncated < documents, "some texts, not all, pass the limit: {truncated}");
    assert_eq!(plan["fingerprint"]["max_tokens"], 16);
    let histogram = &plan["histogram"];
    let binned: u64 = histogram["bins"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).sum();
    assert_eq!(binned, documents, "every text is in the histogram once");
    let files: Vec<&str> = plan["sources"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["files"].as_array().unwrap())
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(files.len(), 3, "{files:?}");
    assert!(plan["sources"][0]["files"][0]["sha256"].as_str().unwrap().len() == 64);

    // The work list: every row once, longest first, in contiguous units within their budget.
    let plan_dir = dir.join("out/docs.lance.plan");
    assert!(plan_dir.join("plan.json").is_file());
    let svg = std::fs::read_to_string(plan_dir.join("histogram.svg")).unwrap();
    let caption = format!("{truncated} of {documents} texts");
    assert!(svg.starts_with("<svg") && svg.contains(&caption) && svg.contains("limit: 16 tokens"), "{svg}");
    assert!(!dir.join("out/docs.lance").exists(), "planning writes no output");
    let work = format!(
        "CREATE EXTERNAL TABLE work STORED AS PARQUET LOCATION '{}'; SELECT * FROM work",
        plan_dir.join("worklist.parquet").display()
    );
    let work = sql(&s, &work).await.unwrap();
    let ids = strings(&work, "id");
    let counts: Vec<u64> = strings(&work, "__token_count").iter().map(|c| c.parse().unwrap()).collect();
    let units: Vec<u64> = strings(&work, "__unit").iter().map(|c| c.parse().unwrap()).collect();
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 90, "every id once");
    assert!(counts.windows(2).all(|w| w[0] >= w[1]), "longest first: {counts:?}");
    assert!(units.windows(2).all(|w| w[1] == w[0] || w[1] == w[0] + 1), "contiguous units: {units:?}");
    let listed = plan["units"].as_array().unwrap();
    assert_eq!(listed.len() as u64, units.last().unwrap() + 1);
    for u in listed {
        let n = u["unit"].as_u64().unwrap();
        let mine: Vec<usize> = (0..units.len()).filter(|i| units[*i] == n).collect();
        assert_eq!(u["first_row"].as_u64(), Some(mine[0] as u64));
        assert_eq!(u["rows"].as_u64(), Some(mine.len() as u64));
        let tokens: u64 = mine.iter().map(|i| counts[*i]).sum();
        assert_eq!(u["useful_tokens"].as_u64(), Some(tokens));
        let last = counts[*mine.last().unwrap()];
        if n + 1 < listed.len() as u64 {
            assert!(tokens >= 200 && tokens < 200 + last, "unit {n} holds {tokens} tokens");
        }
    }

    // inspect reads the plan directory back.
    let o = pipeline(&["inspect", "out/docs.lance.plan", "--json"], dir);
    assert!(o.status.success(), "{}", text(&o).1);
    let back: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(&back, plan, "inspect --json gives the plan back");
    let o = pipeline(&["inspect", "out/docs.lance.plan"], dir);
    let shown = text(&o).0;
    assert!(shown.contains("sources: unchanged since the plan"), "{shown}");
    assert_text("a_plan_inspected", dir, &shown);
    // A line appended, a text edited, a file removed: inspect names each change.
    let (a_before, b_before) =
        (std::fs::read(dir.join("a.jsonl")).unwrap(), std::fs::read_to_string(dir.join("b.csv")).unwrap());
    let mut a = String::from_utf8(a_before.clone()).unwrap();
    a.push_str("{\"id\": \"new\", \"text\": \"one more\"}\n");
    std::fs::write(dir.join("a.jsonl"), a).unwrap();
    let b = b_before.replacen("quick", "quack", 1);
    std::fs::write(dir.join("b.csv"), b).unwrap();
    std::fs::rename(dir.join("c.parquet"), dir.join("c.parquet.moved")).unwrap();
    let shown = text(&pipeline(&["inspect", "out/docs.lance.plan"], dir)).0;
    assert!(shown.contains("sources: changed since the plan"), "{shown}");
    assert!(shown.contains("a.jsonl has ") && shown.contains("bytes, planned with"), "{shown}");
    assert!(shown.contains("b.csv has other content (its SHA-256 differs)"), "{shown}");
    assert!(shown.contains("c.parquet was removed"), "{shown}");
    assert_text("a_plan_inspected_after_its_sources_changed", dir, &shown);
    std::fs::rename(dir.join("c.parquet.moved"), dir.join("c.parquet")).unwrap();
    std::fs::write(dir.join("a.jsonl"), a_before).unwrap();
    std::fs::write(dir.join("b.csv"), b_before).unwrap();

    // The human form says the same.
    let o = pipeline(&["plan", "job.sql", "--units", "3"], dir);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(stdout.contains(&format!("rows: 90 ({documents} documents")), "{stdout}");
    assert!(stdout.contains(&format!("{truncated} documents")) && stdout.contains("units: 3 of about"), "{stdout}");
    assert_text("a_plan_in_three_units", dir, &stdout);
}

#[test]
fn bad_ids_and_a_text_past_the_limit_under_truncation_error_are_refused_at_plan_time() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_jsonl(&dir.join("dup.jsonl"), &[("a", Some("one")), ("a", Some("two")), ("b", Some("three"))]);
    write_jsonl(&dir.join("long.jsonl"), &[("short", Some("one two")), ("long-one", Some(&"word ".repeat(40)))]);
    let write = |table: &str, settings: &str| {
        let job = format!(
            "SET embed.model = '{}';\n{settings}\nCREATE EXTERNAL TABLE t STORED AS JSON LOCATION '{table}.jsonl';\n\
             COPY (SELECT id, embed(text) AS v FROM t) TO 'out/{table}.lance' STORED AS LANCE;\n",
            model_dir().display()
        );
        std::fs::write(dir.join(format!("{table}.sql")), job).unwrap();
        let args = ["plan", &format!("{table}.sql")];
        refusal(&args, &pipeline(&args, dir))
    };
    // Named by the job's statement and line, and the first id seen twice.
    let mut said = write("dup", "");
    assert!(!Path::new(&dir.join("out/dup.lance.plan")).exists(), "a refused plan leaves no plan directory");
    said += &write("long", "SET embed.max_tokens = 16; SET embed.truncation = 'error';");
    // (The output's lock file may stay, as after any run: planning the write takes the output's lock.)
    let left: Vec<String> = std::fs::read_dir(dir.join("out"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.ends_with(".lock"))
        .collect();
    assert!(left.is_empty(), "a plan refused half-way leaves nothing: {left:?}");
    std::fs::write(dir.join("read.sql"), "SELECT 1;").unwrap();
    said += &refusal(&["plan", "read.sql"], &pipeline(&["plan", "read.sql"], dir));
    // A job's variables take their values from --var, as `pipeline run` gives them; one missing is named, one given
    // and not used is warned about.
    std::fs::write(
        dir.join("vars.sql"),
        format!(
            "SET embed.model = '{}';\nCREATE EXTERNAL TABLE t STORED AS JSON LOCATION '${{TABLE}}.jsonl';\n\
             COPY (SELECT id, embed(text) AS v FROM t) TO 'out/${{TABLE}}.lance' STORED AS LANCE;\n",
            model_dir().display()
        ),
    )
    .unwrap();
    said += &refusal(&["plan", "vars.sql"], &pipeline(&["plan", "vars.sql"], dir));
    let o = pipeline(&["plan", "vars.sql", "--var", "TABLE=long", "--var", "EXTRA=1"], dir);
    let (stdout, stderr) = text(&o);
    assert!(o.status.success(), "{stderr}");
    assert!(stdout.contains("rows: 2 (2 documents"), "{stdout}");
    assert!(stderr.contains("--var EXTRA is not used by vars.sql"), "{stderr}");
    assert!(dir.join("out/long.lance.plan/plan.json").is_file());
    let args = ["plan", "vars.sql", "--var", "TABLE"];
    said += &refusal(&args, &pipeline(&args, dir));
    // The bad line is named, as the run names it.
    std::fs::write(dir.join("broken.jsonl"), "{\"id\": \"a\", \"text\": \"x\"}\n{\"id\": \"b\", \"text\":\n").unwrap();
    said += &write("broken", "");
    let args = ["plan", "broken.sql", "--units", "0"];
    said += &refusal(&args, &pipeline(&args, dir));
    assert_text("plan_refusals", dir, &said);
}

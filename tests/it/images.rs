//! Images (issue 57): tiny random CLIP and SigLIP models saved by sentence-transformers (the current one-module
//! layout and CLIP's older `CLIPModel` one), exported by scripts/export-onnx (which checks both towers), and a
//! Parquet table of image files' bytes embedded by `pipeline run` with `embed_image(image, id)`, compared with
//! sentence-transformers' `encode` of each file's path; then resumed, searched by text, and fed bad images; and a
//! folder of the same files through `image_files('folder')` and `embed_image(path, id)`.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use super::lineage::{export_python, repo};
use crate::common::{command, cosine, model_dir, pipeline, python, session_on, sql, strings, text, vectors};

/// The model `shape` built in `dir/ckpt`, its test images in `dir/corpus` (images.parquet and sentence-transformers'
/// reference.json), and its export in `dir/model`.
fn build(dir: &Path, shape: &str) -> HashMap<String, Vec<f32>> {
    let python = export_python();
    for (script, args) in [
        ("make_image_models.py", vec![shape.to_string(), model_dir().display().to_string(), "ckpt".into()]),
        ("make_images.py", vec!["ckpt".into(), "corpus".into()]),
    ] {
        let o = Command::new(&python)
            .arg(repo().join("tests/fixtures").join(script))
            .args(&args)
            .current_dir(dir)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(o.status.success(), "{shape}: {script}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let o = Command::new(repo().join("scripts/export-onnx"))
        .args(["ckpt", "model"])
        .env("PIPELINE", env!("CARGO_BIN_EXE_pipeline"))
        .current_dir(dir)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let (_, err) = text(&o);
    // Its own check: both towers against sentence-transformers (texts at 0.99999, images at 0.9999).
    assert!(
        o.status.success() && err.contains("verified on 16 texts") && err.contains("verified on 10 images"),
        "{shape}: export: {err}"
    );
    serde_json::from_slice(&std::fs::read(dir.join("corpus/reference.json")).unwrap()).unwrap()
}

/// `pipeline run` of `query` (over table `imgs`, the test images) into `out`; the run's output.
fn run_job(dir: &Path, set: &str, query: &str, out: &str) -> std::process::Output {
    run_job_with(dir, set, query, out, &[])
}

/// [`run_job`] with these environment variables.
fn run_job_with(dir: &Path, set: &str, query: &str, out: &str, env: &[(&str, String)]) -> std::process::Output {
    let job = format!(
        "SET embed.model = 'model';\n{set}\nCREATE EXTERNAL TABLE imgs STORED AS PARQUET LOCATION \
         'corpus/images.parquet';\nCOPY ({query}) TO '{out}' STORED AS LANCE;\n"
    );
    std::fs::write(dir.join("job.sql"), job).unwrap();
    command(&["run", "-q", "job.sql"], dir).envs(env.iter().cloned()).output().unwrap()
}

/// A folder's images put in bucket `photos` under `set/`, by their paths under the folder (hidden ones left out).
const UPLOAD_IMAGES: &str = r#"
import os, sys, boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT"])
s3.create_bucket(Bucket="photos")
top = sys.argv[1]
for folder, dirs, files in os.walk(top):
    dirs[:] = [d for d in dirs if not d.startswith(".")]
    for f in files:
        if not f.startswith("."):
            path = os.path.join(folder, f)
            s3.upload_file(path, "photos", "set/" + os.path.relpath(path, top))
"#;

/// The ids and vectors of a Lance dataset.
async fn written(dir: &Path, out: &str) -> HashMap<String, Vec<f32>> {
    let location = dir.join(out).display().to_string();
    let batches = sql(
        &session_on(&dir.join("model")),
        &format!("CREATE EXTERNAL TABLE v STORED AS LANCE LOCATION '{location}'; SELECT id, embedding FROM v"),
    )
    .await
    .unwrap();
    let ids = strings(&batches, "id");
    let vectors: Vec<Vec<f32>> = vectors(&batches, "embedding").into_iter().map(Option::unwrap).collect();
    assert_eq!(ids.len(), ids.iter().collect::<std::collections::HashSet<_>>().len(), "every id once");
    ids.into_iter().zip(vectors).collect()
}

#[tokio::test]
async fn clip_and_siglip_images_match_sentence_transformers_resume_and_are_found_by_text() {
    for shape in ["clip", "clip-legacy", "siglip"] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let reference = build(dir, shape);
        let query = "SELECT id, embed_image(image, id) AS embedding FROM imgs";
        let o = run_job(dir, "", query, "out.lance");
        assert!(o.status.success(), "{shape}: {:?}", text(&o));
        let ours = written(dir, "out.lance").await;
        assert_eq!(ours.len(), reference.len(), "{shape}: every image");
        for (id, want) in &reference {
            let got = &ours[id];
            assert_eq!(got.len(), want.len(), "{shape} {id}");
            let c = cosine(got, want);
            assert!(c >= 0.9999, "{shape} {id}: cosine {c} with sentence-transformers");
        }
        // A second run finds every id written: nothing again, nothing twice.
        let o = run_job(dir, "", query, "out.lance");
        assert!(o.status.success(), "{shape}: {:?}", text(&o));
        assert_eq!(written(dir, "out.lance").await.len(), reference.len(), "{shape}: rerun");

        // The text tower of the same model: a text query finds images, under the dataset's one fingerprint.
        let o = pipeline(&["search", "out.lance", "two dogs in the snow", "-k", "3", "--model", "model"], dir);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{shape}: search: {err}");
        assert_eq!(reference.keys().filter(|id| out.contains(id.as_str())).count(), 3, "{shape}: {out}");
    }
}

#[tokio::test]
async fn a_folder_is_a_table_of_paths_and_bad_images_are_named_by_id_or_skipped() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let reference = build(dir, "clip");
    // A folder as users have them: a hidden file, a hidden folder, notes, a folder without its slash.
    let images = dir.join("corpus/images");
    std::fs::write(images.join(".DS_Store"), "finder").unwrap();
    std::fs::create_dir(images.join(".thumbs")).unwrap();
    std::fs::copy(images.join("rgba.png"), images.join(".thumbs/rgba.png")).unwrap();
    std::fs::write(images.join("notes.txt"), "not a picture").unwrap();
    let query = "SELECT id, bytes, embed_image(path, id) AS embedding FROM image_files('corpus/images')";
    let o = run_job(dir, "", query, "folder.lance");
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("left out 2 hidden files or folders and 1 files that are not images"), "{err}");
    let ours = written(dir, "folder.lance").await;
    assert_eq!(ours.len(), reference.len(), "every image, and nothing else");
    for (id, want) in &reference {
        let c = cosine(&ours[id], want);
        assert!(c >= 0.9999, "{id}: cosine {c} with sentence-transformers, read by path");
    }
    // The run record counts the images, their pixels and their files' bytes.
    let o = pipeline(&["inspect", "folder.lance", "--json"], dir);
    let inspected: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    let run = &inspected["versions"][0]["run"];
    let file_bytes: u64 = reference.keys().map(|id| std::fs::metadata(images.join(id)).unwrap().len()).sum();
    assert_eq!(run["images"], reference.len() as u64, "{run}");
    assert_eq!(run["image_bytes"], file_bytes, "{run}");
    assert!(run["image_pixels"].as_u64().unwrap() > 2400 * 1600, "{run}");
    let o = pipeline(&["inspect", "folder.lance"], dir);
    let said = format!("{} rows, {0} images (0 NULL, 0 bad ones skipped), ", reference.len());
    assert!(text(&o).0.contains(&said) && text(&o).0.contains("megapixels decoded from"), "{}", text(&o).0);
    let o = run_job(dir, "", query, "folder.lance");
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(written(dir, "folder.lance").await.len(), reference.len(), "a rerun adds nothing");

    // Relative paths against a base the job names: a folder, and a prefix in a bucket (moto's S3 server, started
    // here), whose images are fetched from it; a missing object is named by its id.
    let server = super::stores::S3Server::start();
    let env = server.env();
    python(UPLOAD_IMAGES, &[&images.display().to_string()], &env);
    let by_id = "SELECT id, embed_image(id, id) AS embedding FROM image_files('corpus/images')";
    for (base, out) in [("corpus/images/", "based.lance"), ("s3://photos/set", "bucket.lance")] {
        let o = run_job_with(dir, &format!("SET embed.image_base = '{base}';"), by_id, out, &env);
        assert!(o.status.success(), "{base}: {:?}", text(&o));
        let ours = written(dir, out).await;
        assert_eq!(ours.len(), reference.len(), "{base}: every image");
        for (id, want) in &reference {
            let c = cosine(&ours[id], want);
            assert!(c >= 0.9999, "{base} {id}: cosine {c} with sentence-transformers");
        }
    }
    let o = run_job_with(
        dir,
        "SET embed.image_base = 's3://photos/set/';",
        "SELECT 'gone' AS id, embed_image('gone.png', 'gone') AS embedding",
        "gone.lance",
        &env,
    );
    let (_, err) = text(&o);
    assert!(
        !o.status.success()
            && err.contains(
                "the image of id gone cannot be read from its file: s3://photos/set/gone.png: no such object"
            ),
        "{err}"
    );
    let o = run_job(dir, "SET embed.image_base = 'gs://photos/';", by_id, "gs.lance");
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("embed.image_base") && err.contains("s3://"), "{err}");
    drop(server);
    // The folder's job again (a rerun: nothing to add), for what follows.
    assert!(run_job(dir, "", query, "folder.lance").status.success());
    // plan: every image's header read (no pixel decoded), by size and format, the largest named.
    let o = pipeline(&["plan", "job.sql"], dir);
    let (out, err) = text(&o);
    let rows = format!("rows: {} ({0} images whose headers read, 0 NULL, 0 bad)", reference.len());
    assert!(o.status.success() && out.contains(&rows), "{out}{err}");
    assert!(out.contains("1-4 megapixels") && out.contains("largest: rgb-2400x1600.png (2400x1600, Png"), "{out}");
    let o = pipeline(&["inspect", "folder.lance.plan", "--json"], dir);
    let plan: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!((&plan["kind"], &plan["images"]), (&"images".into(), &(reference.len() as u64).into()), "{plan}");
    let file_bytes: u64 = reference.keys().map(|id| std::fs::metadata(images.join(id)).unwrap().len()).sum();
    assert_eq!(plan["bytes"], file_bytes, "{plan}");
    // probe: the largest images decoded on the host alone, then embedded in calls of doubling size.
    let o = pipeline(&["probe", "job.sql", "--json"], dir);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let probe: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (&probe["kind"], &probe["largest"][0]["id"]),
        (&"images".into(), &"rgb-2400x1600.png".into()),
        "{probe}"
    );
    assert!(probe["host"]["ms_per_megapixel"].as_f64().unwrap() > 0.0, "{probe}");
    assert!(probe["steps"].as_array().unwrap().len() >= 2, "{probe}");
    let set = probe["recommended"]["set"][0].as_str().unwrap();
    assert!(set.starts_with("SET embed.batch_images = "), "{probe}");
    trial_and_cost(dir, &reference).await;
    // verify --job: the ids against the folder, and a sample (here every image) embedded again from its path,
    // grouped by decoded size as the headers say.
    let o = pipeline(&["verify", "folder.lance", "--job", "job.sql", "--json"], dir);
    let report: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(report["verdict"], "sound", "{report}");
    let sample = &report["sample"];
    assert_eq!(sample["rows"], reference.len() as u64, "{sample}");
    assert!(sample["min_cosine"].as_f64().unwrap() > 0.99999, "{sample}");
    let bands: Vec<&str> = sample["strata"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["candidates"].as_u64() > Some(0))
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(bands, ["under 0.25 megapixels", "0.25-1 megapixels", "1-4 megapixels"], "{sample}");
    // What the image commands print is what their schemas say (docs/reference/schemas/).
    let trial = std::fs::read_to_string(dir.join("t/a.json")).unwrap();
    let (plan, probe, report) = (plan.to_string(), probe.to_string(), report.to_string());
    let documents = [("image-plan", plan.as_str()), ("image-probe", &probe), ("trial", &trial), ("verify", &report)];
    super::json_schemas::assert_matches_schemas(dir, &documents);
    // The campaign's page counts images, not tokens.
    let o = pipeline(&["report", "folder.lance", "-o", "folder.html", "--trial", "t/a.json"], dir);
    assert!(o.status.success(), "{:?}", text(&o));
    let page = std::fs::read_to_string(dir.join("folder.html")).unwrap();
    assert!(page.contains("<th>images/s</th>") && page.contains("<th>per million images</th>"), "the trial");
    let said = format!("<th>images embedded</th><td>{} (0 bad ones skipped), ", reference.len());
    assert!(page.contains(&said) && page.contains("Images per second, per commit"), "{page}");
    assert!(page.contains("Images per band of decoded size"), "the plan's images on the page");
    assert!(!page.contains("useful tokens"), "an image campaign's page speaks of tokens");
    // A file changed since the run: its vector cannot be checked, and verify says so by id.
    let changed = images.join("rgb-640x480.png");
    let kept = std::fs::read(&changed).unwrap();
    std::fs::write(&changed, "overwritten").unwrap();
    let o = pipeline(&["verify", "folder.lance", "--job", "job.sql"], dir);
    let (out, _) = text(&o);
    assert!(
        o.status.code() == Some(2)
            && out.contains("CANNOT CHECK: 1 sampled images have vectors but cannot be read now")
            && out.contains("rgb-640x480.png"),
        "{out}"
    );
    std::fs::write(&changed, kept).unwrap();
    let o = run_job(
        dir,
        "",
        "SELECT 'gone' AS id, embed_image('corpus/images/gone.png', 'gone') AS embedding",
        "gone.lance",
    );
    let (_, err) = text(&o);
    assert!(
        !o.status.success()
            && err.contains("the image of id gone cannot be read from its file: corpus/images/gone.png"),
        "{err}"
    );

    let good = "SELECT id, image FROM imgs";
    for (set, bad, said) in [
        ("", "SELECT 'empty' AS id, CAST('' AS BYTEA) AS image", "the image of id empty is empty (0 bytes)"),
        (
            "",
            "SELECT 'words' AS id, CAST('plain words, not a picture' AS BYTEA) AS image",
            "the image of id words cannot be read as an image: not an image of a known format",
        ),
        (
            "",
            "SELECT 'cut' AS id, decode(substr(encode(image, 'hex'), 1, 400), 'hex') AS image FROM imgs WHERE id = 'rgb-640x480.png'",
            "the image of id cut cannot be read as an image: Png",
        ),
        (
            "SET embed.max_image_pixels = 100000;",
            "SELECT 'big' AS id, image FROM imgs WHERE id = 'rgb-640x480.png'",
            "pixels, more than embed.max_image_pixels = 100000",
        ),
    ] {
        let query = format!("SELECT id, embed_image(image, id) AS embedding FROM ({good} UNION ALL {bad})");
        let o = run_job(dir, set, &query, "bad.lance");
        let (_, err) = text(&o);
        assert!(!o.status.success() && err.contains(said), "{said}: {err}");
        // Rows embedded before the bad one may have been committed (a resume goes on from them): only good ones.
        if dir.join("bad.lance").join("_versions").exists() {
            let kept = written(dir, "bad.lance").await;
            assert!(kept.keys().all(|id| id.contains('.')), "{said}: only the good images: {:?}", kept.keys());
            std::fs::remove_dir_all(dir.join("bad.lance")).unwrap();
        }
    }
    // Skipped instead: no row for a bad image, each counted and listed by id in the run record; a NULL image keeps
    // its row (and a NULL vector), as a NULL text does.
    let bad = "SELECT 'empty' AS id, CAST('' AS BYTEA) AS image UNION ALL SELECT 'words', CAST('plain words' AS BYTEA) \
               UNION ALL SELECT 'nothing', CAST(NULL AS BYTEA)";
    let query = format!("SELECT id, embed_image(image, id) AS embedding FROM ({good} UNION ALL {bad})");
    let o = run_job(dir, "SET embed.bad_images = 'skip';", &query, "skip.lance");
    assert!(o.status.success(), "{:?}", text(&o));
    let location = dir.join("skip.lance").display().to_string();
    let batches = sql(
        &session_on(&dir.join("model")),
        &format!(
            "CREATE EXTERNAL TABLE s STORED AS LANCE LOCATION '{location}'; SELECT id, embedding FROM s ORDER BY id"
        ),
    )
    .await
    .unwrap();
    let ids = strings(&batches, "id");
    assert_eq!(ids.len(), reference.len() + 1, "the good images and the NULL one: {ids:?}");
    assert!(ids.contains(&"nothing".to_string()) && !ids.contains(&"empty".to_string()), "{ids:?}");
    let o = pipeline(&["inspect", "skip.lance", "--json"], dir);
    let inspected: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    let run = &inspected["versions"][0]["run"];
    assert_eq!(run["skipped_images"], 2, "{run}");
    let listed = run["skipped_image_ids"].to_string();
    assert!(
        listed.contains("\"empty\"") && listed.contains("is empty (0 bytes)") && listed.contains("\"words\""),
        "{listed}"
    );
    // plan: the bad images found from their headers, before any run, named by id.
    let o = pipeline(&["plan", "job.sql"], dir);
    let (out, err) = text(&o);
    assert!(o.status.success() && out.contains("1 NULL, 2 bad)"), "{out}{err}");
    assert!(
        out.contains("bad images: 2 (embed.bad_images = 'skip'") && out.contains("empty (is empty (0 bytes))"),
        "{out}"
    );
    // verify: the skipped ids are not missing ones (their run record lists them), and in the sample they are bad
    // images without a vector, as the run left them.
    let o = pipeline(&["verify", "skip.lance", "--job", "job.sql", "--json"], dir);
    let report: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    assert_eq!(report["verdict"], "sound", "{report}");
    assert_eq!((&report["ids"]["missing"], &report["ids"]["skipped"]), (&0.into(), &2.into()), "{report}");
    assert_eq!(report["sample"]["bad_skipped"], 2, "{report}");
    assert_eq!(report["sample"]["rows"], reference.len() as u64, "{report}");

    // Killed (SIGKILL) once a commit is in, then run again: every id once, each image's vector its own. 760 rows
    // (each image 40 times), 24 to a commit.
    let many = "SELECT id || '#' || CAST(n AS VARCHAR) AS id, embed_image(image, id) AS embedding \
                FROM imgs CROSS JOIN generate_series(1, 40) AS t(n)";
    let set = "SET embed.commit_rows = 24; SET embed.batch_images = 8;";
    let job = format!(
        "SET embed.model = 'model';\n{set}\nCREATE EXTERNAL TABLE imgs STORED AS PARQUET LOCATION \
         'corpus/images.parquet';\nCOPY ({many}) TO 'killed.lance' STORED AS LANCE;\n"
    );
    std::fs::write(dir.join("killed.sql"), job).unwrap();
    let mut child = crate::common::spawn(&["run", "-q", "killed.sql"], dir);
    let start = std::time::Instant::now();
    while !dir.join("killed.lance/_versions").read_dir().is_ok_and(|mut d| d.next().is_some()) {
        assert!(child.try_wait().unwrap().is_none(), "the run ended before its first commit");
        assert!(start.elapsed().as_secs() < 120, "no commit within 120 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap();
    let _ = child.wait();
    let o = pipeline(&["run", "killed.sql"], dir);
    let (out, err) = text(&o);
    let rows = 40 * reference.len();
    let resumed = out.contains("resuming: ") && out.contains(&format!(" of {rows} already done"));
    assert!(o.status.success() && resumed, "{out}{err}");
    let ours = written(dir, "killed.lance").await;
    assert_eq!(ours.len(), rows, "every id once");
    for (id, got) in &ours {
        let c = cosine(got, &reference[id.split('#').next().unwrap()]);
        assert!(c >= 0.9999, "{id}: cosine {c} after the kill");
    }

    // A text model has no vision tower: refused by name before anything is embedded.
    let job = format!(
        "SET embed.model = '{}';\nCREATE EXTERNAL TABLE imgs STORED AS PARQUET LOCATION 'corpus/images.parquet';\n\
         COPY (SELECT id, embed_image(image) AS embedding FROM imgs) TO 'text.lance' STORED AS LANCE;\n",
        model_dir().display()
    );
    std::fs::write(dir.join("text.sql"), job).unwrap();
    let o = pipeline(&["run", "-q", "text.sql"], dir);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("embed_image() needs an image-text model"), "{err}");
}

/// `pipeline trial` of the folder's job (planned): a sample band by band through the write path, each band's
/// images/s extrapolated to its images in the corpus; a smaller trial's images are among the larger's and its vectors
/// match them; `pipeline cost` prices images; a window over the rows; a trial again replaces its vectors; without a
/// plan it makes one.
async fn trial_and_cost(dir: &Path, reference: &HashMap<String, Vec<f32>>) {
    let o =
        pipeline(&["trial", "job.sql", "--sample", "8", "--save", "t/a.json", "--name", "cpu-a", "--no-probe"], dir);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains("trial of job.sql (images)") && out.contains("plan: the plan "), "{out}");
    let a: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("t/a.json")).unwrap()).unwrap();
    let n = |v: &serde_json::Value| v.as_u64().unwrap();
    let f = |v: &serde_json::Value| v.as_f64().unwrap();
    assert_eq!((&a["kind"], n(&a["corpus"]["images"])), (&"images".into(), reference.len() as u64), "{a}");
    let bands = a["bands"].as_array().unwrap();
    assert_eq!(bands.iter().map(|b| n(&b["corpus_images"])).sum::<u64>(), reference.len() as u64, "{a}");
    let sampled: u64 = bands.iter().map(|b| n(&b["sample_images"])).sum();
    assert_eq!(sampled, n(&a["sample"]["images"]), "{a}");
    // The 8 largest always, and about half of the rest at the nearest step to 8 of 19.
    assert!(n(&a["sample"]["step"]) == 2 && sampled >= 8 && sampled < reference.len() as u64, "{a}");
    for b in bands.iter().filter(|b| n(&b["corpus_images"]) > 0) {
        assert!(f(&b["images_per_second"]) > 0.0 && f(&b["predicted_seconds"]) > 0.0, "{b}");
        assert!(n(&b["timed_images"]) == n(&b["sample_images"]) || b["rate_from_band"].is_string(), "{b}");
    }
    let p = &a["prediction"];
    let parts = ["model_load_seconds", "startup_seconds", "finish_seconds", "embedding_seconds"];
    assert!((f(&p["seconds"]) - parts.iter().map(|k| f(&p[k])).sum::<f64>()).abs() < 1e-6, "{p}");
    assert!(f(&p["low_seconds"]) <= f(&p["seconds"]) && f(&p["seconds"]) <= f(&p["high_seconds"]), "{p}");
    // The sample's vectors, each its image's.
    let vectors = written(dir, "t/a.lance").await;
    assert_eq!(vectors.len() as u64, sampled);
    for (id, v) in &vectors {
        assert!(cosine(v, &reference[id]) >= 0.9999, "{id}");
    }

    // A smaller trial, against the first's vectors: its images are among them, the same vectors.
    let o = pipeline(&["trial", "job.sql", "--sample", "2", "--save", "t/b.json", "--reference", "t/a.lance"], dir);
    let (out, err) = text(&o);
    assert!(o.status.success() && out.contains("the vectors match"), "{out}{err}");
    assert!(out.contains("settings (from the probe): embed.batch_images = "), "{out}");
    let b: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("t/b.json")).unwrap()).unwrap();
    assert!(n(&b["sample"]["step"]) > 2 && n(&b["comparison"]["matched"]) == n(&b["sample"]["images"]), "{b}");

    // Priced per million images.
    std::fs::write(dir.join("prices.toml"), "[per_hour]\n\"cpu-a\" = 1.0\ncpu = 2.0\n").unwrap();
    let o = pipeline(&["cost", "t/a.json", "t/b.json", "--prices", "prices.toml"], dir);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}{err}");
    assert!(out.contains(&format!("cost of {} images", reference.len())) && out.contains("USD/M images"), "{out}");
    let o = pipeline(&["cost", "t/a.json", "--prices", "prices.toml", "--json"], dir);
    let cost: serde_json::Value = serde_json::from_str(&text(&o).0).unwrap();
    let row = &cost["rows"][0];
    let want = f(&row["cost"]) / (reference.len() as f64 / 1e6);
    assert!((f(&row["per_million_images"]) - want).abs() < 1e-9 * want.max(1.0), "{cost}");
    assert_eq!((&cost["images"], &row["per_million_tokens"]), (&reference.len().into(), &serde_json::Value::Null));
    let (b, cost) = (b.to_string(), cost.to_string());
    super::json_schemas::assert_matches_schemas(dir, &[("trial", &b), ("cost", &cost)]);

    // A shape users write: a window over the rows; the sample's ids are kept under the window, before embed_image().
    let window = "SET embed.model = 'model';\nCOPY (SELECT id, embed_image(path, id) AS embedding, row_number() OVER \
                  (ORDER BY id) AS n FROM image_files('corpus/images')) TO 'w.lance' STORED AS LANCE;\n";
    std::fs::write(dir.join("window.sql"), window).unwrap();
    let o = pipeline(&["trial", "window.sql", "--sample", "2", "--save", "t/w.json", "--no-probe"], dir);
    assert!(o.status.success(), "{:?}", text(&o));
    let w: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("t/w.json")).unwrap()).unwrap();
    assert_eq!(written(dir, "t/w.lance").await.len() as u64, n(&w["sample"]["images"]), "{w}");

    // Again into the same file: its vectors are replaced, not added to; without a plan, the trial makes one.
    std::fs::rename(dir.join("folder.lance.plan"), dir.join("plan.kept")).unwrap();
    let o = pipeline(&["trial", "job.sql", "--sample", "8", "--save", "t/a.json", "--no-probe"], dir);
    let (out, err) = text(&o);
    assert!(o.status.success() && out.contains("plan: a plan made now (no plan beside the output)"), "{out}{err}");
    assert_eq!(written(dir, "t/a.lance").await.len() as u64, sampled);
    assert!(!dir.join("folder.lance.plan").exists(), "the trial keeps its plan to itself");
    std::fs::rename(dir.join("plan.kept"), dir.join("folder.lance.plan")).unwrap();
}

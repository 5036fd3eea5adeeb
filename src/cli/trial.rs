//! `pipeline trial job.sql [--minutes M | --sample N] [--save trial.json] [--reference DATASET]`: what the
//! job's first write into Lance will cost on this machine's device, measured on a sample by
//! [`embedding_pipeline::ops::trial`], printed.

use std::path::Path;

use super::Exit;
use embedding_pipeline::ops::cost::duration;
use embedding_pipeline::ops::trial::{TrialArgs, TrialReport, run_trial};

/// Run the trial and print (or with `json` print as JSON) what it found; it is saved to `args.save`.
pub async fn trial_file(args: &TrialArgs, json: bool) -> anyhow::Result<()> {
    let report = run_trial(args).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report, &args.save);
    }
    if let Some(why) = report.mismatch() {
        return Err(Exit::with(Exit::DIFFER, anyhow::anyhow!(why)));
    }
    Ok(())
}

/// How busy the model was during the sample, and what that means for the prediction.
fn print_host(r: &TrialReport) {
    let Some(h) = &r.host else { return };
    println!("  while the sample was embedded: {}", h.describe());
    if h.cores_to_keep_busy.is_some() {
        println!(
            "  the prediction holds for this machine's {} cores: one with more would run faster, up to the model's \
             own rate",
            h.cores
        );
    }
}

fn print_report(r: &TrialReport, save: &Path) {
    println!("trial of {} on {}", r.job, r.device);
    let s = &r.settings;
    println!(
        "  settings (from {}): embed.batch_tokens = {}, embed.max_batch_rows = {}, {} session(s) x {} thread(s)",
        s.from, s.batch_tokens, s.max_batch_rows, s.sessions_per_device, s.intra_threads
    );
    if let Some(p) = &r.probe {
        println!("  probe: {} steps, {}", p.steps.len(), p.stopped);
    }
    println!("  plan: {}", r.plan_from);
    let c = &r.corpus;
    println!("  corpus: {} rows, {} useful tokens", c.rows, c.useful_tokens);
    let m = &r.sample;
    println!(
        "  sample: {} rows, {} useful tokens ({:.1}% of the corpus's), for {}; its length mix is within {:.1} points \
         of the corpus's in every bin",
        m.rows,
        m.useful_tokens,
        100.0 * m.share_of_tokens,
        m.chosen_by,
        100.0 * m.largest_bin_difference
    );
    println!("  stratum  tokens/text  corpus tokens  sample tokens  calls  useful tokens/s   predicted");
    for st in &r.strata {
        let rate = match st.rate_from_stratum {
            Some(k) => format!("{:.0} (of {k})", st.useful_tokens_per_second),
            None => format!("{:.0}", st.useful_tokens_per_second),
        };
        println!(
            "  {:>7} {:>12} {:>14} {:>14} {:>6} {:>16} {:>11}",
            st.stratum,
            format!("{}-{}", st.shortest, st.longest),
            st.corpus_tokens,
            st.sample_tokens,
            st.timed_calls,
            rate,
            duration(st.predicted_seconds)
        );
    }
    let p = &r.prediction;
    println!(
        "predicted for the whole corpus from its plan: {} ({} to {}), {:.0} useful tokens/s",
        duration(p.seconds),
        duration(p.low_seconds),
        duration(p.high_seconds),
        p.useful_tokens_per_second
    );
    println!(
        "  of which model load {:.1} s, start {:.1} s, finish {:.1} s; the range is two standard errors of each \
         stratum's rate, not the machine's drift",
        p.model_load_seconds, p.startup_seconds, p.finish_seconds
    );
    print_host(r);
    if let Some(t) = r.plan_seconds {
        println!("  a run without a plan also counts the corpus first: planning took {t:.1} s here");
    }
    println!("  run the campaign with:");
    for line in &s.set {
        println!("    {line}");
    }
    if let Some(c) = &r.comparison {
        let f = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.6}"));
        println!(
            "against {}: {} ids, minimum cosine {}, mean {}, largest difference {}: {}",
            c.reference,
            c.matched,
            f(c.min_cosine),
            f(c.mean_cosine),
            f(c.max_abs_diff),
            if c.passed { "the vectors match".to_string() } else { format!("NO MATCH ({})", c.failures.join("; ")) }
        );
    }
    println!("saved {} (vectors: {})", save.display(), r.vectors);
}

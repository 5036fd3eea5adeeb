//! `pipeline probe job.sql [--memory-budget SIZE] [--json]`: the batch setting a campaign can afford on this
//! machine's device, found by [`embedding_pipeline::ops::probe`], printed.

use std::collections::BTreeMap;
use std::path::Path;

use embedding_pipeline::campaign::memory::mib;
use embedding_pipeline::model::fit::{MemorySplit, gib};
use embedding_pipeline::ops::probe::{LAYOUT_ROUNDS, ProbeReport, SAME_SPEED, faster_layout, probe_job};

/// Probe the first write into Lance of the job file, and print what was found.
pub async fn probe_file(
    file: &Path,
    vars: &BTreeMap<String, String>,
    budget: Option<u64>,
    max_batch_tokens: usize,
    json: bool,
) -> anyhow::Result<()> {
    let report = probe_job(file, vars, budget, max_batch_tokens).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    if let Some(why) = report.no_fit() {
        anyhow::bail!(why);
    }
    Ok(())
}

/// The 48 GB split, as `probe` and `cost` print it.
pub fn print_split(s: &MemorySplit) {
    let by_type: Vec<String> = s.weights.iter().map(|(t, b)| format!("{t} {}", gib(*b))).collect();
    println!("memory split, measured on {}:", s.measured_on);
    println!(
        "  weights {} ({}, exact from the graph); the session after load {}; working memory {} KiB a padded token",
        gib(s.weights_bytes),
        by_type.join(", "),
        gib(s.session_bytes),
        s.working_bytes_per_token.div_ceil(1024)
    );
    for line in s.statements() {
        println!("  {line}");
    }
}

fn print_report(r: &ProbeReport) {
    println!("probe on {}", r.device);
    println!(
        "  longest texts: {} tokens (from {}); memory budget {} ({}); {} with the model loaded",
        r.longest_tokens,
        r.longest_from,
        mib(r.budget_bytes),
        r.budget_from,
        mib(r.loaded_bytes)
    );
    println!("  memory: {}", if r.memory.is_empty() { "the process's resident memory (VmHWM)" } else { &r.memory });
    println!("  batch_tokens   rows  padded length    peak memory     working  useful tokens/s");
    for s in &r.steps {
        let note = match (&s.error, s.fits) {
            (Some(e), _) => format!("  failed: {e}"),
            (None, false) => "  past the budget's margin".to_string(),
            (None, true) => String::new(),
        };
        println!(
            "  {:>12} {:>6} {:>14} {:>14} {:>11} {:>16.0}{note}",
            s.batch_tokens,
            s.rows,
            s.padded_length,
            mib(s.peak_bytes),
            mib(s.working_bytes),
            s.useful_tokens_per_second
        );
    }
    println!("  stopped: {}", r.stopped);
    if let Some(split) = &r.split {
        print_split(split);
    }
    let Some(rec) = &r.recommended else { return };
    println!("recommended: embed.batch_tokens = {}: {}", rec.batch_tokens, rec.why);
    for line in &rec.set {
        println!("  {line}");
    }
    if r.layouts.len() >= 2 {
        println!("session layouts at {} tokens a call, timed in turn {LAYOUT_ROUNDS} times:", rec.batch_tokens);
        for l in &r.layouts {
            let what = format!("  {} session(s) x {} thread(s)", l.sessions_per_device, l.intra_threads);
            let skipped = l.skipped.as_deref().map(|why| format!(" ({why})")).unwrap_or_default();
            if l.rates.is_empty() {
                println!("{what}:{skipped}");
                continue;
            }
            let (lo, hi) = l.spread();
            println!(
                "{what}: {:.0} useful tokens/s (rounds {lo:.0}–{hi:.0}), working memory {}{skipped}",
                l.useful_tokens_per_second,
                mib(l.working_bytes)
            );
        }
        match faster_layout(&r.layouts) {
            Some((other, least, most)) => println!(
                "  {least:.2}x–{most:.2}x faster in every round: SET embed.sessions_per_device = {}; SET \
                 embed.intra_threads = {};",
                other.sessions_per_device, other.intra_threads
            ),
            None if r.layouts.iter().any(|l| l.skipped.is_some()) => {
                println!("  a layout that does not fit the memory budget is not advised: keep the default layout")
            }
            None => println!(
                "  no layout beat the default in every round by more than {:.0}% (the rounds' spread is this \
                 machine's noise): keep the default layout",
                SAME_SPEED * 100.0
            ),
        }
    }
}

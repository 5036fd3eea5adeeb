//! `pipeline cost trial-a.json trial-b.json … [--prices prices.toml] [--deadline 7d] [--json] [--chart FILE]`:
//! the cost table [`crate::ops::cost`] makes of a campaign's trials, printed.

use std::path::{Path, PathBuf};

use crate::ops::cost::{CostReport, amount, cost_trials, hours_text};

/// Print the cost table of the trials in `files`.
pub fn cost_files(
    files: &[PathBuf],
    prices: Option<&Path>,
    deadline: Option<f64>,
    json: bool,
    chart: Option<&Path>,
) -> anyhow::Result<()> {
    let report = cost_trials(files, prices, deadline, chart)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report, chart);
    }
    Ok(())
}

fn print_report(r: &CostReport, chart: Option<&Path>) {
    let c = &r.currency;
    println!(
        "cost of {} useful tokens{}",
        r.useful_tokens,
        r.deadline_hours.map_or(String::new(), |d| format!(", deadline {}", hours_text(d)))
    );
    if r.placeholder_prices {
        println!("  the prices are PLACEHOLDERS (the prices file says so): put your provider's in before deciding");
    }
    let w = r.rows.iter().map(|row| row.name.chars().count()).max().unwrap_or(6).max(6);
    println!(
        "  {:<w$} {:>18} {:>10} {:>22} {:>14} {:>9} {:>9}",
        "device",
        "hours (range)",
        format!("{c}/hour"),
        format!("cost {c} (range)"),
        format!("{c}/M tokens"),
        "vectors",
        "deadline"
    );
    for row in &r.rows {
        let money = |x: Option<f64>| x.map_or("-".to_string(), amount);
        println!(
            "  {:<w$} {:>18} {:>10} {:>22} {:>14} {:>9} {:>9}",
            row.name,
            format!("{} ({}-{})", amount(row.hours), amount(row.low_hours), amount(row.high_hours)),
            money(row.per_hour),
            match (row.cost, row.low_cost, row.high_cost) {
                (Some(m), Some(l), Some(h)) => format!("{} ({}-{})", amount(m), amount(l), amount(h)),
                _ => "no price".to_string(),
            },
            money(row.per_million_tokens),
            match row.vectors_match {
                Some(true) => "match",
                Some(false) => "DIFFER",
                None => "unchecked",
            },
            match row.meets_deadline {
                Some(true) => "meets",
                Some(false) => "MISSES",
                None => "-",
            }
        );
    }
    match &r.choice {
        Some(_) => println!("choice: {}", r.why),
        None => println!("no choice: {}", r.why),
    }
    match &r.memory {
        Some(split) => super::probe::print_split(split),
        None => println!(
            "memory split: no trial probed (a trial probes unless the job sets embed.batch_tokens or --no-probe is given)"
        ),
    }
    if let Some(p) = chart {
        println!("chart: {}", p.display());
    }
}

//! `pipeline cost trial-a.json trial-b.json … [--prices prices.toml] [--deadline 7d] [--json] [--chart FILE]`:
//! the cost table [`embedding_pipeline::ops::cost`] makes of a campaign's trials, printed.

use std::path::{Path, PathBuf};

use super::ExitStatus;
use super::printer::{Printer, out};
use embedding_pipeline::ops::cost::{CostReport, amount, cost_trials, hours_text};

/// `pipeline cost`'s arguments.
#[derive(Debug, clap::Args)]
pub struct CostArgs {
    /// trial.json files from pipeline trial.
    #[arg(required = true)]
    trials: Vec<PathBuf>,
    /// Hourly prices (see examples/prices.toml, whose prices are placeholders).
    #[arg(long, value_name = "FILE")]
    prices: Option<PathBuf>,
    /// The campaign must finish within this, e.g. 7d, 36h, 90min.
    #[arg(long, value_parser = embedding_pipeline::ops::cost::parse_deadline)]
    deadline: Option<f64>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Draw hours and cost per device, with the deadline, into this SVG file.
    #[arg(long, value_name = "FILE")]
    chart: Option<PathBuf>,
}

/// Print the cost table of the trials.
pub fn run(args: CostArgs, printer: Printer) -> anyhow::Result<ExitStatus> {
    let CostArgs { trials, prices, deadline, json, chart } = args;
    let report = cost_trials(&trials, prices.as_deref(), deadline, chart.as_deref())?;
    if json {
        out!(printer, "{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report, chart.as_deref(), printer);
    }
    Ok(ExitStatus::Success)
}

fn print_report(r: &CostReport, chart: Option<&Path>, printer: Printer) {
    out!(
        printer,
        "cost of {}{}",
        r.work(),
        r.deadline_hours.map_or(String::new(), |d| format!(", deadline {}", hours_text(d)))
    );
    if r.placeholder_prices {
        out!(
            printer,
            "  the prices are PLACEHOLDERS (the prices file says so): put your provider's in before deciding"
        );
    }
    for line in table(r) {
        out!(printer, "  {line}");
    }
    match &r.choice {
        Some(_) => out!(printer, "choice: {}", r.why),
        None => out!(printer, "no choice: {}", r.why),
    }
    match &r.memory {
        Some(split) => super::probe::print_split(split, printer),
        None if r.images.is_some() => out!(
            printer,
            "memory split: none for an image model (pipeline probe gives each embed.batch_images' peak memory)"
        ),
        None => out!(
            printer,
            "memory split: no trial probed (a trial probes unless the job sets embed.batch_tokens or --no-probe is given)"
        ),
    }
    if let Some(p) = chart {
        out!(printer, "chart: {}", p.display());
    }
}

/// The cost table's lines, each column as wide as its widest cell: the device's name to the left, figures to the
/// right.
fn table(r: &CostReport) -> Vec<String> {
    let c = &r.currency;
    let per = if r.images.is_some() { format!("{c}/M images") } else { format!("{c}/M tokens") };
    let head =
        ["device", "hours (range)", &format!("{c}/hour"), &format!("cost {c} (range)"), &per].map(str::to_string);
    let mut rows = vec![[head.to_vec(), vec!["vectors".into(), "deadline".into()]].concat()];
    for row in &r.rows {
        let money = |x: Option<f64>| x.map_or("-".to_string(), amount);
        rows.push(vec![
            row.name.clone(),
            format!("{} ({}-{})", amount(row.hours), amount(row.low_hours), amount(row.high_hours)),
            money(row.per_hour),
            match (row.cost, row.low_cost, row.high_cost) {
                (Some(m), Some(l), Some(h)) => format!("{} ({}-{})", amount(m), amount(l), amount(h)),
                _ => "no price".to_string(),
            },
            money(row.per_million_tokens.or(row.per_million_images)),
            match row.vectors_match {
                Some(true) => "match",
                Some(false) => "DIFFER",
                None => "unchecked",
            }
            .to_string(),
            match row.meets_deadline {
                Some(true) => "meets",
                Some(false) => "MISSES",
                None => "-",
            }
            .to_string(),
        ]);
    }
    let widths: Vec<usize> =
        (0..rows[0].len()).map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0)).collect();
    rows.iter()
        .map(|cells| {
            let line: Vec<String> = cells
                .iter()
                .zip(&widths)
                .enumerate()
                .map(|(i, (cell, w))| if i == 0 { format!("{cell:<w$}") } else { format!("{cell:>w$}") })
                .collect();
            line.join("  ")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedding_pipeline::ops::cost::CostRow;

    /// A row: `hours` within ±10%, `cost` (if any) within the same, a thousand tokens' worth per million.
    fn row(name: &str, hours: f64, cost: Option<f64>) -> CostRow {
        CostRow {
            name: name.into(),
            device: String::new(),
            trial: String::new(),
            hours,
            low_hours: hours * 0.9,
            high_hours: hours * 1.1,
            priced_as: None,
            per_hour: cost.map(|c| c / hours),
            cost,
            low_cost: cost.map(|c| c * 0.9),
            high_cost: cost.map(|c| c * 1.1),
            per_million_tokens: cost.map(|c| c / 1000.0),
            per_million_images: None,
            vectors_match: Some(true),
            meets_deadline: None,
        }
    }

    #[test]
    fn the_cost_tables_columns_line_up_whatever_the_figures() {
        // Issue 53: long ranges and small figures pushed the columns out of line.
        let report = CostReport {
            currency: "USD".into(),
            placeholder_prices: false,
            useful_tokens: 1000,
            images: None,
            deadline_hours: None,
            rows: vec![
                row("a6000-cloud-x", 123.456, Some(0.004213)),
                row("cpu", 0.0123, None),
                row("h", 5.0, Some(99.5)),
            ],
            choice: None,
            why: String::new(),
            memory: None,
        };
        let lines = table(&report);
        assert_eq!(lines.len(), 4);
        let widths: Vec<usize> = lines.iter().map(|l| l.chars().count()).collect();
        assert!(widths.iter().all(|w| *w == widths[0]), "{lines:#?}");
        assert!(lines[1].contains("0.00421 (0.00379-0.00463)"), "{lines:#?}");
        assert!(lines.iter().all(|l| l.ends_with("deadline") || l.ends_with('-')), "{lines:#?}");
    }
}

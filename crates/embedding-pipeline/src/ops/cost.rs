//! Costing a campaign (`pipeline cost trial-a.json trial-b.json …`): the trials of one campaign on several
//! devices side by side: hours for the whole corpus (with the
//! trial's range), the price of those hours, the price of a million useful tokens, whether the device's
//! vectors matched the reference, whether it meets the deadline; and the cheapest device that does both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde::{Deserialize, Serialize};

use super::trial::Trial;
use crate::error::{Error, Result};

/// A prices file, as `examples/prices.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    /// Currency of the prices, for the output only.
    #[serde(default = "dollars")]
    pub currency: String,
    /// Whether the prices are placeholders (the example's are): the output says so.
    #[serde(default)]
    pub placeholder: bool,
    /// Price of an hour, by name. A trial takes the price of the entry equal to its name, else of the
    /// longest entry its name or device contains (case ignored).
    pub per_hour: BTreeMap<String, f64>,
}

fn dollars() -> String {
    "USD".into()
}

impl Prices {
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::file(format!("cannot read prices {}", path.display()), e))?;
        let prices: Self = toml::from_str(&text)
            .map_err(|e| Error::Refused(format!("{}: {}", path.display(), e.to_string().trim())))?;
        if let Some((name, p)) = prices.per_hour.iter().find(|(_, p)| !p.is_finite() || **p < 0.0) {
            return Err(Error::Refused(format!(
                "{}: the price of {name} is {p}; prices are hourly amounts of 0 or more",
                path.display()
            )));
        }
        Ok(prices)
    }

    /// The hourly price for a trial named `name` on `device`, and the entry it came from.
    pub fn for_trial(&self, name: &str, device: &str) -> Option<(&str, f64)> {
        let (name_l, device_l) = (name.to_lowercase(), device.to_lowercase());
        if let Some((k, p)) = self.per_hour.iter().find(|(k, _)| k.to_lowercase() == name_l) {
            return Some((k, *p));
        }
        self.per_hour
            .iter()
            .filter(|(k, _)| {
                let k = k.to_lowercase();
                name_l.contains(&k) || device_l.contains(&k)
            })
            .max_by_key(|(k, _)| k.len())
            .map(|(k, p)| (k.as_str(), *p))
    }
}

/// One trial's line.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub struct CostRow {
    pub name: String,
    pub device: String,
    pub trial: String,
    pub hours: f64,
    pub low_hours: f64,
    pub high_hours: f64,
    /// The prices file's entry that priced it, and its hourly price.
    pub priced_as: Option<String>,
    pub per_hour: Option<f64>,
    pub cost: Option<f64>,
    pub low_cost: Option<f64>,
    pub high_cost: Option<f64>,
    /// The price of a million useful tokens (a text campaign's trials) or images (an image campaign's).
    pub per_million_tokens: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_million_images: Option<f64>,
    /// `None` when the trial was not compared with a reference.
    pub vectors_match: Option<bool>,
    /// Whether even the range's high end is within the deadline; `None` without a deadline.
    pub meets_deadline: Option<bool>,
}

#[cfg(test)]
impl CostRow {
    /// A row for tests: `hours` within ±10%, `cost` (if any) within the same, a thousand tokens' worth per million,
    /// vectors that match and no deadline.
    pub(crate) fn sample(name: &str, hours: f64, cost: Option<f64>) -> Self {
        Self {
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
}

/// The table and the choice.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct CostReport {
    pub currency: String,
    pub placeholder_prices: bool,
    /// The corpus's useful tokens (a text campaign's trials; 0 for images) and images (an image campaign's).
    pub useful_tokens: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<u64>,
    pub deadline_hours: Option<f64>,
    pub rows: Vec<CostRow>,
    /// The chosen row's name, and why (or why none).
    pub choice: Option<String>,
    pub why: String,
    /// Whether the model fits a 48 GB and an 80 GB card, from the first trial that probed (see
    /// [`crate::model::fit`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<crate::model::fit::MemorySplit>,
}

/// The cost of each trial, and the cheapest that meets the deadline with matching vectors.
pub fn cost(trials: &[(String, Trial)], prices: Option<&Prices>, deadline_hours: Option<f64>) -> Result<CostReport> {
    let Some((first_path, first)) = trials.first() else {
        return Err(Error::Refused("no trial to price: name one or more trial.json files".into()));
    };
    let work = first.work();
    for (path, t) in trials {
        let w = t.work();
        if w != work {
            return Err(Error::Refused(format!(
                "{path} is a trial of another corpus ({} rows, {} {}) than {first_path} ({} rows, {} {}); cost \
                 compares trials of one campaign",
                w.rows, w.amount, w.unit, work.rows, work.amount, work.unit
            )));
        }
    }
    let rows: Vec<CostRow> = trials
        .iter()
        .map(|(path, t)| {
            let (seconds, low, high) = t.seconds();
            let hours = |s: f64| s / 3600.0;
            let priced = prices.and_then(|prices| prices.for_trial(t.name(), &t.device().device));
            let per_hour = priced.map(|(_, p)| p);
            let cost = per_hour.map(|r| r * hours(seconds));
            let per_million = cost.filter(|_| work.amount > 0).map(|c| c / (work.amount as f64 / 1e6));
            let images = work.unit == "images";
            CostRow {
                name: t.name().to_string(),
                device: t.device().device.clone(),
                trial: path.clone(),
                hours: hours(seconds),
                low_hours: hours(low),
                high_hours: hours(high),
                priced_as: priced.map(|(k, _)| k.to_string()),
                per_hour,
                cost,
                low_cost: per_hour.map(|r| r * hours(low)),
                high_cost: per_hour.map(|r| r * hours(high)),
                per_million_tokens: per_million.filter(|_| !images),
                per_million_images: per_million.filter(|_| images),
                vectors_match: t.comparison().map(|c| c.passed),
                meets_deadline: deadline_hours.map(|d| hours(high) <= d),
            }
        })
        .collect();
    let (choice, why) = choose(&rows, deadline_hours);
    let memory = trials.iter().find_map(|(_, t)| t.memory_split().cloned());
    let images = work.unit == "images";
    Ok(CostReport {
        memory,
        currency: prices.map_or_else(dollars, |p| p.currency.clone()),
        placeholder_prices: prices.is_some_and(|p| p.placeholder),
        useful_tokens: if images { 0 } else { work.amount },
        images: images.then_some(work.amount),
        deadline_hours,
        rows,
        choice,
        why,
    })
}

impl CostReport {
    /// What the corpus holds, in words (`1200 useful tokens`, `19 images`).
    pub fn work(&self) -> String {
        match self.images {
            Some(n) => format!("{n} images"),
            None => format!("{} useful tokens", self.useful_tokens),
        }
    }
}

/// The cheapest row whose vectors did not fail to match and that meets the deadline; the fastest among
/// equal costs. Without prices, the fastest.
fn choose(rows: &[CostRow], deadline: Option<f64>) -> (Option<String>, String) {
    let ok = |r: &&CostRow| r.vectors_match != Some(false) && r.meets_deadline != Some(false);
    let priced = rows.iter().any(|r| r.cost.is_some());
    let candidates: Vec<&CostRow> = rows.iter().filter(ok).filter(|r| !priced || r.cost.is_some()).collect();
    let best = candidates.iter().min_by(|a, b| {
        let key = |r: &CostRow| (r.cost.unwrap_or(0.0), r.hours);
        key(a).partial_cmp(&key(b)).unwrap_or(std::cmp::Ordering::Equal)
    });
    let deadline_text = deadline.map_or(String::new(), |d| format!(" within the deadline of {}", hours_text(d)));
    match best {
        Some(r) => {
            let what = if priced { "the cheapest" } else { "the fastest (no prices given)" };
            let checked = match r.vectors_match {
                Some(true) => "its vectors match the reference",
                _ => "its vectors were not compared with a reference (pipeline trial --reference)",
            };
            (Some(r.name.clone()), format!("{} is {what} device{deadline_text}; {checked}", r.name))
        }
        None => {
            let mut reasons = Vec::new();
            if rows.iter().any(|r| r.vectors_match == Some(false)) {
                reasons.push("some devices' vectors do not match the reference");
            }
            if rows.iter().any(|r| r.meets_deadline == Some(false)) {
                reasons.push("some devices would not finish in time even at their range's high end");
            }
            if priced && rows.iter().any(|r| r.cost.is_none()) {
                reasons.push("some devices have no price in the prices file");
            }
            (None, format!("no device meets every condition{deadline_text}: {}", reasons.join("; ")))
        }
    }
}

/// An amount with two decimals, or three significant digits below 1 (small trials cost fractions of a cent).
pub fn amount(x: f64) -> String {
    if x.abs() >= 1.0 || x == 0.0 {
        format!("{x:.2}")
    } else {
        format!("{:.*}", (2 - x.abs().log10().floor() as i32).max(2) as usize, x)
    }
}

/// Seconds as hours and minutes (`25 min`, `72 h 10 min`).
pub fn duration(seconds: f64) -> String {
    let minutes = (seconds / 60.0).round() as u64;
    match minutes {
        0 => format!("{seconds:.0} s"),
        m if m < 60 => format!("{m} min"),
        m => format!("{} h {:02} min", m / 60, m % 60),
    }
}

/// Hours as days and hours past two days.
pub fn hours_text(h: f64) -> String {
    if h >= 48.0 { format!("{:.1} days", h / 24.0) } else { format!("{h:.1} h") }
}

/// A deadline such as `7d`, `36h` or `90min`, in hours.
pub fn parse_deadline(text: &str) -> Result<f64, String> {
    humantime::parse_duration(text.trim())
        .map(|d| d.as_secs_f64() / 3600.0)
        .map_err(|e| format!("{text:?} is not a duration such as 7d, 36h or 90min ({e})"))
}

/// The cost report of the trials in `files` (saved `trial.json`s), priced by the prices file if given; with
/// `chart`, its picture written there too.
pub fn cost_trials(
    files: &[PathBuf],
    prices: Option<&Path>,
    deadline: Option<f64>,
    chart: Option<&Path>,
) -> Result<CostReport> {
    let prices = prices.map(Prices::read).transpose()?;
    let trials = files.iter().map(|f| Ok((f.display().to_string(), Trial::read(f)?))).collect::<Result<Vec<_>>>()?;
    let report = cost(&trials, prices.as_ref(), deadline)?;
    if let Some(path) = chart {
        cost_svg(path, &report).map_err(Error::Refused)?;
    }
    Ok(report)
}

/// How many times the highest bar a deadline may be and still be drawn as a line on the chart's scale.
const DEADLINE_IN_SCALE: f64 = 4.0;

/// Hours per device as bars with the range as a whisker, the cost written above each, and the deadline
/// as a red line; SVG, with text as SVG text (no system font needed).
pub fn cost_svg(path: &Path, r: &CostReport) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("chart {}: {e}", path.display());
    let n = r.rows.len();
    if n == 0 {
        return Err(err(&"no trial to draw"));
    }
    let highest = r.rows.iter().map(|row| row.high_hours).fold(0.0, f64::max).max(1e-6);
    // A deadline far above every bar would flatten them to nothing: it is then said in the caption, not drawn.
    let deadline = r.deadline_hours.filter(|d| *d <= highest * DEADLINE_IN_SCALE);
    let top = deadline.unwrap_or(0.0).max(highest) * 1.25;
    let root = SVGBackend::new(path, (220 + 160 * n as u32, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let caption = format!(
        "Predicted hours for {}{}{}",
        r.work(),
        if r.placeholder_prices { " (placeholder prices)" } else { "" },
        match r.deadline_hours {
            Some(d) if deadline.is_none() => format!("; deadline {}, far above every bar", hours_text(d)),
            _ => String::new(),
        }
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(14)
        .x_label_area_size(10)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, 0f64..top)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_labels(0)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .y_desc("hours")
        .draw()
        .map_err(|e| err(&e))?;
    for (i, row) in r.rows.iter().enumerate() {
        let x = i as f64;
        let color =
            if r.choice.as_deref() == Some(row.name.as_str()) { RGBColor(60, 150, 80) } else { RGBColor(70, 110, 180) };
        chart
            .draw_series(std::iter::once(Rectangle::new([(x + 0.2, 0.0), (x + 0.8, row.hours)], color.filled())))
            .map_err(|e| err(&e))?;
        let whisker =
            PathElement::new(vec![(x + 0.5, row.low_hours), (x + 0.5, row.high_hours)], BLACK.stroke_width(2));
        chart.draw_series(std::iter::once(whisker)).map_err(|e| err(&e))?;
        let label = match row.cost {
            Some(c) => format!("{}: {} {}", row.name, amount(c), r.currency),
            None => format!("{}: no price", row.name),
        };
        let style = TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
        chart
            .draw_series(std::iter::once(Text::new(label, (x + 0.5, row.high_hours + top / 40.0), style)))
            .map_err(|e| err(&e))?;
    }
    if let Some(d) = deadline {
        chart
            .draw_series(std::iter::once(PathElement::new(vec![(0.0, d), (n as f64, d)], RED.stroke_width(2))))
            .map_err(|e| err(&e))?
            .label(format!("deadline: {}", hours_text(d)))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, hours: f64, cost: Option<f64>, matched: Option<bool>, meets: Option<bool>) -> CostRow {
        CostRow {
            low_cost: None,
            high_cost: None,
            per_million_tokens: None,
            vectors_match: matched,
            meets_deadline: meets,
            ..CostRow::sample(name, hours, cost)
        }
    }

    #[test]
    fn prices_match_the_name_exactly_first_then_the_longest_entry_contained() {
        let prices: Prices = toml::from_str(
            "currency = \"EUR\"\n[per_hour]\n\"RTX 6000 Ada\" = 1.0\n\"RTX 6000\" = 0.5\n\"A100\" = 2.0\n\"cpu-2t\" = 0.1\n",
        )
        .unwrap();
        assert_eq!(prices.for_trial("x", "cuda:0: NVIDIA RTX 6000 Ada Generation"), Some(("RTX 6000 Ada", 1.0)));
        assert_eq!(prices.for_trial("x", "cuda:0: Quadro RTX 6000"), Some(("RTX 6000", 0.5)));
        assert_eq!(prices.for_trial("CPU-2T", "cpu: AMD EPYC"), Some(("cpu-2t", 0.1)));
        assert_eq!(prices.for_trial("x", "cuda:0: NVIDIA H100"), None);
        assert!(toml::from_str::<Prices>("[per_hour]\nA40 = \"cheap\"\n").is_err());
        assert!(toml::from_str::<Prices>("price = 1\n[per_hour]\n").is_err(), "unknown keys are refused");
    }

    #[test]
    fn the_cheapest_device_that_matches_and_meets_the_deadline_is_chosen() {
        let rows = [
            row("a", 10.0, Some(5.0), Some(true), Some(true)),
            row("b", 5.0, Some(4.0), Some(false), Some(true)),
            row("c", 50.0, Some(3.0), Some(true), Some(false)),
            row("d", 8.0, Some(5.0), Some(true), Some(true)),
        ];
        let (choice, why) = choose(&rows, Some(24.0));
        // b is cheaper but its vectors differ; c misses the deadline; a and d cost the same: d is faster.
        assert_eq!(choice.as_deref(), Some("d"), "{why}");
        assert!(why.contains("cheapest") && why.contains("match the reference"), "{why}");
        let (none, why) = choose(&rows[1..3], Some(24.0));
        assert!(none.is_none());
        assert!(why.contains("do not match") && why.contains("not finish in time"), "{why}");
        let (fastest, why) = choose(&[row("x", 3.0, None, None, None), row("y", 2.0, None, None, None)], None);
        assert_eq!(fastest.as_deref(), Some("y"));
        assert!(why.contains("fastest") && why.contains("not compared"), "{why}");
    }

    #[test]
    fn small_amounts_keep_three_significant_digits() {
        assert_eq!(amount(1234.567), "1234.57");
        assert_eq!(amount(0.5), "0.500");
        assert_eq!(amount(0.000_123_4), "0.000123");
        assert_eq!(amount(0.0), "0.00");
    }

    #[test]
    fn durations_read_as_hours_and_minutes() {
        assert_eq!(duration(12.0), "12 s");
        assert_eq!(duration(1_520.0), "25 min");
        assert_eq!(duration(3.0 * 86_400.0 + 600.0), "72 h 10 min");
    }

    #[test]
    fn deadlines_read_as_durations() {
        assert_eq!(parse_deadline("7d").unwrap(), 168.0);
        assert_eq!(parse_deadline("36h").unwrap(), 36.0);
        assert_eq!(parse_deadline("90min").unwrap(), 1.5);
        assert!(parse_deadline("a week").unwrap_err().contains("7d"));
    }

    #[test]
    fn the_chart_is_an_svg_with_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let report = CostReport {
            currency: "USD".into(),
            placeholder_prices: true,
            useful_tokens: 1000,
            images: None,
            deadline_hours: Some(24.0),
            rows: vec![
                row("cpu-1t", 10.0, Some(1.0), Some(true), Some(true)),
                row("cpu-2t", 6.0, Some(2.0), None, Some(true)),
            ],
            choice: Some("cpu-1t".into()),
            why: String::new(),
            memory: None,
        };
        let p = dir.path().join("cost.svg");
        cost_svg(&p, &report).unwrap();
        let s = std::fs::read_to_string(&p).unwrap();
        assert!(
            s.starts_with("<svg")
                && s.contains("deadline: 24.0 h")
                && s.contains("cpu-2t")
                && s.contains("cpu-1t: 1.00 USD"),
            "{s}"
        );
        assert!(bar_heights(&s).iter().all(|h| *h > 50.0), "{:?}", bar_heights(&s));

        // Issue 53: a 7-day deadline over a trial's minutes flattened the bars to nothing.
        let week = CostReport {
            deadline_hours: Some(168.0),
            rows: vec![row("cpu-1t", 0.02, Some(0.01), None, Some(true)), row("cpu-2t", 0.01, None, None, Some(true))],
            ..report
        };
        cost_svg(&p, &week).unwrap();
        let s = std::fs::read_to_string(&p).unwrap();
        let heights = bar_heights(&s);
        assert!(heights.len() == 2 && heights.iter().all(|h| *h > 50.0), "{heights:?}");
        assert!(s.contains("deadline 7.0 days, far above every bar"), "{s}");
    }

    /// The heights of the chart's bars (its rectangles in the bars' two colours), pixels.
    fn bar_heights(svg: &str) -> Vec<f64> {
        svg.split("<rect")
            .skip(1)
            .filter(|r| r.contains("fill=\"#466EB4\"") || r.contains("fill=\"#3C9650\""))
            .filter_map(|r| r.split("height=\"").nth(1)?.split('"').next()?.parse().ok())
            .collect()
    }
}

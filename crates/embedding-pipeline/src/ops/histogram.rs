//! The plan's token-length histogram as an SVG picture, drawn with `plotters` (its SVG backend only: text
//! is written as SVG text, sized by estimate, so no system font is needed).

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Draw `bins` (bin `i` covers `[i*bin_width, (i+1)*bin_width)`, the last bin holds everything
/// beyond) as bars, a red vertical line at `limit`, axis labels and `caption` as the title.
pub fn histogram_svg(
    path: &std::path::Path,
    bin_width: u32,
    bins: &[u64],
    limit: u64,
    caption: &str,
) -> Result<(), String> {
    let svg = histogram_svg_text(bin_width, bins, limit, caption)
        .map_err(|e| format!("histogram {}: {e}", path.display()))?;
    std::fs::write(path, svg).map_err(|e| format!("histogram {}: {e}", path.display()))
}

/// [`histogram_svg`]'s picture, as SVG text.
pub fn histogram_svg_text(bin_width: u32, bins: &[u64], limit: u64, caption: &str) -> Result<String, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    if bins.is_empty() || bin_width == 0 {
        return Err(err(&"need at least one bin and bin_width > 0"));
    }
    let w = u64::from(bin_width);
    let x_max = (bins.len() as u64 * w).max(limit + w);
    let y_max = bins.iter().copied().max().unwrap_or(0).max(1) * 11 / 10 + 1;
    let (last_start, last) = ((bins.len() as u64 - 1) * w, bins[bins.len() - 1]);

    let mut svg = String::new();
    let root = SVGBackend::with_string(&mut svg, (1000, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0u64..x_max, 0u64..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 17))
        .x_desc("tokens per text")
        .y_desc("texts")
        .draw()
        .map_err(|e| err(&e))?;
    let bars = bins.iter().enumerate().map(|(i, &n)| {
        let x0 = i as u64 * w;
        let color = if x0 >= limit { RGBColor(230, 120, 60) } else { RGBColor(70, 110, 180) };
        Rectangle::new([(x0, 0), (x0 + w, n)], color.filled())
    });
    chart.draw_series(bars).map_err(|e| err(&e))?;
    // The last bin is open-ended: label it "512+" right-aligned above the bar.
    let style = TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Right, VPos::Bottom));
    let overflow = Text::new(format!("{last_start}+"), (last_start + w, last + y_max / 100), style);
    chart.draw_series(std::iter::once(overflow)).map_err(|e| err(&e))?;
    let limit_line = PathElement::new(vec![(limit, 0), (limit, y_max)], RED.stroke_width(2));
    chart
        .draw_series(std::iter::once(limit_line))
        .map_err(|e| err(&e))?
        .label(format!("limit: {limit} tokens"))
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED.stroke_width(2)));
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    drop(chart);
    drop(root);
    Ok(svg)
}

/// The picture's title: how much of the corpus is past the limit.
pub fn caption(h: &crate::campaign::work_plan::Histogram, totals: &crate::campaign::work_plan::Totals) -> String {
    format!(
        "{} of {} texts ({:.1}%) and {:.1}% of their tokens are past the {}-token limit",
        totals.truncated_documents,
        totals.documents,
        100.0 * h.documents_over_limit,
        100.0 * h.tokens_over_limit,
        h.limit
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn text_is_escaped_and_nothing_to_draw_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.svg");
        super::histogram_svg(&p, 8, &[0, 3, 1], 256, "a <b> & \"c\" 1,275 (2.1%)").unwrap();
        let s = std::fs::read_to_string(&p).unwrap();
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"), "{s}");
        assert!(s.contains("a &lt;b&gt; &amp;") && s.contains("limit: 256 tokens"), "{s}");
        assert!(super::histogram_svg(&p, 8, &[], 256, "x").is_err());
        assert!(super::histogram_svg(&p, 0, &[1], 256, "x").is_err());
        assert!(super::histogram_svg(&dir.path().join("no/such/dir.svg"), 8, &[1], 256, "x").is_err());
    }
}

//! The SVG bar chart beside a part's report.

use std::fmt::Write as _;

const COLORS: [&str; 6] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948",
];
const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 60.0;
const BOTTOM: f64 = 60.0;
const TOP: f64 = 40.0;
const PLOT_WIDTH: f64 = WIDTH - LEFT - 20.0;
const PLOT_HEIGHT: f64 = HEIGHT - BOTTOM - TOP;

/// A grouped bar chart: one group per `(label, values)`, one bar per series.
pub fn bar_chart(title: &str, series: &[&str], groups: &[(String, Vec<f64>)]) -> String {
    let max = groups
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        .max(1e-9);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"{LEFT}\" y=\"24\" font-size=\"15\">{title}</text>\n",
        HEIGHT + 20.0 * series.len() as f64
    );
    grid(&mut svg, max);
    let group_width = PLOT_WIDTH / groups.len().max(1) as f64;
    for (g, (label, values)) in groups.iter().enumerate() {
        let x0 = LEFT + group_width * g as f64 + group_width * 0.1;
        let bar_width = group_width * 0.8 / series.len().max(1) as f64;
        bars(&mut svg, series, values, max, x0, bar_width);
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
            x0 + group_width * 0.4,
            TOP + PLOT_HEIGHT + 18.0
        );
    }
    legend(&mut svg, series);
    svg.push_str("</svg>\n");
    svg
}

/// Five horizontal lines from 0 to `max`, labelled.
fn grid(svg: &mut String, max: f64) {
    for k in 0..=4 {
        let value = max * k as f64 / 4.0;
        let y = TOP + PLOT_HEIGHT - PLOT_HEIGHT * k as f64 / 4.0;
        let _ = writeln!(
            svg,
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{value:.1}</text>",
            LEFT + PLOT_WIDTH,
            LEFT - 6.0,
            y + 4.0
        );
    }
}

/// One group's bars, from `x0`; a value that is not finite draws no bar.
fn bars(svg: &mut String, series: &[&str], values: &[f64], max: f64, x0: f64, bar_width: f64) {
    for (s, value) in values.iter().enumerate() {
        let h = if value.is_finite() {
            PLOT_HEIGHT * value / max
        } else {
            0.0
        };
        let _ = writeln!(
            svg,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{}\"><title>{}: {value:.2}</title></rect>",
            x0 + bar_width * s as f64,
            TOP + PLOT_HEIGHT - h,
            bar_width * 0.95,
            COLORS[s % COLORS.len()],
            series.get(s).unwrap_or(&"")
        );
    }
}

fn legend(svg: &mut String, series: &[&str]) {
    for (s, name) in series.iter().enumerate() {
        let y = HEIGHT - 10.0 + 20.0 * s as f64;
        let _ = writeln!(
            svg,
            "<rect x=\"{LEFT}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{y:.1}\">{name}</text>",
            y - 10.0,
            COLORS[s % COLORS.len()],
            LEFT + 18.0
        );
    }
}

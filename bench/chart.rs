//! The SVG charts beside a part's report: grouped bars, and lines on a log scale. Hand-written
//! SVG, no dependencies.

use std::fmt::Write as _;

const COLORS: [&str; 10] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac",
];
const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 60.0;
const BOTTOM: f64 = 60.0;
const TOP: f64 = 40.0;
const PLOT_WIDTH: f64 = WIDTH - LEFT - 20.0;
const PLOT_HEIGHT: f64 = HEIGHT - BOTTOM - TOP;

/// Text as SVG character data: labels such as "p90 < 100 ms" must not open a tag.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A grouped bar chart: one group per `(label, values)`, one bar per series.
pub fn bar_chart(title: &str, series: &[&str], groups: &[(String, Vec<f64>)]) -> String {
    let series: Vec<String> = series.iter().map(|s| escape(s)).collect();
    let series: Vec<&str> = series.iter().map(String::as_str).collect();
    let groups: Vec<(String, Vec<f64>)> = groups
        .iter()
        .map(|(label, values)| (escape(label), values.clone()))
        .collect();
    draw_bar_chart(&escape(title), &series, &groups)
}

fn draw_bar_chart(title: &str, series: &[&str], groups: &[(String, Vec<f64>)]) -> String {
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

/// Room right of a line chart's plot for its legend.
const LEGEND_WIDTH: f64 = 200.0;
const LINE_PLOT_WIDTH: f64 = WIDTH - LEFT - LEGEND_WIDTH;

/// How a line chart's y axis maps values.
#[derive(Clone, Copy, PartialEq)]
pub enum YAxis {
    /// Decades with 2x and 5x lines; values must be positive.
    Log,
    /// From 0; values must be 0 or more.
    Linear,
}

/// One polyline per `(name, points)` over a linear x axis and a logarithmic y axis (decades,
/// with 2x and 5x lines between), both labelled, a legend on the right. Points whose y is not
/// positive and finite are left out.
pub fn line_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> String {
    line_chart_on(YAxis::Log, title, x_label, y_label, series)
}

/// [`line_chart`] on the given y axis.
pub fn line_chart_on(
    axis: YAxis,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> String {
    let series: Vec<(String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(name, points)| (escape(name), points.clone()))
        .collect();
    draw_line_chart(
        axis,
        &escape(title),
        &escape(x_label),
        &escape(y_label),
        &series,
    )
}

fn draw_line_chart(
    axis: YAxis,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> String {
    let points = || series.iter().flat_map(|(_, p)| p.iter().copied());
    let drawable = |&(x, y): &(f64, f64)| {
        x.is_finite() && y.is_finite() && (y > 0.0 || (axis == YAxis::Linear && y >= 0.0))
    };
    let x_max = points()
        .filter(drawable)
        .map(|(x, _)| x)
        .fold(0.0f64, f64::max);
    let (y_min, y_max) = points()
        .filter(drawable)
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), (_, y)| {
            (lo.min(y), hi.max(y))
        });
    let scale = match axis {
        YAxis::Log => Scale::Log(LogScale::covering(y_min, y_max)),
        YAxis::Linear => Scale::Linear(y_max.max(1.0)),
    };
    let x_of = |x: f64| LEFT + LINE_PLOT_WIDTH * x / x_max.max(1e-9);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"{LEFT}\" y=\"24\" font-size=\"15\">{title}</text>\n"
    );
    match &scale {
        Scale::Log(log) => log_grid(&mut svg, log),
        Scale::Linear(max) => linear_grid(&mut svg, *max),
    }
    x_ticks(&mut svg, points().filter(drawable).map(|(x, _)| x), &x_of);
    axis_labels(&mut svg, x_label, y_label);
    for (s, (name, line)) in series.iter().enumerate() {
        let color = COLORS[s % COLORS.len()];
        let coords: Vec<(f64, f64)> = line
            .iter()
            .filter(|p| drawable(p))
            .map(|&(x, y)| (x_of(x), scale.y(y)))
            .collect();
        let path: Vec<String> = coords
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            svg,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"><title>{name}</title></polyline>",
            path.join(" ")
        );
        for (x, y) in coords {
            let _ = writeln!(
                svg,
                "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"3\" fill=\"{color}\"/>"
            );
        }
        let y = TOP + 10.0 + 20.0 * s as f64;
        let x = LEFT + LINE_PLOT_WIDTH + 20.0;
        let _ = writeln!(
            svg,
            "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"{color}\" stroke-width=\"3\"/><text x=\"{:.1}\" y=\"{y:.1}\">{name}</text>",
            y - 4.0,
            x + 18.0,
            y - 4.0,
            x + 24.0
        );
    }
    svg.push_str("</svg>\n");
    svg
}

enum Scale {
    Log(LogScale),
    /// From 0 to this.
    Linear(f64),
}

impl Scale {
    fn y(&self, value: f64) -> f64 {
        match self {
            Scale::Log(log) => log.y(value),
            Scale::Linear(max) => TOP + PLOT_HEIGHT - PLOT_HEIGHT * value / max,
        }
    }
}

/// Five labelled lines from 0 to `max`.
fn linear_grid(svg: &mut String, max: f64) {
    let right = LEFT + LINE_PLOT_WIDTH;
    for step in 0..=4 {
        let value = max * f64::from(step) / 4.0;
        let y = TOP + PLOT_HEIGHT - PLOT_HEIGHT * f64::from(step) / 4.0;
        let _ = writeln!(
            svg,
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{right:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{value:.0}</text>",
            LEFT - 6.0,
            y + 4.0
        );
    }
}

/// A y axis, in log10, from the 1-2-5 step at or below `min` to the one at or above `max`.
struct LogScale {
    low: f64,
    high: f64,
}

impl LogScale {
    fn covering(min: f64, max: f64) -> LogScale {
        let (min, max) = if min.is_finite() && max > 0.0 {
            (min, max)
        } else {
            (1.0, 10.0)
        };
        let steps = |decade: f64| [1.0, 2.0, 5.0, 10.0].map(|s| (s * 10f64.powf(decade)).log10());
        let low = steps(min.log10().floor())
            .into_iter()
            .filter(|&s| s <= min.log10() + 1e-9)
            .fold(f64::NEG_INFINITY, f64::max);
        let high = steps(max.log10().floor())
            .into_iter()
            .find(|&s| s >= max.log10() - 1e-9)
            .unwrap_or(max.log10().ceil());
        LogScale {
            low,
            high: high.max(low + 0.3),
        }
    }

    fn y(&self, value: f64) -> f64 {
        let share = (value.log10() - self.low) / (self.high - self.low);
        TOP + PLOT_HEIGHT - PLOT_HEIGHT * share
    }
}

/// Labelled lines at 1, 2 and 5 of each decade within the scale, darker at the decades.
fn log_grid(svg: &mut String, scale: &LogScale) {
    let right = LEFT + LINE_PLOT_WIDTH;
    for decade in scale.low.floor() as i32..=scale.high.ceil() as i32 {
        for step in [1.0, 2.0, 5.0] {
            let value = step * 10f64.powi(decade);
            let log = value.log10();
            if log < scale.low - 1e-9 || log > scale.high + 1e-9 {
                continue;
            }
            let y = scale.y(value);
            let stroke = if step == 1.0 { "#bbb" } else { "#eee" };
            let _ = writeln!(
                svg,
                "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{right:.1}\" y2=\"{y:.1}\" stroke=\"{stroke}\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{value}</text>",
                LEFT - 6.0,
                y + 4.0
            );
        }
    }
}

/// A tick and label under each distinct x.
fn x_ticks(svg: &mut String, xs: impl Iterator<Item = f64>, x_of: &dyn Fn(f64) -> f64) {
    let mut xs: Vec<f64> = xs.collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    // A time series has a point per sample: ticks at round steps instead.
    if xs.len() > 12 {
        xs = round_ticks(xs.last().copied().unwrap_or(0.0));
    }
    let bottom = TOP + PLOT_HEIGHT;
    let _ = writeln!(
        svg,
        "<line x1=\"{LEFT}\" y1=\"{bottom:.1}\" x2=\"{:.1}\" y2=\"{bottom:.1}\" stroke=\"#333\"/>",
        LEFT + LINE_PLOT_WIDTH
    );
    for x in xs {
        let at = x_of(x);
        let _ = writeln!(
            svg,
            "<line x1=\"{at:.1}\" y1=\"{bottom:.1}\" x2=\"{at:.1}\" y2=\"{:.1}\" stroke=\"#333\"/><text x=\"{at:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{x}</text>",
            bottom + 5.0,
            bottom + 18.0
        );
    }
}

/// Ticks from 0 to `max` at a 1-2-5 step giving at most ten.
fn round_ticks(max: f64) -> Vec<f64> {
    let rough = (max / 10.0).max(1e-9);
    let decade = 10f64.powf(rough.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * decade)
        .find(|&s| s >= rough)
        .unwrap_or(10.0 * decade);
    (0..=10)
        .map(|i| f64::from(i) * step)
        .take_while(|&x| x <= max + 1e-9)
        .collect()
}

fn axis_labels(svg: &mut String, x_label: &str, y_label: &str) {
    let _ = writeln!(
        svg,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{x_label}</text>",
        LEFT + LINE_PLOT_WIDTH / 2.0,
        TOP + PLOT_HEIGHT + 40.0
    );
    let (x, y) = (16.0, TOP + PLOT_HEIGHT / 2.0);
    let _ = writeln!(
        svg,
        "<text x=\"{x}\" y=\"{y:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 {x} {y:.1})\">{y_label}</text>"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_scale_spans_the_nearest_1_2_5_steps() {
        let scale = LogScale::covering(184.0, 1137.0);
        assert!((scale.low - 2.0).abs() < 1e-9, "{}", scale.low);
        assert!(
            (scale.high - 2000f64.log10()).abs() < 1e-9,
            "{}",
            scale.high
        );
        assert!((scale.y(100.0) - (TOP + PLOT_HEIGHT)).abs() < 1e-6);
    }

    #[test]
    fn labels_never_open_a_tag() {
        let svg = bar_chart(
            "a < b & c",
            &["x<y"],
            &[("p90 < 100 ms".to_string(), vec![1.0])],
        );
        assert!(svg.contains("p90 &lt; 100 ms") && svg.contains("a &lt; b &amp; c"));
        assert!(!svg.contains("p90 < ") && !svg.contains("x<y"));
    }
}

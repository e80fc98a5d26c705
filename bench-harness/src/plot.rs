//! An SVG of a run: throughput over time above, latency percentiles over time (log scale) below.

use std::fmt::Write;

use crate::stats::Point;

const WIDTH: f64 = 960.0;
const PANEL: f64 = 260.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const GAP: f64 = 60.0;

struct Series<'a> {
    label: &'a str,
    color: &'a str,
    values: Vec<(f64, f64)>,
}

pub fn svg(title: &str, points: &[Point]) -> String {
    let height = TOP + 2.0 * PANEL + GAP + 50.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    let t_max = points.iter().map(|p| p.t).fold(1.0, f64::max);
    let series = |label, color, f: &dyn Fn(&Point) -> f64| Series {
        label,
        color,
        values: points.iter().map(|p| (p.t, f(p))).collect(),
    };
    let rates = [
        series("publish MB/s", "#1f77b4", &|p| p.publish_mb_per_s),
        series("consume MB/s", "#ff7f0e", &|p| p.consume_mb_per_s),
    ];
    panel(&mut s, TOP, "MB/s", t_max, &rates, false, points);
    let us_to_ms = |us: u64| us as f64 / 1000.0;
    let latencies = [
        series("publish p50", "#9ecae1", &|p| us_to_ms(p.publish_p50_us)),
        series("publish p99", "#1f77b4", &|p| us_to_ms(p.publish_p99_us)),
        series("end-to-end p50", "#fdae6b", &|p| us_to_ms(p.e2e_p50_us)),
        series("end-to-end p99", "#e6550d", &|p| us_to_ms(p.e2e_p99_us)),
    ];
    panel(
        &mut s,
        TOP + PANEL + GAP,
        "latency (ms, log)",
        t_max,
        &latencies,
        true,
        points,
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">seconds since start</text>"#,
        LEFT + (WIDTH - LEFT - RIGHT) / 2.0,
        height - 12.0
    );
    s.push_str("</svg>\n");
    s
}

fn panel(
    s: &mut String,
    top: f64,
    unit: &str,
    t_max: f64,
    series: &[Series],
    log: bool,
    points: &[Point],
) {
    let w = WIDTH - LEFT - RIGHT;
    let x = |t: f64| LEFT + t / t_max * w;
    let visible = |v: f64| !log || v > 0.0;
    let all = series
        .iter()
        .flat_map(|s| s.values.iter().map(|&(_, v)| v))
        .filter(|&v| visible(v));
    let (lo, hi) = if log {
        let (mut lo, mut hi) = (f64::MAX, 0.0f64);
        for v in all {
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if hi == 0.0 {
            (0.0, 1.0)
        } else {
            (
                lo.log10().floor(),
                hi.log10().ceil().max(lo.log10().floor() + 1.0),
            )
        }
    } else {
        // Five ticks on a round step (1, 2 or 5 times a power of ten).
        let max = all.fold(0.0f64, f64::max).max(1e-9);
        let magnitude = 10f64.powf((max / 5.0).log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .into_iter()
            .map(|m| m * magnitude)
            .find(|step| step * 5.0 >= max)
            .unwrap_or(10.0 * magnitude);
        (0.0, step * 5.0)
    };
    let y = |v: f64| {
        let v = if log { v.log10() } else { v };
        top + PANEL - (v - lo) / (hi - lo) * PANEL
    };
    // Phases as shaded bands, so warm-up and catch-up stand out.
    let mut start = 0;
    for i in 1..=points.len() {
        if i == points.len() || points[i].phase != points[start].phase {
            let (t0, t1) = (
                if start == 0 { 0.0 } else { points[start - 1].t },
                points[i - 1].t,
            );
            let shade = match points[start].phase {
                "warmup" | "probe-warmup" => Some("#f2f2f2"),
                "catch-up" => Some("#fff3e0"),
                _ => None,
            };
            if let Some(fill) = shade {
                let _ = writeln!(
                    s,
                    r#"<rect x="{:.1}" y="{top}" width="{:.1}" height="{PANEL}" fill="{fill}"/>"#,
                    x(t0),
                    x(t1) - x(t0)
                );
            }
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{}" fill="#888">{}</text>"##,
                x(t0) + 3.0,
                top + 12.0,
                points[start].phase
            );
            start = i;
        }
    }
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{top}" width="{w}" height="{PANEL}" fill="none" stroke="black"/>"#
    );
    // Axes: five ticks over time, decades (log) or five ticks (linear) over values.
    for i in 0..=5 {
        let t = t_max * i as f64 / 5.0;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{:.0}</text>"#,
            x(t),
            top + PANEL + 15.0,
            t
        );
    }
    let ticks: Vec<f64> = if log {
        (lo as i32..=hi as i32).map(|e| 10f64.powi(e)).collect()
    } else {
        (0..=5).map(|i| hi * i as f64 / 5.0).collect()
    };
    for v in ticks {
        // Round steps: a few decimals at most, without float noise.
        let label = format!("{}", (v * 1000.0).round() / 1000.0);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{label}</text>"##,
            LEFT + w,
            y(v),
            y(v),
            LEFT - 5.0,
            y(v) + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{unit}</text>"#,
        top + PANEL / 2.0
    );
    for (i, series) in series.iter().enumerate() {
        let path: Vec<String> = series
            .values
            .iter()
            .filter(|&&(_, v)| visible(v))
            .map(|&(t, v)| format!("{:.1},{:.1}", x(t), y(v)))
            .collect();
        if !path.is_empty() {
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>"#,
                series.color,
                path.join(" ")
            );
        }
        let ly = top + 15.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            LEFT + w + 10.0,
            LEFT + w + 30.0,
            series.color,
            LEFT + w + 35.0,
            ly + 4.0,
            escape(series.label)
        );
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

//! The report as one self-contained HTML page (`--report-html`): a DBA opens it or attaches it
//! to a ticket. Charts of throughput, workers and every harm-budget signal against its limit
//! (pauses shaded), then the harm summary and the run's figures. Everything is inline — CSS and
//! SVG, no script, no font, no network resource — so it renders the same offline and years
//! later.

use crate::governor::show_seconds;
use crate::governor::timeline::{Pause, Timeline};
use crate::report::Report;
use sluice_core::{Error, Result, Retry};
use std::fmt::Write;
use std::path::Path;

const W: f64 = 760.0;
const H: f64 = 170.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 12.0;
const BOTTOM: f64 = 26.0;

/// Write the page of `report` to `path` (a local file, replaced).
pub fn write(path: &Path, report: &Report) -> Result<()> {
    std::fs::write(path, render(report)).map_err(|e| {
        Error::destination(
            Retry::Permanent,
            format!("writing the HTML report {}: {e}", path.display()),
        )
    })
}

/// `&`, `<`, `>`, `"` escaped.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// One line chart of `values` over `t` (seconds), with an optional limit line and the pauses
/// shaded. A gap (`None`) breaks the line.
fn chart(
    title: &str,
    unit: &str,
    t: &[f64],
    values: &[Option<f64>],
    limit: Option<f64>,
    pauses: &[Pause],
) -> String {
    let t_max = t.last().copied().unwrap_or(1.0).max(1.0);
    let v_max = values
        .iter()
        .flatten()
        .copied()
        .chain(limit)
        .fold(0.0_f64, f64::max)
        .max(1e-9)
        * 1.1;
    let x = |s: f64| LEFT + (s / t_max) * (W - LEFT - RIGHT);
    let y = |v: f64| TOP + (1.0 - v / v_max) * (H - TOP - BOTTOM);
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<figure><figcaption>{}</figcaption><svg xmlns=\"http://www.w3.org/2000/svg\" \
         viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" aria-label=\"{}\">",
        esc(title),
        esc(title)
    );
    for p in pauses {
        let _ = write!(
            svg,
            "<rect class=\"pause\" x=\"{:.1}\" y=\"{TOP}\" width=\"{:.1}\" height=\"{:.1}\"><title>{}</title></rect>",
            x(p.from),
            (x(p.to) - x(p.from)).max(1.0),
            H - TOP - BOTTOM,
            esc(&p.reason)
        );
    }
    let _ = write!(
        svg,
        "<line class=\"axis\" x1=\"{LEFT}\" y1=\"{b:.1}\" x2=\"{r:.1}\" y2=\"{b:.1}\"/>\
         <line class=\"axis\" x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{b:.1}\"/>\
         <text x=\"{tx:.1}\" y=\"{TOP}\" class=\"lbl\" text-anchor=\"end\" dy=\"0.8em\">{top}</text>\
         <text x=\"{tx:.1}\" y=\"{b:.1}\" class=\"lbl\" text-anchor=\"end\">0</text>\
         <text x=\"{r:.1}\" y=\"{H}\" class=\"lbl\" text-anchor=\"end\" dy=\"-0.3em\">{secs:.0} s</text>",
        b = H - BOTTOM,
        r = W - RIGHT,
        tx = LEFT - 4.0,
        top = esc(&figure(v_max, unit)),
        secs = t_max
    );
    if let Some(l) = limit {
        let _ = write!(
            svg,
            "<line class=\"limit\" x1=\"{LEFT}\" y1=\"{ly:.1}\" x2=\"{r:.1}\" y2=\"{ly:.1}\"/>\
             <text x=\"{r:.1}\" y=\"{ly:.1}\" class=\"lbl\" text-anchor=\"end\" dy=\"-0.3em\">limit {}</text>",
            esc(&figure(l, unit)),
            ly = y(l),
            r = W - RIGHT
        );
    }
    let mut d = String::new();
    let mut pen_down = false;
    let mut drawn = 0;
    for (s, v) in t.iter().zip(values) {
        match v {
            Some(v) => {
                let _ = write!(
                    d,
                    "{}{:.1},{:.1} ",
                    if pen_down { "L" } else { "M" },
                    x(*s),
                    y(*v)
                );
                pen_down = true;
                drawn += 1;
            }
            None => pen_down = false,
        }
    }
    if drawn == 1 {
        // A single reading still shows as a short flat line.
        let _ = write!(d, "h4");
    }
    let _ = write!(
        svg,
        "<path class=\"line\" d=\"{}\"/></svg></figure>",
        d.trim_end()
    );
    svg
}

/// A value with its unit, for axes and the summary.
fn figure(v: f64, unit: &str) -> String {
    match unit {
        "s" => show_seconds(v),
        "rows/s" if v >= 10_000.0 => format!("{:.0}k rows/s", v / 1000.0),
        _ => format!("{v:.0} {unit}"),
    }
}

fn charts(tl: &Timeline) -> String {
    let t: Vec<f64> = tl.points.iter().map(|p| p.t).collect();
    let mut out = String::new();
    let rows: Vec<Option<f64>> = tl.points.iter().map(|p| Some(p.rows_per_second)).collect();
    out += &chart("Throughput", "rows/s", &t, &rows, None, &tl.pauses);
    let workers: Vec<Option<f64>> = tl.points.iter().map(|p| Some(p.workers as f64)).collect();
    out += &chart(
        "Workers allowed to start chunks",
        "workers",
        &t,
        &workers,
        None,
        &tl.pauses,
    );
    for (i, s) in tl.signals.iter().enumerate() {
        let values: Vec<Option<f64>> = tl
            .points
            .iter()
            .map(|p| p.signals.get(i).copied().flatten())
            .collect();
        out += &chart(&s.name, &s.unit, &t, &values, Some(s.limit), &tl.pauses);
    }
    out
}

fn row(out: &mut String, k: &str, v: &str) {
    let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
}

/// The page.
pub fn render(r: &Report) -> String {
    let mut body = String::new();
    let _ = write!(
        body,
        "<h1>sluice export {}</h1><p>{} → {} ({}), consistency {}</p>",
        esc(&r.run_id),
        esc(&r.source),
        esc(&r.destination),
        esc(&r.format),
        esc(&r.consistency)
    );
    if let Some(tl) = &r.timeline {
        body += "<h2>Over time</h2>";
        if tl.signals.is_empty() {
            body += "<p>No harm budget was set: the export was not governed.</p>";
        }
        body += &charts(tl);
        body += "<h2>Harm budget</h2><table>";
        for s in &tl.signals {
            row(
                &mut body,
                &s.name,
                &format!("limit {}", figure(s.limit, &s.unit)),
            );
        }
        row(&mut body, "paused", &show_seconds(tl.paused_seconds));
        row(
            &mut body,
            "fewest workers allowed",
            &tl.min_workers.to_string(),
        );
        body += "</table>";
        if !tl.pauses.is_empty() {
            body += "<h3>Pauses</h3><table>";
            for p in &tl.pauses {
                row(
                    &mut body,
                    &format!("{:.1}–{:.1} s", p.from, p.to),
                    &p.reason,
                );
            }
            body += "</table>";
        }
    }
    let h = &r.harm;
    body += "<h2>Harm to the source</h2><table>";
    row(
        &mut body,
        "snapshot held",
        &show_seconds(h.snapshot_held_seconds),
    );
    row(
        &mut body,
        "longest transaction",
        &show_seconds(h.longest_transaction_seconds),
    );
    row(
        &mut body,
        "longest statement",
        &show_seconds(h.longest_statement_seconds),
    );
    row(
        &mut body,
        "peak connections",
        &h.peak_connections.to_string(),
    );
    if let Some(x) = h.peak_xmin_age {
        row(&mut body, "peak xmin age", &format!("{x} transactions"));
    }
    row(
        &mut body,
        "peak sessions blocked by the run",
        &h.peak_blocked_sessions.to_string(),
    );
    body += "</table><h2>Run</h2><table>";
    row(&mut body, "rows", &r.rows.to_string());
    row(&mut body, "wall time", &show_seconds(r.wall_seconds));
    row(
        &mut body,
        "rows per second",
        &format!("{:.0}", r.rows_per_second),
    );
    row(
        &mut body,
        "MB per second",
        &format!("{:.1}", r.mb_per_second),
    );
    row(&mut body, "workers", &r.workers.to_string());
    row(&mut body, "parts written", &r.parts_written.to_string());
    row(&mut body, "server", &r.server_version);
    body += "</table>";
    if !r.datasets.is_empty() {
        body += "<h2>Datasets</h2><table>";
        for d in &r.datasets {
            row(
                &mut body,
                &d.name,
                &format!("{} rows in {} parts; {}", d.rows, d.parts, d.guarantee),
            );
        }
        body += "</table>";
    }
    if !r.notes.is_empty() {
        body += "<h2>Notes</h2><ul>";
        for n in &r.notes {
            let _ = write!(body, "<li>{}</li>", esc(n));
        }
        body += "</ul>";
    }
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>sluice export {}</title>\
         <style>body{{font:14px system-ui,sans-serif;margin:2em;color:#222}}\
         figure{{margin:1em 0}}figcaption{{font-weight:600}}\
         .axis{{stroke:#888}}.limit{{stroke:#c00;stroke-dasharray:6 4}}\
         .line{{fill:none;stroke:#1565c0;stroke-width:1.8}}.pause{{fill:#f6c343;opacity:.35}}\
         .lbl{{font-size:11px;fill:#555}}table{{border-collapse:collapse}}\
         th,td{{text-align:left;padding:2px 12px 2px 0;vertical-align:top}}</style></head>\
         <body>{body}</body></html>\n",
        esc(&r.run_id)
    )
}

//! Small multiples: a grid of line-chart panels that share their axis ranges
//! and one legend, so a figure reads the same however many groups it holds.

use super::plots::{encode_png, err, int_tick, register_font, FONT};
use crate::StagesError;
use plotters::prelude::*;

/// Size of one panel in pixels.
pub const PANEL: (u32, u32) = (480, 300);
/// Narrowest figure, so the legend and title fit above a single column.
const MIN_WIDTH: u32 = 720;
/// Height of the title strip.
const TITLE_HEIGHT: u32 = 36;
/// Width of one legend entry (a line sample and a policy name).
const LEGEND_ENTRY: (u32, u32) = (180, 22);

/// One line of a panel: its colour and `(x, y)` points in x order.
pub struct Line<'a> {
    /// Stroke and marker colour (the legend entry's colour).
    pub colour: RGBColor,
    /// Points, in x order.
    pub points: &'a [(f64, f64)],
}

/// One panel of the grid.
pub struct PanelSpec<'a> {
    /// Grid row.
    pub row: usize,
    /// Grid column.
    pub column: usize,
    /// Caption of the panel.
    pub title: String,
    /// Its lines.
    pub lines: Vec<Line<'a>>,
}

/// What a small-multiples figure shows beyond its panels.
pub struct Frame<'a> {
    /// Figure title.
    pub title: &'a str,
    /// X axis description (an integer quantity: only whole ticks are labelled).
    pub x_label: &'a str,
    /// Y axis description.
    pub y_label: &'a str,
    /// The one legend: a label and colour per line kind.
    pub legend: &'a [(String, RGBColor)],
    /// X values that get a marker on every line passing through them.
    pub markers_at: &'a [f64],
}

/// Pixel size of a figure of `rows` x `columns` panels with `legend` entries.
pub fn figure_size(rows: usize, columns: usize, legend: usize) -> (u32, u32) {
    let width = (columns.max(1) as u32 * PANEL.0).max(MIN_WIDTH);
    (
        width,
        TITLE_HEIGHT + legend_height(width, legend) + rows.max(1) as u32 * PANEL.1,
    )
}

fn legend_height(width: u32, entries: usize) -> u32 {
    let per_row = (width / LEGEND_ENTRY.0).max(1) as usize;
    entries.div_ceil(per_row) as u32 * LEGEND_ENTRY.1 + 8
}

/// Draws `panels` on a grid with shared axis ranges (x over every point, y
/// from 0) under one title and one legend; returns the PNG, of
/// [`figure_size`].
pub fn small_multiples(
    frame: &Frame<'_>,
    panels: &[PanelSpec<'_>],
) -> Result<Vec<u8>, StagesError> {
    register_font();
    let rows = panels.iter().map(|p| p.row + 1).max().unwrap_or(1);
    let columns = panels.iter().map(|p| p.column + 1).max().unwrap_or(1);
    let size = figure_size(rows, columns, frame.legend.len());
    let title = frame.title;
    let mut buf = vec![0u8; (size.0 * size.1 * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, size).into_drawing_area();
        root.fill(&WHITE).map_err(err(title))?;
        let head = TITLE_HEIGHT + legend_height(size.0, frame.legend.len());
        let (top, body) = root.split_vertically(head);
        top.draw(&Text::new(
            title.to_string(),
            (12, 8),
            (FONT, 22).into_font(),
        ))
        .map_err(err(title))?;
        let per_row = (size.0 / LEGEND_ENTRY.0).max(1) as usize;
        for (i, (label, colour)) in frame.legend.iter().enumerate() {
            let x = 16 + (i % per_row) as i32 * LEGEND_ENTRY.0 as i32;
            let y = TITLE_HEIGHT as i32 + (i / per_row) as i32 * LEGEND_ENTRY.1 as i32 + 8;
            top.draw(&PathElement::new(
                vec![(x, y), (x + 24, y)],
                colour.stroke_width(3),
            ))
            .map_err(err(title))?;
            top.draw(&Text::new(
                label.clone(),
                (x + 30, y - 8),
                (FONT, 14).into_font(),
            ))
            .map_err(err(title))?;
        }
        let (x_range, y_top) = ranges(panels);
        let areas = body.split_evenly((rows, columns));
        for panel in panels {
            let area = &areas[panel.row * columns + panel.column];
            let mut chart = ChartBuilder::on(area)
                .caption(&panel.title, (FONT, 15))
                .margin(8)
                .x_label_area_size(36)
                .y_label_area_size(52)
                .build_cartesian_2d(x_range.0..x_range.1, 0f64..y_top)
                .map_err(err(title))?;
            chart
                .configure_mesh()
                .x_desc(frame.x_label)
                .y_desc(frame.y_label)
                .x_label_formatter(&int_tick)
                .label_style((FONT, 12))
                .draw()
                .map_err(err(title))?;
            for line in &panel.lines {
                let colour = line.colour;
                chart
                    .draw_series(LineSeries::new(
                        line.points.iter().copied(),
                        colour.stroke_width(2),
                    ))
                    .map_err(err(title))?;
                let marked = line
                    .points
                    .iter()
                    .filter(|p| frame.markers_at.contains(&p.0) || line.points.len() == 1);
                chart
                    .draw_series(marked.map(|&p| Circle::new(p, 3, colour.filled())))
                    .map_err(err(title))?;
            }
        }
        root.present().map_err(err(title))?;
    }
    encode_png(&buf, size)
}

/// The x range over every point of every panel (widened when it is a single
/// value) and the top of the y axis (5% above the largest y, at least 0.01).
fn ranges(panels: &[PanelSpec<'_>]) -> ((f64, f64), f64) {
    let points = || {
        panels
            .iter()
            .flat_map(|p| &p.lines)
            .flat_map(|l| l.points.iter())
    };
    let lo = points().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let hi = points().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let y = points().map(|p| p.1).fold(0f64, f64::max);
    let x = if !lo.is_finite() {
        (0.0, 1.0)
    } else if hi - lo < 1e-12 {
        (lo - 0.5, hi + 0.5)
    } else {
        (lo, hi)
    };
    (x, (y * 1.05).max(0.01))
}

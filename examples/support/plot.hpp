// Line plots for the training examples: loss and max-attention-logit curves side by side, in the spirit of Figure 2
// of the Kimi K2 report (Muon vs MuonClip, with the QK-Clip threshold tau drawn as a dashed reference line).
//
//   namespace plot = moonmoe::plot;
//   plot::Figure fig;
//   fig.panels.push_back({.title = "Training loss", .x_label = "step", .y_label = "loss",
//                         .series = {{.label = "Muon", .x = steps, .y = loss_muon, .color = plot::colors::blue},
//                                    {.label = "MuonClip", .x = steps, .y = loss_clip, .color =
//                                    plot::colors::orange}}});
//   fig.panels.push_back({.title = "Max attention logit", .x_label = "step", .y_label = "max logit",
//                         .series = {...}, .hlines = {{.y = 100, .label = "tau = 100"}}, .log_y = true});
//   plot::write_png("curves.png", fig);  // also curves.plot.csv: panel,series,x,y
//
// The drawing is Debian's cairo (libcairo2-dev; link pkg-config's `cairo`): anti-aliased strokes, dashes, text
// through fontconfig and the PNG encoder are a maintained library's, not code of ours. Not matplotlib: the examples
// must write their PNG on a fresh machine, where Python may be missing. This file only lays out the axes.
//
// Non-finite points (and non-positive ones on a log axis) break a series' line, and a point without a drawn neighbour
// is a dot; empty series are skipped; a constant series or a single point still gets a sensible range.
#pragma once

#include <cairo.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <numbers>
#include <optional>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <moonmoe/io/detail/atomic_file.hpp>

namespace moonmoe::plot {

using Rgb = std::array<std::uint8_t, 3>;

/// matplotlib's "tab10" cycle, and a few neutrals.
namespace colors {
inline constexpr Rgb blue{31, 119, 180}, orange{255, 127, 14}, green{44, 160, 44}, red{214, 39, 40},
    purple{148, 103, 189}, brown{140, 86, 75}, pink{227, 119, 194}, gray{127, 127, 127}, olive{188, 189, 34},
    cyan{23, 190, 207}, black{0, 0, 0}, white{255, 255, 255}, dark_gray{64, 64, 64};
inline constexpr std::array<Rgb, 10> cycle{blue, orange, green, red, purple, brown, pink, gray, olive, cyan};
}  // namespace colors

/// One curve. `x` may be left empty, meaning 0, 1, ..., y.size()-1; otherwise it must have y's size.
struct Series {
    std::string label{};  // legend text; empty: not in the legend
    std::vector<double> x{}, y{};
    std::optional<Rgb> color{};  // unset: colors::cycle[index of the series in its panel % 10]
    int width = 2;               // stroke width in pixels, clamped to [1, 12]
    bool dashed = false;
};

/// A horizontal reference line across the whole panel, drawn over the series, e.g. the QK-Clip threshold tau. Its
/// value is included when the y range is chosen automatically, and a non-empty label puts it in the legend.
struct HLine {
    double y = 0;
    std::string label{};
    Rgb color = colors::dark_gray;
    int width = 2;
    bool dashed = true;
};

enum class LegendPlacement { best, upper_right, upper_left, lower_left, lower_right, none };

/// One set of axes. Unset limits are chosen from the data (with a small margin).
struct Panel {
    std::string title{}, x_label{}, y_label{};
    std::vector<Series> series{};
    std::vector<HLine> hlines{};
    bool log_y = false;
    std::optional<double> x_min{}, x_max{}, y_min{}, y_max{};
    bool grid = true;                                // light grid lines at the major ticks
    LegendPlacement legend = LegendPlacement::best;  // best: the corner covering the fewest drawn points
};

/// Panels are laid out side by side, left to right, in equal-width cells.
struct Figure {
    int width = 1200, height = 500;  // pixels, each in [64, 16384]
    std::string title{};             // optional, centred above all panels
    std::vector<Panel> panels{};
    double font_size = 0;  // pixels; 0: from the cell size (about 15 for 600x500 cells)
};

/// Where a panel's data go, in cairo's pixel coordinates (pixel (i, j) covers [i, i+1) x [j, j+1)). The axis box's
/// 1-pixel lines are centred on left, top, right, bottom (each an integer + 0.5), and the axis limits map onto them.
struct PlotArea {
    double left = 0, top = 0, right = 1, bottom = 1;
    double x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
    bool log_y = false;
    std::vector<double> x_ticks{}, y_ticks{}, y_minor{};  // in data units
    std::vector<std::string> x_labels{}, y_labels{};

    double px(double x) const { return left + (x - x_lo) / (x_hi - x_lo) * (right - left); }
    double py(double y) const {
        const double t = log_y ? std::log10(y / y_lo) / std::log10(y_hi / y_lo) : (y - y_lo) / (y_hi - y_lo);
        return bottom - t * (bottom - top);
    }
};

namespace detail {

struct SurfaceFree {
    void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
};
struct ContextFree {
    void operator()(cairo_t* c) const { cairo_destroy(c); }
};
using Surface = std::unique_ptr<cairo_surface_t, SurfaceFree>;
using Context = std::unique_ptr<cairo_t, ContextFree>;

inline void check(cairo_status_t s, const std::string& what) {
    if (s != CAIRO_STATUS_SUCCESS)
        throw std::runtime_error("moonmoe::plot: " + what + ": " + cairo_status_to_string(s));
}

/// `v` printed with %.*g, the exponent tidied ("1e+06" -> "1e6", "2.50e-05" -> "2.5e-5").
inline std::string format_g(double v, int precision) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    std::string s = buf;
    const auto e = s.find('e');
    if (e == std::string::npos) return s;
    return s.substr(0, e) + "e" + std::to_string(std::stoi(s.substr(e + 1)));
}

/// Ticks k * step inside [lo, hi] (a relative tolerance of 1e-9 admits the ends), with step the smallest of
/// {1, 2, 5} x 10^e giving at most max_count (>= 2) ticks. Empty unless lo < hi, both finite.
inline std::vector<double> nice_ticks(double lo, double hi, int max_count) {
    std::vector<double> out;
    if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return out;
    const auto count = [&](double step) { return std::floor(hi / step + 1e-9) - std::ceil(lo / step - 1e-9) + 1; };
    double step = 0;
    for (double e = std::floor(std::log10((hi - lo) / std::max(max_count, 2))); step == 0; e += 1)
        for (double m : {1.0, 2.0, 5.0})
            if (count(m * std::pow(10.0, e)) <= std::max(max_count, 2)) {
                step = m * std::pow(10.0, e);
                break;
            }
    for (double k = std::ceil(lo / step - 1e-9), last = std::floor(hi / step + 1e-9); k <= last; k += 1)
        out.push_back(std::abs(k) < 0.5 ? 0.0 : k * step);
    return out;
}

/// Evenly spaced ticks: fixed decimals from the spacing ("0.0", "0.5", "1.0"); otherwise (log ticks, or very large
/// or fine values) %g, shortest form ("20", "1e6", "2.5e-5").
inline std::vector<std::string> tick_labels(const std::vector<double>& t) {
    bool even = t.size() >= 2;
    double max_abs = 0;
    for (std::size_t i = 0; i < t.size(); ++i) {
        max_abs = std::max(max_abs, std::abs(t[i]));
        if (i >= 2) even = even && std::abs((t[i] - t[i - 1]) - (t[1] - t[0])) <= 1e-9 * (t[1] - t[0]);
    }
    std::vector<std::string> out;
    for (double v : t) {
        if (even && max_abs < 1e6 && t[1] - t[0] >= 1e-4) {
            char buf[64];
            std::snprintf(buf, sizeof buf, "%.*f", std::max(0, -int(std::floor(std::log10(t[1] - t[0]) + 1e-9))), v);
            out.push_back(buf);
        } else {
            out.push_back(format_g(v, 6));
        }
    }
    return out;
}

/// Ticks for a log axis on [lo, hi] (0 < lo < hi): within less than three decades {1, 2, 5} x 10^k (the other
/// multiples minor) when that gives 2..max_count; otherwise powers of ten, every k-th if there are many (2..9 x 10^k,
/// or the skipped powers, minor); failing both, linear nice ticks.
inline std::pair<std::vector<double>, std::vector<double>> log_ticks(double lo, double hi, int max_count) {
    std::vector<double> major, minor;
    const double a = std::log10(lo), b = std::log10(hi);
    const auto inside = [&](double v) { return v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9); };
    const int k0 = int(std::ceil(a - 1e-9)), k1 = int(std::floor(b + 1e-9)), decades = k1 - k0 + 1;
    if (decades < 3) {
        for (int k = int(std::floor(a)) - 1; k <= int(std::ceil(b)); ++k)
            for (int m = 1; m <= 9; ++m)
                if (const double v = m * std::pow(10.0, k); inside(v))
                    (m == 1 || m == 2 || m == 5 ? major : minor).push_back(v);
        if (major.size() >= 2 && int(major.size()) <= max_count) return {major, minor};
        major.clear(), minor.clear();
    }
    const int stride = std::max(1, (decades + max_count - 1) / std::max(max_count, 2));
    for (int k = k0; k <= k1; ++k) (((k % stride) + stride) % stride == 0 ? major : minor).push_back(std::pow(10., k));
    for (int k = k0 - 1; stride == 1 && k <= k1; ++k)
        for (int m = 2; m <= 9; ++m)
            if (inside(m * std::pow(10.0, k))) minor.push_back(m * std::pow(10.0, k));
    if (major.size() >= 2) return {major, minor};
    return {nice_ticks(lo, hi, max_count), {}};
}

inline double series_x(const Series& s, std::size_t i) { return s.x.empty() ? double(i) : s.x[i]; }
inline bool usable_y(double y, bool log_y) { return std::isfinite(y) && (!log_y || y > 0); }
inline Rgb series_color(const Series& s, std::size_t k) { return s.color.value_or(colors::cycle[k % 10]); }

/// The data limits of a panel: from the data (padded), overridden by the panel's explicit limits.
inline void panel_limits(const Panel& p, PlotArea& a) {
    for (const auto* v : {&p.x_min, &p.x_max, &p.y_min, &p.y_max})
        if (*v && !std::isfinite(**v)) throw std::invalid_argument("moonmoe::plot: an axis limit is not finite");
    if ((p.x_min && p.x_max && !(*p.x_min < *p.x_max)) || (p.y_min && p.y_max && !(*p.y_min < *p.y_max)))
        throw std::invalid_argument("moonmoe::plot: an axis minimum is not below its maximum");
    if (p.log_y && ((p.y_min && *p.y_min <= 0) || (p.y_max && *p.y_max <= 0)))
        throw std::invalid_argument("moonmoe::plot: limits of a log y axis must be positive");
    const double inf = std::numeric_limits<double>::infinity();
    double xl = inf, xh = -inf, yl = inf, yh = -inf;
    for (const Series& s : p.series) {
        if (!s.x.empty() && s.x.size() != s.y.size())
            throw std::invalid_argument("moonmoe::plot: series '" + s.label + "' has " + std::to_string(s.x.size()) +
                                        " x values but " + std::to_string(s.y.size()) + " y values");
        for (std::size_t i = 0; i < s.y.size(); ++i) {
            const double x = series_x(s, i), y = s.y[i];
            if (!std::isfinite(x) || !usable_y(y, p.log_y) || (p.x_min && x < *p.x_min) || (p.x_max && x > *p.x_max))
                continue;  // points outside an explicit x limit do not stretch the y range
            xl = std::min(xl, x), xh = std::max(xh, x), yl = std::min(yl, y), yh = std::max(yh, y);
        }
    }
    for (const HLine& h : p.hlines)
        if (usable_y(h.y, p.log_y)) yl = std::min(yl, h.y), yh = std::max(yh, h.y);
    // No data: [0, 1]. One value: widened by `single` of itself (`at_zero` at 0). A range: `margin` of it each side.
    const auto pad = [](double& lo, double& hi, double single, double at_zero, double margin) {
        if (!(lo <= hi)) return void((lo = 0, hi = 1));
        const double d = lo == hi ? (lo != 0 ? std::abs(lo) * single : at_zero) : (hi - lo) * margin;
        lo -= d, hi += d;
    };
    pad(xl, xh, 0.05, 0.5, 0.02);
    if (p.log_y) {  // padded in decades; a single value gets +-0.3 of one
        double lo = yl <= yh ? std::log10(yl) : 0, hi = yl <= yh ? std::log10(yh) : 1;
        if (lo == hi) lo -= 0.3, hi += 0.3;
        else if (yl <= yh)
            pad(lo, hi, 0, 0, 0.05);
        yl = std::pow(10.0, lo), yh = std::pow(10.0, hi);
    } else {
        pad(yl, yh, 0.1, 1.0, 0.05);
    }
    const auto apply = [](double& lo, double& hi, const std::optional<double>& mn, const std::optional<double>& mx,
                          bool log) {
        lo = mn.value_or(lo), hi = mx.value_or(hi);
        if (hi > lo) return;  // only one limit was given, on the wrong side of the data: a range beside it
        if (mn) hi = log ? lo * 10 : lo + std::max(std::abs(lo) * 0.1, 1.0);
        else
            lo = log ? hi / 10 : hi - std::max(std::abs(hi) * 0.1, 1.0);
    };
    apply(xl, xh, p.x_min, p.x_max, false);
    apply(yl, yh, p.y_min, p.y_max, p.log_y);
    a.x_lo = xl, a.x_hi = xh, a.y_lo = yl, a.y_hi = yh, a.log_y = p.log_y;
}

inline double font_size(const Figure& f) {
    if (f.font_size > 0) return f.font_size;
    const double cell = f.width / double(std::max<std::size_t>(1, f.panels.size()));
    return std::clamp(std::min(cell, double(f.height)) / 34, 8.0, 40.0);
}

inline double text_width(cairo_t* cr, const std::string& s) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, s.c_str(), &e);
    return e.x_advance;
}

/// Text with its baseline at y, anchored at x by `align` (0 left, 0.5 centre, 1 right), turned by `angle` radians.
inline void text(cairo_t* cr, double x, double y, const std::string& s, double align, double angle = 0) {
    cairo_save(cr);
    cairo_translate(cr, x, y);
    cairo_rotate(cr, angle);
    cairo_move_to(cr, -align * text_width(cr, s), 0);
    cairo_show_text(cr, s.c_str());
    cairo_restore(cr);
}

inline void stroke_style(cairo_t* cr, Rgb c, int width, bool dashed) {
    const double w = std::clamp(width, 1, 12), dash[2] = {4 * w + 2, 3 * w + 2};
    cairo_set_source_rgb(cr, c[0] / 255.0, c[1] / 255.0, c[2] / 255.0);
    cairo_set_line_width(cr, w);
    cairo_set_dash(cr, dash, dashed ? 2 : 0, 0);
}

inline void fill(cairo_t* cr, Rgb c) { stroke_style(cr, c, 1, false), cairo_fill(cr); }

inline Context context(cairo_surface_t* s, const Figure& fig) {
    Context cr(cairo_create(s));
    cairo_select_font_face(cr.get(), "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr.get(), font_size(fig));
    cairo_set_line_cap(cr.get(), CAIRO_LINE_CAP_ROUND);  // a lone point (zero-length segment) is a dot
    cairo_set_line_join(cr.get(), CAIRO_LINE_JOIN_ROUND);
    return cr;
}

inline std::vector<PlotArea> layout(cairo_t* cr, const Figure& fig) {
    if (fig.width < 64 || fig.height < 64 || fig.width > 16384 || fig.height > 16384)
        throw std::invalid_argument("moonmoe::plot: figure size " + std::to_string(fig.width) + "x" +
                                    std::to_string(fig.height) + " is outside [64, 16384]");
    const double fs = font_size(fig), pad = 0.6 * fs, gap = 0.4 * fs, tick = 0.4 * fs, line = 1.3 * fs;
    const auto half = [](double v) { return std::floor(v) + 0.5; };
    const auto widest = [&](const std::vector<std::string>& v) {
        double w = 0;
        for (const auto& s : v) w = std::max(w, text_width(cr, s));
        return w;
    };
    std::vector<PlotArea> out;
    const double n = double(fig.panels.size()), fig_top = fig.title.empty() ? 0 : pad + line;
    for (std::size_t k = 0; k < fig.panels.size(); ++k) {
        const Panel& p = fig.panels[k];
        PlotArea a;
        panel_limits(p, a);
        const double x0 = fig.width * double(k) / n, x1 = fig.width * double(k + 1) / n;
        a.top = half(fig_top + pad + (p.title.empty() ? 0.8 * fs : line + 0.3 * fs));
        a.bottom = std::max(a.top + 2, half(fig.height - pad - (p.x_label.empty() ? 0 : line) - line - tick));
        const int max_y = std::max(2, int((a.bottom - a.top) / (2.5 * fs)));
        if (p.log_y) std::tie(a.y_ticks, a.y_minor) = log_ticks(a.y_lo, a.y_hi, max_y);
        else
            a.y_ticks = nice_ticks(a.y_lo, a.y_hi, max_y);
        a.y_labels = tick_labels(a.y_ticks);
        a.left = std::min(x1 - 3, half(x0 + pad + (p.y_label.empty() ? 0 : line) + widest(a.y_labels) + gap + tick));
        a.right = std::max(a.left + 2, half(x1 - pad - 2 * fs));
        // As many x ticks as leave room for the widest label and 1.5 em between labels.
        for (int max_x = std::max(2, int((a.right - a.left) / (3 * fs))); max_x >= 2; --max_x) {
            a.x_ticks = nice_ticks(a.x_lo, a.x_hi, max_x);
            a.x_labels = tick_labels(a.x_ticks);
            if (a.x_ticks.size() < 2 || a.px(a.x_ticks[1]) - a.px(a.x_ticks[0]) >= widest(a.x_labels) + 1.5 * fs) break;
        }
        const double last = a.x_labels.empty() ? 0 : text_width(cr, a.x_labels.back()) / 2;
        a.right = std::max(a.left + 2, half(x1 - pad - std::max(last, 0.5 * fs)));
        out.push_back(std::move(a));
    }
    return out;
}

inline void draw_panel(cairo_t* cr, const Panel& p, const PlotArea& a, double fs) {
    const double tick = 0.4 * fs, gap = 0.4 * fs, line = 1.3 * fs, w = a.right - a.left, h = a.bottom - a.top;
    std::vector<std::vector<std::pair<double, double>>> drawn;  // pixel points per series, NaN at breaks
    cairo_save(cr);
    cairo_rectangle(cr, a.left + 0.5, a.top + 0.5, w - 1, h - 1);
    cairo_clip(cr);
    if (p.grid) {
        for (double t : a.x_ticks) cairo_move_to(cr, std::floor(a.px(t)) + 0.5, a.top), cairo_rel_line_to(cr, 0, h);
        for (double t : a.y_ticks) cairo_move_to(cr, a.left, std::floor(a.py(t)) + 0.5), cairo_rel_line_to(cr, w, 0);
        stroke_style(cr, {232, 232, 232}, 1, false), cairo_stroke(cr);
    }
    for (std::size_t k = 0; k < p.series.size(); ++k) {
        const Series& s = p.series[k];
        auto& pts = drawn.emplace_back();
        for (std::size_t i = 0; i < s.y.size(); ++i) {
            const bool ok = std::isfinite(series_x(s, i)) && usable_y(s.y[i], a.log_y);
            const double nan = std::numeric_limits<double>::quiet_NaN();
            // Far outside explicit limits, clamped within cairo's fixed-point range (24.8 bits); clipped anyway.
            const auto safe = [](double v) { return std::clamp(v, -1e6, 1e6); };
            pts.emplace_back(ok ? safe(a.px(series_x(s, i))) : nan, ok ? safe(a.py(s.y[i])) : nan);
            if (!ok) continue;
            if (i == 0 || std::isnan(pts[i - 1].first)) cairo_move_to(cr, pts[i].first, pts[i].second);
            cairo_line_to(cr, pts[i].first, pts[i].second);  // after a move_to: zero length, so a lone point is a dot
        }
        stroke_style(cr, series_color(s, k), s.width, s.dashed), cairo_stroke(cr);
    }
    for (const HLine& r : p.hlines) {  // over the data, so a threshold stays visible through dense curves
        if (!usable_y(r.y, a.log_y)) continue;
        cairo_move_to(cr, a.left, a.py(r.y)), cairo_rel_line_to(cr, w, 0);
        stroke_style(cr, r.color, r.width, r.dashed), cairo_stroke(cr);
    }
    cairo_restore(cr);

    // The axis box, outward ticks with their labels, the titles.
    cairo_rectangle(cr, a.left, a.top, w, h);
    for (double t : a.x_ticks) cairo_move_to(cr, std::floor(a.px(t)) + 0.5, a.bottom), cairo_rel_line_to(cr, 0, tick);
    for (double t : a.y_ticks) cairo_move_to(cr, a.left, std::floor(a.py(t)) + 0.5), cairo_rel_line_to(cr, -tick, 0);
    for (double t : a.y_minor)
        cairo_move_to(cr, a.left, std::floor(a.py(t)) + 0.5), cairo_rel_line_to(cr, -tick / 2, 0);
    stroke_style(cr, colors::black, 1, false), cairo_stroke(cr);
    const double x_text = a.bottom + tick + gap + 0.75 * fs;  // baseline of the x tick labels
    for (std::size_t i = 0; i < a.x_ticks.size(); ++i) text(cr, a.px(a.x_ticks[i]), x_text, a.x_labels[i], 0.5);
    for (std::size_t i = 0; i < a.y_ticks.size(); ++i)
        text(cr, a.left - tick - gap, a.py(a.y_ticks[i]) + 0.36 * fs, a.y_labels[i], 1);
    if (!p.title.empty()) text(cr, a.left + w / 2, a.top - 0.6 * fs, p.title, 0.5);
    if (!p.x_label.empty()) text(cr, a.left + w / 2, x_text + line, p.x_label, 0.5);
    if (!p.y_label.empty()) {
        double lw = 0;
        for (const auto& l : a.y_labels) lw = std::max(lw, text_width(cr, l));
        text(cr, a.left - tick - gap - lw - 0.3 * fs, a.top + h / 2, p.y_label, 0.5, -std::numbers::pi / 2);
    }

    // The legend: series, then reference lines, that have a label.
    struct Entry {
        const std::string* label;
        Rgb color;
        int width;
        bool dashed;
    };
    std::vector<Entry> entries;
    for (std::size_t k = 0; k < p.series.size(); ++k)
        if (const Series& s = p.series[k]; !s.label.empty())
            entries.push_back({&s.label, series_color(s, k), s.width, s.dashed});
    for (const HLine& r : p.hlines)
        if (!r.label.empty()) entries.push_back({&r.label, r.color, r.width, r.dashed});
    if (entries.empty() || p.legend == LegendPlacement::none) return;
    const double swatch = 2.2 * fs, inset = 0.5 * fs;
    double text_w = 0;
    for (const Entry& e : entries) text_w = std::max(text_w, text_width(cr, *e.label));
    const double bw = std::round(3 * gap + swatch + text_w), bh = std::round(2 * gap + double(entries.size()) * line);
    const double l = a.left + inset, r = a.right - inset - bw, t = a.top + inset, b = a.bottom - inset - bh;
    const std::array<std::pair<double, double>, 4> corners{{{r, t}, {l, t}, {l, b}, {r, b}}};  // as LegendPlacement
    std::size_t pick = p.legend == LegendPlacement::best ? 0 : std::size_t(p.legend) - 1;
    if (p.legend == LegendPlacement::best) {  // the corner covering the fewest points sampled every ~2 px of line
        std::array<long, 4> hits{};
        const auto count = [&](double x, double y) {
            for (std::size_t c = 0; c < 4; ++c)
                hits[c] += x >= corners[c].first - 2 && x <= corners[c].first + bw + 2 && y >= corners[c].second - 2 &&
                           y <= corners[c].second + bh + 2;
        };
        for (const auto& pts : drawn)
            for (std::size_t i = 0; i < pts.size(); ++i) {
                if (std::isnan(pts[i].first)) continue;
                count(pts[i].first, pts[i].second);
                if (i == 0 || std::isnan(pts[i - 1].first)) continue;
                const auto [x0, y0] = pts[i - 1];
                const auto [x1, y1] = pts[i];
                const int steps = int(std::min(2000.0, std::hypot(x1 - x0, y1 - y0) / 2));
                for (int j = 1; j < steps; ++j) count(x0 + (x1 - x0) * j / steps, y0 + (y1 - y0) * j / steps);
            }
        for (const HLine& ref : p.hlines)
            for (double x = a.left; usable_y(ref.y, a.log_y) && x <= a.right; x += 2) count(x, a.py(ref.y));
        for (std::size_t c = 1; c < 4; ++c)
            if (hits[c] < hits[pick]) pick = c;
    }
    const auto [bx, by] = corners[pick];
    cairo_rectangle(cr, std::floor(bx) + 0.5, std::floor(by) + 0.5, bw, bh);
    fill(cr, colors::white);
    cairo_rectangle(cr, std::floor(bx) + 0.5, std::floor(by) + 0.5, bw, bh);
    stroke_style(cr, {190, 190, 190}, 1, false), cairo_stroke(cr);
    for (std::size_t i = 0; i < entries.size(); ++i) {
        const double cy = std::floor(by) + gap + (double(i) + 0.5) * line;
        cairo_move_to(cr, bx + gap, cy), cairo_rel_line_to(cr, swatch, 0);
        stroke_style(cr, entries[i].color, entries[i].width, entries[i].dashed), cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0, 0, 0);
        text(cr, bx + 2 * gap + swatch, cy + 0.36 * fs, *entries[i].label, 0);
    }
}

/// The figure drawn on a new RGB surface; `what` names it in errors.
inline Surface render(const Figure& fig, const std::string& what) {
    Surface measure(cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1));
    const std::vector<PlotArea> areas = layout(context(measure.get(), fig).get(), fig);
    Surface s(cairo_image_surface_create(CAIRO_FORMAT_RGB24, fig.width, fig.height));
    check(cairo_surface_status(s.get()), "cannot create the image for " + what);
    const Context cr = context(s.get(), fig);
    cairo_set_source_rgb(cr.get(), 1, 1, 1);
    cairo_paint(cr.get());
    cairo_set_source_rgb(cr.get(), 0, 0, 0);
    const double fs = font_size(fig);
    if (!fig.title.empty()) text(cr.get(), fig.width / 2.0, 1.6 * fs, fig.title, 0.5);
    for (std::size_t k = 0; k < fig.panels.size(); ++k) draw_panel(cr.get(), fig.panels[k], areas[k], fs);
    check(cairo_status(cr.get()), "drawing " + what);
    cairo_surface_flush(s.get());
    return s;
}

inline std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
}

}  // namespace detail

/// Where each panel's data go in the image (same order as fig.panels). Throws as write_png does for bad input.
inline std::vector<PlotArea> layout(const Figure& fig) {
    detail::Surface s(cairo_image_surface_create(CAIRO_FORMAT_RGB24, 1, 1));
    return detail::layout(detail::context(s.get(), fig).get(), fig);
}

/// The CSV beside a PNG: "dir/curves.png" -> "dir/curves.plot.csv".
inline std::string csv_path(const std::string& png) {
    return std::filesystem::path(png).replace_extension(".plot.csv").string();
}

/// Writes `bytes` as the file `path` atomically (moonmoe/io/detail/atomic_file.hpp: a temporary file beside it,
/// synced, renamed over it): a full disk or a kill leaves the old file or none, never a 0-byte or truncated one.
inline void write_file(const std::string& path, std::string_view bytes) {
    const std::span<const std::byte> chunk = std::as_bytes(std::span(bytes.data(), bytes.size()));
    moonmoe::detail::write_file_atomically(path, std::span(&chunk, 1));
}

/// Every point of every series, one row each: panel (its title, or "panel <k>" counting from 1), series (its label),
/// x, y (%.9g; "nan", "inf" as they are). A reference line is a row with an empty x. Written atomically.
inline void write_csv(const std::string& path, const Figure& fig) {
    std::ostringstream f;
    const auto num = [](double v) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.9g", v);
        return std::string(buf);
    };
    f << "panel,series,x,y\n";
    for (std::size_t k = 0; k < fig.panels.size(); ++k) {
        const Panel& p = fig.panels[k];
        const std::string panel = detail::csv_field(p.title.empty() ? "panel " + std::to_string(k + 1) : p.title);
        for (const Series& s : p.series)
            for (std::size_t i = 0; i < s.y.size(); ++i)
                f << panel << ',' << detail::csv_field(s.label) << ',' << num(detail::series_x(s, i)) << ','
                  << num(s.y[i]) << '\n';
        for (const HLine& h : p.hlines) f << panel << ',' << detail::csv_field(h.label) << ",," << num(h.y) << '\n';
    }
    write_file(path, f.str());
}

/// Draws the figure into the PNG file `path`, and its points into csv_path(path). Throws std::invalid_argument for a
/// bad size, bad limits or a series whose x and y sizes differ; std::runtime_error naming the file, with cairo's
/// reason, when it cannot be written.
inline void write_png(const std::string& path, const Figure& fig) {
    const detail::Surface s = detail::render(fig, "'" + path + "'");
    std::string png;  // encoded in memory, then written atomically as write_file does
    const auto append = [](void* out, const unsigned char* data, unsigned int size) {
        static_cast<std::string*>(out)->append(reinterpret_cast<const char*>(data), size);
        return CAIRO_STATUS_SUCCESS;
    };
    detail::check(cairo_surface_write_to_png_stream(s.get(), append, &png), "cannot encode '" + path + "'");
    write_file(path, png);
    write_csv(csv_path(path), fig);
}

}  // namespace moonmoe::plot

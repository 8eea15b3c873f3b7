// examples/support/plot.hpp: figures written with write_png are read back with cairo's own PNG reader and checked
// pixel by pixel against the axes' data-to-pixel mapping (plot::layout): the size, the white background, each series'
// colour along its line and nowhere near it, gaps at non-finite points, a lone point's dot, dashed and solid
// reference lines, a log axis, the legend's corner; the tick choice; bad input and an unwritable path; the CSV
// written beside the PNG. Also writes a sample figure for a human to look at.
#include <doctest/doctest.h>

#include <cairo.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "../../examples/support/plot.hpp"

// LeakSanitizer (the sanitize preset) reports fontconfig's own leaks, made when cairo's text first loads the font
// configuration (Debian 12's fontconfig 2.14 keeps blocks of the parsed XML and of the patterns it hands cairo's font
// cache): not this code's, so they are suppressed for the whole test binary, wherever it is run from. Global, as
// LeakSanitizer looks it up by name; ignored without sanitizers.
extern "C" const char* __lsan_default_suppressions() { return "leak:libfontconfig.so\n"; }

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_plot {

namespace plot = moonmoe::plot;

namespace {

constexpr plot::Rgb white{255, 255, 255}, black{0, 0, 0};
const double nan = std::numeric_limits<double>::quiet_NaN();

/// A PNG file's pixels, decoded by cairo.
struct Png {
    int width = 0, height = 0;
    std::vector<plot::Rgb> pixels;

    explicit Png(const std::string& path) {
        const plot::detail::Surface s(cairo_image_surface_create_from_png(path.c_str()));
        REQUIRE(cairo_surface_status(s.get()) == CAIRO_STATUS_SUCCESS);
        const cairo_format_t f = cairo_image_surface_get_format(s.get());
        REQUIRE((f == CAIRO_FORMAT_RGB24 || f == CAIRO_FORMAT_ARGB32));
        width = cairo_image_surface_get_width(s.get()), height = cairo_image_surface_get_height(s.get());
        const int stride = cairo_image_surface_get_stride(s.get());
        const unsigned char* data = cairo_image_surface_get_data(s.get());
        for (int y = 0; y < height; ++y)
            for (int x = 0; x < width; ++x) {
                std::uint32_t v;  // native-endian 0xAARRGGBB (opaque: no premultiplication to undo)
                std::memcpy(&v, data + std::size_t(y) * std::size_t(stride) + 4 * std::size_t(x), 4);
                pixels.push_back({std::uint8_t(v >> 16), std::uint8_t(v >> 8), std::uint8_t(v)});
            }
    }
    plot::Rgb at(double x, double y) const {  // the pixel covering the point (x, y)
        const int i = int(std::floor(x)), j = int(std::floor(y));
        if (i < 0 || j < 0 || i >= width || j >= height) throw std::out_of_range("pixel outside the image");
        return pixels[std::size_t(j) * std::size_t(width) + std::size_t(i)];
    }
};

bool near(plot::Rgb a, plot::Rgb b, int tolerance = 12) {
    for (int k = 0; k < 3; ++k)
        if (std::abs(int(a[std::size_t(k)]) - int(b[std::size_t(k)])) > tolerance) return false;
    return true;
}

/// Pixels of colour c (within the tolerance) in the rectangle [x0, x1) x [y0, y1).
int count(const Png& img, double x0, double y0, double x1, double y1, plot::Rgb c, int tolerance = 12) {
    int n = 0;
    for (int y = int(y0); y < int(y1); ++y)
        for (int x = int(x0); x < int(x1); ++x) n += near(img.at(x, y), c, tolerance);
    return n;
}

std::string written(const std::string& name, const plot::Figure& fig) {
    const std::string path = MOONMOE_TEST_BINARY_DIR "/" + name;
    plot::write_png(path, fig);
    return path;
}

}  // namespace

TEST_CASE("plot: the PNG has the figure's size, a white background and the series' colour along its line") {
    const plot::Rgb red{200, 20, 30};
    plot::Figure fig;
    fig.width = 400, fig.height = 300;
    fig.panels.push_back({.series = {{.x = {0, 10}, .y = {0, 10}, .color = red, .width = 3}},
                          .x_min = 0,
                          .x_max = 10,
                          .y_min = 0,
                          .y_max = 10,
                          .grid = false});
    const Png img(written("plot_line.png", fig));
    const plot::PlotArea a = plot::layout(fig).at(0);
    CHECK(img.width == 400);
    CHECK(img.height == 300);
    CHECK(a.left > 0);
    CHECK(a.top > 0);
    CHECK(a.right < fig.width - 1);
    CHECK(a.bottom < fig.height - 1);

    for (double t = 0.5; t < 10; t += 0.5) {
        CAPTURE(t);
        CHECK(near(img.at(a.px(t), a.py(t)), red));
        CHECK(near(img.at(a.px(t), a.py(t) + 6), white));  // 6 px below and above the 3 px line: background
        CHECK(near(img.at(a.px(t), a.py(t) - 6), white));
    }
    CHECK(img.at(0, 0) == white);  // the figure's corners
    CHECK(img.at(fig.width - 1, fig.height - 1) == white);
    CHECK(img.at(a.px(8), a.py(2)) == white);  // inside the axes, away from the line
    CHECK(img.at(a.px(2), a.py(8)) == white);
    CHECK(img.at(a.left, (a.top + a.bottom) / 2) == black);  // the axis box
    CHECK(img.at((a.left + a.right) / 2, a.bottom) == black);
    CHECK(count(img, 0, 0, fig.width, fig.height, red) > 300);  // the line, and no legend: nothing else is red
    CHECK(count(img, 0, 0, a.left, fig.height, red) == 0);
}

TEST_CASE("plot: a NaN or an inf breaks the line, and a point between two breaks is a dot") {
    const plot::Rgb blue{10, 90, 200};
    const double inf = std::numeric_limits<double>::infinity();
    plot::Figure fig;
    fig.width = 600, fig.height = 300;
    fig.panels.push_back({.series = {{.x = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9},
                                      .y = {1, 1, nan, 1, 1, inf, 1, nan, 1, nan},
                                      .color = blue,
                                      .width = 4}},
                          .grid = false});
    const Png img(written("plot_gaps.png", fig));
    const plot::PlotArea a = plot::layout(fig).at(0);
    const double y = a.py(1);
    CHECK(near(img.at(a.px(0.5), y), blue));
    CHECK(near(img.at(a.px(3.5), y), blue));
    CHECK(img.at(a.px(2), y) == white);     // the NaN at x = 2
    CHECK(img.at(a.px(5), y) == white);     // the inf at x = 5
    CHECK(img.at(a.px(7), y) == white);     // the NaN at x = 7
    CHECK(near(img.at(a.px(8), y), blue));  // x = 8: a dot, with white on both sides
    CHECK(img.at(a.px(8) + 5, y) == white);
    CHECK(img.at(a.px(8) - 5, y) == white);
}

TEST_CASE("plot: points far outside explicit limits still draw their lines' visible parts") {
    const plot::Rgb blue{20, 60, 220};
    plot::Figure fig;
    fig.width = 400, fig.height = 300;
    fig.panels.push_back({.series = {{.x = {0, 1, 2}, .y = {0, 1e12, 0}, .color = blue, .width = 3}},
                          .x_min = -1,
                          .x_max = 3,
                          .y_min = -1,
                          .y_max = 10,
                          .grid = false});
    const Png img(written("plot_far.png", fig));
    const plot::PlotArea a = plot::layout(fig).at(0);
    for (double y : {1.0, 5.0, 9.0}) {  // two near-vertical lines, up from x = 0 and down to x = 2
        CAPTURE(y);
        CHECK(count(img, a.px(0) - 2, a.py(y), a.px(0) + 3, a.py(y) + 1, blue) >= 1);
        CHECK(count(img, a.px(2) - 2, a.py(y), a.px(2) + 3, a.py(y) + 1, blue) >= 1);
        CHECK(img.at(a.px(1), a.py(y)) == white);
    }
}

TEST_CASE("plot: a dashed reference line alternates dashes and gaps, a solid one does not") {
    const plot::Rgb teal{0, 128, 128}, purple{120, 40, 160};
    plot::Figure fig;
    fig.width = 500, fig.height = 300;
    fig.panels.push_back({.hlines = {{.y = 2, .label = "dashed", .color = teal},
                                     {.y = 8, .label = "solid", .color = purple, .dashed = false}},
                          .x_min = 0,
                          .x_max = 10,
                          .y_min = 0,
                          .y_max = 10,
                          .grid = false,
                          .legend = plot::LegendPlacement::none});
    const Png img(written("plot_hlines.png", fig));
    const plot::PlotArea a = plot::layout(fig).at(0);
    int dash = 0, gap = 0, changes = 0;
    bool was = false;
    for (double x = a.left + 2; x < a.right - 1; x += 1) {
        const bool on = near(img.at(x, a.py(2)), teal);
        dash += on, gap += img.at(x, a.py(2)) == white, changes += on != was, was = on;
    }
    CHECK(dash > 60);
    CHECK(gap > 40);
    CHECK(changes >= 10);
    const double width = a.right - a.left - 3;
    CHECK(count(img, a.left + 2, a.py(8), a.right - 1, a.py(8) + 1, purple) == int(width));
}

TEST_CASE("plot: a log axis spaces decades evenly and leaves out non-positive values") {
    const plot::Rgb green{30, 150, 30};
    plot::Figure fig;
    fig.width = 500, fig.height = 400;
    fig.panels.push_back(
        {.series = {{.x = {0, 1, 2, 3, 4, 5, 6}, .y = {1, 10, 100, 1000, 1e4, 0, -5}, .color = green, .width = 3}},
         .log_y = true,
         .grid = false});
    const Png img(written("plot_log.png", fig));
    const plot::PlotArea a = plot::layout(fig).at(0);
    CHECK(a.log_y);
    CHECK(a.y_lo > 0);
    CHECK(a.y_lo < 1);
    CHECK(a.y_hi > 1e4);
    CHECK(a.x_hi < 5);  // the skipped points do not stretch the x range either
    REQUIRE(a.y_ticks.size() == 5);
    for (std::size_t i = 0; i < 5; ++i) CHECK(a.y_ticks[i] == doctest::Approx(std::pow(10.0, double(i))));
    CHECK(a.y_labels == std::vector<std::string>{"1", "10", "100", "1000", "10000"});
    // The line from (1, 10) to (2, 100) is straight on the page: it passes (1.5, 10^1.5), half-way between the
    // decades, and not (1.5, 55), where a linear axis would put it.
    CHECK(a.py(10) - a.py(100) == doctest::Approx(a.py(1000) - a.py(1e4)));
    for (double x : {0.5, 1.5, 2.5, 3.5}) CHECK(near(img.at(a.px(x), a.py(std::pow(10.0, x))), green));
    CHECK(img.at(a.px(1.5), a.py(55)) == white);
    CHECK(img.at(a.px(4) + 5, a.py(1e4)) == white);  // nothing drawn towards the 0 at x = 5
}

TEST_CASE("plot: constant series, single points and empty panels get a sensible range") {
    const plot::Rgb orange{240, 120, 10};
    plot::Figure fig;
    fig.width = 1000, fig.height = 300;
    fig.panels.push_back({.series = {{.y = {3, 3, 3, 3}}}});
    fig.panels.push_back({.series = {{.x = {5}, .y = {7}, .color = orange, .width = 8}}, .grid = false});
    fig.panels.push_back({.series = {{.y = {50}}}, .log_y = true});
    fig.panels.push_back({.series = {{.label = "empty"}, {.label = "all NaN", .y = {nan, nan}}}});
    fig.panels.push_back({});
    const Png img(written("plot_ranges.png", fig));
    const auto areas = plot::layout(fig);
    REQUIRE(areas.size() == 5);
    for (const plot::PlotArea& a : areas) {
        CHECK(std::isfinite(a.x_lo));
        CHECK(std::isfinite(a.y_hi));
        CHECK(a.x_lo < a.x_hi);
        CHECK(a.y_lo < a.y_hi);
        CHECK(a.y_ticks.size() >= 2);
        CHECK(a.left < a.right);
    }
    for (std::size_t k = 1; k < areas.size(); ++k) CHECK(areas[k - 1].right < areas[k].left);  // side by side
    CHECK(areas[0].y_lo < 3);
    CHECK(areas[0].y_hi > 3);
    const plot::PlotArea& p = areas[1];
    CHECK((p.x_lo < 5 && p.x_hi > 5 && p.y_lo < 7 && p.y_hi > 7));
    CHECK(near(img.at(p.px(5), p.py(7)), orange));  // the point, as a dot
    CHECK(count(img, p.left, p.top, p.right, p.bottom, orange) > 20);
    CHECK((areas[2].y_lo > 0 && areas[2].y_lo < 50 && areas[2].y_hi > 50));
}

TEST_CASE("plot: the legend shows each labelled series' colour, in the corner with the fewest data") {
    const plot::Rgb red{210, 30, 30}, frame{190, 190, 190};
    const auto figure = [&](plot::LegendPlacement where) {
        plot::Figure fig;
        fig.width = 500, fig.height = 400;
        fig.panels.push_back({.series = {{.label = "rising", .x = {0, 10}, .y = {0, 10}, .color = red}},
                              .x_min = 0,
                              .x_max = 10,
                              .y_min = 0,
                              .y_max = 10,
                              .grid = false,
                              .legend = where});
        return fig;
    };
    const plot::PlotArea a = plot::layout(figure(plot::LegendPlacement::none)).at(0);
    const double mx = (a.left + a.right) / 2, my = (a.top + a.bottom) / 2;
    // The diagonal runs through the lower-left and upper-right quadrants: nothing red in the upper-left one...
    const Png none(written("plot_legend_none.png", figure(plot::LegendPlacement::none)));
    CHECK(count(none, a.left + 1, a.top + 1, mx - 40, my - 40, red) == 0);
    CHECK(count(none, a.left + 1, a.top + 1, a.right, a.bottom, frame, 0) == 0);
    // ...until the legend goes there, with a red swatch and a frame.
    const Png upper_left(written("plot_legend_upper_left.png", figure(plot::LegendPlacement::upper_left)));
    CHECK(count(upper_left, a.left + 1, a.top + 1, mx - 40, my - 40, red) > 15);
    CHECK(count(upper_left, a.left + 1, a.top + 1, mx, my, frame, 0) > 60);
    // Placed automatically: in one of the two empty quadrants, not over the line.
    const Png best(written("plot_legend_best.png", figure(plot::LegendPlacement::best)));
    const int ul = count(best, a.left + 1, a.top + 1, mx, my, frame, 0),
              ur = count(best, mx, a.top + 1, a.right, my, frame, 0),
              ll = count(best, a.left + 1, my, mx, a.bottom, frame, 0),
              lr = count(best, mx, my, a.right, a.bottom, frame, 0);
    CHECK(std::max(ul, lr) > 60);
    CHECK(ur < 10);
    CHECK(ll < 10);
}

TEST_CASE("plot: titles, labels and tick labels are drawn as text") {
    plot::Figure fig;
    fig.width = 600, fig.height = 400;
    fig.title = "MuonClip: τ = 100";
    fig.panels.push_back({.title = "loss", .x_label = "step", .y_label = "nats", .series = {{.y = {3, 2, 1}}}});
    const Png img(written("plot_text.png", fig));
    const plot::PlotArea a = plot::layout(fig).at(0);
    const auto dark = [&](double x0, double y0, double x1, double y1) {
        return count(img, x0, y0, x1, y1, black, 100);
    };
    CHECK(dark(0, 0, fig.width, a.top - 1) > 100);              // figure and panel titles
    CHECK(dark(0, a.bottom + 2, fig.width, fig.height) > 100);  // x tick labels and the x label
    CHECK(dark(0, a.top, a.left - 1, a.bottom) > 100);          // y tick labels and the y label
    CHECK(dark(a.right + 2, a.top, fig.width, a.bottom) == 0);
}

TEST_CASE("plot: tick choice and labels") {
    using plot::detail::nice_ticks;
    const auto same = [](const std::vector<double>& got, const std::vector<double>& want) {
        if (got.size() != want.size()) return false;
        for (std::size_t i = 0; i < got.size(); ++i)
            if (std::abs(got[i] - want[i]) > 1e-12 * std::max(1.0, std::abs(want[i]))) return false;
        return true;
    };
    CHECK(same(nice_ticks(0, 1, 6), {0, 0.2, 0.4, 0.6, 0.8, 1.0}));
    CHECK(same(nice_ticks(0, 1, 11), {0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0}));
    CHECK(same(nice_ticks(-40, 2040, 5), {0, 500, 1000, 1500, 2000}));
    CHECK(same(nice_ticks(1.7, 11.3, 6), {2, 4, 6, 8, 10}));
    CHECK(same(nice_ticks(-3, 3, 4), {-2, 0, 2}));
    CHECK(nice_ticks(1, 1, 5).empty());
    for (double span : {0.3, 7.0, 1234.5, 2e-7}) {  // every step is {1, 2, 5} x 10^k
        const auto t = nice_ticks(0, span * 10, 7);
        REQUIRE(t.size() >= 2);
        CHECK(t.size() <= 7);
        const double step = t[1] - t[0], mant = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
        CHECK((std::abs(mant - 1) < 1e-9 || std::abs(mant - 2) < 1e-9 || std::abs(mant - 5) < 1e-9));
    }
    using plot::detail::tick_labels;
    CHECK(tick_labels({0, 0.5, 1}) == std::vector<std::string>{"0.0", "0.5", "1.0"});
    CHECK(tick_labels({-2, 0, 2}) == std::vector<std::string>{"-2", "0", "2"});
    CHECK(tick_labels({0, 500, 1000}) == std::vector<std::string>{"0", "500", "1000"});
    CHECK(tick_labels({0, 2e6, 4e6}) == std::vector<std::string>{"0", "2e6", "4e6"});
    CHECK(tick_labels({2.5e6, 5e6}) == std::vector<std::string>{"2.5e6", "5e6"});
    CHECK(tick_labels({1e-5, 2e-5}) == std::vector<std::string>{"1e-5", "2e-5"});
    const auto [major, minor] = plot::detail::log_ticks(0.5, 2e5, 8);
    CHECK(same(major, {1, 10, 100, 1000, 1e4, 1e5}));
    CHECK(minor.size() > 20);
    CHECK(tick_labels({1e-6, 1e6}) == std::vector<std::string>{"1e-6", "1e6"});
    CHECK(same(plot::detail::log_ticks(15, 1600, 8).first, {20, 50, 100, 200, 500, 1000}));
    CHECK(same(plot::detail::log_ticks(1e-3, 1e9, 4).first, {1, 1e4, 1e8}));  // 13 decades: every fourth power
}

TEST_CASE("plot: bad input and an unwritable file are reported") {
    plot::Figure fig;
    fig.width = 300, fig.height = 200;
    fig.panels.push_back({.series = {{.label = "bad", .x = {1, 2, 3}, .y = {1, 2}}}});
    CHECK_THROWS_AS(plot::layout(fig), std::invalid_argument);
    CHECK_THROWS_AS(written("plot_bad.png", fig), std::invalid_argument);
    fig.panels[0].series[0].x.clear();
    CHECK_NOTHROW(plot::layout(fig));
    fig.panels[0].y_min = 5, fig.panels[0].y_max = 1;
    CHECK_THROWS_AS(plot::layout(fig), std::invalid_argument);
    fig.panels[0].y_min.reset(), fig.panels[0].y_max.reset();
    fig.panels[0].log_y = true, fig.panels[0].y_min = 0.0;
    CHECK_THROWS_AS(plot::layout(fig), std::invalid_argument);
    fig.panels[0].log_y = false, fig.panels[0].y_min.reset();
    fig.width = 10;
    CHECK_THROWS_AS(plot::layout(fig), std::invalid_argument);
    fig.width = 300;

    const std::string path = "/nonexistent-moonmoe-dir/sub/plot.png";
    try {
        plot::write_png(path, fig);
        FAIL("write_png to a missing directory did not throw");
    } catch (const std::runtime_error& e) {
        const std::string what = e.what();
        CHECK(what.find(path) != std::string::npos);
        CHECK(what.find("No such file or directory") != std::string::npos);
    }
}

TEST_CASE("plot: a write that fails midway (a full disk) leaves the previous PNG and CSV whole") {
    // issue 29: the examples wrote CSV and PNG in place, leaving 0-byte or truncated files on a full disk. A file
    // size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes every write past 64 bytes fail as a full disk would.
    plot::Figure fig;
    fig.width = 320, fig.height = 240;
    fig.panels.push_back({.title = "loss", .series = {{.label = "a", .y = {3, 2, 1.5, 1.2}}}});
    const std::string path = written("plot_full_disk.png", fig);
    const auto read = [](const std::string& p) {
        std::ifstream f(p, std::ios::binary);
        return std::string(std::istreambuf_iterator<char>(f), {});
    };
    const std::string png = read(path), csv = read(plot::csv_path(path));
    REQUIRE(png.size() > 64);
    fig.panels[0].series[0].y = {9, 8, 7, 6, 5};
    {
        rlimit old{};
        REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
        const auto handler = std::signal(SIGXFSZ, SIG_IGN);
        rlimit limited = old;
        limited.rlim_cur = 64;
        REQUIRE(::setrlimit(RLIMIT_FSIZE, &limited) == 0);
        std::string what;
        try {
            plot::write_png(path, fig);
        } catch (const std::exception& e) {
            what = e.what();
        }
        ::setrlimit(RLIMIT_FSIZE, &old);
        std::signal(SIGXFSZ, handler);
        CHECK(what.find(path) != std::string::npos);
    }
    CHECK(read(path) == png);
    CHECK(read(plot::csv_path(path)) == csv);
    CHECK_NOTHROW(plot::write_png(path, fig));  // and without the limit, the new figure replaces them
    CHECK(read(path) != png);
}

TEST_CASE("plot: write_png also writes every point to <stem>.plot.csv") {
    CHECK(plot::csv_path("dir/curves.png") == "dir/curves.plot.csv");
    plot::Figure fig;
    fig.panels.push_back({.title = "loss",
                          .series = {{.label = "Parallel<2, 2, 2>", .x = {1, 2}, .y = {0.5, nan}},
                                     {.label = "say \"hi\"", .y = {1e-7}}}});
    fig.panels.push_back({.series = {{.y = {3}}}, .hlines = {{.y = 100, .label = "tau"}}});
    const std::string path = written("plot_csv.png", fig);
    std::ifstream f(plot::csv_path(path));
    REQUIRE(f);
    std::vector<std::string> lines;
    for (std::string l; std::getline(f, l);) lines.push_back(l);
    CHECK(lines == std::vector<std::string>{"panel,series,x,y", "loss,\"Parallel<2, 2, 2>\",1,0.5",
                                            "loss,\"Parallel<2, 2, 2>\",2,nan", "loss,\"say \"\"hi\"\"\",0,1e-07",
                                            "panel 2,,0,3", "panel 2,tau,,100"});
}

TEST_CASE("plot: sample figure (Muon vs MuonClip, synthetic)") {
    std::vector<double> steps, loss_muon, loss_clip, logit_muon, logit_clip;
    std::uint32_t state = 7;
    const auto noise = [&] {  // roughly uniform in [-1, 1)
        state = state * 1664525u + 1013904223u;
        return double(state >> 8) / double(1u << 23) - 1;
    };
    for (int i = 0; i <= 2000; i += 10) {
        const double s = i, base = 2.2 + 8.0 * std::exp(-s / 150) + 0.6 * std::exp(-s / 1200);
        steps.push_back(s);
        loss_muon.push_back(base + 0.08 * noise() + (s > 900 && s < 960 ? 0.8 : 0));  // a spike
        loss_clip.push_back(base - 0.02 + 0.08 * noise());
        logit_muon.push_back((20 + 1500 * (1 - std::exp(-s / 500))) * (1 + 0.05 * noise()));
        logit_clip.push_back(std::min(100.0, 20 + 300 * (1 - std::exp(-s / 300))) *
                             (s > 1200 ? std::exp(-(s - 1200) / 2000) : 1.0) * (1 + 0.02 * noise()));
    }
    plot::Figure fig;
    fig.title = "Muon vs MuonClip (synthetic data)";
    fig.panels.push_back(
        {.title = "Training loss",
         .x_label = "step",
         .y_label = "loss",
         .series = {{.label = "Muon", .x = steps, .y = loss_muon, .color = plot::colors::blue},
                    {.label = "MuonClip", .x = steps, .y = loss_clip, .color = plot::colors::orange}}});
    fig.panels.push_back({.title = "Max attention logit",
                          .x_label = "step",
                          .y_label = "max logit",
                          .series = {{.label = "Muon", .x = steps, .y = logit_muon, .color = plot::colors::blue},
                                     {.label = "MuonClip", .x = steps, .y = logit_clip, .color = plot::colors::orange}},
                          .hlines = {{.y = 100, .label = "QK-Clip τ = 100", .color = plot::colors::red}},
                          .log_y = true});
    const Png img(written("plot_sample.png", fig));
    CHECK(img.width == 1200);
    CHECK(img.height == 500);
    MESSAGE("wrote " MOONMOE_TEST_BINARY_DIR "/plot_sample.png");
}

}  // namespace unit_plot

// examples/support/plot_png.hpp: the PNG container (signature, chunk CRCs checked against a bitwise CRC-32 written
// here), the zlib stream (inflated by a small stored/fixed-Huffman inflater written here, Adler-32 checked), the
// scanlines (filter 0, exact size), and the drawing: series pixels in their colour, white background, gaps at
// non-finite points, dashed reference lines, tick choice and labels. Also writes a sample figure for a human to look at.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../examples/support/plot_png.hpp"

// The file's own namespace: the test binaries compile files in batches (MOONMOE_UNITY_TESTS).
namespace unit_plot_png {

namespace plot = moonmoe::plot;

namespace {

using Bytes = std::vector<std::uint8_t>;

std::uint32_t bitwise_crc32(const std::uint8_t* p, std::size_t n) {
    std::uint32_t c = 0xFFFFFFFFu;
    for (std::size_t i = 0; i < n; ++i) {
        c ^= p[i];
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return c ^ 0xFFFFFFFFu;
}

std::uint32_t slow_adler32(const Bytes& d) {
    std::uint32_t a = 1, b = 0;
    for (std::uint8_t x : d) a = (a + x) % 65521, b = (b + a) % 65521;
    return (b << 16) | a;
}

std::uint32_t be32(const Bytes& d, std::size_t i) {
    return std::uint32_t(d.at(i)) << 24 | std::uint32_t(d.at(i + 1)) << 16 | std::uint32_t(d.at(i + 2)) << 8 |
           std::uint32_t(d.at(i + 3));
}

struct Chunk {
    std::string type;
    Bytes data;
    bool crc_ok;
};

std::vector<Chunk> parse_chunks(const Bytes& png) {
    std::vector<Chunk> out;
    std::size_t i = 8;
    while (i < png.size()) {
        REQUIRE(i + 12 <= png.size());
        const std::size_t len = be32(png, i);
        REQUIRE(i + 12 + len <= png.size());
        Chunk c;
        c.type.assign(png.begin() + std::ptrdiff_t(i + 4), png.begin() + std::ptrdiff_t(i + 8));
        c.data.assign(png.begin() + std::ptrdiff_t(i + 8), png.begin() + std::ptrdiff_t(i + 8 + len));
        c.crc_ok = bitwise_crc32(png.data() + i + 4, 4 + len) == be32(png, i + 8 + len);
        out.push_back(std::move(c));
        i += 12 + len;
    }
    return out;
}

// A minimal inflater: stored and fixed-Huffman blocks only (all the writer emits); throws on anything else.
class Inflater {
public:
    explicit Inflater(const Bytes& in) : in_(in) {}

    Bytes run() {
        Bytes out;
        bool final = false;
        while (!final) {
            final = bit();
            const unsigned type = bits(2);
            if (type == 0) {
                pos_ = (pos_ + 7) / 8 * 8;  // to the byte boundary
                const unsigned len = bits(16), nlen = bits(16);
                if ((len ^ 0xFFFFu) != nlen) throw std::runtime_error("stored block: NLEN is not ~LEN");
                for (unsigned k = 0; k < len; ++k) out.push_back(std::uint8_t(bits(8)));
                ++stored_blocks;
            } else if (type == 1) {
                ++fixed_blocks;
                for (;;) {
                    const unsigned sym = litlen();
                    if (sym < 256) out.push_back(std::uint8_t(sym));
                    else if (sym == 256) break;
                    else {
                        const unsigned lc = sym - 257;
                        if (lc > 28) throw std::runtime_error("bad length code");
                        const unsigned len = length_base(lc) + bits(length_extra(lc));
                        unsigned dc = 0;
                        for (int k = 0; k < 5; ++k) dc = (dc << 1) | bit();  // 5-bit fixed code, MSB first
                        if (dc > 29) throw std::runtime_error("bad distance code");
                        const unsigned dist = dist_base(dc) + bits(dist_extra(dc));
                        if (dist == 0 || dist > out.size() || dist > 32768) throw std::runtime_error("bad distance");
                        for (unsigned k = 0; k < len; ++k) out.push_back(out[out.size() - dist]);
                    }
                }
            } else {
                throw std::runtime_error("unexpected block type");
            }
        }
        consumed_bytes = (pos_ + 7) / 8;
        return out;
    }

    int stored_blocks = 0, fixed_blocks = 0;
    std::size_t consumed_bytes = 0;

private:
    // RFC 1951 3.2.5, computed rather than copied: lengths 3.. in groups of four codes per extra-bit count.
    static unsigned length_extra(unsigned c) { return c == 28 ? 0 : c < 8 ? 0 : (c - 4) / 4; }
    static unsigned length_base(unsigned c) {
        if (c == 28) return 258;
        unsigned base = 3;
        for (unsigned k = 0; k < c; ++k) base += 1u << length_extra(k);
        return base;
    }
    static unsigned dist_extra(unsigned c) { return c < 4 ? 0 : c / 2 - 1; }
    static unsigned dist_base(unsigned c) {
        unsigned base = 1;
        for (unsigned k = 0; k < c; ++k) base += 1u << dist_extra(k);
        return base;
    }

    unsigned bit() {
        if (pos_ / 8 >= in_.size()) throw std::runtime_error("deflate stream ends early");
        const unsigned b = (in_[pos_ / 8] >> (pos_ % 8)) & 1u;
        ++pos_;
        return b;
    }
    unsigned bits(unsigned n) {  // LSB first
        unsigned v = 0;
        for (unsigned k = 0; k < n; ++k) v |= bit() << k;
        return v;
    }
    unsigned litlen() {  // RFC 1951 3.2.6
        unsigned code = 0;
        for (int k = 0; k < 7; ++k) code = (code << 1) | bit();
        if (code <= 0x17) return 256 + code;
        code = (code << 1) | bit();
        if (code >= 0x30 && code <= 0xBF) return code - 0x30;
        if (code >= 0xC0 && code <= 0xC7) return 280 + (code - 0xC0);
        code = (code << 1) | bit();
        if (code >= 0x190 && code <= 0x1FF) return 144 + (code - 0x190);
        throw std::runtime_error("bad literal/length code");
    }

    const Bytes& in_;
    std::size_t pos_ = 0;
};

struct Decoded {
    int width = 0, height = 0;
    Bytes scanlines;  // inflated IDAT data, with filter bytes
    plot::Image image;
    int stored_blocks = 0, fixed_blocks = 0;
};

// Checks the container and stream along the way.
Decoded decode(const Bytes& png) {
    const Bytes signature{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    REQUIRE(png.size() > 8);
    REQUIRE(Bytes(png.begin(), png.begin() + 8) == signature);
    const auto chunks = parse_chunks(png);
    REQUIRE(chunks.size() >= 3);
    CHECK(chunks.front().type == "IHDR");
    CHECK(chunks.back().type == "IEND");
    CHECK(chunks.back().data.empty());
    Bytes z;
    for (std::size_t k = 0; k < chunks.size(); ++k) {
        CHECK_MESSAGE(chunks[k].crc_ok, "chunk ", k, " (", chunks[k].type, ") has a bad CRC");
        if (chunks[k].type == "IDAT") z.insert(z.end(), chunks[k].data.begin(), chunks[k].data.end());
    }
    const Bytes& ihdr = chunks.front().data;
    REQUIRE(ihdr.size() == 13);
    Decoded d;
    d.width = int(be32(ihdr, 0)), d.height = int(be32(ihdr, 4));
    CHECK(ihdr[8] == 8);   // bit depth
    CHECK(ihdr[9] == 2);   // RGB
    CHECK(ihdr[10] == 0);  // deflate
    CHECK(ihdr[11] == 0);  // filter method
    CHECK(ihdr[12] == 0);  // no interlace

    REQUIRE(z.size() >= 6);
    CHECK((z[0] & 0x0F) == 8);                       // CM = deflate
    CHECK((unsigned(z[0]) * 256 + z[1]) % 31 == 0);  // FCHECK
    CHECK((z[1] & 0x20) == 0);                       // no preset dictionary
    const Bytes deflate(z.begin() + 2, z.end() - 4);
    Inflater inf(deflate);
    d.scanlines = inf.run();
    d.stored_blocks = inf.stored_blocks, d.fixed_blocks = inf.fixed_blocks;
    CHECK(inf.consumed_bytes == deflate.size());
    CHECK(be32(z, z.size() - 4) == slow_adler32(d.scanlines));

    const std::size_t stride = 1 + 3 * std::size_t(d.width);
    REQUIRE(d.scanlines.size() == std::size_t(d.height) * stride);
    d.image = plot::Image(d.width, d.height);
    for (int y = 0; y < d.height; ++y) {
        REQUIRE(d.scanlines[std::size_t(y) * stride] == 0);  // filter type None
        std::copy_n(d.scanlines.begin() + std::ptrdiff_t(std::size_t(y) * stride + 1), 3 * std::size_t(d.width),
                    d.image.rgb.begin() + std::ptrdiff_t(std::size_t(y) * 3 * std::size_t(d.width)));
    }
    return d;
}

const plot::Rgb white{255, 255, 255};

plot::Rgb at(const plot::Image& img, double x, double y) { return img.pixel(int(std::floor(x)), int(std::floor(y))); }

}  // namespace

TEST_CASE("plot: PNG container, chunk CRCs, zlib stream and scanlines") {
    plot::Figure fig;
    fig.width = 320, fig.height = 200;
    fig.panels.push_back({.title = "t", .series = {{.label = "a", .y = {1, 3, 2, 4}}}});
    for (const auto mode : {plot::Compression::fixed_huffman, plot::Compression::stored}) {
        const int m = int(mode);
        CAPTURE(m);
        const Bytes png = plot::render_png(fig, mode);
        const Decoded d = decode(png);
        CHECK(d.width == 320);
        CHECK(d.height == 200);
        CHECK(d.scanlines.size() == std::size_t(200) * (1 + 3 * 320));
        CHECK(d.image.rgb == plot::render(fig).rgb);
        if (mode == plot::Compression::stored) {
            CHECK(d.fixed_blocks == 0);
            CHECK(d.stored_blocks == int((d.scanlines.size() + 65534) / 65535));  // full 65535-byte blocks
        } else {
            CHECK(d.stored_blocks == 0);
            CHECK(d.fixed_blocks == 1);
            CHECK(png.size() * 10 < d.scanlines.size());  // a plot is mostly flat colour
        }
    }
}

TEST_CASE("plot: encode_png round-trips arbitrary pixels exactly") {
    // Noise mixed with runs and repeats at many distances (1 byte, 1 pixel, 1 row, several rows, beyond the window).
    for (const auto mode : {plot::Compression::fixed_huffman, plot::Compression::stored}) {
        for (const std::pair<int, int>& size : {std::pair{1, 1}, std::pair{3, 2}, std::pair{257, 131}, std::pair{5000, 20}}) {
            const int w = size.first, h = size.second;
            CAPTURE(w);
            CAPTURE(h);
            const int m = int(mode);
            CAPTURE(m);
            plot::Image img(w, h);
            std::uint32_t state = 12345;
            for (std::size_t i = 0; i < img.rgb.size(); ++i) {
                state = state * 1664525u + 1013904223u;
                const unsigned r = state >> 24;
                if (r < 100) img.rgb[i] = std::uint8_t(state >> 8);                  // noise
                else if (r < 160 && i >= 3) img.rgb[i] = img.rgb[i - 3];             // pixel repeat
                else if (r < 220 && i >= 3 * std::size_t(w)) img.rgb[i] = img.rgb[i - 3 * std::size_t(w)];  // row
                else img.rgb[i] = 255;                                               // runs
            }
            const Decoded d = decode(plot::encode_png(img, mode));
            CHECK(d.width == w);
            CHECK(d.height == h);
            CHECK(d.image.rgb == img.rgb);
        }
    }
}

TEST_CASE("plot: checksums match their definitions") {
    const std::string s = "123456789";
    const auto* p = reinterpret_cast<const std::uint8_t*>(s.data());
    CHECK(plot::detail::crc32(p, s.size()) == 0xCBF43926u);  // the CRC-32 check value
    CHECK(plot::detail::crc32(p, s.size()) == bitwise_crc32(p, s.size()));
    CHECK(plot::detail::crc32(p + 4, 5, plot::detail::crc32(p, 4)) == 0xCBF43926u);  // continued
    Bytes big(100000);
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = std::uint8_t(255 - i % 7);  // overflow-prone for Adler
    CHECK(plot::detail::adler32(big.data(), big.size()) == slow_adler32(big));
    CHECK(plot::detail::adler32(nullptr, 0) == 1u);
}

TEST_CASE("plot: a drawn line has its series colour and the background is white") {
    const plot::Rgb red{200, 20, 30}, teal{0, 128, 128};
    plot::Figure fig;
    fig.width = 400, fig.height = 300;
    fig.panels.push_back({.series = {{.x = {0, 10}, .y = {0, 10}, .color = red, .width = 3}},
                          .hlines = {{.y = 2, .color = teal, .width = 2, .dashed = true}},
                          .x_min = 0, .x_max = 10, .y_min = 0, .y_max = 10, .grid = false});
    const Decoded d = decode(plot::render_png(fig));
    const plot::PlotArea a = plot::layout(fig).at(0);
    CHECK(a.left > 0);
    CHECK(a.right < fig.width - 1);
    CHECK(a.top > 0);
    CHECK(a.bottom < fig.height - 1);
    CHECK(a.px(0) == doctest::Approx(a.left + 0.5));
    CHECK(a.py(10) == doctest::Approx(a.top + 0.5));

    for (double t : {2.5, 5.0, 7.5}) CHECK(at(d.image, a.px(t), a.py(t)) == red);
    CHECK(at(d.image, a.px(8), a.py(5)) == white);  // interior, away from everything
    CHECK(at(d.image, a.px(2), a.py(8)) == white);
    CHECK(d.image.pixel(0, 0) == white);             // figure corners
    CHECK(d.image.pixel(fig.width - 1, fig.height - 1) == white);
    CHECK(d.image.pixel(a.left, (a.top + a.bottom) / 2) == plot::Rgb{0, 0, 0});  // axis box

    // The dashed line at y = 2: both teal dashes and white gaps along its row (right of the red line).
    int dash = 0, gap = 0;
    const int row = int(std::floor(a.py(2)));
    for (int x = int(a.px(4)); x < a.right; ++x) {
        const plot::Rgb c = d.image.pixel(x, row);
        dash += c == teal, gap += c == white;
    }
    CHECK(dash > 20);
    CHECK(gap > 20);
}

TEST_CASE("plot: non-finite points break a line, empty and constant series are handled") {
    const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
    const plot::Rgb c{10, 90, 200};
    plot::Figure fig;
    fig.width = 600, fig.height = 300;
    fig.panels.push_back({.series = {{.x = {0, 1, 2, 3, 4, 5, 6}, .y = {1, 1, nan, 1, 1, inf, 1}, .color = c},
                                     {.label = "empty"},
                                     {.label = "all NaN", .y = {nan, nan}}},
                          .grid = false});
    fig.panels.push_back({.series = {{.y = {3, 3, 3, 3}}}});                         // constant
    fig.panels.push_back({.series = {{.y = {0, -1, 10, 100, 1000}}}, .log_y = true});  // non-positive skipped
    fig.panels.push_back({});                                                        // nothing at all
    plot::Image img;
    REQUIRE_NOTHROW(img = plot::render(fig));
    const auto areas = plot::layout(fig);
    REQUIRE(areas.size() == 4);

    const plot::PlotArea& a = areas[0];
    CHECK(a.y_lo < 1);
    CHECK(a.y_hi > 1);
    CHECK(at(img, a.px(0.5), a.py(1)) == c);
    CHECK(at(img, a.px(3.5), a.py(1)) == c);
    CHECK(at(img, a.px(2), a.py(1)) == white);  // the NaN at x = 2
    CHECK(at(img, a.px(5), a.py(1)) == white);  // the inf at x = 5

    const plot::PlotArea& k = areas[1];
    CHECK(std::isfinite(k.y_lo));
    CHECK(std::isfinite(k.y_hi));
    CHECK(k.y_lo < 3);
    CHECK(k.y_hi > 3);
    CHECK(k.y_ticks.size() >= 2);

    const plot::PlotArea& g = areas[2];
    CHECK(g.log_y);
    CHECK(g.y_lo > 0);
    CHECK(g.y_lo < 10);
    CHECK(g.y_hi > 1000);
    for (double t : {10.0, 100.0, 1000.0}) {
        bool found = false;
        for (double v : g.y_ticks) found = found || std::abs(v / t - 1) < 1e-12;
        CHECK_MESSAGE(found, "no major tick at ", t);
    }

    CHECK(areas[3].x_lo < areas[3].x_hi);
    CHECK(areas[3].y_lo < areas[3].y_hi);
}

TEST_CASE("plot: nice ticks and their labels") {
    using plot::detail::nice_ticks;
    const auto near = [](const std::vector<double>& got, const std::vector<double>& want) {
        if (got.size() != want.size()) return false;
        for (std::size_t i = 0; i < got.size(); ++i)
            if (std::abs(got[i] - want[i]) > 1e-12 * std::max(1.0, std::abs(want[i]))) return false;
        return true;
    };
    CHECK(near(nice_ticks(0, 1, 6), {0, 0.2, 0.4, 0.6, 0.8, 1.0}));
    CHECK(near(nice_ticks(0, 1, 11), {0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0}));
    CHECK(near(nice_ticks(-40, 2040, 5), {0, 500, 1000, 1500, 2000}));
    CHECK(near(nice_ticks(1.7, 11.3, 6), {2, 4, 6, 8, 10}));
    CHECK(near(nice_ticks(-3, 3, 4), {-2, 0, 2}));
    CHECK(nice_ticks(1, 1, 5).empty());
    for (double step_ok : {0.3, 7.0, 1234.5, 2e-7}) {  // every step is {1, 2, 5} x 10^k
        const auto t = nice_ticks(0, step_ok * 10, 7);
        REQUIRE(t.size() >= 2);
        CHECK(t.size() <= 7);
        const double step = t[1] - t[0], mant = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
        CHECK((std::abs(mant - 1) < 1e-9 || std::abs(mant - 2) < 1e-9 || std::abs(mant - 5) < 1e-9));
    }

    using plot::detail::linear_tick_labels;
    CHECK(linear_tick_labels({0, 0.5, 1}) == std::vector<std::string>{"0.0", "0.5", "1.0"});
    CHECK(linear_tick_labels({-2, 0, 2}) == std::vector<std::string>{"-2", "0", "2"});
    CHECK(linear_tick_labels({0, 500, 1000}) == std::vector<std::string>{"0", "500", "1000"});
    CHECK(linear_tick_labels({0, 2e6, 4e6}) == std::vector<std::string>{"0", "2e6", "4e6"});
    CHECK(linear_tick_labels({2.5e6, 5e6}) == std::vector<std::string>{"2.5e6", "5e6"});
    CHECK(linear_tick_labels({1e-5, 2e-5}) == std::vector<std::string>{"1e-5", "2e-5"});
    CHECK(linear_tick_labels({0, 0.25, 0.5}) == std::vector<std::string>{"0.00", "0.25", "0.50"});

    const auto lt = plot::detail::log_ticks(0.5, 2e5, 8);
    CHECK(near(lt.major, {1, 10, 100, 1000, 1e4, 1e5}));
    CHECK(lt.minor.size() > 20);
    CHECK(plot::detail::log_tick_labels(lt.major) ==
          std::vector<std::string>{"1", "10", "100", "1000", "10000", "100000"});
    CHECK(plot::detail::log_tick_labels({1e-6, 1e6}) == std::vector<std::string>{"1e-6", "1e6"});
    CHECK(near(plot::detail::log_ticks(15, 1600, 8).major, {20, 50, 100, 200, 500, 1000}));
}

TEST_CASE("plot: the font covers printable ASCII and a few symbols") {
    for (char32_t ch = 33; ch < 127; ++ch) {
        const std::uint8_t* g = plot::detail::glyph(ch);
        bool ink = false;
        for (int r = 0; r < plot::detail::glyph_h; ++r) ink = ink || g[r] != 0;
        CHECK_MESSAGE(ink, "glyph ", int(ch), " is blank");
    }
    CHECK(plot::detail::glyph(U'τ') != plot::detail::glyph(U'?'));
    CHECK(plot::detail::glyph(U'\u4E00') == plot::detail::glyph(U'?'));  // unknown: drawn as '?'
    CHECK(plot::detail::text_width("", 2) == 0);
    CHECK(plot::detail::text_width("ab", 1) == 11);
    CHECK(plot::detail::text_width("τ = 1", 3) == plot::detail::text_width("t = 1", 3));  // UTF-8 decoded

    plot::Image img(60, 20);
    plot::detail::draw_text(img, 2, 2, "Ab", {0, 0, 0}, 2);
    int dark = 0;
    for (int y = 0; y < img.height; ++y)
        for (int x = 0; x < img.width; ++x) dark += img.pixel(x, y) == plot::Rgb{0, 0, 0};
    CHECK(dark > 40);
    CHECK(img.pixel(2 + 12 * 2 + 2, 2) == white);  // beyond the text
}

TEST_CASE("plot: bad input is reported") {
    plot::Figure fig;
    fig.panels.push_back({.series = {{.label = "bad", .x = {1, 2, 3}, .y = {1, 2}}}});
    CHECK_THROWS_AS(plot::render(fig), std::invalid_argument);
    fig.panels[0].series[0].x.clear();
    CHECK_NOTHROW(plot::render(fig));

    fig.panels[0].y_min = 5, fig.panels[0].y_max = 1;
    CHECK_THROWS_AS(plot::render(fig), std::invalid_argument);
    fig.panels[0].y_min.reset(), fig.panels[0].y_max.reset();
    fig.panels[0].log_y = true, fig.panels[0].y_min = 0.0;
    CHECK_THROWS_AS(plot::render(fig), std::invalid_argument);
    fig.panels[0].log_y = false;

    fig.width = 10;
    CHECK_THROWS_AS(plot::render(fig), std::invalid_argument);
    fig.width = 300;

    const std::string path = "/nonexistent-moonmoe-dir/sub/plot.png";
    try {
        plot::write_png(path, fig);
        FAIL("write_png to a missing directory did not throw");
    } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()).find(path) != std::string::npos);
    }
}

TEST_CASE("plot: sample figure (Muon vs MuonClip, synthetic)") {
    std::vector<double> steps, loss_muon, loss_clip, logit_muon, logit_clip;
    std::uint32_t state = 7;
    const auto noise = [&] {  // roughly uniform in [-1, 1)
        state = state * 1664525u + 1013904223u;
        return double(state >> 8) / double(1u << 23) - 1;
    };
    for (int i = 0; i <= 2000; i += 10) {
        const double s = i;
        const double base = 2.2 + 8.0 * std::exp(-s / 150) + 0.6 * std::exp(-s / 1200);
        steps.push_back(s);
        loss_muon.push_back(base + 0.08 * noise() + (s > 900 && s < 960 ? 0.8 : 0));  // a spike
        loss_clip.push_back(base - 0.02 + 0.08 * noise());
        logit_muon.push_back((20 + 1500 * (1 - std::exp(-s / 500))) * (1 + 0.05 * noise()));
        logit_clip.push_back(std::min(100.0, 20 + 300 * (1 - std::exp(-s / 300))) *
                             (s > 1200 ? std::exp(-(s - 1200) / 2000) : 1.0) * (1 + 0.02 * noise()));
    }
    plot::Figure fig;
    fig.title = "Muon vs MuonClip (synthetic data)";
    fig.panels.push_back({.title = "Training loss", .x_label = "step", .y_label = "loss",
                          .series = {{.label = "Muon", .x = steps, .y = loss_muon, .color = plot::colors::blue},
                                     {.label = "MuonClip", .x = steps, .y = loss_clip, .color = plot::colors::orange}}});
    fig.panels.push_back({.title = "Max attention logit", .x_label = "step", .y_label = "max logit",
                          .series = {{.label = "Muon", .x = steps, .y = logit_muon, .color = plot::colors::blue},
                                     {.label = "MuonClip", .x = steps, .y = logit_clip, .color = plot::colors::orange}},
                          .hlines = {{.y = 100, .label = "QK-Clip τ = 100", .color = plot::colors::red}},
                          .log_y = true});

    const std::string path = MOONMOE_TEST_BINARY_DIR "/plot_sample.png";
    plot::write_png(path, fig);
    std::ifstream f(path, std::ios::binary);
    REQUIRE(f);
    const Bytes written((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    CHECK(written == plot::render_png(fig));
    const Decoded d = decode(written);
    CHECK(d.width == 1200);
    CHECK(d.height == 500);
    MESSAGE("wrote ", path);
}

}  // namespace unit_plot_png

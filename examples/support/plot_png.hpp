// A small, dependency-free PNG line-plot writer for the training examples: loss curves and max-attention-logit
// curves side by side, in the spirit of Figure 2 of the Kimi K2 report (Muon vs MuonClip, with the QK-Clip
// threshold tau drawn as a dashed reference line).
//
//   namespace plot = moonmoe::plot;
//   plot::Figure fig;
//   fig.panels.push_back({.title = "Training loss", .x_label = "step", .y_label = "loss",
//                         .series = {{.label = "Muon", .x = steps, .y = loss_muon, .color = plot::colors::blue},
//                                    {.label = "MuonClip", .x = steps, .y = loss_clip, .color = plot::colors::orange}}});
//   fig.panels.push_back({.title = "Max attention logit", .x_label = "step", .y_label = "max logit",
//                         .series = {...}, .hlines = {{.y = 100, .label = "tau = 100"}}, .log_y = true});
//   plot::write_png("curves.png", fig);
//
// Everything is standard C++20: the PNG is 8-bit RGB, one IDAT chunk holding a zlib stream with one fixed-Huffman
// deflate block (greedy LZ77 with a hash chain; a 1200x500 figure's 1.8 MB of scanlines become ~50 KB) or, on
// request, stored blocks of at most 65535 bytes. Lines are anti-aliased strokes with round joins; text uses a built-in 5x7 bitmap font (ASCII 32-126 plus
// a few Greek letters and math signs, decoded from UTF-8) scaled by an integer factor.
//
// Non-finite points (and non-positive ones on a log axis) break a series' line; empty series are skipped; a
// constant series or a single point still gets a sensible range.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
    std::string label{};           // legend text; empty: not in the legend
    std::vector<double> x{}, y{};
    std::optional<Rgb> color{};    // unset: colors::cycle[index of the series in its panel % 10]
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
    bool grid = true;                                  // light grid lines at the major ticks
    LegendPlacement legend = LegendPlacement::best;    // best: the corner covering the fewest data points
};

/// Panels are laid out side by side, left to right, in equal-width cells.
struct Figure {
    int width = 1200, height = 500;   // pixels, each in [64, 16384]
    std::string title{};              // optional, centred above all panels
    std::vector<Panel> panels{};
    int text_scale = 0;               // font pixel size; 0: chosen from the panel size (2 for 600x500 cells)
    bool antialias = true;
};

/// An 8-bit RGB raster, row-major, top row first.
struct Image {
    int width = 0, height = 0;
    std::vector<std::uint8_t> rgb;    // width * height * 3 bytes

    Image() = default;
    Image(int w, int h, Rgb fill = colors::white) : width(w), height(h), rgb(std::size_t(w) * std::size_t(h) * 3) {
        for (std::size_t i = 0; i < rgb.size(); i += 3) std::copy(fill.begin(), fill.end(), rgb.begin() + std::ptrdiff_t(i));
    }
    bool contains(int x, int y) const { return x >= 0 && y >= 0 && x < width && y < height; }
    Rgb pixel(int x, int y) const {
        const std::size_t i = (std::size_t(y) * std::size_t(width) + std::size_t(x)) * 3;
        return {rgb[i], rgb[i + 1], rgb[i + 2]};
    }
    void set(int x, int y, Rgb c) {  // ignores pixels outside the image
        if (!contains(x, y)) return;
        const std::size_t i = (std::size_t(y) * std::size_t(width) + std::size_t(x)) * 3;
        rgb[i] = c[0], rgb[i + 1] = c[1], rgb[i + 2] = c[2];
    }
    void blend(int x, int y, Rgb c, double alpha) {  // alpha in [0, 1]; alpha 1 writes c exactly
        if (!contains(x, y) || !(alpha > 0)) return;
        if (alpha >= 1) return set(x, y, c);
        const std::size_t i = (std::size_t(y) * std::size_t(width) + std::size_t(x)) * 3;
        for (int k = 0; k < 3; ++k)
            rgb[i + std::size_t(k)] =
                std::uint8_t(std::lround(rgb[i + std::size_t(k)] * (1 - alpha) + c[std::size_t(k)] * alpha));
    }
};

/// Where a panel's data went. left, top, right, bottom are the pixel columns and rows of the axis box's lines; the
/// interior is the pixels left < i < right, top < j < bottom. Data map to continuous pixel coordinates, in which
/// pixel (i, j) covers [i, i+1) x [j, j+1): the axis limits land on the centres of the box lines (x_lo -> left + 0.5,
/// x_hi -> right + 0.5, y_lo -> bottom + 0.5, y_hi -> top + 0.5), so data point (x, y) is drawn around pixel
/// (floor(px(x)), floor(py(y))).
struct PlotArea {
    int left = 0, top = 0, right = 0, bottom = 0;
    double x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
    bool log_y = false;
    std::vector<double> x_ticks, y_ticks;   // major ticks, in data units

    double px(double x) const { return left + 0.5 + (x - x_lo) / (x_hi - x_lo) * (right - left); }
    double py(double y) const {
        const double t = log_y ? (std::log10(y) - std::log10(y_lo)) / (std::log10(y_hi) - std::log10(y_lo))
                               : (y - y_lo) / (y_hi - y_lo);
        return bottom + 0.5 - t * (bottom - top);
    }
};

enum class Compression { fixed_huffman, stored };

// ----------------------------------------------------------------------------------------------------------------
// Implementation details (usable, but not a stable interface).
// ----------------------------------------------------------------------------------------------------------------
namespace detail {

// --- checksums --------------------------------------------------------------------------------------------------

inline constexpr std::array<std::uint32_t, 256> crc32_table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t n = 0; n < 256; ++n) {
        std::uint32_t c = n;
        for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        t[n] = c;
    }
    return t;
}();

/// CRC-32 (ISO 3309 / PNG / zlib), continuing from `crc` (0 to start).
inline std::uint32_t crc32(const std::uint8_t* p, std::size_t n, std::uint32_t crc = 0) {
    crc = ~crc;
    for (std::size_t i = 0; i < n; ++i) crc = crc32_table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

/// Adler-32 (RFC 1950).
inline std::uint32_t adler32(const std::uint8_t* p, std::size_t n) {
    constexpr std::uint32_t mod = 65521;
    std::uint32_t a = 1, b = 0;
    while (n > 0) {
        const std::size_t k = std::min<std::size_t>(n, 5552);  // largest block with no 32-bit overflow
        for (std::size_t i = 0; i < k; ++i) a += p[i], b += a;
        a %= mod, b %= mod, p += k, n -= k;
    }
    return (b << 16) | a;
}

// --- deflate (RFC 1951) -----------------------------------------------------------------------------------------

class BitWriter {
public:
    explicit BitWriter(std::vector<std::uint8_t>& out) : out_(out) {}
    void bits(std::uint32_t value, int count) {  // LSB first
        acc_ |= std::uint64_t(value) << n_;
        n_ += count;
        while (n_ >= 8) out_.push_back(std::uint8_t(acc_ & 0xFF)), acc_ >>= 8, n_ -= 8;
    }
    void huffman(std::uint32_t code, int length) {  // Huffman codes go out most significant bit first
        std::uint32_t r = 0;
        for (int i = 0; i < length; ++i) r = (r << 1) | ((code >> i) & 1);
        bits(r, length);
    }
    void flush() {
        if (n_ > 0) out_.push_back(std::uint8_t(acc_ & 0xFF));
        acc_ = 0, n_ = 0;
    }

private:
    std::vector<std::uint8_t>& out_;
    std::uint64_t acc_ = 0;
    int n_ = 0;
};

inline constexpr std::array<std::uint16_t, 29> length_base{3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                                           31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
inline constexpr std::array<std::uint8_t, 29> length_extra{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                                           2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
inline constexpr std::array<std::uint16_t, 30> dist_base{1,   2,   3,   4,   5,   7,    9,    13,   17,   25,
                                                         33,  49,  65,  97,  129, 193,  257,  385,  513,  769,
                                                         1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
inline constexpr std::array<std::uint8_t, 30> dist_extra{0, 0, 0, 0, 1, 1, 2, 2,  3,  3,  4,  4,  5,  5,  6,
                                                         6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

inline void put_fixed_litlen(BitWriter& w, unsigned sym) {  // RFC 1951 3.2.6
    if (sym <= 143) w.huffman(0x30 + sym, 8);
    else if (sym <= 255) w.huffman(0x190 + (sym - 144), 9);
    else if (sym <= 279) w.huffman(sym - 256, 7);
    else w.huffman(0xC0 + (sym - 280), 8);
}

inline void put_match(BitWriter& w, unsigned length, unsigned distance) {
    unsigned l = 28;
    while (length_base[l] > length) --l;
    put_fixed_litlen(w, 257 + l);
    if (length_extra[l]) w.bits(length - length_base[l], length_extra[l]);
    unsigned d = 29;
    while (dist_base[d] > distance) --d;
    w.huffman(d, 5);
    if (dist_extra[d]) w.bits(distance - dist_base[d], dist_extra[d]);
}

/// One final fixed-Huffman block; matches found by greedy LZ77 over a 32 KiB window with a bounded hash chain.
inline void deflate_fixed(const std::vector<std::uint8_t>& in, std::vector<std::uint8_t>& out) {
    constexpr int hash_bits = 15, max_chain = 48;
    constexpr std::size_t window = 32768, max_len = 258, min_len = 3;
    BitWriter w(out);
    w.bits(1, 1);  // BFINAL
    w.bits(1, 2);  // BTYPE 01: fixed Huffman codes
    const std::size_t n = in.size();
    std::vector<std::int64_t> head(std::size_t(1) << hash_bits, -1), prev(window, -1);
    const auto hash = [&](std::size_t i) {
        const std::uint32_t v = std::uint32_t(in[i]) | std::uint32_t(in[i + 1]) << 8 | std::uint32_t(in[i + 2]) << 16;
        return (v * 2654435761u) >> (32 - hash_bits);
    };
    const auto insert = [&](std::size_t i) {
        if (i + min_len > n) return;
        const auto h = hash(i);
        prev[i % window] = head[h];
        head[h] = std::int64_t(i);
    };
    std::size_t i = 0;
    while (i < n) {
        std::size_t best_len = 0, best_dist = 0;
        if (i + min_len <= n) {
            const std::size_t limit = std::min(max_len, n - i);
            std::int64_t cand = head[hash(i)];
            // A chain entry is still valid while it lies within the window: the slot of position c is only
            // overwritten by position c + window, which is inserted after the window has passed c.
            for (int chain = 0; cand >= 0 && i - std::size_t(cand) <= window && chain < max_chain; ++chain) {
                const std::size_t c = std::size_t(cand);
                std::size_t len = 0;
                while (len < limit && in[c + len] == in[i + len]) ++len;
                if (len > best_len) best_len = len, best_dist = i - c;
                if (len == limit) break;
                cand = prev[c % window];
            }
        }
        if (best_len >= min_len) {
            put_match(w, unsigned(best_len), unsigned(best_dist));
            for (std::size_t k = 0; k < best_len; ++k) insert(i + k);
            i += best_len;
        } else {
            put_fixed_litlen(w, in[i]);
            insert(i);
            ++i;
        }
    }
    put_fixed_litlen(w, 256);  // end of block
    w.flush();
}

/// Stored (uncompressed) blocks of at most 65535 bytes; the last one is final.
inline void deflate_stored(const std::vector<std::uint8_t>& in, std::vector<std::uint8_t>& out) {
    std::size_t pos = 0;
    do {
        const std::size_t len = std::min<std::size_t>(in.size() - pos, 65535);
        const bool last = pos + len == in.size();
        out.push_back(last ? 1 : 0);  // BFINAL, BTYPE 00, then padding to the byte boundary
        out.push_back(std::uint8_t(len & 0xFF)), out.push_back(std::uint8_t(len >> 8));
        out.push_back(std::uint8_t(~len & 0xFF)), out.push_back(std::uint8_t((~len >> 8) & 0xFF));
        out.insert(out.end(), in.begin() + std::ptrdiff_t(pos), in.begin() + std::ptrdiff_t(pos + len));
        pos += len;
    } while (pos < in.size());
}

/// A zlib stream (RFC 1950): header, deflate data, Adler-32 of the uncompressed data.
inline std::vector<std::uint8_t> zlib_compress(const std::vector<std::uint8_t>& in, Compression mode) {
    std::vector<std::uint8_t> out{0x78, 0x01};  // deflate, 32 KiB window, no dictionary; 0x7801 % 31 == 0
    if (mode == Compression::stored) deflate_stored(in, out);
    else deflate_fixed(in, out);
    const std::uint32_t a = adler32(in.data(), in.size());
    for (int s = 24; s >= 0; s -= 8) out.push_back(std::uint8_t(a >> s));
    return out;
}

inline void put_be32(std::vector<std::uint8_t>& out, std::uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(std::uint8_t(v >> s));
}

inline void put_chunk(std::vector<std::uint8_t>& out, const char (&type)[5], const std::vector<std::uint8_t>& data) {
    put_be32(out, std::uint32_t(data.size()));
    const std::size_t start = out.size();
    out.insert(out.end(), type, type + 4);
    out.insert(out.end(), data.begin(), data.end());
    put_be32(out, crc32(out.data() + start, out.size() - start));  // over type and data
}

// --- font -------------------------------------------------------------------------------------------------------

// 5x7 glyphs in a 5x9 cell: rows 0-6 sit on the baseline, rows 7-8 hold descenders. Bit 4 is the leftmost column.
inline constexpr int glyph_w = 5, glyph_h = 9, cap_h = 7, advance = 6;

inline constexpr std::uint8_t ascii_glyphs[95][glyph_h] = {
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},  // ' '
    {0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x04, 0x00, 0x00},  // '!'
    {0x0A, 0x0A, 0x0A, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},  // '"'
    {0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A, 0x00, 0x00},  // '#'
    {0x04, 0x0F, 0x14, 0x0E, 0x05, 0x1E, 0x04, 0x00, 0x00},  // '$'
    {0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03, 0x00, 0x00},  // '%'
    {0x0C, 0x12, 0x14, 0x08, 0x15, 0x12, 0x0D, 0x00, 0x00},  // '&'
    {0x04, 0x04, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},  // '''
    {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02, 0x00, 0x00},  // '('
    {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08, 0x00, 0x00},  // ')'
    {0x00, 0x04, 0x15, 0x0E, 0x15, 0x04, 0x00, 0x00, 0x00},  // '*'
    {0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00, 0x00, 0x00},  // '+'
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C, 0x04, 0x08},  // ','
    {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00, 0x00, 0x00},  // '-'
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C, 0x00, 0x00},  // '.'
    {0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00, 0x00, 0x00},  // '/'
    {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E, 0x00, 0x00},  // '0'
    {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E, 0x00, 0x00},  // '1'
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F, 0x00, 0x00},  // '2'
    {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E, 0x00, 0x00},  // '3'
    {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02, 0x00, 0x00},  // '4'
    {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E, 0x00, 0x00},  // '5'
    {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E, 0x00, 0x00},  // '6'
    {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08, 0x00, 0x00},  // '7'
    {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E, 0x00, 0x00},  // '8'
    {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C, 0x00, 0x00},  // '9'
    {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00, 0x00, 0x00},  // ':'
    {0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x04, 0x08, 0x00},  // ';'
    {0x02, 0x04, 0x08, 0x10, 0x08, 0x04, 0x02, 0x00, 0x00},  // '<'
    {0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00, 0x00, 0x00},  // '='
    {0x08, 0x04, 0x02, 0x01, 0x02, 0x04, 0x08, 0x00, 0x00},  // '>'
    {0x0E, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04, 0x00, 0x00},  // '?'
    {0x0E, 0x11, 0x01, 0x0D, 0x15, 0x15, 0x0E, 0x00, 0x00},  // '@'
    {0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11, 0x00, 0x00},  // 'A'
    {0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E, 0x00, 0x00},  // 'B'
    {0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E, 0x00, 0x00},  // 'C'
    {0x1E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1E, 0x00, 0x00},  // 'D'
    {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F, 0x00, 0x00},  // 'E'
    {0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10, 0x00, 0x00},  // 'F'
    {0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F, 0x00, 0x00},  // 'G'
    {0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11, 0x00, 0x00},  // 'H'
    {0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E, 0x00, 0x00},  // 'I'
    {0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C, 0x00, 0x00},  // 'J'
    {0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11, 0x00, 0x00},  // 'K'
    {0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F, 0x00, 0x00},  // 'L'
    {0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11, 0x00, 0x00},  // 'M'
    {0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11, 0x00, 0x00},  // 'N'
    {0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E, 0x00, 0x00},  // 'O'
    {0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10, 0x00, 0x00},  // 'P'
    {0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D, 0x00, 0x00},  // 'Q'
    {0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11, 0x00, 0x00},  // 'R'
    {0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E, 0x00, 0x00},  // 'S'
    {0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x00},  // 'T'
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E, 0x00, 0x00},  // 'U'
    {0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04, 0x00, 0x00},  // 'V'
    {0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A, 0x00, 0x00},  // 'W'
    {0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11, 0x00, 0x00},  // 'X'
    {0x11, 0x11, 0x0A, 0x04, 0x04, 0x04, 0x04, 0x00, 0x00},  // 'Y'
    {0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F, 0x00, 0x00},  // 'Z'
    {0x0E, 0x08, 0x08, 0x08, 0x08, 0x08, 0x0E, 0x00, 0x00},  // '['
    {0x00, 0x10, 0x08, 0x04, 0x02, 0x01, 0x00, 0x00, 0x00},  // backslash
    {0x0E, 0x02, 0x02, 0x02, 0x02, 0x02, 0x0E, 0x00, 0x00},  // ']'
    {0x04, 0x0A, 0x11, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},  // '^'
    {0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F, 0x00},  // '_'
    {0x08, 0x04, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00},  // '`'
    {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F, 0x00, 0x00},  // 'a'
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E, 0x00, 0x00},  // 'b'
    {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E, 0x00, 0x00},  // 'c'
    {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F, 0x00, 0x00},  // 'd'
    {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E, 0x00, 0x00},  // 'e'
    {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08, 0x00, 0x00},  // 'f'
    {0x00, 0x00, 0x0F, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x0E},  // 'g'
    {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11, 0x00, 0x00},  // 'h'
    {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E, 0x00, 0x00},  // 'i'
    {0x02, 0x00, 0x06, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C},  // 'j'
    {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12, 0x00, 0x00},  // 'k'
    {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E, 0x00, 0x00},  // 'l'
    {0x00, 0x00, 0x1A, 0x15, 0x15, 0x15, 0x15, 0x00, 0x00},  // 'm'
    {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11, 0x00, 0x00},  // 'n'
    {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E, 0x00, 0x00},  // 'o'
    {0x00, 0x00, 0x1E, 0x11, 0x11, 0x11, 0x1E, 0x10, 0x10},  // 'p'
    {0x00, 0x00, 0x0F, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x01},  // 'q'
    {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10, 0x00, 0x00},  // 'r'
    {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E, 0x00, 0x00},  // 's'
    {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06, 0x00, 0x00},  // 't'
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D, 0x00, 0x00},  // 'u'
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04, 0x00, 0x00},  // 'v'
    {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A, 0x00, 0x00},  // 'w'
    {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x00, 0x00},  // 'x'
    {0x00, 0x00, 0x11, 0x11, 0x11, 0x11, 0x0F, 0x01, 0x0E},  // 'y'
    {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F, 0x00, 0x00},  // 'z'
    {0x02, 0x04, 0x04, 0x08, 0x04, 0x04, 0x02, 0x00, 0x00},  // '{'
    {0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x00},  // '|'
    {0x08, 0x04, 0x04, 0x02, 0x04, 0x04, 0x08, 0x00, 0x00},  // '}'
    {0x00, 0x00, 0x08, 0x15, 0x02, 0x00, 0x00, 0x00, 0x00},  // '~'
};

struct ExtraGlyph {
    char32_t code;
    std::uint8_t rows[glyph_h];
};
inline constexpr ExtraGlyph extra_glyphs[] = {
    {0x03B1, {0x00, 0x00, 0x0D, 0x12, 0x12, 0x12, 0x0D, 0x00, 0x00}},  // alpha
    {0x03B2, {0x0E, 0x11, 0x1E, 0x11, 0x11, 0x11, 0x1E, 0x10, 0x10}},  // beta
    {0x03B7, {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11, 0x01, 0x01}},  // eta
    {0x03BB, {0x10, 0x08, 0x08, 0x04, 0x0A, 0x11, 0x11, 0x00, 0x00}},  // lambda
    {0x03BC, {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x1D, 0x10, 0x10}},  // mu
    {0x03C3, {0x00, 0x00, 0x0F, 0x12, 0x11, 0x11, 0x0E, 0x00, 0x00}},  // sigma
    {0x03C4, {0x00, 0x00, 0x1F, 0x04, 0x04, 0x04, 0x03, 0x00, 0x00}},  // tau
    {0x00B7, {0x00, 0x00, 0x00, 0x0C, 0x0C, 0x00, 0x00, 0x00, 0x00}},  // middle dot
    {0x00D7, {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x00, 0x00}},  // multiplication sign
    {0x2212, {0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00, 0x00, 0x00}},  // minus sign
    {0x2264, {0x03, 0x0C, 0x10, 0x0C, 0x03, 0x00, 0x1F, 0x00, 0x00}},  // less-than or equal
    {0x2265, {0x18, 0x06, 0x01, 0x06, 0x18, 0x00, 0x1F, 0x00, 0x00}},  // greater-than or equal
};

/// The glyph rows for a code point; '?' for one the font lacks.
inline const std::uint8_t* glyph(char32_t c) {
    if (c >= 32 && c <= 126) return ascii_glyphs[c - 32];
    for (const auto& g : extra_glyphs)
        if (g.code == c) return g.rows;
    return ascii_glyphs['?' - 32];
}

/// UTF-8 to code points; a malformed byte becomes U+FFFD (drawn as '?').
inline std::u32string decode_utf8(std::string_view s) {
    std::u32string out;
    for (std::size_t i = 0; i < s.size();) {
        const auto b = static_cast<unsigned char>(s[i]);
        const int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        char32_t c = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
        bool ok = n > 0 && i + std::size_t(n) <= s.size();
        for (int k = 1; ok && k < n; ++k) {
            const auto t = static_cast<unsigned char>(s[i + std::size_t(k)]);
            ok = (t >> 6) == 2;
            c = (c << 6) | (t & 0x3F);
        }
        out.push_back(ok ? c : U'\uFFFD');
        i += ok ? std::size_t(n) : 1;
    }
    return out;
}

/// Width in pixels of a line of text at `scale` (no trailing gap).
inline int text_width(std::string_view s, int scale) {
    const auto n = int(decode_utf8(s).size());
    return n == 0 ? 0 : (n * advance - 1) * scale;
}

enum class Orient { horizontal, up };  // up: rotated 90 degrees counter-clockwise, read bottom to top

/// Draws `s` with the top-left corner of its (possibly rotated) 9-row box at (x, y).
inline void draw_text(Image& img, int x, int y, std::string_view s, Rgb color, int scale,
                      Orient orient = Orient::horizontal, bool bold = false) {
    const std::u32string cps = decode_utf8(s);
    const int total_w = cps.empty() ? 0 : (int(cps.size()) * advance - 1) * scale;
    for (std::size_t k = 0; k < cps.size(); ++k) {
        const std::uint8_t* rows = glyph(cps[k]);
        for (int r = 0; r < glyph_h; ++r)
            for (int col = 0; col < glyph_w; ++col) {
                if (!((rows[r] >> (glyph_w - 1 - col)) & 1)) continue;
                const int u = (int(k) * advance + col) * scale, v = r * scale;  // along, down the text
                for (int a = 0; a < scale + (bold ? 1 : 0); ++a)
                    for (int b = 0; b < scale; ++b) {
                        if (orient == Orient::horizontal) img.set(x + u + a, y + v + b, color);
                        else img.set(x + v + b, y + total_w - 1 - (u + a), color);
                    }
            }
    }
}

// --- strokes ----------------------------------------------------------------------------------------------------

struct Rect {  // pixels x0 <= i < x1, y0 <= j < y1
    int x0, y0, x1, y1;
};

/// Accumulates the coverage of one stroke (the max over its segments, so joins are not drawn twice), then
/// composites it onto the image in one colour.
class StrokeLayer {
public:
    StrokeLayer(int w, int h) : w_(w), h_(h), cov_(std::size_t(w) * std::size_t(h), 0.0f) {}

    /// The segment (ax, ay)-(bx, by) in continuous pixel coordinates, round-capped, clipped to `clip`. For a dashed
    /// stroke, `phase` is the arc length at a (in pixels) and the dash pattern is on for [0, dash) of every period.
    void segment(double ax, double ay, double bx, double by, double width, bool antialias, Rect clip, bool dashed,
                 double phase) {
        clip = {std::max(clip.x0, 0), std::max(clip.y0, 0), std::min(clip.x1, w_), std::min(clip.y1, h_)};
        if (clip.x0 >= clip.x1 || clip.y0 >= clip.y1) return;
        const double hw = width / 2, reach = hw + 1;
        // Liang-Barsky clip to the clip rectangle grown by the stroke's reach, so that far-away points stay cheap.
        double t0 = 0, t1 = 1;
        const double dx = bx - ax, dy = by - ay;
        const double p[4] = {-dx, dx, -dy, dy};
        const double q[4] = {ax - (clip.x0 - reach), (clip.x1 + reach) - ax, ay - (clip.y0 - reach),
                             (clip.y1 + reach) - ay};
        for (int k = 0; k < 4; ++k) {
            if (p[k] == 0) {
                if (q[k] < 0) return;
                continue;
            }
            const double r = q[k] / p[k];
            if (p[k] < 0) t0 = std::max(t0, r);
            else t1 = std::min(t1, r);
        }
        if (t0 > t1) return;
        const double len = std::hypot(dx, dy);
        const double sx = ax + t0 * dx, sy = ay + t0 * dy, ex = ax + t1 * dx, ey = ay + t1 * dy;
        const double seg_phase = phase + t0 * len, seg_len = (t1 - t0) * len;
        const double ux = seg_len > 0 ? (ex - sx) / seg_len : 0, uy = seg_len > 0 ? (ey - sy) / seg_len : 0;
        const int i0 = std::max(clip.x0, int(std::floor(std::min(sx, ex) - reach)));
        const int i1 = std::min(clip.x1 - 1, int(std::ceil(std::max(sx, ex) + reach)));
        const int j0 = std::max(clip.y0, int(std::floor(std::min(sy, ey) - reach)));
        const int j1 = std::min(clip.y1 - 1, int(std::ceil(std::max(sy, ey) + reach)));
        const double dash = 4 * width + 4, period = dash + 3 * width + 3;
        for (int j = j0; j <= j1; ++j)
            for (int i = i0; i <= i1; ++i) {
                const double cx = i + 0.5 - sx, cy = j + 0.5 - sy;
                const double along = std::clamp(cx * ux + cy * uy, 0.0, seg_len);
                const double ox = cx - along * ux, oy = cy - along * uy, d = std::sqrt(ox * ox + oy * oy);
                double c = antialias ? std::clamp(hw + 0.5 - d, 0.0, 1.0) : (d <= std::max(hw, 0.5) ? 1.0 : 0.0);
                if (c <= 0) continue;
                if (dashed && std::fmod(seg_phase + along, period) >= dash) continue;
                float& slot = cov_[std::size_t(j) * std::size_t(w_) + std::size_t(i)];
                slot = std::max(slot, float(c));
                touched_.x0 = std::min(touched_.x0, i), touched_.x1 = std::max(touched_.x1, i + 1);
                touched_.y0 = std::min(touched_.y0, j), touched_.y1 = std::max(touched_.y1, j + 1);
            }
    }

    void composite(Image& img, Rgb color) {
        for (int j = touched_.y0; j < touched_.y1; ++j)
            for (int i = touched_.x0; i < touched_.x1; ++i) {
                float& slot = cov_[std::size_t(j) * std::size_t(w_) + std::size_t(i)];
                if (slot > 0) img.blend(i, j, color, slot), slot = 0;
            }
        touched_ = {w_, h_, 0, 0};
    }

private:
    int w_, h_;
    std::vector<float> cov_;
    Rect touched_{w_, h_, 0, 0};
};

/// Strokes a polyline given in pixel coordinates; non-finite points break it.
inline void stroke_polyline(StrokeLayer& layer, const std::vector<std::pair<double, double>>& pts, double width,
                            bool antialias, const Rect& clip, bool dashed) {
    double phase = 0;
    bool have_prev = false;
    std::pair<double, double> prev{};
    for (const auto& p : pts) {
        if (!std::isfinite(p.first) || !std::isfinite(p.second)) {
            have_prev = false, phase = 0;
            continue;
        }
        if (have_prev) {
            layer.segment(prev.first, prev.second, p.first, p.second, width, antialias, clip, dashed, phase);
            const double len = std::hypot(p.first - prev.first, p.second - prev.second);
            if (std::isfinite(len)) phase += len;
        } else {
            // A lone point (between gaps) is drawn as a dot.
            layer.segment(p.first, p.second, p.first, p.second, width, antialias, clip, false, 0);
        }
        prev = p, have_prev = true;
    }
}

// --- ticks and their labels -------------------------------------------------------------------------------------

/// `v` printed with %.*g, the exponent tidied ("1e+06" -> "1e6", "2.50e-05" -> "2.5e-5").
inline std::string format_g(double v, int precision) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    std::string s = buf;
    const auto e = s.find('e');
    if (e == std::string::npos) return s;
    std::string mant = s.substr(0, e);
    if (mant.find('.') != std::string::npos) {
        while (mant.back() == '0') mant.pop_back();
        if (mant.back() == '.') mant.pop_back();
    }
    return mant + "e" + std::to_string(std::stoi(s.substr(e + 1)));
}

/// Ticks k * step inside [lo, hi] (a relative tolerance of 1e-9 admits the ends), with step the smallest of
/// {1, 2, 5} x 10^e giving at most max_count (>= 2) ticks. Empty unless lo < hi, both finite.
inline std::vector<double> nice_ticks(double lo, double hi, int max_count) {
    std::vector<double> out;
    if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return out;
    max_count = std::max(max_count, 2);
    const auto count = [&](double step) {
        return std::floor(hi / step + 1e-9) - std::ceil(lo / step - 1e-9) + 1;
    };
    double step = 0;
    for (double e = std::floor(std::log10((hi - lo) / max_count)); step == 0; e += 1)
        for (double m : {1.0, 2.0, 5.0})
            if (count(m * std::pow(10.0, e)) <= max_count) {
                step = m * std::pow(10.0, e);
                break;
            }
    for (double k = std::ceil(lo / step - 1e-9), last = std::floor(hi / step + 1e-9); k <= last; k += 1)
        out.push_back(std::abs(k) < 0.5 ? 0.0 : k * step);
    return out;
}

/// Labels for evenly spaced linear ticks: fixed decimals from the spacing ("0.0", "0.5", "1.0"), or, for very large or
/// very fine ticks, %g with as few digits as identify each tick ("2e6", "2.5e-5").
inline std::vector<std::string> linear_tick_labels(const std::vector<double>& ticks) {
    std::vector<std::string> out;
    if (ticks.empty()) return out;
    if (ticks.size() == 1) return {format_g(ticks[0], 6)};
    const double step = std::abs(ticks[1] - ticks[0]);
    const int step_exp = int(std::floor(std::log10(step) + 1e-9));
    double max_abs = 0;
    for (double t : ticks) max_abs = std::max(max_abs, std::abs(t));
    const bool scientific = max_abs >= 1e6 || step_exp <= -5;
    int decimals = std::max(0, -step_exp);  // more if the spacing is not {1, 2, 5} x 10^k, e.g. 0.25
    while (decimals < 10 && std::abs(step * std::pow(10.0, decimals) - std::round(step * std::pow(10.0, decimals))) >
                                1e-6 * step * std::pow(10.0, decimals))
        ++decimals;
    for (double t : ticks) {
        char buf[64];
        if (scientific && t == 0) {
            out.push_back("0");
        } else if (scientific) {
            // The fewest significant digits that pin the tick down to a millionth of the spacing.
            int precision = 1;
            while (precision < 15 && std::abs(std::stod(format_g(t, precision)) - t) > 1e-6 * step) ++precision;
            out.push_back(format_g(t, precision));
        } else {
            std::snprintf(buf, sizeof buf, "%.*f", decimals, t);
            out.push_back(buf);
        }
    }
    return out;
}

struct LogTicks {
    std::vector<double> major, minor;
};

/// Ticks for a log axis on [lo, hi] (0 < lo < hi). Within less than three decades, {1, 2, 5} x 10^k (the other
/// multiples as minor ticks) when that gives 2..max_count ticks; otherwise powers of ten (every k-th when there are
/// many decades; 2..9 x 10^k, or the skipped powers, as minor ticks); failing both, linear nice ticks.
inline LogTicks log_ticks(double lo, double hi, int max_count) {
    LogTicks out;
    if (!(hi > lo) || !(lo > 0) || !std::isfinite(hi)) return out;
    max_count = std::max(max_count, 2);
    const double a = std::log10(lo), b = std::log10(hi);
    const auto inside = [&](double v) { return v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9); };
    const int k0 = int(std::ceil(a - 1e-9)), k1 = int(std::floor(b + 1e-9)), decades = k1 - k0 + 1;
    if (decades < 3) {
        for (int k = int(std::floor(a)) - 1; k <= int(std::ceil(b)); ++k)
            for (int m = 1; m <= 9; ++m) {
                const double v = m * std::pow(10.0, k);
                if (inside(v)) (m == 1 || m == 2 || m == 5 ? out.major : out.minor).push_back(v);
            }
        if (out.major.size() >= 2 && int(out.major.size()) <= max_count) return out;
        out = {};
    }
    if (decades >= 2) {
        const int stride = (decades + max_count - 1) / max_count;
        for (int k = k0; k <= k1; ++k) {
            if (((k % stride) + stride) % stride == 0) out.major.push_back(std::pow(10.0, k));
            else out.minor.push_back(std::pow(10.0, k));
        }
        if (stride == 1)
            for (int k = k0 - 1; k <= k1; ++k)
                for (int m = 2; m <= 9; ++m)
                    if (inside(m * std::pow(10.0, k))) out.minor.push_back(m * std::pow(10.0, k));
        if (out.major.size() >= 2) return out;
    }
    return {nice_ticks(lo, hi, max_count), {}};
}

inline std::vector<std::string> log_tick_labels(const std::vector<double>& ticks) {
    bool powers_of_ten = true;
    for (double t : ticks) {
        const double k = std::round(std::log10(t));
        powers_of_ten = powers_of_ten && std::abs(t / std::pow(10.0, k) - 1) < 1e-9;
    }
    if (!powers_of_ten && ticks.size() >= 2) {
        // Linear fallback ticks, or {1, 2, 5} x 10^k: plain decimals unless the values are extreme.
        bool evenly = true;
        for (std::size_t i = 2; i < ticks.size(); ++i)
            evenly = evenly && std::abs((ticks[i] - ticks[i - 1]) - (ticks[1] - ticks[0])) <= 1e-9 * ticks.back();
        if (evenly) return linear_tick_labels(ticks);
    }
    std::vector<std::string> out;
    for (double t : ticks) out.push_back(format_g(t, 6));
    return out;
}

// --- layout -----------------------------------------------------------------------------------------------------

struct Metrics {
    int s;                               // font pixel size
    int pad, gap, tick_len, line_h, cap;
    explicit Metrics(int scale)
        : s(scale), pad(5 * scale), gap(3 * scale), tick_len(2 + 2 * scale), line_h(glyph_h * scale),
          cap(cap_h * scale) {}
};

struct PanelLayout {
    PlotArea area;
    std::vector<std::string> x_labels, y_labels;
    std::vector<double> y_minor;
    int cell_x0 = 0, cell_x1 = 0, title_y = 0;
};

struct FigureLayout {
    int scale = 1;
    std::vector<PanelLayout> panels;
};

/// x of the series' i-th point.
inline double series_x(const Series& s, std::size_t i) { return s.x.empty() ? double(i) : s.x[i]; }

inline void check_series(const Series& s) {
    if (!s.x.empty() && s.x.size() != s.y.size())
        throw std::invalid_argument("moonmoe::plot: series '" + s.label + "' has " + std::to_string(s.x.size()) +
                                    " x values but " + std::to_string(s.y.size()) + " y values");
}

inline bool usable_y(double y, bool log_y) { return std::isfinite(y) && (!log_y || y > 0); }

/// The data limits of a panel: from the data (padded), overridden by the panel's explicit limits.
inline void panel_limits(const Panel& p, double& x_lo, double& x_hi, double& y_lo, double& y_hi) {
    const auto check_limit = [](const std::optional<double>& v, const char* name) {
        if (v && !std::isfinite(*v)) throw std::invalid_argument(std::string("moonmoe::plot: ") + name + " is not finite");
    };
    check_limit(p.x_min, "x_min"), check_limit(p.x_max, "x_max"), check_limit(p.y_min, "y_min"),
        check_limit(p.y_max, "y_max");
    if (p.x_min && p.x_max && !(*p.x_min < *p.x_max))
        throw std::invalid_argument("moonmoe::plot: x_min must be less than x_max");
    if (p.y_min && p.y_max && !(*p.y_min < *p.y_max))
        throw std::invalid_argument("moonmoe::plot: y_min must be less than y_max");
    if (p.log_y && ((p.y_min && *p.y_min <= 0) || (p.y_max && *p.y_max <= 0)))
        throw std::invalid_argument("moonmoe::plot: limits of a log y axis must be positive");

    const double inf = std::numeric_limits<double>::infinity();
    double xl = inf, xh = -inf, yl = inf, yh = -inf;
    for (const Series& s : p.series) {
        check_series(s);
        for (std::size_t i = 0; i < s.y.size(); ++i) {
            const double x = series_x(s, i), y = s.y[i];
            if (!std::isfinite(x) || !usable_y(y, p.log_y)) continue;
            // Points outside an explicit x limit do not stretch the y range.
            if ((p.x_min && x < *p.x_min) || (p.x_max && x > *p.x_max)) continue;
            xl = std::min(xl, x), xh = std::max(xh, x), yl = std::min(yl, y), yh = std::max(yh, y);
        }
    }
    for (const HLine& h : p.hlines)
        if (usable_y(h.y, p.log_y)) yl = std::min(yl, h.y), yh = std::max(yh, h.y);

    // An empty range becomes [0, 1]; a single value is widened by `single` (relative, or `at_zero` at 0); a real
    // range gets a margin of `margin` of its width on both sides.
    const auto pad = [](double& lo, double& hi, double single, double at_zero, double margin) {
        if (!(lo <= hi)) lo = 0, hi = 1;
        else {
            const double d = lo == hi ? (lo != 0 ? std::abs(lo) * single : at_zero) : (hi - lo) * margin;
            lo -= d, hi += d;
        }
    };
    pad(xl, xh, 0.05, 0.5, 0.02);
    if (p.log_y) {  // padded in decades: a single value gets +-0.3 of one
        double a = 0, b = 1;
        if (yl == yh) a = std::log10(yl) - 0.3, b = std::log10(yh) + 0.3;
        else if (yl < yh) a = std::log10(yl), b = std::log10(yh), pad(a, b, 0, 0, 0.05);
        yl = std::pow(10.0, a), yh = std::pow(10.0, b);
    } else {
        pad(yl, yh, 0.1, 1.0, 0.05);
    }

    const auto apply = [](double& lo, double& hi, const std::optional<double>& mn, const std::optional<double>& mx,
                          bool log) {
        if (mn) lo = *mn;
        if (mx) hi = *mx;
        if (hi > lo) return;
        // Only one limit was given, on the wrong side of the data: open a range beside it.
        if (mn) hi = log ? lo * 10 : lo + std::max(std::abs(lo) * 0.1, 1.0);
        else lo = log ? hi / 10 : hi - std::max(std::abs(hi) * 0.1, 1.0);
    };
    apply(xl, xh, p.x_min, p.x_max, false);
    apply(yl, yh, p.y_min, p.y_max, p.log_y);
    x_lo = xl, x_hi = xh, y_lo = yl, y_hi = yh;
}

inline int figure_scale(const Figure& f) {
    if (f.text_scale > 0) return std::min(f.text_scale, 16);
    const int cell_w = f.width / std::max<int>(1, int(f.panels.size()));
    return std::clamp(std::min(cell_w, f.height) / 200, 1, 8);
}

inline void check_figure(const Figure& f) {
    if (f.width < 64 || f.height < 64 || f.width > 16384 || f.height > 16384)
        throw std::invalid_argument("moonmoe::plot: figure size " + std::to_string(f.width) + "x" +
                                    std::to_string(f.height) + " is outside [64, 16384]");
}

inline int max_width(const std::vector<std::string>& labels, int s) {
    int w = 0;
    for (const auto& l : labels) w = std::max(w, text_width(l, s));
    return w;
}

inline FigureLayout layout_figure(const Figure& fig) {
    check_figure(fig);
    FigureLayout out;
    out.scale = figure_scale(fig);
    const Metrics m(out.scale);
    const int fig_top = fig.title.empty() ? 0 : m.pad + m.line_h + m.gap;
    const int n = int(fig.panels.size());
    for (int k = 0; k < n; ++k) {
        const Panel& p = fig.panels[std::size_t(k)];
        PanelLayout L;
        PlotArea& a = L.area;
        L.cell_x0 = fig.width * k / n, L.cell_x1 = fig.width * (k + 1) / n;
        panel_limits(p, a.x_lo, a.x_hi, a.y_lo, a.y_hi);
        a.log_y = p.log_y;

        L.title_y = fig_top + m.pad;
        a.top = L.title_y + (p.title.empty() ? 0 : m.line_h + m.gap) + m.cap / 2 + m.s;
        a.bottom = fig.height - 1 - m.pad - (p.x_label.empty() ? 0 : m.line_h + m.gap) - m.cap - m.gap - m.tick_len;
        a.top = std::min(a.top, fig.height - 3);  // only a tiny figure with huge text gets here
        a.bottom = std::max(a.bottom, a.top + 2);
        const int plot_h = a.bottom - a.top;

        const int max_y = std::max(2, int(plot_h / (3.5 * m.cap)));
        if (p.log_y) {
            LogTicks t = log_ticks(a.y_lo, a.y_hi, max_y);
            a.y_ticks = std::move(t.major), L.y_minor = std::move(t.minor);
            L.y_labels = log_tick_labels(a.y_ticks);
        } else {
            a.y_ticks = nice_ticks(a.y_lo, a.y_hi, max_y);
            L.y_labels = linear_tick_labels(a.y_ticks);
        }
        a.left = L.cell_x0 + m.pad + (p.y_label.empty() ? 0 : m.line_h + m.gap) + max_width(L.y_labels, m.s) +
                 m.gap + m.tick_len;
        a.left = std::min(a.left, L.cell_x1 - 3);

        // x ticks: as many as fit with a two-character gap between labels; then make room on the right for the
        // last label, which may move the ticks, so once more.
        int right_room = m.pad;
        for (int pass = 0; pass < 2; ++pass) {
            a.right = std::max(a.left + 2, L.cell_x1 - 1 - right_room);
            const int plot_w = a.right - a.left;
            for (int max_x = std::max(2, plot_w / (3 * advance * m.s)); max_x >= 2; --max_x) {
                a.x_ticks = nice_ticks(a.x_lo, a.x_hi, max_x);
                L.x_labels = linear_tick_labels(a.x_ticks);
                const double spacing =
                    a.x_ticks.size() >= 2 ? std::abs(a.px(a.x_ticks[1]) - a.px(a.x_ticks[0])) : double(plot_w);
                if (spacing >= max_width(L.x_labels, m.s) + 2 * advance * m.s) break;
            }
            int need = m.pad;
            for (std::size_t i = 0; i < a.x_ticks.size(); ++i)
                need = std::max(need, int(std::ceil(a.px(a.x_ticks[i]) + text_width(L.x_labels[i], m.s) / 2.0)) -
                                          (L.cell_x1 - 1 - right_room) + right_room + m.s);
            if (need <= right_room) break;
            right_room = need;
        }
        out.panels.push_back(std::move(L));
    }
    return out;
}

// --- drawing ----------------------------------------------------------------------------------------------------

inline void fill_rect(Image& img, int x0, int y0, int x1, int y1, Rgb c) {  // [x0, x1) x [y0, y1)
    for (int y = std::max(0, y0); y < std::min(img.height, y1); ++y)
        for (int x = std::max(0, x0); x < std::min(img.width, x1); ++x) img.set(x, y, c);
}

struct LegendEntry {
    std::string label;
    Rgb color;
    int width;
    bool dashed;
};

inline Rgb series_color(const Series& s, std::size_t index) {
    return s.color ? *s.color : colors::cycle[index % colors::cycle.size()];
}

inline double clamp_width(int w) { return double(std::clamp(w, 1, 12)); }

/// The series' points in pixel coordinates; unusable points become NaN (a break in the line).
inline std::vector<std::pair<double, double>> series_pixels(const Series& s, const PlotArea& a) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<std::pair<double, double>> pts;
    pts.reserve(s.y.size());
    for (std::size_t i = 0; i < s.y.size(); ++i) {
        const double x = series_x(s, i), y = s.y[i];
        if (!std::isfinite(x) || !usable_y(y, a.log_y)) pts.emplace_back(nan, nan);
        else pts.emplace_back(a.px(x), a.py(y));
    }
    return pts;
}

inline void draw_panel(Image& img, StrokeLayer& layer, const Panel& p, const PanelLayout& L, const Metrics& m,
                       bool aa) {
    const PlotArea& a = L.area;
    const Rect interior{a.left + 1, a.top + 1, a.right, a.bottom};
    const Rgb grid_color{232, 232, 232}, axis_color{0, 0, 0}, text_color{0, 0, 0};
    const auto col = [&](double x) { return int(std::floor(a.px(x))); };
    const auto row = [&](double y) { return int(std::floor(a.py(y))); };

    if (p.grid) {
        for (double t : a.x_ticks)
            if (const int c = col(t); c > a.left && c < a.right) fill_rect(img, c, a.top + 1, c + 1, a.bottom, grid_color);
        for (double t : a.y_ticks)
            if (const int r = row(t); r > a.top && r < a.bottom) fill_rect(img, a.left + 1, r, a.right, r + 1, grid_color);
    }

    std::vector<std::vector<std::pair<double, double>>> pixels;
    for (std::size_t k = 0; k < p.series.size(); ++k) {
        const Series& s = p.series[k];
        pixels.push_back(series_pixels(s, a));
        stroke_polyline(layer, pixels.back(), clamp_width(s.width), aa, interior, s.dashed);
        layer.composite(img, series_color(s, k));
    }

    // Reference lines go over the data, so that a threshold stays visible through dense curves.
    for (const HLine& h : p.hlines) {
        if (!usable_y(h.y, a.log_y)) continue;
        const double y = a.py(h.y);
        layer.segment(a.left, y, a.right + 1, y, clamp_width(h.width), aa, interior, h.dashed, 0);
        layer.composite(img, h.color);
    }

    // Axis box, ticks (outward) and their labels.
    fill_rect(img, a.left, a.top, a.right + 1, a.top + 1, axis_color);
    fill_rect(img, a.left, a.bottom, a.right + 1, a.bottom + 1, axis_color);
    fill_rect(img, a.left, a.top, a.left + 1, a.bottom + 1, axis_color);
    fill_rect(img, a.right, a.top, a.right + 1, a.bottom + 1, axis_color);
    for (std::size_t i = 0; i < a.x_ticks.size(); ++i) {
        const int c = std::clamp(col(a.x_ticks[i]), a.left, a.right);
        fill_rect(img, c, a.bottom + 1, c + 1, a.bottom + 1 + m.tick_len, axis_color);
        const int w = text_width(L.x_labels[i], m.s);
        draw_text(img, c - w / 2, a.bottom + 1 + m.tick_len + m.gap, L.x_labels[i], text_color, m.s);
    }
    for (std::size_t i = 0; i < a.y_ticks.size(); ++i) {
        const int r = std::clamp(row(a.y_ticks[i]), a.top, a.bottom);
        fill_rect(img, a.left - m.tick_len, r, a.left, r + 1, axis_color);
        const int w = text_width(L.y_labels[i], m.s);
        draw_text(img, a.left - m.tick_len - m.gap - w, r - m.cap / 2, L.y_labels[i], text_color, m.s);
    }
    for (double t : L.y_minor) {
        const int r = std::clamp(row(t), a.top, a.bottom);
        fill_rect(img, a.left - m.tick_len / 2, r, a.left, r + 1, axis_color);
    }

    // Titles.
    const int mid_x = (a.left + a.right + 1) / 2;
    if (!p.title.empty())
        draw_text(img, mid_x - text_width(p.title, m.s) / 2, L.title_y, p.title, text_color, m.s, Orient::horizontal,
                  true);
    if (!p.x_label.empty())
        draw_text(img, mid_x - text_width(p.x_label, m.s) / 2, a.bottom + 1 + m.tick_len + m.gap + m.cap + m.gap,
                  p.x_label, text_color, m.s);
    if (!p.y_label.empty())
        draw_text(img, L.cell_x0 + m.pad, (a.top + a.bottom) / 2 - text_width(p.y_label, m.s) / 2, p.y_label,
                  text_color, m.s, Orient::up);

    // Legend.
    std::vector<LegendEntry> entries;
    for (std::size_t k = 0; k < p.series.size(); ++k)
        if (!p.series[k].label.empty())
            entries.push_back({p.series[k].label, series_color(p.series[k], k), p.series[k].width, p.series[k].dashed});
    for (const HLine& h : p.hlines)
        if (!h.label.empty()) entries.push_back({h.label, h.color, h.width, h.dashed});
    if (entries.empty() || p.legend == LegendPlacement::none) return;
    const int swatch = 14 * m.s, row_h = m.line_h + 2 * m.s, inset = 3 * m.s;
    int text_w = 0;
    for (const auto& e : entries) text_w = std::max(text_w, text_width(e.label, m.s));
    const int box_w = m.gap + swatch + m.gap + text_w + m.gap + 1;
    const int box_h = m.gap + int(entries.size()) * row_h - 2 * m.s + m.gap;
    const int xl = a.left + 1 + inset, xr = a.right - inset - box_w, yt = a.top + 1 + inset,
              yb = a.bottom - inset - box_h;
    const std::array<std::pair<int, int>, 4> corners{{{xr, yt}, {xl, yt}, {xl, yb}, {xr, yb}}};
    std::size_t pick = 0;
    switch (p.legend) {
        case LegendPlacement::upper_right: pick = 0; break;
        case LegendPlacement::upper_left: pick = 1; break;
        case LegendPlacement::lower_left: pick = 2; break;
        case LegendPlacement::lower_right: pick = 3; break;
        default: {
            // The corner whose box covers the fewest points sampled every ~2 px along the drawn lines.
            std::array<long, 4> hits{};
            const auto count = [&](double x, double y) {
                for (std::size_t c = 0; c < 4; ++c)
                    if (x >= corners[c].first - 2 && x <= corners[c].first + box_w + 2 && y >= corners[c].second - 2 &&
                        y <= corners[c].second + box_h + 2)
                        ++hits[c];
            };
            for (const auto& pts : pixels)
                for (std::size_t i = 0; i < pts.size(); ++i) {
                    const auto [x1, y1] = pts[i];
                    if (!std::isfinite(x1)) continue;
                    count(x1, y1);
                    if (i == 0 || !std::isfinite(pts[i - 1].first)) continue;
                    const auto [x0, y0] = pts[i - 1];
                    const int steps = int(std::min(2000.0, std::hypot(x1 - x0, y1 - y0) / 2));
                    for (int k = 1; k < steps; ++k)
                        count(x0 + (x1 - x0) * k / steps, y0 + (y1 - y0) * k / steps);
                }
            for (const HLine& h : p.hlines)
                if (usable_y(h.y, a.log_y))
                    for (int x = a.left; x <= a.right; x += 2) count(x, a.py(h.y));
            for (std::size_t c = 1; c < 4; ++c)
                if (hits[c] < hits[pick]) pick = c;
        }
    }
    const auto [bx, by] = corners[pick];
    fill_rect(img, bx, by, bx + box_w, by + box_h, colors::white);
    const Rgb frame{190, 190, 190};
    fill_rect(img, bx, by, bx + box_w, by + 1, frame);
    fill_rect(img, bx, by + box_h - 1, bx + box_w, by + box_h, frame);
    fill_rect(img, bx, by, bx + 1, by + box_h, frame);
    fill_rect(img, bx + box_w - 1, by, bx + box_w, by + box_h, frame);
    const Rect all{0, 0, img.width, img.height};
    for (std::size_t i = 0; i < entries.size(); ++i) {
        const int top = by + m.gap + int(i) * row_h;
        const double cy = top + m.cap / 2 + 0.5;
        layer.segment(bx + m.gap, cy, bx + m.gap + swatch, cy, clamp_width(entries[i].width), aa, all,
                      entries[i].dashed, 0);
        layer.composite(img, entries[i].color);
        draw_text(img, bx + m.gap + swatch + m.gap, top, entries[i].label, text_color, m.s);
    }
}

}  // namespace detail

/// Where each panel's data goes in the rendered image (same order as fig.panels).
inline std::vector<PlotArea> layout(const Figure& fig) {
    std::vector<PlotArea> out;
    for (auto& p : detail::layout_figure(fig).panels) out.push_back(std::move(p.area));
    return out;
}

/// Draws the figure. Throws std::invalid_argument for a bad size, bad limits, or a series whose x and y sizes differ.
inline Image render(const Figure& fig) {
    const detail::FigureLayout L = detail::layout_figure(fig);
    const detail::Metrics m(L.scale);
    Image img(fig.width, fig.height);
    detail::StrokeLayer layer(fig.width, fig.height);
    if (!fig.title.empty())
        detail::draw_text(img, fig.width / 2 - detail::text_width(fig.title, m.s) / 2, m.pad, fig.title,
                          colors::black, m.s, detail::Orient::horizontal, true);
    for (std::size_t k = 0; k < fig.panels.size(); ++k)
        detail::draw_panel(img, layer, fig.panels[k], L.panels[k], m, fig.antialias);
    return img;
}

/// The bytes of a PNG file holding `img`: 8-bit RGB, filter 0 on every row, one IDAT chunk.
inline std::vector<std::uint8_t> encode_png(const Image& img, Compression mode = Compression::fixed_huffman) {
    if (img.width <= 0 || img.height <= 0 || img.rgb.size() != std::size_t(img.width) * std::size_t(img.height) * 3)
        throw std::invalid_argument("moonmoe::plot: image size does not match its pixel buffer");
    const std::size_t stride = std::size_t(img.width) * 3;
    std::vector<std::uint8_t> raw;
    raw.reserve((stride + 1) * std::size_t(img.height));
    for (int y = 0; y < img.height; ++y) {
        raw.push_back(0);  // filter type None
        const auto row = img.rgb.begin() + std::ptrdiff_t(std::size_t(y) * stride);
        raw.insert(raw.end(), row, row + std::ptrdiff_t(stride));
    }
    std::vector<std::uint8_t> out{0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
    std::vector<std::uint8_t> ihdr;
    detail::put_be32(ihdr, std::uint32_t(img.width));
    detail::put_be32(ihdr, std::uint32_t(img.height));
    ihdr.insert(ihdr.end(), {8, 2, 0, 0, 0});  // bit depth 8, colour type 2 (RGB), deflate, adaptive filters, no interlace
    detail::put_chunk(out, "IHDR", ihdr);
    detail::put_chunk(out, "IDAT", detail::zlib_compress(raw, mode));
    detail::put_chunk(out, "IEND", {});
    return out;
}

/// The bytes of a .png file showing the figure.
inline std::vector<std::uint8_t> render_png(const Figure& fig, Compression mode = Compression::fixed_huffman) {
    return encode_png(render(fig), mode);
}

/// Writes bytes to `path`; throws std::runtime_error naming the path if it cannot.
inline void write_file(const std::string& path, const std::vector<std::uint8_t>& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    if (!f) throw std::runtime_error("moonmoe::plot: cannot open '" + path + "' for writing");
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    f.close();
    if (!f) throw std::runtime_error("moonmoe::plot: failed writing '" + path + "'");
}

/// Renders the figure and writes it as a PNG file; throws std::runtime_error naming the path if it cannot.
inline void write_png(const std::string& path, const Figure& fig) { write_file(path, render_png(fig)); }
inline void write_png(const std::string& path, const Image& img) { write_file(path, encode_png(img)); }

}  // namespace moonmoe::plot

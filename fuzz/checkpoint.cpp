// fuzz/checkpoint.cpp: fuzz_checkpoint, the whole checkpoint loader (load_transformer, Checkpoint, load_weights) on
// checkpoint directories that are always well-formed JSON, so that mutations reach the loader's semantic checks
// instead of dying in a JSON parser (libFuzzer signature; fuzz/run.sh builds and runs it under ASan + UBSan).
//
// Base checkpoint: LLVMFuzzerInitialize builds a tiny DeepSeek-V3 model (base_config below: hidden 16, 2 layers of
// which the second is MoE with 4 routed experts, vocab 32; about 6,000 parameters), initialises it and saves it with
// save_transformer as F32, BF16 and F16 into a per-process directory under /dev/shm ($TMPDIR or /tmp without it),
// then reads each save back into records (name, dtype, shape, bytes) and its config.json. So the base comes from
// the library's own writer.
//
// Input: not file bytes but a program. Two option bytes (missing bytes read as 0):
//   byte 0: bit 0 LoadOptions::check_finite, bit 1 with_optimizer_state, bits 2-3 memory_limit (16 MiB, 256 MiB,
//           4 KiB: below the base model, 64 MiB), bits 4-5 the layout (one model.safetensors; 2 or 3 shards with a
//           model.safetensors.index.json; model.safetensors beside 2 shards and an index, which it overrides),
//           bits 6-7 the base weights (F32, BF16, F16, or FP8: F8_E4M3 matrices with _scale_inv in [4, 8] blocks,
//           quantization_config set)
//   byte 1: bit 0 loads through Checkpoint(dir, Shards::as_needed) + load_weights instead of load_transformer,
//           bit 1 into a model of bf16-stored matrices (Precision<BF16, Weights<BF16>>: Checkpoint::read_bf16)
// then up to 64 edits, each an Op byte (enum Op below) and its operands, every choice an index into a table of
// dtypes, edge sizes, offset deltas, names, config.json fields x values, index targets and special values. The edited
// checkpoint is serialized with valid JSON everywhere (headers and index written key by key, so that a key may appear
// twice, strings escaped, the 8-byte header length right, the data section grown to cover offsets moved past it)
// into a fresh directory and loaded.
//
// Findings: anything but io_error / config_error / shape_error out of the loader; and, for a load that succeeds,
// any broken promise, checked against a model of the files written here (not against the library's parsers):
// every file read obeys the safetensors rules (dtype, shape, byte size, tensors tiling the data section, no key
// twice); an index maps each tensor to a shard that holds it and a shard holds nothing the index does not map to
// it; every parameter has the shape and, bit for bit, the values of its record (F8_E4M3 dequantised with a finite
// `_scale_inv` of the right shape for quantization_config's blocks); every tensor of the checkpoint is a parameter,
// a scale of an F8 parameter, or part of a multi-token-prediction layer (num_nextn_predict_layers) with its
// eh_proj; with check_finite every value is finite; the model is config.json's resolved configuration, within
// memory_limit, with as many parameters as estimate_model_memory counts. The input with no edit (the empty input)
// must load, and with the 4 KiB limit must be refused.
//
// Seeds: fuzz/corpus/checkpoint, written by this target from the symbolic programs in write_seeds() (so they
// follow the Op numbering): MOONMOE_FUZZ_WRITE_SEEDS=fuzz/corpus/checkpoint build-fuzz/fuzz/fuzz_checkpoint -runs=0.
// Dictionary: fuzz/dict/checkpoint.dict, whole edits as byte strings, written the same way (MOONMOE_FUZZ_WRITE_DICT).
// MOONMOE_FUZZ_VERBOSE=1 prints what the loader made of each input. Built with the CPU backend and without coverage
// counters in nlohmann::json and libstdc++ (fuzz/checkpoint_coverage.ignorelist), which keeps it at a few hundred
// inputs a second on one core.
#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <variant>
#include <vector>

#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <moonmoe/backend/cpu.hpp>
#include <moonmoe/config/presets.hpp>
#include <moonmoe/io/model_io.hpp>
#include <moonmoe/nn/init.hpp>

#include "fuzz_common.hpp"

namespace {

using json = nlohmann::json;
using moonmoe::DType;
using moonmoe::index_t;
namespace fs = std::filesystem;

using Model = moonmoe::nn::Transformer<moonmoe::cpu>;

/// The model every input starts from (saved and read back by LLVMFuzzerInitialize).
constexpr const char* base_config = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "hidden_size": 16, "num_hidden_layers": 2, "first_k_dense_replace": 1, "vocab_size": 32, "intermediate_size": 24,
  "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": 8, "kv_lora_rank": 8,
  "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4,
  "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1, "moe_intermediate_size": 8,
  "n_group": 2, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
  "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": false,
  "max_position_embeddings": 64, "rope_theta": 10000.0,
  "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 32.0,
                   "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
})";

constexpr std::size_t max_ops = 64;
constexpr std::size_t max_data_bytes = std::size_t(4) << 20;  // all records together, so every input stays fast
constexpr std::uint64_t max_extension = 1 << 16;  // the data section grows to cover offsets moved this far past it
constexpr std::array<std::int64_t, 2> base_fp8_block{4, 8};

[[noreturn]] void fail(const std::string& what) {
    std::fprintf(stderr, "moonmoe fuzz: broken invariant: %s\n", what.c_str());
    std::abort();
}
void require(bool ok, const std::string& what) {
    if (!ok) fail(what);
}

// ---------------------------------------------------------------------------------------------------------------
// Reading the input.

/// The input read from the front as small choices; 0 once it runs out (so a short input is a valid program).
class Reader {
public:
    Reader(const std::uint8_t* data, std::size_t size) : p_(data), n_(size) {}
    bool empty() const { return n_ == 0; }
    std::uint8_t byte() {
        if (n_ == 0) return 0;
        --n_;
        return *p_++;
    }
    std::size_t below(std::size_t count) { return count == 0 ? 0 : byte() % count; }
    template <class T, std::size_t N>
    const T& pick(const T (&table)[N]) {
        return table[byte() % N];
    }

private:
    const std::uint8_t* p_;
    std::size_t n_;
};

// ---------------------------------------------------------------------------------------------------------------
// The checkpoint being edited.

/// How a record's header entry is spelled beyond its three fields.
enum class EntryEdit : std::uint8_t {
    none,
    no_dtype,
    no_shape,
    no_offsets,
    extra_field,
    dtype_twice,
    shape_twice,
    offsets_twice,
    count
};

/// How data_offsets is written: [begin, end] (after the deltas), or one of the malformed forms.
enum class OffsetForm : std::uint8_t { pair, reversed, one, three, floats, negative, null, object, text, count };

struct Record {
    std::string name;
    json dtype;  // a string such as "F32"; any JSON after an edit
    json shape;  // an array of integers; any JSON after an edit
    std::vector<std::uint8_t> bytes;
    std::int64_t begin_delta = 0, end_delta = 0;  // added to the offsets the layout gives
    OffsetForm form = OffsetForm::pair;
    EntryEdit edit = EntryEdit::none;
    std::size_t shard = 0;
};

struct ShardExtras {
    std::vector<std::pair<std::string, json>> metadata{{"format", "pt"}};
    int metadata_objects = 1;  // 0: none, 2: "__metadata__" twice
    std::size_t trailing = 0;  // bytes after the last tensor
};

struct IndexEdit {
    std::uint8_t kind, entry, value;
};

struct Options {
    moonmoe::LoadOptions load;
    bool tiny_limit = false;
    bool as_needed = false;
    bool bf16_weights = false;
    int layout = 0;
    int base = 0;
};

struct Candidate {
    json config;
    std::vector<Record> records;
    std::array<ShardExtras, 3> shards;
    std::size_t shard_count = 1;  // shards of the index layout
    bool single_file = true;      // model.safetensors
    bool index_file = false;      // model.safetensors.index.json with its shards
    std::vector<IndexEdit> index_edits;
    std::optional<json> total_size;  // the index's metadata.total_size, when edited
};

struct Base {
    json config;
    std::vector<Record> records;
};
std::array<Base, 4> bases;  // F32, BF16, F16 as save_transformer wrote them, and F32 with FP8 matrices
fs::path work_dir, checkpoint_dir;
bool verbose = false;  // MOONMOE_FUZZ_VERBOSE set: each input's outcome on stderr (to see what an input does)

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::optional<std::int64_t> json_int(const json& j) {
    if (j.is_number_unsigned()) {
        const auto v = j.get<std::uint64_t>();
        return v <= std::uint64_t(INT64_MAX) ? std::optional<std::int64_t>(std::int64_t(v)) : std::nullopt;
    }
    if (j.is_number_integer()) return j.get<std::int64_t>();
    return std::nullopt;
}

/// An integer as JSON: negative as int64, else as uint64; beyond both, the nearest of them.
json json_of(__int128 v) {
    if (v < INT64_MIN) v = INT64_MIN;
    if (v > __int128(UINT64_MAX)) v = UINT64_MAX;
    return v < 0 ? json(std::int64_t(v)) : json(std::uint64_t(v));
}

std::int64_t clamp64(__int128 v) { return v < INT64_MIN ? INT64_MIN : v > INT64_MAX ? INT64_MAX : std::int64_t(v); }

std::optional<DType> dtype_of(const Record& r) {
    return r.dtype.is_string() ? moonmoe::parse_dtype(r.dtype.get<std::string>()) : std::nullopt;
}

/// The record's shape as sizes, when it is an array of non-negative integers.
std::optional<std::vector<index_t>> sizes_of(const json& shape) {
    if (!shape.is_array()) return std::nullopt;
    std::vector<index_t> out;
    for (const json& d : shape) {
        const auto v = json_int(d);
        if (!v || *v < 0) return std::nullopt;
        out.push_back(*v);
    }
    return out;
}

/// The record's values as f32, when its dtype, shape and bytes agree (and it is small enough to bother).
std::optional<std::vector<float>> values_of(const Record& r) {
    const auto dtype = dtype_of(r);
    const auto sizes = sizes_of(r.shape);
    if (!dtype || !sizes) return std::nullopt;
    const auto n = moonmoe::checked_product(*sizes);
    if (!n || *n > (index_t(1) << 20) || std::size_t(*n) * moonmoe::dtype_size(*dtype) != r.bytes.size())
        return std::nullopt;
    std::vector<float> out(static_cast<std::size_t>(*n));
    moonmoe::detail::decode_to_f32(*dtype, std::as_bytes(std::span(r.bytes)), out);
    return out;
}

template <class T>
void append(std::vector<std::uint8_t>& out, T v) {
    const auto* p = reinterpret_cast<const std::uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof v);
}

template <class T>
T clamp_to(float x, double lo, double hi) {
    return std::isnan(x) ? T(0) : T(std::clamp(double(x), lo, hi));
}

std::vector<std::uint8_t> encode(const std::vector<float>& values, DType t) {
    std::vector<std::uint8_t> out;
    for (float x : values) {
        switch (t) {
        case DType::f64: append(out, double(x)); break;
        case DType::f16: append(out, moonmoe::f16::from_float(x).bits); break;
        case DType::bf16: append(out, moonmoe::bf16::from_float(x).bits); break;
        case DType::f8_e4m3: append(out, moonmoe::f8_e4m3::from_float(x).bits); break;
        case DType::f8_e5m2: append(out, std::uint8_t(moonmoe::f16::from_float(x).bits >> 8)); break;
        case DType::i64: append(out, clamp_to<std::int64_t>(x, -1e18, 1e18)); break;
        case DType::i32: append(out, clamp_to<std::int32_t>(x, -2e9, 2e9)); break;
        case DType::i16: append(out, clamp_to<std::int16_t>(x, -32768, 32767)); break;
        case DType::i8: append(out, clamp_to<std::int8_t>(x, -128, 127)); break;
        case DType::u64: append(out, clamp_to<std::uint64_t>(x, 0, 1e18)); break;
        case DType::u32: append(out, clamp_to<std::uint32_t>(x, 0, 4e9)); break;
        case DType::u16: append(out, clamp_to<std::uint16_t>(x, 0, 65535)); break;
        case DType::u8: append(out, clamp_to<std::uint8_t>(x, 0, 255)); break;
        case DType::boolean: append(out, std::uint8_t(x != 0.0f)); break;
        case DType::f32: append(out, x); break;
        }
    }
    return out;
}

std::size_t data_bytes(const Candidate& c) {
    std::size_t n = 0;
    for (const Record& r : c.records) n += r.bytes.size();
    return n;
}

/// The layer N of "model.layers.N.<rest>" (1 to 18 digits, as the loader reads it), or nullopt.
std::optional<index_t> layer_of(std::string_view name) {
    constexpr std::string_view prefix = "model.layers.";
    if (!name.starts_with(prefix)) return std::nullopt;
    name.remove_prefix(prefix.size());
    const std::size_t digits = std::min(name.find_first_not_of("0123456789"), name.size());
    if (digits == 0 || digits > 18 || digits == name.size() || name[digits] != '.') return std::nullopt;
    index_t n = 0;
    for (std::size_t i = 0; i < digits; ++i) n = n * 10 + (name[i] - '0');
    return n;
}

/// `name` with its layer number replaced by `layer` (same name if it has none).
std::string with_layer(const std::string& name, const std::string& layer) {
    constexpr std::string_view prefix = "model.layers.";
    if (!name.starts_with(prefix)) return name;
    const std::size_t end = name.find('.', prefix.size());
    if (end == std::string::npos) return name;
    return std::string(prefix) + layer + name.substr(end);
}

std::int64_t config_int(const json& config, const char* field, std::int64_t fallback) {
    const auto it = config.find(field);
    if (it == config.end()) return fallback;
    return json_int(*it).value_or(fallback);
}

/// quantization_config.weight_block_size as the loader reads it, when it is [rows, cols] of positive integers;
/// [128, 128] when the config has no block size (or no quantization_config).
std::optional<std::array<index_t, 2>> fp8_block(const json& config) {
    const auto q = config.find("quantization_config");
    if (q == config.end() || q->is_null()) return moonmoe::default_fp8_block;
    if (!q->is_object()) return std::nullopt;
    const auto b = q->find("weight_block_size");
    if (b == q->end() || b->is_null()) return moonmoe::default_fp8_block;
    if (!b->is_array() || b->size() != 2) return std::nullopt;
    const auto b0 = json_int((*b)[0]), b1 = json_int((*b)[1]);
    if (!b0 || !b1 || *b0 <= 0 || *b1 <= 0) return std::nullopt;
    return std::array<index_t, 2>{*b0, *b1};
}

std::array<index_t, 2> scale_shape(index_t rows, index_t cols, std::array<index_t, 2> block) {
    return {rows / block[0] + (rows % block[0] != 0), cols / block[1] + (cols % block[1] != 0)};
}

/// Quantises a 2-D record to F8_E4M3 in `block` blocks, as DeepSeek's FP8 checkpoints are (scale_inv = amax / 448),
/// and puts its `_scale_inv` record beside it. False if the record is not a small 2-D floating tensor.
bool quantize(Candidate& c, std::size_t i, std::array<index_t, 2> block) {
    const auto values = values_of(c.records[i]);
    const auto sizes = sizes_of(c.records[i].shape);
    if (!values || sizes->size() != 2 || (*sizes)[0] == 0 || (*sizes)[1] == 0) return false;
    const index_t rows = (*sizes)[0], cols = (*sizes)[1];
    const auto s = scale_shape(rows, cols, block);
    std::vector<float> scale(std::size_t(s[0] * s[1]), 0.0f);
    for (index_t r = 0; r < rows; ++r)
        for (index_t col = 0; col < cols; ++col) {
            float& amax = scale[std::size_t((r / block[0]) * s[1] + col / block[1])];
            amax = std::max(amax, std::abs((*values)[std::size_t(r * cols + col)]));
        }
    for (float& x : scale) x = std::isfinite(x) && x > 0 ? x / moonmoe::f8_e4m3::max_finite : 1.0f;
    std::vector<float> codes(values->size());
    for (index_t r = 0; r < rows; ++r)
        for (index_t col = 0; col < cols; ++col)
            codes[std::size_t(r * cols + col)] =
                (*values)[std::size_t(r * cols + col)] / scale[std::size_t((r / block[0]) * s[1] + col / block[1])];
    Record& w = c.records[i];
    w.dtype = "F8_E4M3";
    w.bytes = encode(codes, DType::f8_e4m3);
    Record scale_record{w.name + "_scale_inv", "F32", json::array({s[0], s[1]}), encode(scale, DType::f32)};
    scale_record.shard = w.shard;
    for (Record& r : c.records)
        if (r.name == scale_record.name) {
            r = std::move(scale_record);
            return true;
        }
    c.records.insert(c.records.begin() + std::ptrdiff_t(i) + 1, std::move(scale_record));
    return true;
}

Options read_options(Reader& in) {
    const std::uint8_t a = in.byte(), b = in.byte();
    Options o;
    o.load.check_finite = a & 1;
    o.load.with_optimizer_state = (a >> 1) & 1;
    constexpr double limits[4] = {16.0 * (1 << 20), 256.0 * (1 << 20), 4096.0, 64.0 * (1 << 20)};
    o.load.memory_limit = limits[(a >> 2) & 3];
    o.tiny_limit = ((a >> 2) & 3) == 2;
    o.layout = (a >> 4) & 3;
    o.base = (a >> 6) & 3;
    o.as_needed = b & 1;
    o.bf16_weights = b & 2;
    return o;
}

/// The F32 base with its matrices quantised as DeepSeek-V3 ships them: every 2-D weight but the embedding, the head
/// and the router, in base_fp8_block blocks, quantization_config saying so.
Base fp8_base(const Base& f32) {
    Candidate c;
    c.config = f32.config;
    c.records = f32.records;
    c.config["quantization_config"] = {{"quant_method", "fp8"},
                                       {"fmt", "e4m3"},
                                       {"activation_scheme", "dynamic"},
                                       {"weight_block_size", base_fp8_block}};
    for (std::size_t i = 0; i < c.records.size(); ++i) {
        const std::string& n = c.records[i].name;
        if (n.find("embed_tokens") == std::string::npos && !n.starts_with("lm_head") &&
            n.find("mlp.gate.") == std::string::npos && !n.ends_with("_scale_inv"))
            quantize(c, i, base_fp8_block);
    }
    return {std::move(c.config), std::move(c.records)};
}

Candidate initial(const Options& o) {
    Candidate c;
    c.config = bases[std::size_t(o.base)].config;
    c.records = bases[std::size_t(o.base)].records;
    c.single_file = o.layout == 0 || o.layout == 3;
    c.index_file = o.layout != 0;
    c.shard_count = o.layout == 2 ? 3 : o.layout == 0 ? 1 : 2;
    const std::size_t total = data_bytes(c);
    std::size_t cursor = 0;
    for (Record& r : c.records) {  // shards of about equal bytes, in order
        r.shard = std::min(c.shard_count - 1, total ? cursor * c.shard_count / total : 0);
        cursor += r.bytes.size();
    }
    return c;
}

// ---------------------------------------------------------------------------------------------------------------
// The edits.

enum Op : std::uint8_t {
    set_dtype,      // record, dtype: the header's dtype changes, the bytes stay
    convert,        // record, dtype: the values re-encoded in another type (bytes and header agree)
    quantize_op,    // record, block: F8_E4M3 with a _scale_inv, in config.json's blocks (0) or a table's
    set_dim,        // record, dimension, value: one extent to an edge value
    reshape,        // record, kind: a dimension dropped / added, flattened, transposed, not an array ...
    move_offsets,   // record, which, delta: data_offsets begin / end / both moved, or a malformed form
    edit_entry,     // record, kind: a field of the header entry missing, extra or twice
    rename,         // record, kind, operand: another name (another record's, a layer past the model, ...)
    duplicate,      // record, where: a copy in the same shard or the next
    drop,           // record
    move_record,    // record, position, shard: the data order and the shard change
    write_special,  // record, element, value: NaN, infinities, extremes, -0, subnormals in the record's width
    swap_bytes,     // record, record: their data exchanged
    metadata,       // shard, kind, key, value: __metadata__ entries (non-string values), none, or twice
    trailing,       // shard, amount: bytes after the last tensor
    config_set,     // field, value: a config.json field to a value of the table (relative or absolute)
    config_erase,   // field
    quant_config,   // kind, block, block: quantization_config present, absent, other fmt / method / blocks
    index_edit,     // kind, entry, value: model.safetensors.index.json edited (applied when it is written)
    copy_layer,     // from, to: every tensor of a layer copied under another layer number
    mtp_layer,      // layer, kind: a multi-token-prediction module (eh_proj, enorm, hnorm) past the last layer
    op_count
};

const json dtype_names[] = {"F32", "BF16", "F16", "F64",   "F8_E4M3", "F8_E5M2",    "I64",  "I32",
                            "I16", "I8",   "U64", "U32",   "U16",     "U8",         "BOOL", "F4",
                            "f32", "",     "FP8", nullptr, json(32),  json::array()};
constexpr DType convert_types[] = {DType::f32,     DType::bf16, DType::f16, DType::f64, DType::f8_e4m3,
                                   DType::f8_e5m2, DType::i64,  DType::i32, DType::u8,  DType::boolean};
constexpr std::int64_t block_sizes[] = {1, 2, 3, 4, 8, 16, 128, 0, -1, INT32_MAX, 1LL << 31, 1LL << 62, INT64_MAX};

/// An extent or a config.json integer: relative to the current value `v` or an edge.
json edge_value(std::uint8_t choice, std::int64_t v) {
    const __int128 cur = v;
    switch (choice % 28) {
    case 0: return json_of(cur - 1);
    case 1: return json_of(cur + 1);
    case 2: return json_of(cur * 2);
    case 3: return json_of(cur / 2);
    case 4: return json_of(cur + 8);
    case 5: return 0;
    case 6: return 1;
    case 7: return 2;
    case 8: return 3;
    case 9: return 4;
    case 10: return 7;
    case 11: return 16;
    case 12: return -1;
    case 13: return std::int64_t(1) << 31;
    case 14: return std::int64_t(1) << 32;
    case 15: return std::int64_t(1) << 62;
    case 16: return INT64_MAX;
    case 17: return std::uint64_t(INT64_MAX) + 1;
    case 18: return UINT64_MAX;
    case 19: return INT64_MIN;
    case 20: return 1.5;
    case 21: return double(v);  // 16.0 for 16
    case 22: return std::to_string(v);
    case 23: return nullptr;
    case 24: return true;
    case 25: return json::array({v});
    case 26: return 1e308;
    default: return -0.0;
    }
}

/// A config.json value: edge_value's 28, then strings and objects for the fields that take them.
json config_value(std::uint8_t choice, const json& current) {
    std::int64_t v = json_int(current).value_or(0);
    if (current.is_number_float() && std::isfinite(current.get<double>()))
        v = clamp64(__int128(std::clamp(current.get<double>(), -9e18, 9e18)));
    static const json strings[] = {"deepseek_v3",
                                   "kimi_k2",
                                   "deepseek_v2",
                                   "llama",
                                   "float32",
                                   "bfloat16",
                                   "float16",
                                   "float8_e4m3fn",
                                   "sigmoid",
                                   "softmax",
                                   "noaux_tc",
                                   "greedy",
                                   "group_limited_greedy",
                                   "silu",
                                   "gelu",
                                   "yarn",
                                   "default",
                                   "e5m2",
                                   false,
                                   1e-300,
                                   json::object(),
                                   json::array({"DeepseekV3ForCausalLM"}),
                                   json::array({"DeepseekV2ForCausalLM"}),
                                   json::array({"LlamaForCausalLM"}),
                                   json::array({"LlamaForCausalLM", "DeepseekV3ForCausalLM"}),
                                   {{"type", "yarn"}, {"factor", 4.0}},
                                   {{"rope_type", "default"}, {"rope_theta", 10000.0}},
                                   {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}}};
    const std::size_t k = choice % (28 + std::size(strings));
    return k < 28 ? edge_value(std::uint8_t(k), v) : strings[k - 28];
}

const char* const config_fields[] = {"/num_hidden_layers",
                                     "/hidden_size",
                                     "/first_k_dense_replace",
                                     "/vocab_size",
                                     "/intermediate_size",
                                     "/num_attention_heads",
                                     "/num_key_value_heads",
                                     "/q_lora_rank",
                                     "/kv_lora_rank",
                                     "/qk_nope_head_dim",
                                     "/qk_rope_head_dim",
                                     "/v_head_dim",
                                     "/n_routed_experts",
                                     "/num_experts_per_tok",
                                     "/n_shared_experts",
                                     "/moe_intermediate_size",
                                     "/n_group",
                                     "/topk_group",
                                     "/max_position_embeddings",
                                     "/num_nextn_predict_layers",
                                     "/rms_norm_eps",
                                     "/routed_scaling_factor",
                                     "/rope_theta",
                                     "/rope_interleave",
                                     "/rope_scaling",
                                     "/rope_scaling/factor",
                                     "/rope_scaling/original_max_position_embeddings",
                                     "/rope_scaling/type",
                                     "/rope_parameters",
                                     "/torch_dtype",
                                     "/dtype",
                                     "/model_type",
                                     "/architectures",
                                     "/quantization_config",
                                     "/quantization_config/weight_block_size",
                                     "/quantization_config/weight_block_size/0",
                                     "/quantization_config/fmt",
                                     "/tie_word_embeddings",
                                     "/attention_bias",
                                     "/topk_method",
                                     "/scoring_func",
                                     "/norm_topk_prob",
                                     "/hidden_act",
                                     "/moe_layer_freq",
                                     "/bos_token_id",
                                     "/eos_token_id"};

/// Offset deltas; element_size and length are the record's (what moves it onto its neighbour).
std::int64_t offset_delta(std::uint8_t choice, std::int64_t element_size, std::int64_t length) {
    switch (choice % 18) {
    case 0: return 1;
    case 1: return -1;
    case 2: return 2;
    case 3: return -2;
    case 4: return 4;
    case 5: return -4;
    case 6: return 8;
    case 7: return -8;
    case 8: return element_size;
    case 9: return -element_size;
    case 10: return length;
    case 11: return -length;
    case 12: return length + 1;
    case 13: return std::int64_t(1) << 32;
    case 14: return std::int64_t(1) << 62;
    case 15: return INT64_MAX;
    case 16: return INT64_MIN;
    default: return 4096;
    }
}

/// Bit patterns of special values, by element width (1: F8, 2: BF16 and F16, 4: F32, 8: F64).
std::vector<std::uint8_t> special_value(std::size_t width, std::uint8_t choice) {
    std::vector<std::uint8_t> out;
    if (width == 1) {
        constexpr std::uint8_t e4m3_e5m2[] = {0x7F, 0xFF, 0x7E, 0xFE, 0x80, 0x01, 0x7C, 0xFC, 0x7D, 0x00};
        append(out, e4m3_e5m2[choice % std::size(e4m3_e5m2)]);
    } else if (width == 2) {
        constexpr std::uint16_t half[] = {0x7FC0, 0xFFC0, 0x7F81, 0x7F80, 0xFF80, 0x7F7F, 0x8000,
                                          0x0001, 0x7E00, 0x7C00, 0xFC00, 0x7BFF, 0x03FF, 0x7D00};
        append(out, half[choice % std::size(half)]);
    } else if (width == 8) {
        constexpr double f64[] = {std::numeric_limits<double>::quiet_NaN(),
                                  std::numeric_limits<double>::infinity(),
                                  -std::numeric_limits<double>::infinity(),
                                  std::numeric_limits<double>::max(),
                                  3.5e38,
                                  -3.5e38,
                                  1e-300,
                                  std::numeric_limits<double>::denorm_min(),
                                  -0.0};
        append(out, f64[choice % std::size(f64)]);
    } else {
        constexpr std::uint32_t f32[] = {0x7FC00000, 0xFFC00000, 0x7F800001, 0x7F800000, 0xFF800000, 0x7F7FFFFF,
                                         0xFF7FFFFF, 0x80000000, 0x00000001, 0x007FFFFF, 0x00800000};
        append(out, f32[choice % std::size(f32)]);
        out.resize(width, 0);
    }
    return out;
}

void apply(Candidate& c, Reader& in) {
    const auto op = Op(in.byte() % op_count);
    const std::int64_t layers = config_int(c.config, "num_hidden_layers", 2);
    if (op == config_set || op == config_erase) {
        const json::json_pointer field(in.pick(config_fields));
        const std::uint8_t choice = in.byte();
        try {
            if (op == config_erase) {
                json& parent = c.config[field.parent_pointer()];
                if (parent.is_object()) parent.erase(field.back());
            } else {
                const json current = c.config.contains(field) ? c.config[field] : json();
                c.config[field] = config_value(choice, current);
            }
        } catch (const json::exception&) {  // a parent that is not an object: no edit
        }
        return;
    }
    if (op == quant_config) {
        const std::uint8_t kind = in.byte();
        const std::int64_t b0 = in.pick(block_sizes), b1 = in.pick(block_sizes);
        json& q = c.config["quantization_config"];
        switch (kind % 7) {
        case 0: c.config.erase("quantization_config"); break;
        case 1:
            q = {{"quant_method", "fp8"},
                 {"fmt", "e4m3"},
                 {"activation_scheme", "dynamic"},
                 {"weight_block_size", {b0, b1}}};
            break;
        case 2: q = {{"quant_method", "fp8"}, {"fmt", "e5m2"}}; break;
        case 3: q = {{"quant_method", "bitsandbytes"}}; break;
        case 4: q = {{"quant_method", "fp8"}, {"weight_block_size", {b0}}}; break;
        case 5: q = "fp8"; break;
        default: q = {{"quant_method", "fp8"}}; break;  // the default [128, 128] blocks
        }
        return;
    }
    if (op == index_edit) {
        const IndexEdit e{in.byte(), in.byte(), in.byte()};
        c.index_edits.push_back(e);
        return;
    }
    if (op == metadata || op == trailing) {
        ShardExtras& s = c.shards[in.below(c.shards.size())];
        if (op == trailing) {
            constexpr std::size_t amounts[] = {1, 3, 4, 8, 64, 4096};
            s.trailing += in.pick(amounts);
            return;
        }
        const std::uint8_t kind = in.byte();
        static const char* const keys[] = {"format", "total_size", "__metadata__", "", "x", "format\u00e9"};
        static const json values[] = {"pt", "", "np", 1, nullptr, json::array(), json::object(), true, 1.5};
        const std::string key = in.pick(keys);
        const json value = in.pick(values);
        switch (kind % 5) {
        case 0: s.metadata.emplace_back(key, value); break;
        case 1: s.metadata.clear(); break;
        case 2: s.metadata_objects = 0; break;
        case 3: s.metadata_objects = 2; break;
        default:
            s.metadata_objects = std::max(s.metadata_objects, 1);
            if (!s.metadata.empty()) s.metadata.push_back(s.metadata.front());  // a key twice
        }
        return;
    }
    if (op == copy_layer) {
        const std::int64_t from = in.below(2) == 0 ? 0 : clamp64(__int128(layers) - 1);
        const std::int64_t mtp = config_int(c.config, "num_nextn_predict_layers", 0);
        const std::string targets[] = {std::to_string(layers),
                                       std::to_string(__int128(layers) + 1 > INT64_MAX ? layers : layers + 1),
                                       std::to_string(clamp64(__int128(layers) + mtp)),
                                       "0" + std::to_string(from),
                                       "99999",
                                       "999999999999999999",
                                       "1000000000000000000",
                                       std::to_string(from)};
        const std::string to = in.pick(targets);
        std::vector<Record> copies;
        for (const Record& r : c.records)
            if (layer_of(r.name) == from) copies.push_back(r), copies.back().name = with_layer(r.name, to);
        std::size_t added = 0;
        for (const Record& r : copies) added += r.bytes.size();
        if (data_bytes(c) + added <= max_data_bytes) c.records.insert(c.records.end(), copies.begin(), copies.end());
        return;
    }
    if (op == mtp_layer) {
        const std::int64_t k = in.below(3);
        const std::uint8_t kind = in.byte();
        const std::int64_t hidden = config_int(c.config, "hidden_size", 16);
        if (hidden <= 0 || hidden > 256 || layers > INT64_MAX - 3 ||
            data_bytes(c) + std::size_t(4 * (4 * hidden * hidden + 2 * hidden)) > max_data_bytes)
            return;
        const std::string prefix = "model.layers." + std::to_string(layers + k) + ".";
        const std::vector<float> proj(std::size_t(2 * hidden * hidden), 0.25f), gain(std::size_t(hidden), 1.0f);
        if (kind & 1)
            c.records.push_back({prefix + "eh_proj.weight", "F32", {hidden, 2 * hidden}, encode(proj, DType::f32)});
        c.records.push_back({prefix + "enorm.weight", "F32", {hidden}, encode(gain, DType::f32)});
        c.records.push_back({prefix + "hnorm.weight", "F32", {hidden}, encode(gain, DType::f32)});
        if (kind & 2)
            c.records.push_back(
                {prefix + "mlp.down_proj.weight", "F32", {hidden, 2 * hidden}, encode(proj, DType::f32)});
        if (kind & 4) c.config["num_nextn_predict_layers"] = k + 1;
        if ((kind & 1) && (kind & 8)) {  // the eh_proj quantised, with its scale
            for (std::size_t i = 0; i < c.records.size(); ++i)
                if (c.records[i].name == prefix + "eh_proj.weight") {
                    quantize(c, i, moonmoe::default_fp8_block);
                    break;
                }
        }
        for (Record& r : c.records) r.shard = std::min(r.shard, c.shard_count - 1);
        return;
    }

    // The rest edit one record.
    if (c.records.empty()) return;
    const std::size_t i = in.below(c.records.size());
    Record& r = c.records[i];
    switch (op) {
    case set_dtype: r.dtype = in.pick(dtype_names); break;
    case convert: {
        const DType to = in.pick(convert_types);
        if (const auto values = values_of(r)) {
            std::vector<std::uint8_t> bytes = encode(*values, to);
            if (data_bytes(c) - r.bytes.size() + bytes.size() <= max_data_bytes) {
                r.bytes = std::move(bytes);
                r.dtype = std::string(moonmoe::dtype_name(to));
            }
        }
        break;
    }
    case quantize_op: {
        const std::uint8_t choice = in.byte();
        std::array<index_t, 2> block = fp8_block(c.config).value_or(moonmoe::default_fp8_block);
        if (choice != 0) {
            const std::int64_t b = block_sizes[choice % 7];  // the positive small ones
            block = {b, block_sizes[(choice / 7) % 7]};
        }
        quantize(c, i, block);
        break;
    }
    case set_dim: {
        const std::size_t d = in.byte();
        const std::uint8_t choice = in.byte();
        if (!r.shape.is_array()) break;
        if (r.shape.empty()) {
            r.shape.push_back(edge_value(choice, 1));
            break;
        }
        json& extent = r.shape[d % r.shape.size()];
        extent = edge_value(choice, json_int(extent).value_or(0));
        break;
    }
    case reshape: {
        const std::uint8_t kind = in.byte();
        const auto sizes = sizes_of(r.shape);
        const auto n = sizes ? moonmoe::checked_product(*sizes) : std::nullopt;
        switch (kind % 9) {
        case 0:
            if (r.shape.is_array() && !r.shape.empty()) r.shape.erase(r.shape.size() - 1);
            break;
        case 1:
            if (r.shape.is_array()) r.shape.push_back(1);
            break;
        case 2:
            if (r.shape.is_array()) r.shape.insert(r.shape.begin(), 1);
            break;
        case 3:
            if (n) r.shape = json::array({*n});
            break;
        case 4:
            if (r.shape.is_array()) std::reverse(r.shape.begin(), r.shape.end());  // a transposed weight
            break;
        case 5: r.shape = json::array(); break;
        case 6:
            if (n) r.shape = json::array({*n, 1});
            break;
        case 7: r.shape = "[2, 2]"; break;
        default:
            if (sizes && !sizes->empty()) r.shape[0] = double((*sizes)[0]);
        }
        break;
    }
    case move_offsets: {
        const std::uint8_t which = in.byte(), choice = in.byte();
        if (which % 4 == 3) {
            r.form = OffsetForm(choice % std::uint8_t(OffsetForm::count));
            break;
        }
        const auto dtype = dtype_of(r);
        const std::int64_t delta =
            offset_delta(choice, dtype ? std::int64_t(moonmoe::dtype_size(*dtype)) : 4, std::int64_t(r.bytes.size()));
        if (which % 4 != 1) r.begin_delta = clamp64(__int128(r.begin_delta) + delta);
        if (which % 4 != 0) r.end_delta = clamp64(__int128(r.end_delta) + delta);
        break;
    }
    case edit_entry: r.edit = EntryEdit(in.byte() % std::uint8_t(EntryEdit::count)); break;
    case rename: {
        const std::uint8_t kind = in.byte();
        const std::size_t other = in.below(c.records.size());
        const std::int64_t experts = config_int(c.config, "n_routed_experts", 4);
        const std::int64_t mtp = config_int(c.config, "num_nextn_predict_layers", 0);
        std::string name = r.name;
        switch (kind % 12) {
        case 0: name = c.records[other].name; break;
        case 1: name += ".x"; break;
        case 2: name = "__metadata__"; break;
        case 3: name.clear(); break;
        case 4: name = with_layer(name, std::to_string(layers)); break;
        case 5: name = with_layer(name, std::to_string(clamp64(__int128(layers) + mtp))); break;
        case 6: name += "_scale_inv"; break;
        case 7:
            if (!name.empty()) name.pop_back();
            break;
        case 8:
            if (const std::size_t at = name.find(".experts."); at != std::string::npos) {
                const std::size_t end = name.find('.', at + 9);
                if (end != std::string::npos)
                    name = name.substr(0, at + 9) + std::to_string(experts) + name.substr(end);
            }
            break;
        case 9: name.insert(name.size() / 2, 1, '\0'); break;
        case 10: name = with_layer(name, "0" + std::to_string(layer_of(name).value_or(0))); break;
        default:
            if (name.starts_with("model.")) name.erase(0, 6);
            else
                name = "model." + name;
        }
        c.records[i].name = std::move(name);
        break;
    }
    case duplicate: {
        const std::uint8_t where = in.byte();
        if (data_bytes(c) + r.bytes.size() > max_data_bytes) break;
        Record copy = r;
        if (where & 1) copy.shard = (copy.shard + 1) % c.shard_count;
        c.records.insert(c.records.begin() + std::ptrdiff_t(i) + 1, std::move(copy));
        break;
    }
    case drop: c.records.erase(c.records.begin() + std::ptrdiff_t(i)); break;
    case move_record: {
        const std::size_t to = in.below(c.records.size());
        const std::uint8_t shard = in.byte();
        Record moved = std::move(r);
        if (shard & 0x80) moved.shard = shard % c.shard_count;
        c.records.erase(c.records.begin() + std::ptrdiff_t(i));
        c.records.insert(c.records.begin() + std::ptrdiff_t(std::min(to, c.records.size())), std::move(moved));
        break;
    }
    case write_special: {
        const std::uint8_t where = in.byte(), choice = in.byte();
        const auto dtype = dtype_of(r);
        const std::size_t width = dtype ? moonmoe::dtype_size(*dtype) : 4;
        const std::size_t count = r.bytes.size() / width;
        if (count == 0) break;
        const std::size_t element = where == 0 ? 0 : where == 1 ? count - 1 : where == 2 ? count / 2 : where % count;
        const std::vector<std::uint8_t> v = special_value(width, choice);
        std::copy(v.begin(), v.end(), r.bytes.begin() + std::ptrdiff_t(element * width));
        break;
    }
    case swap_bytes: std::swap(r.bytes, c.records[in.below(c.records.size())].bytes); break;
    default: break;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Writing the checkpoint, and what a correct reader must make of it.

// The headers and the index are written by hand for what they mostly hold (strings, integers, arrays of integers),
// nlohmann's dump only for the rest: built with dumps they took a sixth of each run.

void put_string(std::string& out, std::string_view s) {
    static constexpr char hex[] = "0123456789abcdef";
    out += '"';
    for (const char ch : s) {
        const auto c = static_cast<unsigned char>(ch);
        if (c == '"' || c == '\\') out += '\\', out += ch;
        else if (c < 0x20)
            out += "\\u00", out += hex[c >> 4], out += hex[c & 15];
        else
            out += ch;  // names and keys are ASCII or the tables' UTF-8 literals
    }
    out += '"';
}

/// An integer as json_of writes it.
void put_int(std::string& out, __int128 v) {
    char buf[24];
    const auto text = v < 0 ? std::to_chars(buf, buf + sizeof buf, std::int64_t(std::max<__int128>(v, INT64_MIN)))
                            : std::to_chars(buf, buf + sizeof buf, std::uint64_t(std::min<__int128>(v, UINT64_MAX)));
    out.append(buf, text.ptr);
}

void put_value(std::string& out, const json& v) {
    if (v.is_string()) return put_string(out, v.get_ref<const std::string&>());
    if (v.is_number_unsigned()) return put_int(out, v.get<std::uint64_t>());
    if (v.is_number_integer()) return put_int(out, v.get<std::int64_t>());
    if (v.is_array() && std::all_of(v.begin(), v.end(), [](const json& x) { return x.is_number_integer(); })) {
        out += '[';
        for (std::size_t i = 0; i < v.size(); ++i) {
            if (i) out += ',';
            put_value(out, v[i]);
        }
        out += ']';
        return;
    }
    out += dump(v);
}

/// A tensor of a written file that the safetensors rules accept: its record and its bytes in the data section.
struct Placed {
    const Record* record;
    std::uint64_t begin, end;
};

struct BuiltFile {
    std::string name;
    std::string bytes;
    std::size_t data_start = 0;
    bool well_formed = true;      // a reader following the safetensors rules accepts it
    std::vector<Placed> tensors;  // when well_formed
};

/// The elements of a shape as the reader counts them (both in uint64 and left to right in int64), or nullopt.
std::optional<std::uint64_t> element_count(const json& shape) {
    if (!shape.is_array()) return std::nullopt;
    std::uint64_t n = 1;
    index_t signed_n = 1;
    for (const json& d : shape) {
        const auto v = json_int(d);
        if (!v || *v < 0 || __builtin_mul_overflow(n, std::uint64_t(*v), &n)) return std::nullopt;
        const auto next = moonmoe::checked_mul(signed_n, *v);
        if (!next) return std::nullopt;
        signed_n = *next;
    }
    return n;
}

/// Whether the keys are all different.
bool unique(std::vector<std::string_view> keys) {
    std::sort(keys.begin(), keys.end());
    return std::adjacent_find(keys.begin(), keys.end()) == keys.end();
}

BuiltFile build_file(std::string name, const std::vector<const Record*>& records, const ShardExtras& extras) {
    BuiltFile f;
    f.name = std::move(name);
    std::vector<std::uint64_t> natural;
    std::uint64_t cursor = 0;
    for (const Record* r : records) natural.push_back(cursor), cursor += r->bytes.size();
    std::uint64_t data_size = cursor + extras.trailing;
    const auto span = [&](std::size_t i) {  // [begin, end) after the deltas, unclamped
        const Record& r = *records[i];
        return std::pair<__int128, __int128>(__int128(natural[i]) + r.begin_delta,
                                             __int128(natural[i]) + __int128(r.bytes.size()) + r.end_delta);
    };
    for (std::size_t i = 0; i < records.size(); ++i) {
        const auto [begin, end] = span(i);
        if (records[i]->form == OffsetForm::pair && begin >= 0 && begin <= end && end > __int128(data_size) &&
            end <= __int128(cursor + max_extension))
            data_size = std::uint64_t(end);
    }

    // The header, item by item (so that a key may appear twice).
    std::string header = "{";
    std::vector<std::string_view> top_keys;
    const auto key = [&](std::string& out, std::string_view k) {
        if (out.back() != '{') out += ',';
        put_string(out, k);
        out += ':';
    };
    for (int m = 0; m < extras.metadata_objects; ++m) {
        key(header, "__metadata__");
        top_keys.push_back("__metadata__");
        header += '{';
        std::vector<std::string_view> keys;
        for (const auto& [k, v] : extras.metadata) {
            key(header, k);
            put_value(header, v);
            keys.push_back(k);
            if (!v.is_string()) f.well_formed = false;
        }
        header += '}';
        if (!unique(std::move(keys))) f.well_formed = false;
    }
    std::vector<Placed> placed;
    for (std::size_t i = 0; i < records.size(); ++i) {
        const Record& r = *records[i];
        key(header, r.name);
        top_keys.push_back(r.name);
        // the fields as written: dtype, shape, data_offsets, less or more by r.edit
        const auto [begin, end] = span(i);
        std::optional<std::pair<__int128, __int128>> offsets;  // [begin, end] when written as two integers
        std::string offsets_text;
        switch (r.form) {
        case OffsetForm::pair: offsets.emplace(begin, end); break;
        case OffsetForm::reversed: offsets.emplace(end, begin); break;
        case OffsetForm::one: offsets_text = "[" + dump(json_of(begin)) + "]"; break;
        case OffsetForm::three: offsets_text = "[" + dump(json_of(begin)) + "," + dump(json_of(end)) + ",0]"; break;
        case OffsetForm::floats: offsets_text = dump(json::array({double(begin), double(end)})); break;
        case OffsetForm::negative: offsets_text = "[-1," + dump(json_of(end)) + "]"; break;
        case OffsetForm::null: offsets_text = "null"; break;
        case OffsetForm::object:
            offsets_text = "{\"begin\":" + dump(json_of(begin)) + ",\"end\":" + dump(json_of(end)) + "}";
            break;
        default: offsets_text = "\"" + std::to_string(clamp64(begin)) + "," + std::to_string(clamp64(end)) + "\"";
        }
        if (offsets) {
            offsets_text = "[";
            put_int(offsets_text, offsets->first);
            offsets_text += ',';
            put_int(offsets_text, offsets->second);
            offsets_text += ']';
        }
        bool has_dtype = false, has_shape = false, has_offsets = false, twice = false, all_strings = true;
        header += '{';
        const auto field = [&](std::string_view k, bool& seen, const json* value, bool offsets_field) {
            key(header, k);
            if (value) put_value(header, *value);
            else
                header += offsets_text;
            twice = twice || seen;
            seen = true;
            all_strings = all_strings && (offsets_field ? r.form == OffsetForm::text : value->is_string());
        };
        bool extra = false;
        if (r.edit != EntryEdit::no_dtype) field("dtype", has_dtype, &r.dtype, false);
        if (r.edit != EntryEdit::no_shape) field("shape", has_shape, &r.shape, false);
        if (r.edit != EntryEdit::no_offsets) field("data_offsets", has_offsets, nullptr, true);
        static const json note = "x", f32 = "F32";
        if (r.edit == EntryEdit::extra_field) field("dtype_note", extra, &note, false);
        if (r.edit == EntryEdit::dtype_twice) field("dtype", has_dtype, &f32, false);
        if (r.edit == EntryEdit::shape_twice) field("shape", has_shape, &r.shape, false);
        if (r.edit == EntryEdit::offsets_twice) field("data_offsets", has_offsets, nullptr, true);
        header += '}';
        if (twice) f.well_formed = false;
        if (r.name == "__metadata__") {  // read as the metadata object: every value must be a string
            if (!all_strings) f.well_formed = false;
            continue;
        }
        const auto dtype = dtype_of(r);
        const auto count = element_count(r.shape);
        std::uint64_t expected = 0;
        const auto nonnegative = [](__int128 v) { return v >= 0; };  // json_of clamps above UINT64_MAX
        if (!has_dtype || !has_shape || !has_offsets || !dtype || !count ||
            __builtin_mul_overflow(*count, moonmoe::dtype_size(*dtype), &expected) || !offsets ||
            !nonnegative(offsets->first) || !nonnegative(offsets->second)) {
            f.well_formed = false;
            continue;
        }
        const std::uint64_t b = std::uint64_t(std::min<__int128>(offsets->first, UINT64_MAX));
        const std::uint64_t e = std::uint64_t(std::min<__int128>(offsets->second, UINT64_MAX));
        if (b > e || e > data_size || e - b != expected) {
            f.well_formed = false;
            continue;
        }
        placed.push_back({&r, b, e});
    }
    header += '}';
    header.append((8 - header.size() % 8) % 8, ' ');  // the reference writer pads with spaces
    if (!unique(std::move(top_keys))) f.well_formed = false;

    // The tensors tile the data section: sorted by offset, each starts where the previous one ended.
    std::sort(placed.begin(), placed.end(), [](const Placed& x, const Placed& y) {
        return x.begin != y.begin ? x.begin < y.begin : x.end - x.begin < y.end - y.begin;
    });
    std::uint64_t expected_begin = 0;
    for (const Placed& t : placed) {
        if (t.begin != expected_begin) f.well_formed = false;
        expected_begin = t.end;
    }
    if (expected_begin != data_size) f.well_formed = false;
    if (f.well_formed) f.tensors = std::move(placed);

    const std::uint64_t header_size = header.size();
    f.bytes.reserve(8 + header.size() + data_size);
    f.bytes.append(reinterpret_cast<const char*>(&header_size), 8);
    f.bytes += header;
    f.data_start = f.bytes.size();
    for (const Record* r : records) f.bytes.append(reinterpret_cast<const char*>(r->bytes.data()), r->bytes.size());
    f.bytes.resize(f.data_start + data_size, '\0');
    return f;
}

/// The file a shard name of the index names in the directory (the loader's rule), or nullopt if it names none.
std::optional<std::string_view> shard_file(const json& j) {
    if (!j.is_string()) return std::nullopt;
    const std::string_view s = j.get_ref<const std::string&>();
    if (s.empty() || s.find('\0') != s.npos || s.find('\\') != s.npos || s.front() == '/' || s.back() == '/')
        return std::nullopt;
    std::string_view plain;
    std::size_t segments = 0;
    for (std::size_t begin = 0; begin <= s.size();) {
        const std::size_t end = std::min(s.find('/', begin), s.size());
        const std::string_view segment = s.substr(begin, end - begin);
        begin = end + 1;
        if (segment.empty() || segment == ".") continue;
        if (segment == ".." || ++segments > 1) return std::nullopt;
        plain = segment;
    }
    return segments == 1 ? std::optional<std::string_view>(plain) : std::nullopt;
}

struct BuiltIndex {
    std::string text;
    bool valid = true;                              // parse_safetensors_index accepts it
    std::vector<std::pair<std::string, json>> map;  // as written
};

BuiltIndex build_index(const Candidate& c, const std::vector<json>& shard_names) {
    BuiltIndex x;
    std::uint64_t total = 0;
    std::vector<std::string_view> names;
    for (const Record& r : c.records) total += r.bytes.size(), names.push_back(r.name);
    const bool repeated = !unique(names);
    for (std::size_t i = 0; i < c.records.size(); ++i) {  // a tensor held twice is listed once, with its first shard
        const Record& r = c.records[i];
        if (repeated &&
            std::find(names.begin(), names.begin() + std::ptrdiff_t(i), names[i]) != names.begin() + std::ptrdiff_t(i))
            continue;
        x.map.emplace_back(r.name, shard_names[r.shard]);
    }
    std::optional<json> total_size;
    for (const IndexEdit& e : c.index_edits) {
        const std::size_t n = x.map.size();
        const std::size_t k = n ? e.entry % n : 0;
        switch (e.kind % 7) {
        case 0: {  // another shard name for one tensor
            if (!n) break;
            const std::string own = x.map[k].second.is_string() ? x.map[k].second.get<std::string>() : "x";
            const json targets[] = {"model-00009-of-00009.safetensors",
                                    shard_names[(e.value / 16 + 1) % shard_names.size()],
                                    "./" + own,
                                    ".//" + own,
                                    "../" + own,
                                    "sub/" + own,
                                    "/" + own,
                                    "",
                                    "model.safetensors",
                                    own + "/",
                                    nullptr,
                                    7,
                                    ".",
                                    "model.safetensors.index.json",
                                    "config.json",
                                    "./././" + own};
            x.map[k].second = targets[e.value % std::size(targets)];
            break;
        }
        case 1:
            if (n) x.map.erase(x.map.begin() + std::ptrdiff_t(k));
            break;
        case 2: {  // a tensor no shard holds
            const std::string extra[] = {"lm_head.weight_scale_inv", "model.layers.2.eh_proj.weight", "model.norm.bias",
                                         "model.layers.0.input_layernorm.weight"};
            x.map.emplace_back(extra[e.value % std::size(extra)], shard_names[e.value / 16 % shard_names.size()]);
            break;
        }
        case 3:
            if (n) x.map.push_back(x.map[k]);  // listed twice
            break;
        case 4: {
            const json sizes[] = {0, -1, "12", 1e300, UINT64_MAX, nullptr};
            total_size = sizes[e.value % std::size(sizes)];
            break;
        }
        case 5: x.map.clear(); break;
        default:
            if (n) x.map[k].first += e.value % 2 ? ".x" : "_scale_inv";
        }
    }
    x.text = "{\"metadata\":{\"total_size\":";
    if (total_size) put_value(x.text, *total_size);
    else
        put_int(x.text, total);
    x.text += "},\"weight_map\":{";
    names.clear();
    for (const auto& [name, file] : x.map) {
        if (x.text.back() != '{') x.text += ',';
        put_string(x.text, name);
        x.text += ':';
        put_value(x.text, file);
        names.push_back(name);
        if (!shard_file(file)) x.valid = false;
    }
    x.text += "}}\n";
    if (x.map.empty() || !unique(std::move(names))) x.valid = false;
    return x;
}

struct Built {
    std::string config_text;
    std::vector<BuiltFile> files;  // model.safetensors and / or the shards
    std::optional<BuiltIndex> index;
    const BuiltFile* file(std::string_view name) const {
        for (const BuiltFile& f : files)
            if (f.name == name) return &f;
        return nullptr;
    }
};

Built build(const Candidate& c) {
    Built b;
    b.config_text = c.config.dump(2, ' ', false, json::error_handler_t::replace);
    if (c.single_file) {
        std::vector<const Record*> all;
        for (const Record& r : c.records) all.push_back(&r);
        b.files.push_back(build_file("model.safetensors", all, c.shards[0]));
    }
    if (c.index_file) {
        std::vector<json> names;
        for (std::size_t s = 0; s < c.shard_count; ++s)
            names.push_back(moonmoe::detail::shard_file_name(s, c.shard_count));
        for (std::size_t s = 0; s < c.shard_count; ++s) {
            std::vector<const Record*> in_shard;
            for (const Record& r : c.records)
                if (r.shard == s) in_shard.push_back(&r);
            b.files.push_back(build_file(names[s].get<std::string>(), in_shard, c.shards[s]));
        }
        b.index = build_index(c, names);
    }
    return b;
}

void write_file(const fs::path& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    if (!out) fail("cannot write " + path.string());
}

void write_directory(const Built& b) {
    std::error_code ec;
    fs::remove_all(checkpoint_dir, ec);
    if (!fs::create_directory(checkpoint_dir, ec)) fail("cannot create " + checkpoint_dir.string());
    write_file(checkpoint_dir / "config.json", b.config_text);
    for (const BuiltFile& f : b.files) write_file(checkpoint_dir / f.name, f.bytes);
    if (b.index) write_file(checkpoint_dir / "model.safetensors.index.json", b.index->text);
}

// ---------------------------------------------------------------------------------------------------------------
// What a load that succeeded must have done.

bool same_bits(float a, float b) {
    return (std::isnan(a) && std::isnan(b)) || std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}

/// A tensor of a file the loader read, as the safetensors rules make it.
struct TensorView {
    const BuiltFile* file;
    DType dtype;
    std::vector<index_t> shape;
    std::size_t offset;  // into file->bytes
};

TensorView view_of(const BuiltFile& f, const Placed& t) {
    return {&f, *dtype_of(*t.record), *sizes_of(t.record->shape), f.data_start + std::size_t(t.begin)};
}

float element(const TensorView& v, std::size_t k) {
    const char* p = v.file->bytes.data() + v.offset;
    const auto load = [&]<class T>(T) {
        T x;
        std::memcpy(&x, p + k * sizeof(T), sizeof(T));
        return x;
    };
    switch (v.dtype) {
    case DType::f32: return load(float{});
    case DType::f64: return float(load(double{}));
    case DType::bf16: return std::bit_cast<float>(std::uint32_t(load(std::uint16_t{})) << 16);
    case DType::f16: return moonmoe::f16{load(std::uint16_t{})}.to_float();
    case DType::f8_e4m3: return moonmoe::f8_e4m3{load(std::uint8_t{})}.to_float();
    default: fail("a weight of a non-floating dtype was loaded");
    }
}

void check_loaded(Model& model, const Candidate& c, const Built& b, const Options& o,
                  const std::vector<std::string>& opened) {
    using moonmoe::ParamRef;
    // The files the loader read obey the format, and the tensors it saw are these (no view: in a shard never
    // opened, which Shards::as_needed allows).
    std::map<std::string_view, std::optional<TensorView>, std::less<>> found;
    if (c.single_file) {
        const BuiltFile& f = b.files.front();
        require(f.well_formed, "loaded a model.safetensors that breaks the safetensors rules");
        for (const Placed& t : f.tensors) found.emplace(t.record->name, view_of(f, t));
    } else {
        require(b.index && b.index->valid, "loaded with an index that names a tensor twice, none, or a shard outside");
        std::map<std::string_view, std::string_view, std::less<>> shard_of;  // tensor -> shard file
        for (const auto& [name, file] : b.index->map) shard_of.emplace(name, *shard_file(file));
        std::set<std::string_view, std::less<>> read(opened.begin(), opened.end());
        if (!o.as_needed)
            for (const auto& [name, file] : shard_of) read.insert(file);
        std::map<std::string_view, std::map<std::string_view, const Placed*, std::less<>>, std::less<>> held;
        for (const std::string_view file : read) {
            const BuiltFile* f = b.file(file);
            require(f != nullptr, "loaded with an index naming a missing shard " + std::string(file));
            require(f->well_formed, "loaded a shard that breaks the safetensors rules: " + std::string(file));
            for (const Placed& t : f->tensors) {
                const auto it = shard_of.find(t.record->name);
                require(it != shard_of.end() && it->second == file,
                        "shard " + std::string(file) + " holds '" + t.record->name +
                            "', which the index maps elsewhere or not at all");
                held[file][t.record->name] = &t;
            }
        }
        for (const auto& [name, file] : shard_of) {
            if (!read.count(file)) {
                found.emplace(name, std::nullopt);
                continue;
            }
            const auto t = held[file].find(name);
            require(t != held[file].end(),
                    "the index maps '" + std::string(name) + "' to " + std::string(file) + ", which lacks it");
            found.emplace(name, view_of(*b.file(file), *t->second));
        }
    }

    // The model is config.json's, within the budget.
    moonmoe::HFConfig hf;
    moonmoe::ModelConfig want;
    try {
        hf = moonmoe::parse_hf_config(b.config_text, "fuzz config.json");
        want = moonmoe::resolve(moonmoe::AnyDeepSeekV3::config, hf);
    } catch (const std::exception& e) {
        fail(std::string("loaded a checkpoint whose config.json does not resolve: ") + e.what());
    }
    const moonmoe::ModelConfig& got = model.config;
    require(got.dims.hidden == want.dims.hidden && got.dims.layers == want.dims.layers &&
                got.dims.dense_layers == want.dims.dense_layers && got.dims.vocab == want.dims.vocab &&
                got.dims.dense_hidden == want.dims.dense_hidden && got.attention.heads == want.attention.heads &&
                got.attention.q_rank == want.attention.q_rank && got.attention.kv_rank == want.attention.kv_rank &&
                got.attention.nope_dim == want.attention.nope_dim &&
                got.attention.rope_dim == want.attention.rope_dim && got.attention.v_dim == want.attention.v_dim &&
                got.moe.experts == want.moe.experts && got.moe.top_k == want.moe.top_k &&
                got.moe.shared == want.moe.shared && got.moe.expert_hidden == want.moe.expert_hidden &&
                got.moe.groups == want.moe.groups && got.moe.top_groups == want.moe.top_groups &&
                got.rope.max_positions == want.rope.max_positions,
            "the loaded model's configuration is not config.json's");
    require(got.dims.layers == config_int(c.config, "num_hidden_layers", -1) &&
                got.dims.hidden == config_int(c.config, "hidden_size", -1) &&
                got.dims.vocab == config_int(c.config, "vocab_size", -1),
            "the loaded model's sizes are not config.json's fields");
    const moonmoe::MemoryEstimate estimate = moonmoe::estimate_model_memory(got, "fuzz", o.load.with_optimizer_state);
    require(estimate.total_bytes() <= *o.load.memory_limit, "loaded a model above memory_limit");

    // Every parameter is its record, bit for bit.
    const auto block = fp8_block(c.config);
    std::set<std::string, std::less<>> params, fp8_params;
    double parameters = 0;
    model.visit_params([&](const ParamRef& p) {
        const std::string at = "parameter '" + p.name + "'";
        params.insert(p.name);
        parameters += double(p.numel());
        require(p.value != nullptr || (p.stored_bf16 && p.value16 != nullptr), at + " has no values");
        const auto it = found.find(p.name);
        require(it != found.end() && it->second, at + " loaded without a tensor of that name in a file read");
        const TensorView& v = *it->second;
        require(v.shape == p.shape, at + " loaded from a tensor of another shape");
        require(v.dtype == DType::f32 || v.dtype == DType::bf16 || v.dtype == DType::f16 || v.dtype == DType::f64 ||
                    v.dtype == DType::f8_e4m3,
                at + " loaded from a tensor of dtype " + std::string(moonmoe::dtype_name(v.dtype)));
        const auto scale = found.find(p.name + "_scale_inv");
        const std::size_t n = std::size_t(p.numel());
        // A parameter stored in bf16 holds a BF16 record's bits as they are, any other record rounded to nearest.
        const auto loaded = [&](std::size_t k, float expected) {
            if (p.value) return same_bits(p.value[k], expected);
            const moonmoe::bf16 got = p.value16[k];
            if (v.dtype == DType::bf16) return got.bits == (std::bit_cast<std::uint32_t>(expected) >> 16);
            return same_bits(got.to_float(), moonmoe::bf16::from_float(expected).to_float());
        };
        const auto value = [&](std::size_t k) { return p.value ? p.value[k] : p.value16[k].to_float(); };
        if (v.dtype != DType::f8_e4m3) {
            require(scale == found.end(), at + " is not FP8 but loaded beside a _scale_inv");
            for (std::size_t k = 0; k < n; ++k)
                if (!loaded(k, element(v, k))) fail(at + " differs from its record at " + std::to_string(k));
        } else {
            fp8_params.insert(p.name);
            require(block.has_value(), at + " dequantised with an invalid quantization_config");
            require(scale != found.end() && scale->second, at + " is FP8 but loaded without a _scale_inv");
            require(v.shape.size() == 2, at + " is an FP8 tensor of rank other than 2");
            const TensorView& s = *scale->second;
            const auto want_shape = scale_shape(v.shape[0], v.shape[1], *block);
            require(s.dtype == DType::f32 && s.shape.size() == 2 && s.shape[0] == want_shape[0] &&
                        s.shape[1] == want_shape[1],
                    at + "_scale_inv is not F32 of the blocks' shape");
            const index_t cols = v.shape[1];
            for (std::size_t k = 0; k < n; ++k) {
                const index_t row = index_t(k) / cols, col = index_t(k) % cols;
                const float sc = element(s, std::size_t((row / (*block)[0]) * want_shape[1] + col / (*block)[1]));
                if (!std::isfinite(sc)) fail(at + " dequantised with a non-finite block scale");
                if (!loaded(k, element(v, k) * sc)) fail(at + " differs from its dequantised record");
            }
        }
        if (o.load.check_finite)
            for (std::size_t k = 0; k < n; ++k)
                if (!std::isfinite(value(k))) fail(at + " holds a non-finite value despite check_finite");
    });
    require(parameters == estimate.parameters, "estimate_model_memory counts other parameters than the model has");

    // Nothing of the checkpoint was left out but the scales of FP8 weights and the MTP modules.
    const std::int64_t layers = got.dims.layers, mtp = hf.mtp_layers;
    for (const auto& [name, where] : found) {
        if (params.count(name)) continue;
        if (name.ends_with("_scale_inv") && fp8_params.count(name.substr(0, name.size() - 10))) continue;
        const auto layer = layer_of(name);
        require(layer && *layer >= layers && *layer - layers < mtp &&
                    found.count("model.layers." + std::to_string(*layer) + ".eh_proj.weight"),
                "loaded a checkpoint holding '" + std::string(name) + "', which the model has no place for");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Set-up.

fs::path pick_work_root() {
    const char* const roots[] = {"/dev/shm", std::getenv("TMPDIR"), "/tmp"};
    for (const char* root : roots)
        if (root && *root && fs::is_directory(root) && ::access(root, W_OK) == 0) return root;
    return fs::temp_directory_path();
}

/// Removes the directories of fuzz_checkpoint processes that are gone (a crash leaves its directory behind).
void remove_stale(const fs::path& root, std::string_view prefix) {
    std::error_code ec;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (!name.starts_with(prefix)) continue;
        const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
        if (pid > 0 && ::kill(pid_t(pid), 0) != 0 && errno == ESRCH) fs::remove_all(it->path(), ec);
    }
}

void make_bases() {
    const moonmoe::HFConfig hf = moonmoe::parse_hf_config(base_config, "fuzz_checkpoint base_config");
    Model model(moonmoe::resolve(moonmoe::AnyDeepSeekV3::config, hf));
    moonmoe::nn::init_weights(model, {.seed = 1});
    constexpr DType stores[] = {DType::f32, DType::bf16, DType::f16};
    for (std::size_t s = 0; s < 3; ++s) {
        const fs::path dir = work_dir / ("base-" + std::string(moonmoe::dtype_name(stores[s])));
        moonmoe::save_transformer(dir, model, {.store = stores[s]});
        std::ifstream config(dir / "config.json");
        bases[s].config = json::parse(config);
        const moonmoe::SafetensorsFile file(dir / "model.safetensors");
        for (const moonmoe::TensorRecord& r : file.records()) {
            const auto* p = reinterpret_cast<const std::uint8_t*>(r.bytes.data());
            bases[s].records.push_back(Record{r.name, std::string(moonmoe::dtype_name(r.dtype)), json(r.shape),
                                              std::vector<std::uint8_t>(p, p + r.bytes.size())});
        }
        moonmoe_fuzz::fuzz_require(bases[s].records.size() > 20, "the base checkpoint has its tensors");
    }
    bases[3] = fp8_base(bases[0]);
}

/// An operand of a seed's edit: a byte, or the record of that name (its index when the edit is applied).
using Operand = std::variant<int, std::string>;

/// The bytes of a program: two option bytes, then each edit as {Op, operands...}.
std::vector<std::uint8_t> program(std::uint8_t options, std::uint8_t options2,
                                  std::initializer_list<std::vector<Operand>> edits) {
    std::vector<std::uint8_t> bytes{options, options2};
    for (const std::vector<Operand>& edit : edits) {
        Reader in(bytes.data(), bytes.size());  // the checkpoint as the edits so far leave it
        const Options o = read_options(in);
        Candidate c = initial(o);
        while (!in.empty()) apply(c, in);
        for (const Operand& x : edit) {
            if (const int* v = std::get_if<int>(&x)) {
                bytes.push_back(std::uint8_t(*v));
                continue;
            }
            const auto& name = std::get<std::string>(x);
            const auto it =
                std::find_if(c.records.begin(), c.records.end(), [&](const Record& r) { return r.name == name; });
            if (it == c.records.end()) fail("write_seeds: no record " + name);
            bytes.push_back(std::uint8_t(it - c.records.begin()));
        }
    }
    return bytes;
}

/// The committed seeds (fuzz/corpus/checkpoint), as programs of Op.
void write_seeds(const fs::path& dir) {
    const std::string o_proj = "model.layers.1.self_attn.o_proj.weight", norm = "model.norm.weight";
    const std::string expert = "model.layers.1.mlp.experts.3.down_proj.weight";
    const std::string layer0_norm = "model.layers.0.input_layernorm.weight",
                      layer0_post_norm = "model.layers.0.post_attention_layernorm.weight";
    constexpr std::uint8_t finite = 1, tiny_budget = 2 << 2, two_shards = 1 << 4, three_shards = 2 << 4, both = 3 << 4,
                           bf16 = 1 << 6, f16 = 2 << 6, fp8 = 3 << 6, as_needed = 1, bf16_weights = 2;
    const std::vector<std::pair<std::string, std::vector<std::uint8_t>>> seeds = {
        {"pristine", {}},
        {"check_finite_bf16", program(finite | bf16, 0, {})},
        {"f16_two_shards", program(f16 | two_shards, 0, {})},
        {"fp8_three_shards_as_needed", program(fp8 | three_shards, as_needed, {})},
        {"bf16_into_bf16_weights", program(bf16 | finite, bf16_weights, {})},
        {"fp8_into_bf16_weights", program(fp8 | two_shards, bf16_weights | as_needed, {})},
        {"bf16_scale_into_bf16_weights", program(bf16, bf16_weights, {{quantize_op, o_proj, 0}, {convert, o_proj, 1}})},
        {"single_file_beside_index", program(both, 0, {})},
        {"below_memory_limit", program(tiny_budget, 0, {})},
        {"nan_with_check_finite", program(finite, 0, {{write_special, o_proj, 5, 0}})},
        {"transposed_weight", program(0, 0, {{reshape, o_proj, 4}})},
        {"offset_by_one", program(two_shards, 0, {{move_offsets, norm, 2, 0}})},
        {"fp8_wrong_block", program(fp8, 0, {{quant_config, 1, 2, 6}})},
        {"fp8_nan_scale", program(fp8 | finite, 0, {{write_special, o_proj + "_scale_inv", 0, 0}})},
        {"quantize_one", program(0, 0, {{quantize_op, o_proj, 0}})},
        {"hidden_size_plus_one", program(0, 0, {{config_set, 1, 1}})},
        {"mtp_module", program(0, 0, {{mtp_layer, 0, 1 | 4}})},
        {"layer_past_the_model", program(0, 0, {{copy_layer, 1, 0}})},
        {"expert_past_the_model", program(0, 0, {{rename, expert, 8, 0}})},
        {"index_to_missing_shard", program(three_shards, 0, {{index_edit, 0, 7, 0}})},
        {"e5m2_weight", program(0, 0, {{convert, o_proj, 5}})},
        {"swap_norms", program(0, 0, {{swap_bytes, norm, layer0_norm}})},
        {"moved_record", program(two_shards, 0, {{move_record, norm, 0, 0x81}})},
        {"metadata_number", program(0, 0, {{metadata, 0, 0, 1, 3}})},
        {"duplicate_other_shard", program(two_shards, 0, {{duplicate, norm, 1}})},
        // Longer programs (libFuzzer grows its inputs from the longest seed): edits that keep the checkpoint valid,
        // then the same with edits that break it.
        {"fp8_shards_valid_edits", program(fp8 | three_shards | finite, as_needed,
                                           {{index_edit, 0, 3, 2},      // "./" before a shard name
                                            {move_record, norm, 0, 0},  // another data order
                                            {swap_bytes, layer0_norm, layer0_post_norm},
                                            {mtp_layer, 0, 1 | 4 | 8},  // an FP8 MTP module, declared
                                            {metadata, 1, 0, 4, 2},     // another metadata string
                                            {config_set, 44, 5}})},     // bos_token_id 0
        {"fp8_shards_broken_edits", program(fp8 | three_shards | finite, as_needed,
                                            {{index_edit, 0, 3, 2},
                                             {move_record, norm, 0, 0},
                                             {swap_bytes, layer0_norm, layer0_post_norm},
                                             {mtp_layer, 0, 1 | 4 | 8},
                                             {write_special, o_proj, 2, 1},  // an F8 NaN code
                                             {quant_config, 1, 2, 6},        // [3, 128] blocks
                                             {move_offsets, norm, 2, 10},    // onto the next tensor
                                             {rename, expert, 5, 0}})},      // into the MTP layer
    };
    fs::create_directories(dir);
    for (const auto& [name, bytes] : seeds)
        write_file(dir / name, std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
    std::fprintf(stderr, "fuzz_checkpoint: wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
}

/// Loads the checkpoint directory as load_transformer does, or (Options::as_needed) through a Checkpoint that opens
/// each shard when a tensor in it is first read; `opened` gets the files that Checkpoint opened.
template <class Type>
void load_as(const Options& options, std::optional<Model>& model, std::vector<std::string>& opened) {
    if (!options.as_needed) {
        model.emplace(moonmoe::load_transformer<Type>(checkpoint_dir, options.load));
        return;
    }
    moonmoe::Checkpoint ck(checkpoint_dir, moonmoe::Checkpoint::Shards::as_needed);
    const moonmoe::ModelConfig config = moonmoe::resolve(Type::config, ck.config());
    moonmoe::check_memory_budget(config, ck.config().source, options.load.memory_limit,
                                 options.load.with_optimizer_state);
    Model m(config);
    moonmoe::load_weights(m, ck, options.load);
    for (const std::string& path : ck.files()) opened.push_back(fs::path(path).filename().string());
    model.emplace(std::move(m));
}

void load(const Options& options, std::optional<Model>& model, std::vector<std::string>& opened) {
    using moonmoe::BF16;
    if (options.bf16_weights)
        return load_as<moonmoe::AnyDeepSeekV3::with<moonmoe::Precision<BF16, moonmoe::Weights<BF16>>>>(options, model,
                                                                                                       opened);
    load_as<moonmoe::AnyDeepSeekV3>(options, model, opened);
}

/// fuzz/dict/checkpoint.dict: whole edits as byte strings, for libFuzzer to insert into programs (record operands
/// are those of the F32 single-file base).
void write_dictionary(const fs::path& file) {
    std::string text =
        "# fuzz/dict/checkpoint.dict: whole edits of fuzz_checkpoint's programs (enum Op in fuzz/checkpoint.cpp).\n"
        "# Written by the target: MOONMOE_FUZZ_WRITE_DICT=fuzz/dict/checkpoint.dict build-fuzz/fuzz/fuzz_checkpoint "
        "-runs=0\n";
    const auto entry = [&](std::string name, const std::vector<std::uint8_t>& bytes) {
        static constexpr char hex[] = "0123456789abcdef";
        std::replace(name.begin(), name.end(), '/', '_');
        text += name + "=\"";
        for (std::size_t i = 2; i < bytes.size(); ++i)  // without the option bytes
            text += "\\x", text += hex[bytes[i] >> 4], text += hex[bytes[i] & 15];
        text += "\"\n";
    };
    const std::string records[] = {"model.layers.1.self_attn.o_proj.weight", "model.norm.weight",
                                   "model.layers.1.mlp.experts.3.down_proj.weight", "model.embed_tokens.weight",
                                   "model.layers.1.mlp.gate.e_score_correction_bias"};
    for (std::size_t f = 0; f < std::size(config_fields); ++f) {
        const std::string field = std::string(config_fields[f]).substr(1);
        for (const int value : {1, 5, 12, 16, 23}) {  // +1, 0, -1, INT64_MAX, null
            entry("config_" + field + "_" + std::to_string(value), program(0, 0, {{config_set, int(f), value}}));
        }
        entry("erase_" + field, program(0, 0, {{config_erase, int(f), 0}}));
    }
    for (int k = 0; k < 7; ++k) entry("quant_config_" + std::to_string(k), program(0, 0, {{quant_config, k, 2, 6}}));
    for (int k = 0; k < 7; ++k)
        for (const int v : {0, 2, 4, 10})
            entry("index_" + std::to_string(k) + "_" + std::to_string(v), program(0, 0, {{index_edit, k, 3, v}}));
    for (const int k : {1, 5, 7, 13}) entry("mtp_" + std::to_string(k), program(0, 0, {{mtp_layer, 0, k}}));
    for (const int to : {0, 1, 2, 3, 6})
        entry("copy_layer_" + std::to_string(to), program(0, 0, {{copy_layer, 1, to}}));
    for (std::size_t r = 0; r < std::size(records); ++r) {
        const std::string n = "r" + std::to_string(r) + "_";
        entry(n + "quantize", program(0, 0, {{quantize_op, records[r], 0}}));
        entry(n + "transpose", program(0, 0, {{reshape, records[r], 4}}));
        entry(n + "to_bf16", program(0, 0, {{convert, records[r], 1}}));
        entry(n + "dim_plus_one", program(0, 0, {{set_dim, records[r], 0, 1}}));
        entry(n + "nan", program(0, 0, {{write_special, records[r], 2, 0}}));
        entry(n + "mtp_layer", program(0, 0, {{rename, records[r], 5, 0}}));
        entry(n + "end_plus_4", program(0, 0, {{move_offsets, records[r], 1, 4}}));
    }
    write_file(file, text);
    std::fprintf(stderr, "fuzz_checkpoint: wrote %s\n", file.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    const fs::path root = pick_work_root();
    const std::string prefix = "moonmoe-fuzz-checkpoint-";
    remove_stale(root, prefix);
    work_dir = root / (prefix + std::to_string(::getpid()));
    checkpoint_dir = work_dir / "ck";
    std::error_code ec;
    fs::remove_all(work_dir, ec);  // a directory of an earlier process with this pid
    fs::create_directories(work_dir);
    std::atexit([] {
        std::error_code ignored;
        fs::remove_all(work_dir, ignored);
    });
    try {
        make_bases();
    } catch (const std::exception& e) {
        fail(std::string("cannot make the base checkpoint: ") + e.what());
    }
    verbose = std::getenv("MOONMOE_FUZZ_VERBOSE") != nullptr;
    if (const char* seeds = std::getenv("MOONMOE_FUZZ_WRITE_SEEDS")) write_seeds(seeds);
    if (const char* dictionary = std::getenv("MOONMOE_FUZZ_WRITE_DICT")) write_dictionary(dictionary);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    Reader in(data, size);
    const Options options = read_options(in);
    Candidate c = initial(options);
    std::size_t ops = 0;
    for (; ops < max_ops && !in.empty(); ++ops) apply(c, in);
    const Built built = build(c);
    write_directory(built);

    std::optional<Model> model;
    std::vector<std::string> opened;
    moonmoe_fuzz::expect_documented_errors([&] {
        if (!verbose) return load(options, model, opened);
        try {
            load(options, model, opened);
            std::fprintf(stderr, "fuzz_checkpoint: %zu edits, loaded\n", ops);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "fuzz_checkpoint: %zu edits, refused: %s\n", ops, e.what());
            throw;
        }
    });
    if (ops == 0)  // the checkpoint as the library saved it, in any layout and base dtype
        moonmoe_fuzz::fuzz_require(model.has_value() != options.tiny_limit,
                                   "the unedited checkpoint loads, and is refused below its memory need");
    if (model) check_loaded(*model, c, built, options, opened);
    return 0;
}

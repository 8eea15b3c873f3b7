// moonmoe/io/safetensors_index.hpp: the weight map of a sharded checkpoint's model.safetensors.index.json.
//
// The index (transformers' save_pretrained, huggingface_hub's split_torch_state_dict_into_shards) reads
//   {"metadata": {"total_size": ...}, "weight_map": {"<tensor name>": "<shard file>", ...}}
// A shard must be a file of the checkpoint directory itself. "./model-00001-of-00003.safetensors" is accepted and
// normalised to the plain name, since transformers joins the name onto the directory and so loads it; absolute
// paths, "..", subdirectories, empty names and NUL bytes are refused, so an index never reaches outside its
// directory. The text is checked for nesting deeper than 128 levels before it is parsed (detail/json.hpp), and a
// tensor listed twice is refused rather than silently taking the last entry.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "detail/json.hpp"
#include "error.hpp"

namespace moonmoe {

/// Tensor name -> shard file name (a plain file name of the checkpoint directory), sorted by tensor name.
using WeightMap = std::map<std::string, std::string, std::less<>>;

namespace detail {

/// Why `file` does not name a file of the checkpoint directory itself, or "" when it does; `plain` then gets the
/// name without its "./" segments. Backslashes are refused too: on Windows they separate directories.
inline std::string shard_file_problem(std::string_view file, std::string& plain) {
    if (file.empty()) return "the name is empty";
    if (file.find('\0') != std::string_view::npos) return "the name contains a NUL byte";
    if (file.find('\\') != std::string_view::npos) return "the name contains a backslash";
    if (file.front() == '/') return "it is an absolute path";
    if (file.back() == '/') return "it names a directory";
    plain.clear();
    std::size_t segments = 0;
    for (std::size_t begin = 0; begin <= file.size();) {
        const std::size_t end = std::min(file.find('/', begin), file.size());
        const std::string_view segment = file.substr(begin, end - begin);
        begin = end + 1;
        if (segment.empty() || segment == ".") continue;  // "./x", ".//x": the directory itself
        if (segment == "..") return "it goes up with '..'";
        if (++segments > 1) return "it is in a subdirectory";
        plain = segment;
    }
    if (segments == 0) return "it names the directory itself";
    return "";
}

}  // namespace detail

/// Parses the text of a model.safetensors.index.json; `where` (the path) starts every error message.
/// Throws io_error on invalid JSON, nesting deeper than detail::max_json_depth, a missing or empty "weight_map"
/// object, an entry that is not a string, a tensor listed twice, or a shard that is not a file of the directory.
inline WeightMap parse_safetensors_index(std::string_view text, const std::string& where) {
    if (const auto at = detail::json_too_deep(text))
        throw io_error(where + ": nests deeper than " + std::to_string(detail::max_json_depth) + " levels (at byte " +
                       std::to_string(*at) + ")");
    if (const auto nul = detail::json_nul_byte(text))
        throw io_error(where + ": has a NUL byte at offset " + std::to_string(*nul) + " of " +
                       std::to_string(text.size()) + "; a JSON index holds none (is the file truncated or padded?)");

    // nlohmann keeps the last of duplicate keys; the parser callback sees each of them, so a twice-listed tensor
    // (which shard would be meant?) is refused here.
    std::string top_key;
    bool seen_weight_map = false;
    std::set<std::string, std::less<>> listed;
    const auto on_event = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (event != nlohmann::json::parse_event_t::key) return true;
        const auto& key = parsed.get_ref<const std::string&>();
        if (depth == 1) {
            top_key = key;
            if (key == "weight_map" && std::exchange(seen_weight_map, true))
                throw io_error(where + ": \"weight_map\" appears twice");
        } else if (depth == 2 && top_key == "weight_map" && !listed.insert(key).second) {
            throw io_error(where + ": tensor " + detail::quoted(key) + " appears twice in weight_map");
        }
        return true;
    };
    nlohmann::json index;
    try {
        index = nlohmann::json::parse(text.begin(), text.end(), on_event);
    } catch (const nlohmann::json::exception& e) {
        throw io_error(where + ": not valid JSON: " + e.what());
    }
    const auto found = index.find("weight_map");  // end() for a non-object too
    if (found == index.end()) throw io_error(where + ": no \"weight_map\" object");
    const nlohmann::json& map = *found;
    if (!map.is_object())
        throw io_error(where + ": \"weight_map\" is " + map.type_name() +
                       ", not an object mapping tensor names to shard files");
    if (map.empty()) throw io_error(where + ": \"weight_map\" is empty; it must list every tensor of the checkpoint");

    WeightMap out;
    std::string plain;
    for (const auto& [name, file] : map.items()) {
        const std::string tensor = "tensor " + detail::quoted(name);
        if (!file.is_string())
            throw io_error(where + ": weight_map entry of " + tensor + " is " + file.type_name() +
                           ", not a shard file name");
        const auto& file_name = file.get_ref<const std::string&>();
        if (const std::string problem = detail::shard_file_problem(file_name, plain); !problem.empty())
            throw io_error(where + ": shard " + detail::quoted(file_name) + " of " + tensor +
                           " is not a file in the checkpoint directory: " + problem);
        out.emplace(name, plain);
    }
    return out;
}

}  // namespace moonmoe

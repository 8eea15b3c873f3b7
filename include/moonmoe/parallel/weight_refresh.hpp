// moonmoe/parallel/weight_refresh.hpp: the training layout's updated parameters into a decoding model on every rank,
// as Kimi K2's checkpoint engine moves them between RL iterations (Kimi K2 technical report, section 3.3.2: every
// worker broadcasts what it holds so that all get the full parameter set, parameter by parameter in a pipeline, and
// the inference engine takes the shards it needs).
//
//   parallel::WeightRefresh refresh(training_part, world);     // collective: learns who holds what, once
//   nn::Transformer<cpu> decoding(config_without_parallelism); // this rank's decoding model: whole, or a part
//   const parallel::RefreshReport r = refresh.into(decoding);  // collective, after every optimizer step
//
// Every parameter of the whole model has one owner, the lowest world rank whose training part holds it (ZeRO-1
// leaves every rank of a part with its whole parameters after a step). In a fixed order (the owners' in turn, each
// in its visit order) each parameter is broadcast from its owner to every rank, in pieces of at most
// `piece_floats` values through one host buffer (the bytes in flight are bounded, not the whole model); each rank
// copies what its decoding model holds and drops the rest. Then the decoding model's bf16 working copies are
// re-rounded. The values moved are the parameters' f32 values (or, for a parameter stored in bf16, its bf16 values),
// so the decoding model holds the training weights bit for bit.
//
// The broadcast is an all-gather in which only the owner contributes (Communicator::all_gather_v), over host memory:
// an MPI world, or any communicator whose buffers are host memory (device_memory() false). The report counts, per
// rank and per refresh, the bytes it sent as an owner (to every other rank), the bytes it received, those it kept,
// and the seconds the refresh took.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstddef>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "../nn/transformer.hpp"
#include "../tensor/transfer.hpp"
#include "comm.hpp"

namespace moonmoe::parallel {

struct RefreshReport {
    index_t parameters = 0;            ///< tensors broadcast (every parameter of the whole model once)
    std::uint64_t bytes_sent = 0;      ///< by this rank, as an owner, to every other rank
    std::uint64_t bytes_received = 0;  ///< from the owners of the parameters this rank does not own
    std::uint64_t bytes_kept = 0;      ///< written into this rank's decoding model
    double seconds = 0;                ///< wall time of the refresh on this rank
};

template <class B = cpu>
class WeightRefresh {
public:
    /// Collective over `world`: every rank passes its training part (a whole model in one process, else its part).
    WeightRefresh(nn::Transformer<B>& training, Communicator& world, index_t piece_floats = index_t(1) << 22)
        : training_(training), world_(world), piece_(piece_floats) {
        if (world.device_memory())
            throw std::invalid_argument(world.where("WeightRefresh") +
                                        ": the refresh stages through host memory and needs a host-memory "
                                        "communicator (MPI); this one moves device memory");
        if (piece_floats < 1) throw std::invalid_argument("WeightRefresh: piece_floats must be positive");
        // every rank's parameter list (name, elements, bf16 storage), gathered as text: "name\tnumel\tbf16\n"
        std::string mine;
        training.visit_params([&](const ParamRef& p) {
            mine += p.name + "\t" + std::to_string(p.numel()) + "\t" + (p.stored_bf16 ? "1" : "0") + "\n";
        });
        const int n = world.size();
        std::vector<index_t> sizes(std::size_t(n), 0), one = { index_t(mine.size()) };
        world.all_gather(std::span<const index_t>(one), std::span<index_t>(sizes));
        index_t total = 0;
        for (index_t s : sizes) total += s;
        std::vector<std::byte> all(static_cast<std::size_t>(total));
        world.all_gather_v(std::as_bytes(std::span<const char>(mine.data(), mine.size())), std::span<std::byte>(all),
                           sizes);
        std::map<std::string, std::size_t> seen;
        std::size_t at = 0;
        for (int r = 0; r < n; ++r) {
            const std::string text(reinterpret_cast<const char*>(all.data()) + at, std::size_t(sizes[std::size_t(r)]));
            at += std::size_t(sizes[std::size_t(r)]);
            std::size_t line = 0;
            while (line < text.size()) {
                const std::size_t end = text.find('\n', line), t1 = text.find('\t', line), t2 = text.find('\t', t1 + 1);
                Entry e{text.substr(line, t1 - line), std::stoll(text.substr(t1 + 1, t2 - t1 - 1)), text[t2 + 1] == '1',
                        r};
                line = end + 1;
                const auto [it, fresh] = seen.emplace(e.name, entries_.size());
                if (fresh) entries_.push_back(std::move(e));
                else if (entries_[it->second].numel != e.numel || entries_[it->second].bf16 != e.bf16)
                    throw std::invalid_argument(world.where("WeightRefresh") + ": parameter '" + e.name + "' has " +
                                                std::to_string(e.numel) + " elements on rank " + std::to_string(r) +
                                                " and " + std::to_string(entries_[it->second].numel) + " on rank " +
                                                std::to_string(entries_[it->second].owner));
            }
        }
    }

    /// The parameters of the whole model, in the refresh's order, with their owners.
    struct Entry {
        std::string name;
        index_t numel;
        bool bf16;
        int owner;
    };
    const std::vector<Entry>& entries() const { return entries_; }

    /// Collective: every parameter to every rank; `decoding` keeps those it holds (by name; each of its parameters
    /// must be one of the training model's, with the same size). Returns this rank's report.
    template <class D>
    RefreshReport into(nn::Transformer<D>& decoding) {
        const auto start = std::chrono::steady_clock::now();
        std::map<std::string, ParamRef> mine, wanted;
        training_.visit_params([&](const ParamRef& p) { mine.emplace(p.name, p); });
        decoding.visit_params([&](const ParamRef& p) { wanted.emplace(p.name, p); });
        std::map<std::string, const Entry*> by_name;
        for (const Entry& e : entries_) by_name.emplace(e.name, &e);
        // checked before any byte moves, and agreed: a rank whose decoding model does not fit refuses, and so does
        // every other rank (none is left waiting in a broadcast)
        std::string problem;
        for (const auto& [name, p] : wanted) {
            const auto it = by_name.find(name);
            if (it == by_name.end())
                problem = "the decoding model's parameter '" + name + "' is not one of the training model's";
            else if (it->second->numel != p.numel() || it->second->bf16 != p.stored_bf16)
                problem = "the decoding model's '" + name + "' has " + std::to_string(p.numel()) +
                          (p.stored_bf16 ? " bf16" : " f32") + " values, the training model's " +
                          std::to_string(it->second->numel) + (it->second->bf16 ? " bf16" : " f32");
            if (!problem.empty()) break;
        }
        std::vector<index_t> refused = {problem.empty() ? index_t(-1) : index_t(world_.rank())};
        world_.all_reduce(std::span<index_t>(refused), ReduceOp::max);
        if (refused[0] >= 0)
            throw std::invalid_argument(world_.where("WeightRefresh::into") + ": " +
                                        (problem.empty() ? "rank " + std::to_string(refused[0]) +
                                                               "'s decoding model does not fit the training model "
                                                               "(its message names the parameter)"
                                                         : problem));
        RefreshReport r;
        const int me = world_.rank(), n = world_.size();
        std::vector<float> out, in;
        std::vector<bf16> out16, in16;
        std::vector<index_t> counts(std::size_t(n), 0);
        for (const Entry& e : entries_) {
            ++r.parameters;
            const ParamRef* src = e.owner == me ? &mine.at(e.name) : nullptr;
            const auto dst_it = wanted.find(e.name);
            const ParamRef* dst = dst_it == wanted.end() ? nullptr : &dst_it->second;
            const std::size_t width = e.bf16 ? sizeof(bf16) : sizeof(float);
            for (index_t first = 0; first < e.numel; first += piece_) {
                const index_t len = std::min(piece_, e.numel - first);
                std::fill(counts.begin(), counts.end(), 0);
                counts[std::size_t(e.owner)] = len;
                if (e.bf16)
                    move_piece<D>(src ? src->value16 + first : nullptr, dst ? dst->value16 + first : nullptr, len,
                                  counts, out16, in16);
                else
                    move_piece<D>(src ? src->value + first : nullptr, dst ? dst->value + first : nullptr, len, counts,
                                  out, in);
                const std::uint64_t bytes = std::uint64_t(len) * width;
                if (src) r.bytes_sent += bytes * std::uint64_t(n - 1);
                else
                    r.bytes_received += bytes;
                if (dst) r.bytes_kept += bytes;
            }
        }
        decoding.refresh_working_weights();
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        return r;
    }

private:
    /// One piece of len values from the owner (src set there, backend B memory) to every rank; dst (decoding
    /// backend D memory, where set) gets them. Both through host buffers.
    template <class D, class T>
    void move_piece(const T* src, T* dst, index_t len, std::span<const index_t> counts, std::vector<T>& out,
                    std::vector<T>& in) {
        if (src) out = to_host(View<const T, 1, B>(src, {len}));
        in.resize(std::size_t(len));
        world_.all_gather_v(std::span<const T>(out.data(), src ? std::size_t(len) : 0), std::span<T>(in), counts);
        if (dst) copy_to_device(std::span<const T>(in), View<T, 1, D>(dst, {len}));
    }

    nn::Transformer<B>& training_;
    Communicator& world_;
    index_t piece_;
    std::vector<Entry> entries_;
};

}  // namespace moonmoe::parallel

// moonmoe/nn/latent_step.hpp: LatentDecodeStep<B>, one MLA layer's absorbed decode step for a fixed batch of
// sequences, captured as a CUDA graph after warm-up (backend/graph.hpp) and replayed while the caches grow.
//
// A decode step's shapes change every step (each cache is one row longer), and a graph replays fixed shapes. So
// the step keeps what changes on the device: the positions of the new rows and the caches' lengths live in buffers
// of its own, written (asynchronously, before the replay) at every run; the products over each cache span its length
// rounded up to `bucket` rows (at most its capacity), the rows past the length masked by the device lengths
// (backend latent_decode). The graph is captured again when a sequence crosses a bucket boundary or a weight
// matrix moves; between those, a step is one graph launch plus two small uploads and two copies. Under the CPU
// backend (no graphs) the same code runs eagerly, with the same results.
//
// Precision<BF16> only: the bf16 latent caches are what the tensor-core decode reads; Precision<F32> decodes with
// MLA::forward_absorbed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../backend/graph.hpp"
#include "../tensor/transfer.hpp"
#include "mla.hpp"

namespace moonmoe::nn {

template <class B>
class LatentDecodeStep {
public:
    using LatentCache = typename MLA<B>::LatentCache;

    /// The step of `attention` for the sequences of `caches`, each run taking rows[s] new tokens of sequence s.
    /// `attention` and the caches must outlive the step; `bucket` (> 0) rounds the keys each sequence's products
    /// span up, so the captured shapes hold for up to `bucket` steps.
    LatentDecodeStep(const MLA<B>& attention, std::vector<LatentCache*> caches, std::vector<index_t> rows,
                     index_t bucket = 256)
        : attention_(&attention), caches_(std::move(caches)), bucket_(bucket) {
        if (attention.compute != NumberFormat::bf16)
            throw std::invalid_argument("LatentDecodeStep: the attention computes in " +
                                        std::string(format_name(attention.compute)) +
                                        "; the step runs the bf16 absorbed decode (Precision<BF16>), f32 decodes "
                                        "with MLA::forward_absorbed");
        if (bucket < 1) throw std::invalid_argument("LatentDecodeStep: bucket " + std::to_string(bucket) + " < 1");
        if (rows.size() != caches_.size() || rows.empty())
            throw std::invalid_argument("LatentDecodeStep: " + std::to_string(rows.size()) + " row counts for " +
                                        std::to_string(caches_.size()) + " caches (one per sequence, at least one)");
        offsets_.push_back(0);
        for (std::size_t s = 0; s < rows.size(); ++s) {
            if (rows[s] < 1)
                throw std::invalid_argument("LatentDecodeStep: sequence " + std::to_string(s) + " takes " +
                                            std::to_string(rows[s]) + " rows per step (at least 1)");
            offsets_.push_back(offsets_.back() + rows[s]);
        }
        const index_t T = offsets_.back(), hidden = attention.o_proj.out_features();
        x_ = Tensor<float, 2, B>({T, hidden}), out_ = Tensor<float, 2, B>({T, hidden});
        positions_ = Tensor<index_t, 1, B>({T});
        lengths_ = Tensor<index_t, 1, B>({index_t(caches_.size())});
    }

    /// out = the attention of x [rows, hidden] (the next rows of every sequence, one sequence after another, at
    /// positions caches[s]->length, ...); appends them to the caches.
    void run(View<const float, 2, B> x, View<float, 2, B> out) {
        using Ops = backend::Ops<B>;
        const index_t T = offsets_.back(), N = index_t(caches_.size());
        if (x.shape != x_.shape() || out.shape != out_.shape())
            throw shape_error("LatentDecodeStep.run: x " + shape_string(x.shape) + " and out " +
                              shape_string(out.shape) + " for " + std::to_string(T) + " rows of width " +
                              std::to_string(x_.size(1)));
        attention_->check_latent_caches(offsets_, caches_, "LatentDecodeStep.run");
        std::vector<index_t> lengths, positions;
        std::vector<std::int64_t> key;
        extents_.clear();
        for (index_t s = 0; s < N; ++s) {
            const LatentCache& c = *caches_[std::size_t(s)];
            const index_t n = offsets_[std::size_t(s) + 1] - offsets_[std::size_t(s)];
            lengths.push_back(c.length);
            for (index_t i = 0; i < n; ++i) positions.push_back(c.length + i);
            extents_.push_back(std::min(c.capacity(), (c.length + n + bucket_ - 1) / bucket_ * bucket_));
            key.push_back(extents_.back());
            key.push_back(std::int64_t(reinterpret_cast<std::uintptr_t>(c.rows.data())));
        }
        attention_->for_each_weight(
            [&](const void* p) { key.push_back(std::int64_t(reinterpret_cast<std::uintptr_t>(p))); });
        copy_to_device(std::span<const index_t>(lengths), lengths_.view());
        copy_to_device(std::span<const index_t>(positions), positions_.view());
        Ops::copy(x, x_.view());
        graph_.run(key, [&] {
            attention_->absorbed_bf16(std::as_const(x_).view(), std::as_const(positions_).view(), offsets_, caches_,
                                      std::as_const(lengths_).view(), extents_, out_.view());
        });
        Ops::copy(std::as_const(out_).view(), out);
        for (index_t s = 0; s < N; ++s)
            caches_[std::size_t(s)]->length += offsets_[std::size_t(s) + 1] - offsets_[std::size_t(s)];
    }

    /// The graph: how many runs were eager (warm-up), captured, replayed.
    const backend::StepGraph<B>& graph() const { return graph_; }

private:
    const MLA<B>* attention_;
    std::vector<LatentCache*> caches_;
    index_t bucket_;
    std::vector<index_t> offsets_, extents_;
    Tensor<float, 2, B> x_, out_;
    Tensor<index_t, 1, B> positions_, lengths_;
    backend::StepGraph<B> graph_;
};

}  // namespace moonmoe::nn

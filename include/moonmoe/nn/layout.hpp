// moonmoe/nn/layout.hpp: how the rows of an activation [tokens, features] map to sequences and positions.
//
// Rows are packed: sequence s holds rows [offsets[s], offsets[s + 1]) (cu_seqlens in FlashAttention's varlen
// API), so sequences of different lengths share one batch without padding. Attention never crosses a sequence
// boundary, a sequence's last token has no target, and positions restart at each sequence's first position.
#pragma once

#include <initializer_list>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <vector>

#include "../config/named.hpp"
#include "../tensor/transfer.hpp"

namespace moonmoe::nn {

namespace detail {

/// A layout's positions on a backend, uploaded once (TokenLayout::device_positions). Copying a layout gives the
/// copy an empty one: it may change its positions.
class DevicePositions {
public:
    DevicePositions() = default;
    DevicePositions(const DevicePositions&) : DevicePositions() {}
    DevicePositions& operator=(const DevicePositions&) {
        state_ = std::make_unique<State>();
        return *this;
    }

    template <class B>
    std::shared_ptr<const Tensor<index_t, 1, B>> get(const std::vector<index_t>& positions) const {
        std::lock_guard<std::mutex> lock(state_->mutex);  // a pipeline's stages may share a layout across threads
        if (state_->backend != &typeid(B) || state_->uploaded != positions) {
            state_->tensor = std::make_shared<const Tensor<index_t, 1, B>>(to_device<B>(positions));
            state_->backend = &typeid(B);
            state_->uploaded = positions;
        }
        return std::static_pointer_cast<const Tensor<index_t, 1, B>>(state_->tensor);
    }

private:
    struct State {
        std::mutex mutex;
        const std::type_info* backend = nullptr;
        std::vector<index_t> uploaded;  // what `tensor` holds, so a change of the positions is seen
        std::shared_ptr<const void> tensor;
    };
    std::unique_ptr<State> state_ = std::make_unique<State>();
};

}  // namespace detail

class TokenLayout {
public:
    TokenLayout() = default;

    /// `batch` sequences of `seq` tokens each: row t = b * seq + i, at position first_position + i.
    static TokenLayout sequences(index_t batch, index_t seq, index_t first_position = 0) {
        if (batch < 1 || seq < 1)
            throw std::invalid_argument("TokenLayout: batch and sequence length must be positive, got " +
                                        std::to_string(batch) + " x " + std::to_string(seq));
        return packed(std::vector<index_t>(static_cast<std::size_t>(batch), seq), first_position);
    }

    /// Sequences of the given lengths, one after another: sequence s at rows [sum of lengths before s, + its
    /// length), at positions first_position, first_position + 1, ...
    static TokenLayout packed(std::span<const index_t> lengths, index_t first_position = 0) {
        std::vector<index_t> offsets{0};
        offsets.reserve(lengths.size() + 1);
        for (std::size_t s = 0; s < lengths.size(); ++s) {
            if (lengths[s] < 1)
                throw std::invalid_argument("TokenLayout.packed: sequence " + std::to_string(s) + " has length " +
                                            std::to_string(lengths[s]) + "; every length must be positive");
            offsets.push_back(offsets.back() + lengths[s]);
        }
        return from_offsets(std::move(offsets), first_position);
    }
    static TokenLayout packed(std::initializer_list<index_t> lengths, index_t first_position = 0) {
        return packed(std::span<const index_t>(lengths.begin(), lengths.size()), first_position);
    }

    /// From cumulative offsets [0, end of sequence 0, end of sequence 1, ..., tokens] (cu_seqlens), strictly
    /// increasing.
    static TokenLayout from_offsets(std::vector<index_t> offsets, index_t first_position = 0) {
        if (offsets.size() < 2 || offsets.front() != 0)
            throw std::invalid_argument("TokenLayout: offsets must start at 0 and hold at least one sequence (got " +
                                        std::to_string(offsets.size()) + " offsets" +
                                        (offsets.empty() ? "" : ", the first " + std::to_string(offsets.front())) +
                                        ")");
        TokenLayout l;
        for (std::size_t s = 0; s + 1 < offsets.size(); ++s)
            if (offsets[s + 1] <= offsets[s])
                throw std::invalid_argument("TokenLayout: offsets must increase strictly; sequence " +
                                            std::to_string(s) + " runs from " + std::to_string(offsets[s]) + " to " +
                                            std::to_string(offsets[s + 1]));
        l.positions.resize(static_cast<std::size_t>(offsets.back()));
        for (std::size_t s = 0; s + 1 < offsets.size(); ++s)
            for (index_t t = offsets[s]; t < offsets[s + 1]; ++t)
                l.positions[std::size_t(t)] = first_position + t - offsets[s];
        l.offsets_ = std::move(offsets);
        return l;
    }

    index_t sequences() const { return offsets_.empty() ? 0 : index_t(offsets_.size()) - 1; }
    index_t tokens() const { return offsets_.empty() ? 0 : offsets_.back(); }
    index_t begin(index_t s) const { return offsets_[std::size_t(s)]; }  ///< first row of sequence s
    index_t end(index_t s) const { return offsets_[std::size_t(s) + 1]; }
    index_t length(index_t s) const { return end(s) - begin(s); }
    const std::vector<index_t>& offsets() const { return offsets_; }
    /// True when every sequence has the same length (what sequences() builds).
    bool uniform() const {
        for (index_t s = 1; s < sequences(); ++s)
            if (length(s) != length(0)) return false;
        return true;
    }

    /// Throws unless the layout covers exactly `rows` rows, each with a position; `what` names the caller.
    void check_rows(index_t rows, const char* what) const {
        if (tokens() != rows || index_t(positions.size()) != rows)
            throw std::invalid_argument(std::string(what) + ": the token layout covers " + std::to_string(tokens()) +
                                        " rows with " + std::to_string(positions.size()) +
                                        " positions, the input has " + std::to_string(rows) + " rows");
    }

    /// Throws unless the rows of sequence s sit at positions cached, cached + 1, ...: the next tokens of a sequence
    /// with `cached` tokens in its decoding cache.
    void check_continues(index_t s, index_t cached, const char* what) const {
        for (index_t t = begin(s); t < end(s); ++t)
            if (positions[std::size_t(t)] != cached + t - begin(s))
                throw std::invalid_argument(std::string(what) + ": token " + std::to_string(t - begin(s)) +
                                            " of sequence " + std::to_string(s) + " is at position " +
                                            std::to_string(positions[std::size_t(t)]) + ", but its cache holds " +
                                            std::to_string(cached) + " tokens, so it belongs at " +
                                            std::to_string(cached + t - begin(s)));
    }

    /// The positions on backend B, uploaded at the first call and shared by every later one (every attention layer
    /// of a forward and its backward): one upload per layout, not one per layer. Uploaded again when `positions` has
    /// changed since (it is compared); a copy of the layout starts without an upload.
    template <class B>
    std::shared_ptr<const Tensor<index_t, 1, B>> device_positions() const {
        return device_positions_.get<B>(positions);
    }

    /// Position of each row, used by RoPE. Restarts at each sequence for training; decoding sets it to where each
    /// token lands in its sequence's cache.
    std::vector<index_t> positions;

private:
    std::vector<index_t> offsets_;
    detail::DevicePositions device_positions_;
};

}  // namespace moonmoe::nn

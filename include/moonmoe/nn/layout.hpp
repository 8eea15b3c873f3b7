// moonmoe/nn/layout.hpp: how the rows of an activation [tokens, features] map to sequences and positions.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "../config/named.hpp"

namespace moonmoe::nn {

/// `batch` sequences of `seq` tokens each, row t = b * seq + i, at position positions[t] (i for training).
struct TokenLayout {
    index_t batch = 1, seq = 0;
    std::vector<index_t> positions;

    static TokenLayout sequences(index_t batch, index_t seq, index_t first_position = 0) {
        if (batch < 1 || seq < 1)
            throw std::invalid_argument("TokenLayout: batch and sequence length must be positive, got " +
                                        std::to_string(batch) + " x " + std::to_string(seq));
        TokenLayout l{batch, seq, std::vector<index_t>(static_cast<std::size_t>(batch * seq))};
        for (index_t t = 0; t < batch * seq; ++t) l.positions[t] = first_position + t % seq;
        return l;
    }
    index_t tokens() const { return batch * seq; }
};

}  // namespace moonmoe::nn

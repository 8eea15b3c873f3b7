// moonmoe/parallel/layout.hpp: where each process sits in `Parallel<PP, EP, DP>` and which groups it belongs to,
// as pure functions of the configuration (config/parallel.hpp) and the world rank.
//
// World rank = (pp_rank * DP + dp_rank) * EP + ep_rank: the EP ranks of one expert group are neighbours (their
// all-to-all is the heaviest traffic), then the data-parallel replicas, then the pipeline stages. Groups:
//   pipeline      same (ep, dp), pp = 0 .. PP-1          activations and their gradients between stages
//   expert        same (pp, dp), ep = 0 .. EP-1          the tokens' all-to-all
//   dense DP      same pp, every (ep, dp): EP x DP ranks  ZeRO-1 over the weights every EP rank holds a copy of
//   expert DP     same (pp, ep), dp = 0 .. DP-1          ZeRO-1 over the experts of one EP rank
// A group lists world ranks in ascending order; a process's rank inside a group is its index in that list.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "../config/parallel.hpp"

namespace moonmoe::parallel {

/// One process's coordinates.
struct Coordinates {
    index_t pp = 0, ep = 0, dp = 0;
    constexpr bool operator==(const Coordinates&) const = default;
};

struct RankLayout {
    index_t pp = 1, ep = 1, dp = 1;

    RankLayout() = default;
    RankLayout(index_t pp_, index_t ep_, index_t dp_) : pp(pp_), ep(ep_), dp(dp_) {
        if (pp < 1 || ep < 1 || dp < 1)
            throw std::invalid_argument("Parallel<" + std::to_string(pp) + ", " + std::to_string(ep) + ", " +
                                        std::to_string(dp) + ">: every extent must be at least 1");
    }
    explicit RankLayout(const ParallelConfig& c) : RankLayout(c.pp, c.ep, c.dp) {}

    index_t world_size() const { return pp * ep * dp; }

    /// Refuses a world that is not PP x EP x DP processes, naming both (every rank calls it at start-up).
    void check_world(index_t world, const std::string& where = "moonmoe::parallel") const {
        if (world != world_size())
            throw std::invalid_argument(where + ": the model type's Parallel<" + std::to_string(pp) + ", " +
                                        std::to_string(ep) + ", " + std::to_string(dp) + "> needs " +
                                        std::to_string(world_size()) + " processes (PP x EP x DP), this run has " +
                                        std::to_string(world) + " (mpirun -np " + std::to_string(world_size()) + ")");
    }

    Coordinates coordinates(index_t rank) const {
        check_rank(rank);
        return {rank / (ep * dp), rank % ep, (rank / ep) % dp};
    }
    index_t rank_of(Coordinates c) const { return (c.pp * dp + c.dp) * ep + c.ep; }

    std::vector<index_t> pipeline_group(index_t rank) const {
        const Coordinates c = coordinates(rank);
        std::vector<index_t> g;
        for (index_t p = 0; p < pp; ++p) g.push_back(rank_of({p, c.ep, c.dp}));
        return g;
    }
    std::vector<index_t> expert_group(index_t rank) const {
        const Coordinates c = coordinates(rank);
        std::vector<index_t> g;
        for (index_t e = 0; e < ep; ++e) g.push_back(rank_of({c.pp, e, c.dp}));
        return g;
    }
    std::vector<index_t> dense_dp_group(index_t rank) const {
        const Coordinates c = coordinates(rank);
        std::vector<index_t> g;
        for (index_t d = 0; d < dp; ++d)
            for (index_t e = 0; e < ep; ++e) g.push_back(rank_of({c.pp, e, d}));
        return g;
    }
    std::vector<index_t> expert_dp_group(index_t rank) const {
        const Coordinates c = coordinates(rank);
        std::vector<index_t> g;
        for (index_t d = 0; d < dp; ++d) g.push_back(rank_of({c.pp, c.ep, d}));
        return g;
    }

private:
    void check_rank(index_t rank) const {
        if (rank < 0 || rank >= world_size())
            throw std::invalid_argument("rank " + std::to_string(rank) + " outside the " +
                                        std::to_string(world_size()) + " processes of Parallel<" + std::to_string(pp) +
                                        ", " + std::to_string(ep) + ", " + std::to_string(dp) + ">");
    }
};

}  // namespace moonmoe::parallel

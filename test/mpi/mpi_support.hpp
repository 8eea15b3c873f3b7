// The world communicator of the MPI test binary (test/mpi/main.cpp sets it before the cases run).
#pragma once

#include <memory>

#include <moonmoe/parallel/mpi.hpp>

namespace moonmoe::testing {

inline std::unique_ptr<parallel::Communicator>& world_communicator() {
    static std::unique_ptr<parallel::Communicator> c;
    return c;
}
inline parallel::Communicator& world() { return *world_communicator(); }

}  // namespace moonmoe::testing

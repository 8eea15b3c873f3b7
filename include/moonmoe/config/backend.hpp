// moonmoe/config/backend.hpp: backend tags. `Backend<cpu>` (Eigen) or `Backend<cuda>` (cuBLAS, Thrust, NCCL).
//
// A tag only selects specialisations of the primitives in backend/; it carries no state.
#pragma once

#include "named.hpp"

namespace moonmoe {
namespace slots { struct backend; }

enum class BackendKind { cpu, cuda };

struct cpu { static constexpr BackendKind kind = BackendKind::cpu; static constexpr const char* name = "cpu"; };
struct cuda { static constexpr BackendKind kind = BackendKind::cuda; static constexpr const char* name = "cuda"; };

template <class Tag>
concept backend_tag = requires {
    { Tag::kind } -> std::convertible_to<BackendKind>;
};

template <class Tag = cpu>
struct Backend {
    static_assert(backend_tag<Tag>, "Backend<Tag>: Tag must be a backend tag, moonmoe::cpu or moonmoe::cuda");
    using slot = slots::backend;
    using type = Tag;
};

}  // namespace moonmoe

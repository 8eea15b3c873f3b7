// moonmoe/config/named.hpp: named, order-independent template arguments.
//
// A named argument is a type with a nested `slot` tag, e.g. `Heads<64>` is `Value<slots::heads, 64>`.
// A component such as `MLA<Args...>` looks each slot up among its arguments (first match wins, otherwise the
// default), and rejects arguments it does not take and arguments given twice. Lookups are folds, not recursion,
// so compile cost stays flat in the number of arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <tuple>
#include <type_traits>

namespace moonmoe {

/// Signed size type used for every dimension, count and index in the library.
using index_t = std::int64_t;

/// A value not fixed in the type: it is read from `config.json` when a checkpoint is loaded (as in Eigen). Sizes,
/// real numbers (`Theta<Dynamic>`, `RoutedScale<Dynamic>`, stored as -1.0) and flags (`NormTopK<Dynamic>`) take it.
inline constexpr index_t Dynamic = -1;

/// True when a real-valued argument was given as Dynamic.
constexpr bool is_dynamic(double v) { return v == double(Dynamic); }

/// A named argument carrying one compile-time value (a size, a flag or a real number).
template <class Slot, auto V>
struct Value {
    using slot = Slot;
    static constexpr auto value = V;
};

/// A named argument carrying a policy type (e.g. the Newton-Schulz coefficient schedule).
template <class Slot, class P>
struct Policy {
    using slot = Slot;
    using type = P;
};

namespace detail {

template <class A>
concept named_argument = requires { typename A::slot; };

struct not_a_named_argument;
template <class A>
struct slot_of {
    using type = not_a_named_argument;
};
template <named_argument A>
struct slot_of<A> {
    using type = typename A::slot;
};
template <class A>
using slot_of_t = typename slot_of<A>::type;

template <class Slot, class... Args>
inline constexpr int slot_count = (0 + ... + int(std::is_same_v<slot_of_t<Args>, Slot>));

// Position of the first argument that fills `Slot`, or sizeof...(Args) if none does.
template <class Slot, class... Args>
consteval std::size_t slot_index() {
    std::size_t i = 0, found = sizeof...(Args);
    ((found = (found == sizeof...(Args) && std::is_same_v<slot_of_t<Args>, Slot>) ? i : found, ++i), ...);
    return found;
}

/// The argument filling `Slot` among `Args`, or `Default`.
template <class Slot, class Default, class... Args>
using pick_t = std::tuple_element_t<slot_index<Slot, Args...>(), std::tuple<Args..., Default>>;

/// The value of `Slot` among `Args`, or `Default`.
template <class Slot, auto Default, class... Args>
inline constexpr auto value_of = pick_t<Slot, Value<Slot, Default>, Args...>::value;

/// The policy type of `Slot` among `Args`, or `Default`.
template <class Slot, class Default, class... Args>
using policy_of = typename pick_t<Slot, Policy<Slot, Default>, Args...>::type;

/// A flag argument (`CorrectionBias<true>`, `NormTopK<Dynamic>`), or `unset` when the type does not give it and
/// its default follows other arguments.
struct unset_flag {};
enum class FlagState { off, on, dynamic, unset };
template <auto V>
constexpr FlagState flag_state() {
    using T = std::remove_cvref_t<decltype(V)>;
    if constexpr (std::is_same_v<T, unset_flag>) {
        return FlagState::unset;
    } else if constexpr (std::is_same_v<T, bool>) {
        return V ? FlagState::on : FlagState::off;
    } else {
        static_assert(std::is_integral_v<T> && V == Dynamic, "a flag argument is true, false or Dynamic");
        return FlagState::dynamic;
    }
}

template <class... Slots>
struct slot_list {
    template <class A>
    static constexpr bool contains = (std::is_same_v<slot_of_t<A>, Slots> || ...);
};

/// True when every argument is a named argument that `Accepted` lists, and no slot is filled twice.
template <class Accepted, class... Args>
inline constexpr bool only_accepted = ((!named_argument<Args> || Accepted::template contains<Args>) && ...);
template <class... Args>
inline constexpr bool no_repeats = ((slot_count<slot_of_t<Args>, Args...> == 1) && ...);

// `with`: replace the arguments whose slots `New` fills, keep the others, append `New`.
template <template <class...> class Target, class Tuple>
struct rebind;
template <template <class...> class Target, class... Ts>
struct rebind<Target, std::tuple<Ts...>> {
    using type = Target<Ts...>;
};
template <template <class...> class Target, class... New>
struct replacing {
    template <class... Old>
    using apply = typename rebind<Target, decltype(std::tuple_cat(
                                              std::declval<std::conditional_t<(slot_count<slot_of_t<Old>, New...> > 0),
                                                                              std::tuple<>, std::tuple<Old>>>()...,
                                              std::declval<std::tuple<New...>>()))>::type;
};

}  // namespace detail
}  // namespace moonmoe

/// Checks every component runs on its arguments; the message names the component.
#define MOONMOE_CHECK_ARGUMENTS(component, accepted, args)                                                             \
    static_assert((::moonmoe::detail::named_argument<args> && ...),                                                    \
                  component ": every argument must be a named argument such as Heads<64>");                            \
    static_assert(::moonmoe::detail::only_accepted<accepted, args...>,                                                 \
                  component ": an argument does not belong here (see the component's list of arguments)");             \
    static_assert(::moonmoe::detail::no_repeats<args...>, component ": the same argument is given twice")

// fuzz/fuzz_common.hpp: what every moonmoe fuzz target treats as a finding.
//
// The readers document three exception types for bad input: io_error (io/error.hpp), config_error
// (config/model_config.hpp) and shape_error (tensor/shape.hpp). Those end an input quietly. Any other exception,
// a broken invariant (fuzz_require), a crash or a sanitizer report aborts, which libFuzzer records as a finding
// with the input that caused it.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <typeinfo>

#include <moonmoe/config/model_config.hpp>
#include <moonmoe/io/error.hpp>
#include <moonmoe/tensor/shape.hpp>

namespace moonmoe_fuzz {

/// Runs `f`; returns normally if it returns or throws a documented error, aborts on anything else.
template <class F>
void expect_documented_errors(F&& f) {
    try {
        f();
    } catch (const moonmoe::io_error&) {
    } catch (const moonmoe::config_error&) {
    } catch (const moonmoe::shape_error&) {
    } catch (const std::exception& e) {
        std::fprintf(stderr, "moonmoe fuzz: undocumented exception %s: %s\n", typeid(e).name(), e.what());
        std::abort();
    } catch (...) {
        std::fprintf(stderr, "moonmoe fuzz: an exception not derived from std::exception\n");
        std::abort();
    }
}

/// A promise of the library that held for this input, or abort naming it.
inline void fuzz_require(bool ok, const char* what) {
    if (ok) return;
    std::fprintf(stderr, "moonmoe fuzz: broken invariant: %s\n", what);
    std::abort();
}

}  // namespace moonmoe_fuzz

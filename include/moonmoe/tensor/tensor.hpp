// moonmoe/tensor/tensor.hpp: `Tensor<T, Rank, B>` (owning, contiguous, row-major) and `View<T, Rank, B>`
// (non-owning, strided), the common currency of every op.
//
// Memory lives where backend B puts it (host memory for cpu). A View never owns; a Tensor converts to a View of
// its whole extent. Element access (operator()) compiles only for host-visible backends (backend/memory.hpp): module
// code calls backend primitives instead, and device code takes raw pointers.
#pragma once

#include <cstring>
#include <initializer_list>
#include <type_traits>
#include <utility>

#include "../backend/memory.hpp"
#include "../config/macros.hpp"
#include "shape.hpp"

namespace moonmoe {

template <class T, int Rank, class B = cpu>
struct View {
    static_assert(Rank >= 1, "View: Rank must be at least 1");
    T* data = nullptr;
    Shape<Rank> shape{};
    Shape<Rank> strides{};

    View() = default;
    View(T* d, Shape<Rank> s, Shape<Rank> st) : data(d), shape(s), strides(st) {}
    View(T* d, Shape<Rank> s) : data(d), shape(s), strides(contiguous_strides<Rank>(s)) {}

    /// A View of const T from one of T.
    template <class U>
        requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
    View(const View<U, Rank, B>& v) : data(v.data), shape(v.shape), strides(v.strides) {}

    index_t size(int d) const { return shape[d]; }
    index_t stride(int d) const { return strides[d]; }
    index_t numel() const { return moonmoe::numel<Rank>(shape); }
    bool contiguous() const { return strides == contiguous_strides<Rank>(shape); }
    /// Rows of the last dimension are contiguous (what GEMM needs; the row pitch may be larger).
    bool rows_contiguous() const { return strides[Rank - 1] == 1; }

    template <class... I>
        requires(sizeof...(I) == Rank && backend::host_visible<B>)
    T& operator()(I... i) const {
        const index_t idx[] = {index_t(i)...};
        index_t off = 0;
        for (int d = 0; d < Rank; ++d) off += idx[d] * strides[d];
        return data[off];
    }

    /// Element `i` of the first dimension, one rank lower.
    auto operator[](index_t i) const
        requires(Rank > 1)
    {
        View<T, Rank - 1, B> v;
        v.data = data + i * strides[0];
        for (int d = 1; d < Rank; ++d) v.shape[d - 1] = shape[d], v.strides[d - 1] = strides[d];
        return v;
    }

    /// Elements [begin, end) of dimension `dim`; the same rank, strides unchanged.
    View slice(int dim, index_t begin, index_t end) const {
        if (begin < 0 || end < begin || end > shape[dim])
            throw shape_error("slice: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                              ") of dimension " + std::to_string(dim) + " is outside shape " + shape_string(shape));
        View v = *this;
        v.data = data + begin * strides[dim];
        v.shape[dim] = end - begin;
        return v;
    }

    /// The same elements with another shape; the view must be contiguous.
    template <int R2>
    View<T, R2, B> reshape(Shape<R2> s) const {
        if (!contiguous() || moonmoe::numel<R2>(s) != numel())
            throw shape_error("reshape: cannot view " + shape_string(shape) + (contiguous() ? "" : " (strided)") +
                              " as " + shape_string(s));
        return View<T, R2, B>(data, s);
    }
};

/// Owning, contiguous, row-major. Zero-initialised on construction; Tensor::for_overwrite leaves the contents
/// unspecified, for a tensor that is written whole before it is read (backend/memory.hpp, Init::overwritten).
template <class T, int Rank, class B = cpu>
class Tensor {
public:
    using value_type = T;
    static constexpr int rank = Rank;

    Tensor() = default;
    explicit Tensor(Shape<Rank> s) : Tensor(s, backend::Init::zeroed) {}
    Tensor(std::initializer_list<index_t> s) : Tensor(to_shape(s)) {}
    /// A tensor of shape s whose contents are unspecified (not cleared): every element must be written before it is
    /// read (a widened copy, a cast's or a product's output).
    static Tensor for_overwrite(Shape<Rank> s) { return Tensor(s, backend::Init::overwritten); }
    ~Tensor() { backend::Memory<B>::release(data_); }

    Tensor(Tensor&& o) noexcept : data_(std::exchange(o.data_, nullptr)), shape_(std::exchange(o.shape_, {})) {}
    Tensor& operator=(Tensor&& o) noexcept {
        if (this != &o) {
            backend::Memory<B>::release(data_);
            data_ = std::exchange(o.data_, nullptr);
            shape_ = std::exchange(o.shape_, {});
        }
        return *this;
    }
    Tensor(const Tensor&) = delete;  // copies are explicit: clone()
    Tensor& operator=(const Tensor&) = delete;

    Tensor clone() const {
        Tensor t = for_overwrite(shape_);
        backend::Memory<B>::copy(t.data_, data_, bytes());
        return t;
    }

    T* data() { return data_; }
    const T* data() const { return data_; }
    const Shape<Rank>& shape() const { return shape_; }
    index_t size(int d) const { return shape_[d]; }
    index_t numel() const { return moonmoe::numel<Rank>(shape_); }
    std::size_t bytes() const { return checked_bytes(numel(), sizeof(T), "Tensor " + shape_string(shape_)); }
    bool empty() const { return numel() == 0; }

    View<T, Rank, B> view() { return {data_, shape_}; }
    View<const T, Rank, B> view() const { return {data_, shape_}; }
    operator View<T, Rank, B>() { return view(); }
    operator View<const T, Rank, B>() const { return view(); }

    template <class... I>
        requires(sizeof...(I) == Rank && backend::host_visible<B>)
    T& operator()(I... i) {
        return view()(i...);
    }
    template <class... I>
        requires(sizeof...(I) == Rank && backend::host_visible<B>)
    const T& operator()(I... i) const {
        return view()(i...);
    }

    template <int R2>
    View<T, R2, B> reshape(Shape<R2> s) {
        return view().template reshape<R2>(s);
    }
    template <int R2>
    View<const T, R2, B> reshape(Shape<R2> s) const {
        return view().template reshape<R2>(s);
    }

    void zero() { backend::Memory<B>::fill_zero(data_, bytes()); }

private:
    Tensor(Shape<Rank> s, backend::Init init) : shape_(s) {
        for (index_t d : s)
            if (d < 0) throw shape_error("Tensor: negative extent in shape " + shape_string(s));
        const std::size_t n = checked_bytes(moonmoe::numel<Rank>(s), sizeof(T), "Tensor " + shape_string(s));
        data_ = static_cast<T*>(backend::Memory<B>::allocate(n, init));
    }

    static Shape<Rank> to_shape(std::initializer_list<index_t> s) {
        if (s.size() != std::size_t(Rank))
            throw shape_error("Tensor: " + std::to_string(s.size()) + " extents given for a rank-" +
                              std::to_string(Rank) + " tensor");
        Shape<Rank> out{};
        int d = 0;
        for (index_t v : s) out[d++] = v;
        return out;
    }

    T* data_ = nullptr;
    Shape<Rank> shape_{};
};

template <class T, int R, class B>
using ConstView = View<const T, R, B>;

}  // namespace moonmoe

// The native statistics op (msprobe_runtime.native_stats, which builds it with torch.utils.cpp_extension.load
// and describes it): the fused statistics pass (and the training monitor's figures from it, monitor_figures),
// the records made from it (Recorder), the backward hooks that record gradients, the walk of a module's part
// of the graph and the capture of call stacks. Every file in this folder is part of the build's cache key: an
// edit here is a new build.

#include <torch/extension.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/python_cpp_function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <algorithm>
#include <memory>
#include <frameobject.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e4m3fnuz.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Float8_e5m2fnuz.h>
#include <c10/util/Half.h>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include <type_traits>
#include <utility>

// An autograd node's owning handle as this torch's Tensor::grad_fn gives it: c10::intrusive_ptr from torch
// 2.13, std::shared_ptr before (2.11's headers, docs/versions.md); one source builds on both.
using NodeRef = std::decay_t<decltype(std::declval<const at::Tensor&>().grad_fn())>;

namespace {

constexpr int L = 16;                 // float lanes
constexpr int64_t BLOCK = 1 << 16;    // elements per parallel block (fixed: results never depend on threads)

struct Partial {
  float mx, mn;
  double s, q;
  int64_t nan, inf;
  int64_t zero;  // |v| < eps, counted only by the monitor's pass (ZEROS)
};

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const c10::BFloat16* p, int64_t i) {
  uint16_t raw;
  std::memcpy(&raw, reinterpret_cast<const char*>(p) + 2 * i, 2);
  uint32_t bits = static_cast<uint32_t>(raw) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}
inline float load(const c10::Half* p, int64_t i) {  // branch-free, so the loop vectorises
  uint16_t raw;
  std::memcpy(&raw, reinterpret_cast<const char*>(p) + 2 * i, 2);
  const uint32_t h = raw;
  const uint32_t em = h & 0x7fffu;
  uint32_t bits = em << 13;
  float v;
  std::memcpy(&v, &bits, 4);
  v *= 0x1p112f;  // rebias the exponent (15 -> 127); exact, and right for subnormal halves too
  std::memcpy(&bits, &v, 4);
  const uint32_t special = (em << 13) | 0x7f800000u;  // Inf and NaN keep their payload
  bits = em >= 0x7c00u ? special : bits;
  bits |= (h & 0x8000u) << 16;
  std::memcpy(&v, &bits, 4);
  return v;
}

// How far ahead of the loop its memory is asked for. The loop converts each element to double, so it runs
// too slowly for the hardware prefetcher to keep many lines in flight: a tensor not in cache (a weight in the
// forward) was read 1.8x (float32) to 5.9x (float16) slower than torch.sum reads it. Asking for the line
// 16 KiB ahead closes most of that gap (bench/statistics_pass.py's out-of-cache rows); it changes no value.
constexpr int64_t AHEAD_BYTES = 16384;
#if defined(__GNUC__) || defined(__clang__)
#define MSPROBE_PREFETCH(address) __builtin_prefetch(address)
#else
#define MSPROBE_PREFETCH(address) ((void)0)
#endif

// ``p``'s first ``n`` elements; ``avail`` (>= n) of them lie inside the tensor, so may be asked for ahead.
// ``ZEROS`` (the monitor's ``monitor_figures``) also counts the elements with |v| < ``eps``, in the same loop.
template <typename T, bool ZEROS = false>
Partial reduce_block(const T* p, int64_t n, bool counts, int64_t avail, float eps = 0.0f) {
  constexpr int64_t AHEAD = AHEAD_BYTES / static_cast<int64_t>(sizeof(T));
  constexpr int64_t LINE = 64 / static_cast<int64_t>(sizeof(T));  // elements per cache line
  const float INF = std::numeric_limits<float>::infinity();
  float mx[L], mn[L];
  double s[L], q[L];
  int32_t z[L];  // a block holds at most BLOCK elements: a lane's count fits
  for (int j = 0; j < L; ++j) {
    mx[j] = -INF; mn[j] = INF; s[j] = 0.0; q[j] = 0.0; z[j] = 0;
  }
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    if (i % LINE == 0 && i + AHEAD < avail) MSPROBE_PREFETCH(p + i + AHEAD);
    for (int j = 0; j < L; ++j) {
      float v = load(p, i + j);
      mx[j] = v > mx[j] ? v : mx[j];  // skips NaN
      mn[j] = v < mn[j] ? v : mn[j];
      s[j] += static_cast<double>(v);
      q[j] += static_cast<double>(v * v);  // squared in float, as torch does: below its range 0, above it inf
      if constexpr (ZEROS) z[j] += std::fabs(v) < eps;  // false for NaN, as torch's ``abs(x) < eps``
    }
  }
  for (int j = 0; i < n; ++i, ++j) {  // the tail, into lanes 0..
    float v = load(p, i);
    mx[j] = v > mx[j] ? v : mx[j];
    mn[j] = v < mn[j] ? v : mn[j];
    s[j] += static_cast<double>(v);
    q[j] += static_cast<double>(v * v);
    if constexpr (ZEROS) z[j] += std::fabs(v) < eps;
  }
  Partial out{-INF, INF, 0.0, 0.0, 0, 0, 0};
  for (int j = 0; j < L; ++j) {
    out.mx = mx[j] > out.mx ? mx[j] : out.mx;
    out.mn = mn[j] < out.mn ? mn[j] : out.mn;
    out.s += s[j];
    out.q += q[j];
    if constexpr (ZEROS) out.zero += z[j];
  }
  // A block's sum of float squares is finite when the block holds no NaN, no Inf and no value whose square
  // passes float's range (|v| > 1.8e19): only then is a second, counting pass skipped.
  if (counts && !std::isfinite(out.q)) {
    int64_t cn = 0, ci = 0;
    for (int64_t k = 0; k < n; ++k) {
      float v = load(p, k);
      cn += (v != v);
      ci += (std::fabs(v) == INF);
    }
    out.nan = cn;
    out.inf = ci;
  }
  return out;
}

template <typename T, bool ZEROS = false>
Partial reduce_all(const T* p, int64_t n, bool counts, float eps = 0.0f) {
  if (n <= BLOCK) return reduce_block<T, ZEROS>(p, n, counts, n, eps);
  const int64_t blocks = (n + BLOCK - 1) / BLOCK;
  std::vector<Partial> parts(blocks);
  at::parallel_for(0, blocks, 4, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t start = b * BLOCK;
      parts[b] = reduce_block<T, ZEROS>(p + start, std::min(BLOCK, n - start), counts, n - start, eps);
    }
  });
  Partial out = parts[0];
  for (int64_t b = 1; b < blocks; ++b) {  // block order: deterministic
    const Partial& x = parts[b];
    out.mx = x.mx > out.mx ? x.mx : out.mx;
    out.mn = x.mn < out.mn ? x.mn : out.mn;
    out.s += x.s;
    out.q += x.q;
    out.nan += x.nan;
    out.inf += x.inf;
    out.zero += x.zero;
  }
  return out;
}

template <typename T>
double round_to(double x) { return static_cast<double>(static_cast<float>(static_cast<T>(static_cast<float>(x)))); }
template <>
double round_to<float>(double x) { return static_cast<double>(static_cast<float>(x)); }

// ``x``, or the infinity of its sign past the largest float (NaN stays NaN).
double in_float_range(double x) {
  const double most = static_cast<double>(std::numeric_limits<float>::max());
  return x > most ? std::numeric_limits<double>::infinity() : x < -most ? -std::numeric_limits<double>::infinity() : x;
}

template <typename T>
std::vector<double> stats_of(const at::Tensor& t, bool counts, double repeat) {
  const T* p = t.data_ptr<T>();
  const int64_t n = t.numel();
  Partial r = reduce_all<T>(p, n, counts);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const bool has_nan = std::isnan(r.q);
  std::vector<double> out(counts ? 6 : 4);
  out[0] = has_nan ? nan : static_cast<double>(r.mx);
  out[1] = has_nan ? nan : static_cast<double>(r.mn);
  // torch accumulates a float tensor's sum and sum of squares in float: past float's range they are inf, so
  // Mean and Norm are inf there on the torch ops (the path of CUDA and NPU tensors) and in msprobe's dump; the
  // double sums here keep the rounding finer, not the range wider (tests/runtime/test_native_stats.py)
  out[2] = round_to<T>(in_float_range(r.s) / static_cast<double>(n));
  out[3] = round_to<T>(std::sqrt(in_float_range(r.q) * repeat));
  if (counts) {
    out[4] = static_cast<double>(r.nan) * repeat;
    out[5] = static_cast<double>(r.inf) * repeat;
  }
  return out;
}

// A plain strided tensor, on any device, whose data is its own memory.
bool own_data(const at::Tensor& t) {
  if (!t.defined() || t.layout() != at::kStrided || t.is_quantized() || t.is_nested() || !t.has_storage())
    return false;
  const c10::DispatchKeySet keys = t.key_set();
  // a tensor whose data is somewhere else (a Python subclass, functionalization, functorch's wrappers)
  return !(keys.has(c10::DispatchKey::Python) || keys.has(c10::DispatchKey::Functionalize) ||
           keys.has(c10::DispatchKey::FuncTorchBatched) || keys.has(c10::DispatchKey::FuncTorchGradWrapper) ||
           keys.has(c10::DispatchKey::ZeroTensor));
}

bool own_cpu_data(const at::Tensor& t) { return own_data(t) && t.device().is_cpu(); }

bool readable(const at::Tensor& t) {
  if (!own_cpu_data(t)) return false;
  const at::ScalarType type = t.scalar_type();
  return type == at::kFloat || type == at::kBFloat16 || type == at::kHalf;
}

}  // namespace

// Max, Min, Mean, Norm, then (with ``counts``) the NaN and Inf counts of a non-empty CPU tensor of float32,
// float16 or bfloat16, read once; an empty list for any other tensor (the caller's torch ops serve it).
// Every statistic is independent of element order, so a broadcast (stride-0) dimension is read once and
// counted ``size`` times, and a tensor whose elements fill one block of memory (transposed or permuted) is
// read as that block; only other layouts are copied first.
// ``t`` with each broadcast (stride-0) dimension of more than one element narrowed to one, ``repeat`` multiplied by
// its size: each value once. A view (``t`` itself where it has no such dimension), recording no autograd node.
// ``N``: the CPU path counts in double, the lane in int64, as the Python path's statistics.dense_view.
template <typename N>
at::Tensor broadcast_once(const at::Tensor& t, N* repeat) {
  at::NoGradGuard no_grad;
  at::Tensor out = t;
  for (int64_t d = 0; d < out.dim(); ++d) {
    if (out.stride(d) == 0 && out.size(d) > 1) {
      *repeat *= static_cast<N>(out.size(d));
      out = out.narrow(d, 0, 1);
    }
  }
  return out;
}

// ``input``'s elements as one block of memory, each element once: a broadcast (stride-0) dimension narrowed to
// one (``repeat`` multiplied by its size), a negative view resolved, any other layout that does not fill one
// block copied. What is read is the same multiset of values, up to the repeats.
at::Tensor dense_once(const at::Tensor& input, double* repeat) {
  at::Tensor t = input;
  if (t.is_neg()) t = t.resolve_neg();
  t = broadcast_once(t, repeat);
  if (!t.is_non_overlapping_and_dense()) t = t.contiguous();
  return t;
}

std::vector<double> stats(const at::Tensor& input, bool counts) {
  if (!readable(input) || input.numel() == 0) return {};
  at::NoGradGuard no_grad;
  double repeat = 1.0;
  const at::Tensor t = dense_once(input, &repeat);
  if (t.data_ptr() == nullptr) return {};
  const at::ScalarType type = t.scalar_type();
  if (type == at::kFloat) return stats_of<float>(t, counts, repeat);
  if (type == at::kBFloat16) return stats_of<c10::BFloat16>(t, counts, repeat);
  return stats_of<c10::Half>(t, counts, repeat);
}

namespace {

// msprobe's monitor ops, as runtime/monitor/metrics.py numbers them (CODES there)
enum MonitorCode : int64_t { M_MIN = 0, M_MAX = 1, M_NORM = 2, M_MEAN = 3, M_ZEROS = 4, M_NANS = 5, M_ID = 6 };

template <typename T>
at::Tensor monitor_of(const at::Tensor& t, const std::vector<int64_t>& codes, double eps, double repeat,
                      int64_t total, bool scalar) {
  const T* p = t.data_ptr<T>();
  const int64_t n = t.numel();
  bool zeros = false, nans = false;
  for (int64_t c : codes) {
    zeros = zeros || c == M_ZEROS;
    nans = nans || c == M_NANS;
  }
  // torch's ``x.abs() < eps`` compares in the tensor's dtype: eps rounded to it (through float, as c10 converts)
  const float bound = static_cast<float>(static_cast<T>(static_cast<float>(eps)));
  const Partial r = zeros ? reduce_all<T, true>(p, n, nans, bound) : reduce_all<T, false>(p, n, nans);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const bool has_nan = std::isnan(r.q);
  at::Tensor out = at::empty({static_cast<int64_t>(codes.size())}, at::TensorOptions().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  for (size_t k = 0; k < codes.size(); ++k) {
    float v = nan;
    switch (codes[k]) {
      case M_MIN: v = has_nan ? nan : r.mn; break;
      case M_MAX: v = has_nan ? nan : r.mx; break;
      // Mean and Norm as torch's ``mean``/``vector_norm`` with dtype=float32 give them: float32, inf past its
      // range (the double sums keep the rounding finer, not the range wider)
      case M_NORM: v = static_cast<float>(std::sqrt(in_float_range(r.q) * repeat)); break;
      case M_MEAN: v = static_cast<float>(in_float_range(r.s) / static_cast<double>(n)); break;
      // the torch-op path's ``count_nonzero(...) / numel``: both made float32, then divided in float32
      case M_ZEROS: v = static_cast<float>(static_cast<double>(r.zero) * repeat) / static_cast<float>(total); break;
      case M_NANS: v = static_cast<float>(static_cast<double>(r.nan) * repeat); break;
      case M_ID: v = scalar ? load(p, 0) : nan; break;
      default: break;
    }
    o[k] = v;
  }
  return out;
}

}  // namespace

// The figures of msprobe's monitor ops ``codes`` (metrics.py's CODES) of a non-empty CPU tensor of float32,
// float16 or bfloat16, in one read: a float32 tensor of one figure per code, as metrics.py's torch ops give
// them; an undefined tensor (None) for any other tensor, which the torch ops then serve. The NaN count costs a
// second read of a block only where its sum of squares is not finite (reduce_block), the |x| < eps count a
// compare per element, and only where asked for.
at::Tensor monitor_figures(const at::Tensor& input, const std::vector<int64_t>& codes, double eps) {
  if (!readable(input) || input.numel() == 0) return at::Tensor();
  at::NoGradGuard no_grad;
  double repeat = 1.0;
  const at::Tensor t = dense_once(input, &repeat);
  if (t.data_ptr() == nullptr) return at::Tensor();
  const int64_t total = input.numel();
  const bool scalar = input.dim() == 0;
  const at::ScalarType type = t.scalar_type();
  if (type == at::kFloat) return monitor_of<float>(t, codes, eps, repeat, total, scalar);
  if (type == at::kBFloat16) return monitor_of<c10::BFloat16>(t, codes, eps, repeat, total, scalar);
  return monitor_of<c10::Half>(t, codes, eps, repeat, total, scalar);
}

namespace {

// float8: each format's 256 encodings decoded once (c10's own conversions) into a table, and the tensor read byte
// by byte through it; besides the statistics, the elements equal to zero and those at the format's largest
// finite magnitude are counted (statistics.py's _add_low, docs/low-precision.md).
struct LowPartial {
  float mx, mn;
  double s, q;
  int64_t nan, inf, zero, top;
};

template <typename T>
const std::array<float, 256>& float8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> out{};
    for (int b = 0; b < 256; ++b) {
      const uint8_t raw = static_cast<uint8_t>(b);
      T v;
      std::memcpy(&v, &raw, 1);
      out[b] = static_cast<float>(v);
    }
    return out;
  }();
  return table;
}

LowPartial reduce_low_block(const uint8_t* p, int64_t n, const float* table, float top) {
  const float INF = std::numeric_limits<float>::infinity();
  LowPartial out{-INF, INF, 0.0, 0.0, 0, 0, 0, 0};
  for (int64_t i = 0; i < n; ++i) {
    const float v = table[p[i]];
    out.mx = v > out.mx ? v : out.mx;  // skips NaN
    out.mn = v < out.mn ? v : out.mn;
    out.s += static_cast<double>(v);
    out.q += static_cast<double>(v * v);
    out.nan += (v != v);
    out.inf += (std::fabs(v) == INF);
    out.zero += (v == 0.0f);
    out.top += (std::fabs(v) == top);
  }
  return out;
}

std::vector<double> low_stats_of(const at::Tensor& t, bool counts, double repeat, const float* table, float top) {
  const uint8_t* p = static_cast<const uint8_t*>(t.data_ptr());
  const int64_t n = t.numel();
  const int64_t blocks = (n + BLOCK - 1) / BLOCK;
  std::vector<LowPartial> parts(blocks);
  at::parallel_for(0, blocks, 4, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t start = b * BLOCK;
      parts[b] = reduce_low_block(p + start, std::min(BLOCK, n - start), table, top);
    }
  });
  LowPartial r = parts[0];
  for (int64_t b = 1; b < blocks; ++b) {  // block order: deterministic
    const LowPartial& x = parts[b];
    r.mx = x.mx > r.mx ? x.mx : r.mx;
    r.mn = x.mn < r.mn ? x.mn : r.mn;
    r.s += x.s;
    r.q += x.q;
    r.nan += x.nan;
    r.inf += x.inf;
    r.zero += x.zero;
    r.top += x.top;
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> out;
  out.push_back(r.nan ? nan : static_cast<double>(r.mx));  // torch's amax gives NaN where a NaN is
  out.push_back(r.nan ? nan : static_cast<double>(r.mn));
  out.push_back(static_cast<double>(static_cast<float>(r.s / static_cast<double>(n))));  // repeats cancel
  out.push_back(static_cast<double>(static_cast<float>(std::sqrt(r.q * repeat))));
  if (counts) {
    out.push_back(static_cast<double>(r.nan) * repeat);
    out.push_back(static_cast<double>(r.inf) * repeat);
  }
  out.push_back(static_cast<double>(r.zero) * repeat);
  out.push_back(static_cast<double>(r.top) * repeat);
  return out;
}

template <typename T>
std::vector<double> low_stats_typed(const at::Tensor& t, bool counts, double repeat) {
  return low_stats_of(t, counts, repeat, float8_table<T>().data(),
                      static_cast<float>(std::numeric_limits<T>::max()));
}

}  // namespace

// Max, Min, Mean, Norm, then (with ``counts``) the NaN and Inf counts, then the zero and largest-magnitude
// counts of a non-empty CPU float8 tensor (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz), read once; an empty list for any
// other tensor (the caller's chunked torch ops serve it).
std::vector<double> stats_low(const at::Tensor& input, bool counts) {
  if (!own_cpu_data(input) || input.numel() == 0) return {};
  const at::ScalarType type = input.scalar_type();
  if (type != at::kFloat8_e4m3fn && type != at::kFloat8_e5m2 && type != at::kFloat8_e4m3fnuz &&
      type != at::kFloat8_e5m2fnuz)
    return {};
  at::NoGradGuard no_grad;
  double repeat = 1.0;
  const at::Tensor t = dense_once(input, &repeat);
  if (t.data_ptr() == nullptr) return {};
  if (type == at::kFloat8_e4m3fn) return low_stats_typed<c10::Float8_e4m3fn>(t, counts, repeat);
  if (type == at::kFloat8_e5m2) return low_stats_typed<c10::Float8_e5m2>(t, counts, repeat);
  if (type == at::kFloat8_e4m3fnuz) return low_stats_typed<c10::Float8_e4m3fnuz>(t, counts, repeat);
  return low_stats_typed<c10::Float8_e5m2fnuz>(t, counts, repeat);
}

namespace {

PyObject* dtype_name(at::ScalarType type) {  // str(dtype), "torch.float32", made once per dtype
  static PyObject* names[static_cast<int>(at::ScalarType::NumOptions)] = {};
  PyObject*& name = names[static_cast<int>(type)];
  if (name == nullptr) {
    name = PyObject_Str(reinterpret_cast<PyObject*>(torch::getTHPDtype(type)));
    if (name == nullptr) throw py::error_already_set();
  }
  Py_INCREF(name);
  return name;
}

// A tuple of numbers, strings, None and such tuples can hold no reference cycle: the garbage collector need not
// look at it. CPython untracks such a tuple itself, but only at the first collection that meets it; untracked
// now, a step's records are never walked by the young collections that the step's own allocations bring on.
PyObject* untracked(PyObject* tuple) {
  if (tuple != nullptr) PyObject_GC_UnTrack(tuple);
  return tuple;
}

// ``object`` (an exact list, or a tuple without a ``__dict__``) untracked where none of its items is tracked: true
// where it is untracked now. Only for a list nothing appends a tracked object to later (CPython tracks a tuple or a
// dict again itself, never a list): a finished entry's (``seal``), a backward hook's arrival.
bool untrack_flat(PyObject* object) {
  PyObject* const* items;
  Py_ssize_t count;
  if (PyList_CheckExact(object)) {
    items = PySequence_Fast_ITEMS(object);
    count = PyList_GET_SIZE(object);
  } else if (PyTuple_Check(object) && Py_TYPE(object)->tp_dictoffset == 0) {
    items = PySequence_Fast_ITEMS(object);
    count = PyTuple_GET_SIZE(object);
  } else {
    return false;
  }
  for (Py_ssize_t k = 0; k < count; ++k) {
    if (PyObject_GC_IsTracked(items[k])) return false;
  }
  if (PyObject_GC_IsTracked(object)) PyObject_GC_UnTrack(object);
  return true;
}

// A record's shape: one tuple per shape seen lately (a direct-mapped table, GIL held), since a step's records
// repeat a few shapes hundreds of times. Each record made with it allocates, frees and marshals one object (and
// its large sizes' ints) fewer, and the step's message names a repeated shape by reference.
constexpr size_t SHAPE_SLOTS = 1024;
// queue items ``launch_direct`` launches at most: two groups of four (a cast's inputs and outputs, say)
constexpr int MAX_DIRECT = 8;

PyObject* shape_tuple(c10::IntArrayRef sizes) {
  static PyObject* slots[SHAPE_SLOTS] = {};
  size_t hash = sizes.size();
  for (int64_t size : sizes) hash = (hash * 1000003u) ^ static_cast<size_t>(size);
  PyObject*& slot = slots[hash % SHAPE_SLOTS];
  const Py_ssize_t dim = static_cast<Py_ssize_t>(sizes.size());
  if (slot != nullptr && PyTuple_GET_SIZE(slot) == dim) {
    bool same = true;
    for (Py_ssize_t d = 0; d < dim && same; ++d) same = PyLong_AsLongLong(PyTuple_GET_ITEM(slot, d)) == sizes[d];
    if (same) {
      Py_INCREF(slot);
      return slot;
    }
  }
  PyObject* shape = PyTuple_New(dim);
  if (shape == nullptr) throw py::error_already_set();
  for (Py_ssize_t d = 0; d < dim; ++d) {
    PyObject* size = PyLong_FromLongLong(sizes[d]);
    if (size == nullptr) {
      Py_DECREF(shape);
      throw py::error_already_set();
    }
    PyTuple_SET_ITEM(shape, d, size);
  }
  untracked(shape);
  Py_XDECREF(slot);
  Py_INCREF(shape);
  slot = shape;
  return shape;
}

PyObject* new_record(const at::Tensor& t, PyObject* row, bool scalar) {  // json_files.native_json reads it
  PyObject* shape = shape_tuple(t.sizes());
  PyObject* out = PyTuple_New(5);
  if (out == nullptr) {
    Py_DECREF(shape);
    throw py::error_already_set();
  }
  PyTuple_SET_ITEM(out, 0, dtype_name(t.scalar_type()));
  PyTuple_SET_ITEM(out, 1, shape);
  PyTuple_SET_ITEM(out, 2, PyBool_FromLong(t.requires_grad()));
  PyTuple_SET_ITEM(out, 3, PyBool_FromLong(scalar));
  Py_INCREF(row);
  if (PyTuple_CheckExact(row)) untracked(row);  // numbers and None (bytes are no container: never tracked)
  PyTuple_SET_ITEM(out, 4, row);
  return untracked(out);
}

PyObject* builtin_record(PyObject* item) {  // records.describe_builtin's {"type", "value"} for exact types
  const char* type;
  if (PyBool_Check(item)) type = "bool";
  else if (PyLong_CheckExact(item)) type = "int";
  else if (PyFloat_CheckExact(item)) type = "float";
  else if (PyUnicode_CheckExact(item)) type = "str";
  else return nullptr;
  PyObject* out = PyDict_New();
  PyObject* name = PyUnicode_InternFromString(type);
  PyDict_SetItemString(out, "type", name);
  Py_DECREF(name);
  PyDict_SetItemString(out, "value", item);
  return out;
}

// The row of an empty tensor's record: Max, Min, Mean and Norm null, no counts (json_files.native_json). Made once
// and never freed (as the interned names: no decref after the interpreter's end).
PyObject* empty_row() {
  static PyObject* row = untracked(PyTuple_Pack(4, Py_None, Py_None, Py_None, Py_None));
  if (row == nullptr) throw py::error_already_set();
  return row;
}

py::object long_of(int64_t value) {
  PyObject* out = PyLong_FromLongLong(value);
  if (out == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(out);
}

// Max and Min of ``n`` integers (n > 0), one pass.
template <typename T>
void extremes_of(const T* p, int64_t n, int64_t* top, int64_t* low) {
  T mx = p[0], mn = p[0];
  for (int64_t i = 1; i < n; ++i) {
    mx = p[i] > mx ? p[i] : mx;
    mn = p[i] < mn ? p[i] : mn;
  }
  *top = static_cast<int64_t>(mx);
  *low = static_cast<int64_t>(mn);
}

// The record of a non-empty CPU tensor of bool or of a signed or 8-bit unsigned integer type, as the
// collector's torch ops give it (statistics.tensor_kind): Max and Min (``any`` and ``all`` for bool, also
// 0-d), or a 0-d integer's value as all four; no Mean, Norm nor NaN/Inf counts. Read here in one pass over
// the block ``dense_once`` gives: through ATen's reductions (aminmax, any, all and their ``item``) these took
// a quarter of the native records' time on the tiny GPT, whose token ids and masks are small. Else nullptr.
PyObject* integral_record(const at::Tensor& input) {
  const at::ScalarType type = input.scalar_type();
  const bool is_bool = type == at::kBool;
  if (!is_bool && type != at::kByte && type != at::kChar && type != at::kShort && type != at::kInt &&
      type != at::kLong)
    return nullptr;
  if (!own_cpu_data(input) || input.numel() == 0) return nullptr;
  double repeat = 1.0;
  const at::Tensor t = dense_once(input, &repeat);
  const void* data = t.data_ptr();
  if (data == nullptr) return nullptr;
  const int64_t n = t.numel();
  bool scalar = false;
  py::object row;
  if (is_bool) {
    const uint8_t* p = static_cast<const uint8_t*>(data);  // a bool is one byte, 0 or 1
    int64_t set = 0;
    for (int64_t i = 0; i < n; ++i) set += p[i] != 0;
    row = py::make_tuple(py::bool_(set > 0), py::bool_(set == n), py::none(), py::none());
  } else {
    int64_t top = 0, low = 0;
    switch (type) {
      case at::kByte: extremes_of(static_cast<const uint8_t*>(data), n, &top, &low); break;
      case at::kChar: extremes_of(static_cast<const int8_t*>(data), n, &top, &low); break;
      case at::kShort: extremes_of(static_cast<const int16_t*>(data), n, &top, &low); break;
      case at::kInt: extremes_of(static_cast<const int32_t*>(data), n, &top, &low); break;
      default: extremes_of(static_cast<const int64_t*>(data), n, &top, &low); break;
    }
    if (input.dim() == 0) {
      scalar = true;
      row = py::make_tuple(long_of(top));
    } else {
      row = py::make_tuple(long_of(top), long_of(low), py::none(), py::none());
    }
  }
  return new_record(input, row.ptr(), scalar);
}

// A tensor recently read, as Collector._reuse remembers one: held, with its version counter then, where its
// elements lie (when they fill one block of memory exactly once), and the row read.
struct Recent {
  at::Tensor tensor;
  int64_t version;
  bool placed;
  const void* data;
  int64_t numel;
  at::ScalarType dtype;
  py::object row;
  bool scalar;
};

// A leaf that requires grad (a parameter) read this step, under the address of its elements: the last few
// tensors (Recent) do not reach back to a weight read in an earlier microbatch, or before the many calls of a
// megatron layer's forward. Held weakly, so it keeps no memory alive; while the weak hold lasts the leaf's
// object is not freed, so a live lock is that leaf, and its address and version then tell a stale entry.
struct Leaf {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> impl;
  int64_t version;
  int64_t numel;
  at::ScalarType dtype;
  py::object row;
  bool scalar;
};

}  // namespace

using GraphKey = std::pair<std::pair<const torch::autograd::Node*, uint32_t>, std::vector<int64_t>>;
using Consumers = std::vector<std::pair<NodeRef,
                                        std::vector<std::pair<int64_t, int64_t>>>>;

// An input's gradient edge: its grad_fn and output number, or a leaf's gradient accumulator (null where it has
// none yet, as a leaf that nothing in this graph takes).
std::pair<const torch::autograd::Node*, uint32_t> gradient_edge(const at::Tensor& t) {
  const NodeRef& fn = t.grad_fn();
  if (fn) return {fn.get(), static_cast<uint32_t>(t.output_nr())};
  NodeRef accumulator = torch::autograd::impl::try_get_grad_accumulator(t);
  return {accumulator.get(), 0u};
}

bool walk_keys(py::handle inputs, py::handle outputs, const std::vector<GraphKey>& keys, int64_t limit,
               Consumers* found);

// The walk of backward._consumer_edges over autograd's own graph: the nodes created after the inputs (by
// sequence number) that the walk from the outputs reaches and that take an input's gradient edge (its grad_fn
// and output number, or a leaf's gradient accumulator), each with its (edge index, input position) pairs, in
// ``found``; false past ``limit`` nodes. ``targets``: ``[(tensor, [positions])]``, the inputs that require
// grad. The walk, its order and its count are the Python function's: depth first, a node's next edges in
// order, each node once.
bool walk_module(py::handle inputs, py::handle outputs, py::handle targets, int64_t limit, Consumers* found) {
  std::vector<GraphKey> keys;
  for (py::handle item : targets) {
    py::handle tensor = item[py::int_(0)];
    std::vector<int64_t> positions;
    for (py::handle position : item[py::int_(1)]) positions.push_back(position.cast<int64_t>());
    auto edge = gradient_edge(THPVariable_Unpack(tensor.ptr()));
    if (edge.first != nullptr) keys.push_back({edge, std::move(positions)});
  }
  return walk_keys(inputs, outputs, keys, limit, found);
}

bool walk_keys(py::handle inputs, py::handle outputs, const std::vector<GraphKey>& keys, int64_t limit,
               Consumers* found) {
  using torch::autograd::Node;
  int64_t threshold = -1;
  for (py::handle item : inputs) {
    if (item.is_none() || !THPVariable_Check(item.ptr())) continue;
    const NodeRef& fn = THPVariable_Unpack(item.ptr()).grad_fn();
    if (fn) threshold = std::max(threshold, static_cast<int64_t>(fn->sequence_nr()));
  }
  std::vector<NodeRef> stack;
  std::unordered_set<const Node*> seen;
  for (py::handle item : outputs) {
    if (item.is_none() || !THPVariable_Check(item.ptr())) continue;
    const NodeRef& fn = THPVariable_Unpack(item.ptr()).grad_fn();
    if (fn && seen.insert(fn.get()).second) stack.push_back(fn);
  }
  int64_t walked = 0;
  while (!stack.empty()) {
    NodeRef node = std::move(stack.back());
    stack.pop_back();
    if (threshold >= 0 && node->sequence_nr() <= static_cast<uint64_t>(threshold)) continue;
    if (++walked > limit) {
      found->clear();
      return false;
    }
    std::vector<std::pair<int64_t, int64_t>> edges;
    const auto& next = node->next_edges();
    for (size_t index = 0; index < next.size(); ++index) {
      const torch::autograd::Edge& edge = next[index];
      if (!edge.is_valid()) continue;
      const std::vector<int64_t>* positions = nullptr;
      for (const auto& key : keys) {
        if (key.first.first == edge.function.get() && key.first.second == edge.input_nr) {
          positions = &key.second;
          break;
        }
      }
      if (positions != nullptr) {
        for (int64_t position : *positions) edges.push_back({static_cast<int64_t>(index), position});
        continue;
      }
      if (seen.insert(edge.function.get()).second) stack.push_back(edge.function);
    }
    if (!edges.empty()) found->push_back({std::move(node), std::move(edges)});
  }
  return true;
}

class Recorder;

// A hook's hold on its Recorder. Let go with the GIL held, since the last hold may free the Recorder and its
// Python objects; once the interpreter is gone it is left, as torch leaves its own hooks' Python objects.
class RecorderRef {
 public:
  explicit RecorderRef(std::shared_ptr<Recorder> recorder) : recorder_(std::move(recorder)) {}
  RecorderRef(const RecorderRef&) = delete;
  RecorderRef& operator=(const RecorderRef&) = delete;

  ~RecorderRef() {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      recorder_.reset();
    } else {
      new std::shared_ptr<Recorder>(std::move(recorder_));
    }
  }

  Recorder* operator->() const { return recorder_.get(); }
  const Recorder* get() const { return recorder_.get(); }

 private:
  std::shared_ptr<Recorder> recorder_;
};

// What the op's backward hooks share: their Recorder and the step they were attached in (``generation``); a
// hook of an earlier step stays silent. A node can outlive its step (a tensor kept from step to step, as a
// cache computed with grad, or one that an API returns as it is), so a Recorder drops its silent hooks from a
// node when it puts a new one there (drop_stale), rather than leave one more there every step.
class OwnHook {
 public:
  OwnHook(std::shared_ptr<Recorder> recorder, int64_t generation)
      : recorder_(std::move(recorder)), generation_(generation) {}
  virtual ~OwnHook() = default;
  bool of(const Recorder* owner) const { return recorder_.get() == owner; }
  bool stale(const Recorder* owner, int64_t generation) const { return of(owner) && generation_ != generation; }

 protected:
  RecorderRef recorder_;
  int64_t generation_;
};

template <typename Hooks>
void drop_stale(Hooks& hooks, const Recorder* owner, int64_t generation) {
  hooks.erase(std::remove_if(hooks.begin(), hooks.end(),
                             [&](const auto& hook) {
                               const OwnHook* own = dynamic_cast<const OwnHook*>(hook.get());
                               return own != nullptr && own->stale(owner, generation);
                             }),
              hooks.end());
}

template <typename Hooks>
int64_t count_own(const Hooks& hooks, const Recorder* owner) {
  int64_t n = 0;
  for (const auto& hook : hooks) {
    const OwnHook* own = dynamic_cast<const OwnHook*>(hook.get());
    n += own != nullptr && own->of(owner);
  }
  return n;
}

// An API call's backward, observed by the op: a post-hook on one grad_fn behind the API's outputs (``positions``:
// (output position, the node's output number) of each), which makes the records of the gradients there and
// adds ``(index, [(position, record)], [records])`` to the Recorder's ``arrivals`` list, where the collector
// reads it (Collector.take_arrivals): no Python frame runs in the backward. A gradient it cannot record hands
// the whole call to the Recorder's Python ``fallback``. It returns the gradients it was given, so the engine
// goes on as without it.
class ApiBackwardHook : public torch::autograd::FunctionPostHook, public OwnHook {
 public:
  ApiBackwardHook(std::shared_ptr<Recorder> recorder, int64_t generation, int64_t index,
                  std::vector<std::pair<int64_t, int64_t>> positions)
      : OwnHook(std::move(recorder), generation), index_(index), positions_(std::move(positions)) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grad_inputs,
                                            const torch::autograd::variable_list& grad_outputs) override;

 private:
  int64_t index_;
  std::vector<std::pair<int64_t, int64_t>> positions_;
};

// One module call's backward, shared by its consumer hooks: for each input slot, the gradient summed so far over
// the nodes inside the module that take that input, and the edges still to come.
struct ModuleCall {
  std::vector<at::Tensor> partial;
  std::vector<int64_t> left;
};

// A module's backward, observed by the op as backward.hook_module_backward's Python hooks observe it: a tensor
// hook on one of the module's outputs (``field`` 0, the entry's ``input``) or on an input that no node inside
// takes (``field`` 1, ``output``), as a pre-hook on the tensor's grad_fn for its output number, which is where
// torch runs a tensor's hooks. Its record goes to ``arrivals`` as ``(index, field, slot, record)``.
class ModuleTensorHook : public torch::autograd::FunctionPreHook, public OwnHook {
 public:
  ModuleTensorHook(std::shared_ptr<Recorder> recorder, int64_t generation, int64_t index, int64_t field,
                   int64_t slot, size_t value)
      : OwnHook(std::move(recorder), generation), index_(index), field_(field), slot_(slot), value_(value) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override;

 private:
  int64_t index_, field_, slot_;
  size_t value_;
};

// A post-hook on a node inside a module that takes some of its inputs (``edges``: (the node's gradient
// index, input slot)): it adds the gradients there to the call's sums, and records an input's sum once its
// last edge has arrived (``field`` 1), as backward._observe_consumers does.
class ModuleConsumerHook : public torch::autograd::FunctionPostHook, public OwnHook {
 public:
  ModuleConsumerHook(std::shared_ptr<Recorder> recorder, int64_t generation, int64_t index,
                     std::shared_ptr<ModuleCall> call, std::vector<std::pair<int64_t, int64_t>> edges)
      : OwnHook(std::move(recorder), generation), index_(index), call_(std::move(call)), edges_(std::move(edges)) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grad_inputs,
                                            const torch::autograd::variable_list& grad_outputs) override;

 private:
  int64_t index_;
  std::shared_ptr<ModuleCall> call_;
  std::vector<std::pair<int64_t, int64_t>> edges_;
};

// Records of a call's arguments or outputs, as Collector.describe gives them with no file names: a plain
// tensor that the op serves, None, and an exact bool, int, float or str. Each other item is ``later`` in the
// list, for the caller to describe; the second item of the result counts them. Looks at each value's type
// only, never at its attributes. A tensor of ``below`` elements or more is first looked for among the last
// ``keep`` such tensors (Collector._reuse's rule: the same tensor at the same version, or one whose elements
// are exactly the same block of memory at the same version: a transpose, a view, a detach), or among the
// parameters read (Leaf), and its row reused; ``clear`` forgets them (a new step), as ``forget`` does where they
// may have changed unseen. ``reads`` counts the tensors read, not those served again.
class Recorder : public std::enable_shared_from_this<Recorder> {
 public:
  Recorder(bool counts, int64_t below, size_t keep, py::object later)
      : counts_(counts), below_(below), keep_(keep), later_(std::move(later)) {}

  py::tuple records(py::handle values) {
    PyObject* seq = values.ptr();
    if (!PyTuple_CheckExact(seq) && !PyList_CheckExact(seq)) throw py::type_error("a tuple or a list");
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    py::list out(n);
    Py_ssize_t todo = 0;
    at::NoGradGuard no_grad;
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
      PyObject* record = nullptr;
      if (item == Py_None) {
        Py_INCREF(Py_None);
        record = Py_None;
      } else if (THPVariable_CheckExact(item)) {
        try {
          record = tensor_record(THPVariable_Unpack(item));
        } catch (const py::error_already_set&) {
          throw;
        } catch (const std::exception&) {  // a layout it could not copy: the caller's torch ops serve it
          record = nullptr;
        }
      } else {
        record = builtin_record(item);
      }
      if (record == nullptr) {
        record = later_.ptr();
        Py_INCREF(record);
        ++todo;
      }
      PyList_SET_ITEM(out.ptr(), i, record);
    }
    return py::make_tuple(out, todo);
  }

  void forget() {  // the tensors read may change from here without a sign (start, stop, an optimizer's step)
    recent_.clear();
    leaves_.clear();
  }

  void clear() {  // a new step: it reads afresh, and its hooks, none of the earlier steps', may record
    forget();
    ++generation_;
    lane_reads_ = 0;
  }

  int64_t reads() const { return reads_; }

  // The hooks of this Recorder on ``tensor``'s grad_fn (its post-hooks and tensor pre-hooks): for tests.
  int64_t hooks_on(py::handle tensor) const {
    if (!THPVariable_Check(tensor.ptr())) return 0;
    auto fn = THPVariable_Unpack(tensor.ptr()).grad_fn();
    if (!fn) return 0;
    return count_own(fn->post_hooks(), this) + count_own(fn->tensor_pre_hooks(), this);
  }

  // Where the backward hooks put what they record, and who records what they cannot: an API's
  // ``fallback(owner, index, positions, grad_inputs, grad_outputs)``, a module's ``module_fallback(owner, index,
  // field, slot, gradient)``; ``owner`` passed back as given (a weak reference: the Recorder must not keep the
  // collector alive).
  void observe_backward(py::object arrivals, py::object fallback, py::object module_fallback, py::object owner) {
    if (!PyList_CheckExact(arrivals.ptr())) throw py::type_error("arrivals: a list");
    arrivals_ = std::move(arrivals);
    fallback_ = std::move(fallback);
    module_fallback_ = std::move(module_fallback);
    owner_ = std::move(owner);
  }

  bool collecting = false;

  // The Triton lane (triton_stats.TritonStats.attach): while ``lane_open`` (the records of one call, between its
  // ``begin`` and ``end``), a contiguous float32, float16 or bfloat16 CUDA tensor (a CPU one too with ``cpu``,
  // for tests under Triton's interpreter) gets its record here, as a CPU tensor's: its rows taken in the arena
  // that ``arenas`` holds for its device (``(device index, 4, False)``, the arena ``triton_stats._queued`` fills
  // too, so that a call's tensors are one launch), ``renew(tensor, rows)`` closing it and giving a fresh one where
  // it is full, and the tuple ``_queued`` makes appended to ``queue``, which the ``end`` of the call launches. Its
  // row is ``(mark, arena's key, tensor)``, made JSON by the writing process (json_files.native_json). A backward
  // hook's gradients too, launched by ``launch()`` as the hook ends. The kernels' arguments (``block`` elements a
  // program loads, ``max_rows`` rows a tensor at most) are triton_stats's.
  void lane(py::object queue, py::object arenas, py::object renew, py::object launch, py::object mark, bool cpu,
            int64_t block, int64_t max_rows, py::object calls) {
    queue_and_arenas(queue, arenas);
    if (block <= 0 || max_rows <= 0) throw py::value_error("block and max_rows: positive");
    lane_queue_ = std::move(queue);
    lane_calls_ = std::move(calls);
    lane_arenas_ = std::move(arenas);
    lane_renew_ = std::move(renew);
    lane_launch_ = std::move(launch);
    lane_mark_ = std::move(mark);
    lane_cpu_ = cpu;
    block_ = block;
    max_rows_ = max_rows;
  }

  // The lane's direct launches (triton_stats.TritonStats._launch_queue, triton_launch): ``fast`` maps ``(kind,
  // device, code, aligned)`` to ``(callee, head, packed, tail, options, namespace, name, kernel)``, the
  // compiled kernel that Triton's run chose for a launch of one queued tensor (kind 1: ``_partials``) or of two to
  // four of one arena and dtype (kind 4: ``_partials_few``), which the Python path enters after that launch.
  // ``aligned``: a bit per pointer argument (the arena's part and meta, then each tensor's) whose address is a
  // multiple of 16; ``code`` the tensors' dtype code. ``driver`` is Triton's ``triton.runtime.driver``,
  // ``runtime`` its ``knobs.runtime`` (the launch hooks), ``options`` the ``(object, attribute)`` pairs whose
  // values ``options`` of an entry holds (Triton's run takes them into its key).
  // ``lock`` (the kernels' lock, TritonStats._lock): a backward hook's queue is launched by ``launch_direct`` here,
  // under it, where no other thread holds it (``launch_held``); None: by the lane's ``launch``, as before.
  void lane_direct(py::object fast, py::object driver, py::object runtime, py::object options, py::object lock) {
    if (!PyDict_CheckExact(fast.ptr())) throw py::type_error("fast: a dict");
    if (!PyTuple_CheckExact(options.ptr())) throw py::type_error("options: a tuple");
    direct_fast_ = std::move(fast);
    direct_driver_ = std::move(driver);
    direct_runtime_ = std::move(runtime);
    direct_options_ = std::move(options);
    direct_lock_ = std::move(lock);
  }

  // summary_mode fingerprint: every record made here has a fingerprint besides its statistics, so the op makes
  // only those the lane makes with ``lane_fingerprints`` set (a call's or a hook's float32, float16 or bfloat16
  // device tensor, an integer or bool one with ``lane_integers``, an empty one of any dtype); every other tensor,
  // and every one before the lane and its fingerprints are set, is left to the Python path (nullptr). None is
  // reused by place: a view may order its bytes otherwise.
  void checksums() { checksums_ = true; }

  // The fingerprints' lane (triton_fingerprint.Fingerprints.attach): a record the lane makes has its tensor's bytes
  // queued in ``queue`` too, as ``Fingerprints.add`` queues them (``(bytes, n, iters, programs, first row, index,
  // arena, version, watch, slot)``), its rows taken in the arena ``arenas`` holds for its device index (``renew(t,
  // rows)`` giving a fresh one where it is full). Its slot is None and the arena holds the lane's mark in its place,
  // as a statistics arena does for the lane's records: the record names its parts by the arena's key and its index
  // there, and a slot is made only for a launch that fails (``Fingerprints._by_torch_ops``); the record's row is
  // ``(mark, statistics arena's key, tensor, fingerprints arena's key, tensor there)``; an empty tensor's is
  // ``empty`` (json_files.EMPTY_FINGERPRINT_ROW: no bytes to queue, its statistics null). ``block``, ``one``,
  // ``programs``, ``iters``: triton_fingerprint.plan's constants. ``lock`` (the fingerprints' lock,
  // Fingerprints.lock): with the kernels' one, a backward hook's queues are launched here (``launch_held``).
  void lane_fingerprints(py::object queue, py::object arenas, py::object renew, py::object empty, int64_t block,
                         int64_t one, int64_t programs, int64_t iters, py::object lock) {
    queue_and_arenas(queue, arenas);
    if (block <= 0 || one <= 0 || programs <= 0 || iters <= 0) throw py::value_error("plan constants: positive");
    if (!PyTuple_CheckExact(empty.ptr())) throw py::type_error("empty: a tuple");
    hash_empty_row_ = std::move(empty);
    hash_queue_ = std::move(queue);
    hash_arenas_ = std::move(arenas);
    hash_renew_ = std::move(renew);
    hash_block_ = block;
    hash_one_ = one;
    hash_programs_ = programs;
    hash_iters_ = iters;
    hash_lock_ = std::move(lock);
  }

  // The lane's integer records (integer_lane.IntegerLane.attach): a call's or a hook's device tensor of bool or of a
  // signed or 8-bit unsigned integer type (``integral_record``'s, the CPU's: token and position ids, attention masks,
  // a router's counts), of any layout and dimension, 0-d too, read by one ``aminmax`` whose two 0-d tensors (Max,
  // then Min: for bool ``any`` and ``all``) are appended to the ``values`` of the arena ``arenas`` holds for its
  // device index and dtype (``integer_key``; ``renew(key)`` making one where there is none), the record's row
  // ``(mark, arena's key, index there)``. The Python path reads it by ``amax``, ``amin`` (``any``, ``all``; a 0-d
  // one's value by a copy) and ``stack``; both are exact. In summary_mode fingerprint its bytes are queued for their
  // fingerprint too (``integer_checksum_read``).
  void lane_integers(py::object arenas, py::object renew, py::object mark) {
    if (!PyDict_CheckExact(arenas.ptr())) throw py::type_error("arenas: a dict");
    int_arenas_ = std::move(arenas);
    int_renew_ = std::move(renew);
    int_mark_ = std::move(mark);
  }

  // Whether the lane takes ``t`` (not one of ``lane_takes``) as an integer record (``lane_integers``); an empty one
  // is made before this is asked.
  bool integers_take(const at::Tensor& t) const {
    if (int_arenas_.is_none()) return false;
    const at::ScalarType type = t.scalar_type();
    return type == at::kLong || type == at::kInt || type == at::kBool || type == at::kShort || type == at::kChar ||
           type == at::kByte;
  }

  // ``t``'s device index as the arenas' dicts key it (``get_device``: -1 for the CPU).
  static int64_t device_index(const at::Tensor& t) {
    const c10::Device device = t.device();
    return device.is_cpu() ? -1 : device.index();
  }

  // The key of the integer arena of ``t``'s device and dtype: an arena's values are stacked, so share a dtype.
  static int64_t integer_key(const at::Tensor& t) {
    return (device_index(t) + 1) * 64 + static_cast<int64_t>(t.scalar_type());
  }

  // ``t``'s Max and Min (0-d tensors of its dtype, by one ``aminmax``) as Python objects.
  static std::pair<py::object, py::object> extremes(const at::Tensor& t) {
    at::Tensor top, low;
    {
      at::NoGradGuard no_grad;
      std::tie(low, top) = at::aminmax(t);
    }
    py::object top_object = py::reinterpret_steal<py::object>(THPVariable_Wrap(top));
    py::object low_object = py::reinterpret_steal<py::object>(THPVariable_Wrap(low));
    if (!top_object || !low_object) throw py::error_already_set();
    return {top_object, low_object};
  }

  // The integer arena filling for ``integer_key``'s ``key`` (``renew`` makes one where there is none: Python code).
  py::object integer_arena(int64_t key) {
    py::object name = long_of(key);
    py::object arena = py::reinterpret_borrow<py::object>(PyDict_GetItemWithError(int_arenas_.ptr(), name.ptr()));
    if (!arena && PyErr_Occurred()) throw py::error_already_set();
    if (!arena) arena = int_renew_(name);
    return arena;
  }

  // ``arena``'s values list and key, read by attribute (its slots: no Python code runs).
  static std::pair<py::object, py::object> integer_state(const py::object& arena) {
    static PyObject* names[] = {PyUnicode_InternFromString("values"), PyUnicode_InternFromString("key")};
    py::object values = py::reinterpret_steal<py::object>(PyObject_GetAttr(arena.ptr(), names[0]));
    if (!values) throw py::error_already_set();
    py::object key = py::reinterpret_steal<py::object>(PyObject_GetAttr(arena.ptr(), names[1]));
    if (!key) throw py::error_already_set();
    if (!PyList_CheckExact(values.ptr())) throw py::type_error("an integer arena's values: a list");
    return {values, key};
  }

  // Max, then Min, appended to an arena's ``values`` (both or neither).
  static void integer_append(const py::object& values, const std::pair<py::object, py::object>& pair) {
    const Py_ssize_t at = PyList_GET_SIZE(values.ptr());
    if (PyList_Append(values.ptr(), pair.first.ptr()) != 0) throw py::error_already_set();
    if (PyList_Append(values.ptr(), pair.second.ptr()) != 0) {
      PyList_SetSlice(values.ptr(), at, at + 1, nullptr);
      throw py::error_already_set();
    }
  }

  // ``t``'s record by ``lane_integers``: its Max and Min appended to the arena of its device and dtype, the row
  // naming them.
  PyObject* integer_read(const at::Tensor& t, py::object* row, bool* scalar) {
    const auto pair = extremes(t);
    py::object arena = integer_arena(integer_key(t));
    // from here no Python code runs until both are appended: a flush (another thread) takes an arena out of the
    // dict and closes it, and an arena read here must not be closed before they are in
    const auto [values, key] = integer_state(arena);
    *row = py::make_tuple(int_mark_, key, PyList_GET_SIZE(values.ptr()) / 2);
    integer_append(values, pair);
    ++int_reads_;
    *scalar = false;
    return new_record(t, row->ptr(), false);
  }

  // ``integer_read`` in summary_mode fingerprint: the bytes of ``t`` queued for its fingerprint too, as ``lane_read``
  // queues a float tensor's (``hash_prepare``, then the arenas' states read last, with no Python code between), the
  // row ``(mark, arena's key, index, fingerprints' arena's key, tensor there)``.
  PyObject* integer_checksum_read(const at::Tensor& t, py::object* row, bool* scalar) {
    const int64_t index = device_index(t);
    py::object wrapped = py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
    if (!wrapped) throw py::error_already_set();
    HashRead hash = hash_prepare(t, index, wrapped);
    const auto pair = extremes(t);
    py::object arena = integer_arena(integer_key(t));
    hash_state(&hash);
    const auto [values, key] = integer_state(arena);
    const HashPlace place = hash_place(hash);
    *row = py::make_tuple(int_mark_, key, PyList_GET_SIZE(values.ptr()) / 2, place.key, place.tensor);
    if (!hash_commit(hash, place)) throw py::error_already_set();
    integer_append(values, pair);
    ++int_reads_;
    *scalar = false;
    return new_record(t, row->ptr(), false);
  }

  int64_t integer_reads() const { return int_reads_; }

  void fingerprints_off() {  // the fingerprint kernels failed: the Python path's records (the torch ops) from here
    hash_queue_ = py::none();
    hash_arenas_ = py::none();
    hash_renew_ = py::none();
    hash_lock_ = py::none();
  }

  bool fingerprinting() const { return checksums_ && !hash_queue_.is_none() && !lane_queue_.is_none(); }

  // Whether a queued tensor ``t`` is as it was queued: ``version`` None (read at its record, before any user code),
  // or its version counter then (an inference tensor's -1).
  static bool as_queued(PyObject* version, const at::Tensor& t) {
    if (version == Py_None) return true;
    const long long held = PyLong_AsLongLong(version);
    if (held == -1 && PyErr_Occurred()) throw py::error_already_set();
    return held == (t.is_inference() ? -1 : static_cast<long long>(t._version()));
  }

  // Whether the ints of a queue item's fields 1 to ``last`` are within int32 (Triton's run types a larger one int64).
  static bool ints_fit(PyObject* item, int last) {
    for (int field = 1; field <= last; ++field) {
      const long long value = PyLong_AsLongLong(PyTuple_GET_ITEM(item, field));
      if (value == -1 && PyErr_Occurred()) throw py::error_already_set();
      if (value < -(1LL << 31) || value >= (1LL << 31)) return false;
    }
    return true;
  }

  // A lane's queue and arenas, as ``lane`` and ``lane_fingerprints`` take them.
  static void queue_and_arenas(const py::object& queue, const py::object& arenas) {
    if (!PyList_CheckExact(queue.ptr())) throw py::type_error("queue: a list");
    if (!PyDict_CheckExact(arenas.ptr())) throw py::type_error("arenas: a dict");
  }

  // The key of ``fast`` (``lane_direct``) for a launch of queue items ``items`` (one to four), ``(kind, device,
  // code, aligned)``, or None where they are no such launch (not one arena and dtype, a version moved since the
  // item was queued, an int past int32, the lane's Triton not set): the one rule by which ``launch_direct`` looks
  // its kernel up and triton_stats.TritonStats._enter enters one (``direct_key``). Unused places of a launch of
  // two to four repeat the first tensor, as triton_stats._launch pads them. Sets ``part``, ``meta`` (the arena's),
  // ``active`` (Triton's driver) and ``device``, and fills ``items`` past ``count`` with nullptr.
  py::object queue_key(PyObject** items, Py_ssize_t count, py::object& part, py::object& meta, py::object& active,
                       py::object& device, bool few = false) {
    static PyObject* names[] = {PyUnicode_InternFromString("part"), PyUnicode_InternFromString("meta")};
    if (direct_driver_.is_none() || count < 1 || count > 4) return py::none();
    PyObject* arena = nullptr;
    long code = -1;
    for (Py_ssize_t k = 0; k < count; ++k) {
      PyObject* item = items[k];
      if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 11 || !THPVariable_Check(PyTuple_GET_ITEM(item, 0)))
        return py::none();
      const long item_code = PyLong_AsLong(PyTuple_GET_ITEM(item, 7));
      if (item_code == -1 && PyErr_Occurred()) throw py::error_already_set();
      if (k == 0) {
        arena = PyTuple_GET_ITEM(item, 8);
        code = item_code;
      } else if (PyTuple_GET_ITEM(item, 8) != arena || item_code != code) {
        return py::none();
      }
      const at::Tensor& t = THPVariable_Unpack(PyTuple_GET_ITEM(item, 0));
      const at::ScalarType dtype = code == 0 ? at::kFloat : code == 1 ? at::kHalf : code == 2 ? at::kBFloat16
                                                                                                : at::kDouble;
      if (code < 0 || code > 2 || t.scalar_type() != dtype) return py::none();
      PyObject* version = PyTuple_GET_ITEM(item, 9);
      // read after its call, it must be as it was at the call (else the Python path leaves it null, and says so);
      // Triton types an int past int32 int64 (its run's to launch)
      if (!as_queued(version, t) || !ints_fit(item, 6)) return py::none();
    }
    const int kind = count == 1 && !few ? 1 : 4;
    for (Py_ssize_t k = count; k < kind; ++k) items[k] = nullptr;  // a few's unused places: the first tensor again
    part = py::reinterpret_steal<py::object>(PyObject_GetAttr(arena, names[0]));
    if (!part) throw py::error_already_set();
    meta = py::reinterpret_steal<py::object>(PyObject_GetAttr(arena, names[1]));
    if (!meta) throw py::error_already_set();
    if (!THPVariable_Check(part.ptr()) || !THPVariable_Check(meta.ptr())) return py::none();
    auto aligned = [](PyObject* tensor) {
      return reinterpret_cast<uintptr_t>(THPVariable_Unpack(tensor).data_ptr()) % 16 == 0;
    };
    long mask = (aligned(part.ptr()) ? 1 : 0) | (aligned(meta.ptr()) ? 2 : 0);
    for (int k = 0; k < kind; ++k) {
      PyObject* item = items[k] != nullptr ? items[k] : items[0];
      if (aligned(PyTuple_GET_ITEM(item, 0))) mask |= 4L << k;
    }
    current_device(active, device);
    return py::make_tuple(kind, device, code, mask);
  }

  // Triton's active driver (``active``) and its current device (``device``), as a launch's key names it.
  void current_device(py::object& active, py::object& device) const {
    static PyObject* names[] = {PyUnicode_InternFromString("active"),
                                PyUnicode_InternFromString("get_current_device")};
    active = py::reinterpret_steal<py::object>(PyObject_GetAttr(direct_driver_.ptr(), names[0]));
    if (!active) throw py::error_already_set();
    device = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(active.ptr(), names[1]));
    if (!device) throw py::error_already_set();
  }

  // ``queue_key`` of the queue items ``items`` (a list), for the Python path's entry of the kernel it launched them to.
  // With ``hashes`` (a list of one to four fingerprints' queue items of one arena): the key of their launch with
  // the statistics' (kind 5: triton_fingerprint._partials_hash_few), or, ``items`` empty, of their launch alone
  // (kind 6: triton_fingerprint._hash_few).
  py::object direct_key(py::list items, py::object hashes) {
    PyObject* given[4];
    PyObject* hashed[4];
    const Py_ssize_t count = PyList_GET_SIZE(items.ptr());
    if (count < (hashes.is_none() ? 1 : 0) || count > 4) return py::none();
    for (Py_ssize_t k = 0; k < count; ++k) given[k] = PyList_GET_ITEM(items.ptr(), k);
    py::object part, meta, active, device;
    if (hashes.is_none()) return queue_key(given, count, part, meta, active, device);
    if (!PyList_CheckExact(hashes.ptr())) throw py::type_error("hashes: a list or None");
    const Py_ssize_t hcount = PyList_GET_SIZE(hashes.ptr());
    if (hcount < 1 || hcount > 4) return py::none();
    for (Py_ssize_t k = 0; k < hcount; ++k) hashed[k] = PyList_GET_ITEM(hashes.ptr(), k);
    py::object hpart, hmeta;
    if (count == 0) return hashes_key(hashed, hcount, hpart, hmeta, active, device);
    py::object key = queue_key(given, count, part, meta, active, device, true);
    if (key.is_none()) return key;
    return fused_key(key, hashed, hcount, hpart, hmeta);
  }

  // The key of a launch of the fingerprints' items ``hashed`` alone (one to four of one arena, as ``fused_key``
  // takes them): ``(6, device, 0, mask)``, the mask's bits as a fused launch's hashes' (from 6); None where they are
  // no such launch. Sets ``hpart``, ``hmeta``, ``active`` and ``device`` as ``queue_key`` and ``fused_key`` do.
  py::object hashes_key(PyObject** hashed, Py_ssize_t hcount, py::object& hpart, py::object& hmeta,
                        py::object& active, py::object& device) {
    if (direct_driver_.is_none() || hcount < 1 || hcount > 4) return py::none();
    current_device(active, device);
    return fused_key(py::make_tuple(6, device, 0, 0), hashed, hcount, hpart, hmeta, 6);
  }

  // The key of a launch of the statistics' queue (``key``, its kind 4) with the fingerprints' items ``hashed`` (one
  // to four of one arena: bytes, each unchanged since it was queued where it keeps its version, its ints within
  // int32): ``(5, device, code, mask)``, the mask's bits from 6 the hashes' part, meta and tensors' alignments; None
  // where they are no such launch. Sets ``hpart`` and ``hmeta`` (their arena's), and fills ``hashed`` past
  // ``hcount`` with nullptr. ``kind`` 6: the hashes' launch alone (``hashes_key``).
  static py::object fused_key(const py::object& key, PyObject** hashed, Py_ssize_t hcount, py::object& hpart,
                              py::object& hmeta, int kind = 5) {
    static PyObject* names[] = {PyUnicode_InternFromString("part"), PyUnicode_InternFromString("meta")};
    PyObject* arena = nullptr;
    for (Py_ssize_t k = 0; k < hcount; ++k) {
      PyObject* item = hashed[k];
      if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 10 || !THPVariable_Check(PyTuple_GET_ITEM(item, 0)))
        return py::none();
      if (k == 0) arena = PyTuple_GET_ITEM(item, 6);
      else if (PyTuple_GET_ITEM(item, 6) != arena) return py::none();
      const at::Tensor& raw = THPVariable_Unpack(PyTuple_GET_ITEM(item, 0));
      if (raw.scalar_type() != at::kByte) return py::none();
      PyObject* version = PyTuple_GET_ITEM(item, 7);
      if (!as_queued(version, raw) || !ints_fit(item, 5)) return py::none();
    }
    for (Py_ssize_t k = hcount; k < 4; ++k) hashed[k] = nullptr;
    hpart = py::reinterpret_steal<py::object>(PyObject_GetAttr(arena, names[0]));
    if (!hpart) throw py::error_already_set();
    hmeta = py::reinterpret_steal<py::object>(PyObject_GetAttr(arena, names[1]));
    if (!hmeta) throw py::error_already_set();
    if (!THPVariable_Check(hpart.ptr()) || !THPVariable_Check(hmeta.ptr())) return py::none();
    auto aligned = [](PyObject* tensor) {
      return reinterpret_cast<uintptr_t>(THPVariable_Unpack(tensor).data_ptr()) % 16 == 0;
    };
    long mask = PyLong_AsLong(PyTuple_GET_ITEM(key.ptr(), 3));
    mask |= (aligned(hpart.ptr()) ? 1L << 6 : 0) | (aligned(hmeta.ptr()) ? 1L << 7 : 0);
    for (int k = 0; k < 4; ++k) {
      PyObject* item = hashed[k] != nullptr ? hashed[k] : hashed[0];
      if (aligned(PyTuple_GET_ITEM(item, 0))) mask |= 1L << (8 + k);
    }
    return py::make_tuple(kind, py::handle(PyTuple_GET_ITEM(key.ptr(), 1)),
                          py::handle(PyTuple_GET_ITEM(key.ptr(), 2)), mask);
  }

  // One launch straight to a compiled kernel entered in ``fast``: the entry (which holds the kernel's run) and the
  // arguments of its run. ``launch_direct`` makes them all before it launches any.
  struct DirectLaunch {
    py::object entry;
    py::object call;
  };

  // The launch of queue items ``items`` (one to four of one arena and dtype) and, with ``hcount`` of them, the
  // fingerprints' ``hashed`` in the same launch; ``count`` 0: the fingerprints' alone (``_hash_few``). False where
  // ``fast`` holds no kernel for it, or where Triton's run must serve it (the kernel's pre-run hooks, Triton's
  // options changed, another kernel under its name).
  bool prepare_direct(PyObject** items, Py_ssize_t count, PyObject** hashed, Py_ssize_t hcount, DirectLaunch& out) {
    static PyObject* names[] = {PyUnicode_InternFromString("get_current_stream"),
                                PyUnicode_InternFromString("pre_run_hooks")};
    py::object part, meta, active, device, hpart, hmeta;
    py::object key;
    if (count == 0) {
      key = hashes_key(hashed, hcount, hpart, hmeta, active, device);
    } else {
      key = queue_key(items, count, part, meta, active, device, hcount > 0);
      if (!key.is_none() && hcount > 0) key = fused_key(key, hashed, hcount, hpart, hmeta);
    }
    if (key.is_none()) return false;
    const int kind = count == 0 ? 6 : hcount > 0 ? 5 : count == 1 ? 1 : 4;
    PyObject* entry = PyDict_GetItemWithError(direct_fast_.ptr(), key.ptr());
    if (entry == nullptr) {
      if (PyErr_Occurred()) throw py::error_already_set();
      return false;
    }
    if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 8) return false;
    out.entry = py::reinterpret_borrow<py::object>(entry);  // the dict may change under the calls below
    PyObject* under_name = PyDict_GetItemWithError(PyTuple_GET_ITEM(entry, 5), PyTuple_GET_ITEM(entry, 6));
    if (under_name != PyTuple_GET_ITEM(entry, 7)) {  // another kernel under the name now (a test's stub)
      if (PyErr_Occurred()) throw py::error_already_set();
      return false;
    }
    py::object pre = py::reinterpret_steal<py::object>(PyObject_GetAttr(under_name, names[1]));
    if (!pre) throw py::error_already_set();
    if (!PyList_CheckExact(pre.ptr()) || PyList_GET_SIZE(pre.ptr()) != 0) return false;
    PyObject* held_options = PyTuple_GET_ITEM(entry, 4);
    const Py_ssize_t n_options = PyTuple_GET_SIZE(direct_options_.ptr());
    if (!PyTuple_CheckExact(held_options) || PyTuple_GET_SIZE(held_options) != n_options) return false;
    for (Py_ssize_t k = 0; k < n_options; ++k) {
      PyObject* pair = PyTuple_GET_ITEM(direct_options_.ptr(), k);
      py::object now = py::reinterpret_steal<py::object>(
          PyObject_GetAttr(PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1)));
      if (!now) throw py::error_already_set();
      const int same = PyObject_RichCompareBool(now.ptr(), PyTuple_GET_ITEM(held_options, k), Py_EQ);
      if (same < 0) throw py::error_already_set();
      if (!same) return false;
    }
    py::object stream =
        py::reinterpret_steal<py::object>(PyObject_CallMethodOneArg(active.ptr(), names[0], device.ptr()));
    if (!stream) throw py::error_already_set();
    PyObject* tail = PyTuple_GET_ITEM(entry, 3);
    if (!PyTuple_CheckExact(tail)) return false;
    std::vector<PyObject*> args;  // borrowed: each held by the queue, the entry or the locals above
    args.reserve(48);
    py::object grid, stats_programs;
    py::object zero = py::reinterpret_steal<py::object>(PyLong_FromLong(0));
    py::object one = py::reinterpret_steal<py::object>(PyLong_FromLong(1));
    if (!zero || !one) throw py::error_already_set();
    // the hashes' arguments (triton_fingerprint._arguments): hpart, hmeta, hx0..3, hn0..3, hiters0..3, hrows0..3,
    // hrow0..3, hindex0..3, an unused place the first tensor's bytes again with no programs; their programs
    auto push_hashes = [&]() {
      long long hprograms = 0;
      args.push_back(hpart.ptr());
      args.push_back(hmeta.ptr());
      for (int field = 0; field <= 5; ++field) {
        for (int k = 0; k < 4; ++k) {
          PyObject* item = hashed[k];
          if (item != nullptr) {
            args.push_back(PyTuple_GET_ITEM(item, field));
          } else {
            args.push_back(field == 0 ? PyTuple_GET_ITEM(hashed[0], 0) : field <= 2 ? one.ptr() : zero.ptr());
          }
        }
      }
      for (Py_ssize_t k = 0; k < hcount; ++k) hprograms += PyLong_AsLongLong(PyTuple_GET_ITEM(hashed[k], 3));
      return hprograms;
    };
    if (kind == 6) {  // _hash_few(hpart, hmeta, ...): the hashes alone
      grid = py::reinterpret_steal<py::object>(PyLong_FromLongLong(push_hashes()));
      if (!grid) throw py::error_already_set();
    } else if (kind == 1) {
      PyObject* item = items[0];
      grid = py::reinterpret_borrow<py::object>(PyTuple_GET_ITEM(item, 3));
      // _partials(x, n, iters, part, meta, tensor, row0, rows, repeat, code, d1, d2, d3, s0, s1, s2, s3)
      for (PyObject* arg : {PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1), PyTuple_GET_ITEM(item, 2),
                            part.ptr(), meta.ptr(), PyTuple_GET_ITEM(item, 5), PyTuple_GET_ITEM(item, 4),
                            PyTuple_GET_ITEM(item, 3), PyTuple_GET_ITEM(item, 6), PyTuple_GET_ITEM(item, 7),
                            one.ptr(), one.ptr(), one.ptr(), zero.ptr(), zero.ptr(), zero.ptr(), zero.ptr()})
        args.push_back(arg);
    } else {  // kinds 4 and 5
      // _partials_few(part, meta, x0..x3, n0..n3, iters0..3, rows0..3, row0..3, index0..3, repeat0..3, code):
      // an unused place is the first tensor again with no programs, as triton_stats._launch pads it
      long long programs = 0;
      args.push_back(part.ptr());
      args.push_back(meta.ptr());
      static const int fields[] = {0, 1, 2, 3, 4, 5, 6};
      for (int field : fields) {
        for (int k = 0; k < 4; ++k) {
          PyObject* item = items[k];
          if (item != nullptr) {
            args.push_back(PyTuple_GET_ITEM(item, field));
          } else {
            args.push_back(field == 0 ? PyTuple_GET_ITEM(items[0], 0) : field <= 2 || field == 6 ? one.ptr() : zero.ptr());
          }
        }
      }
      for (int k = 0; k < count; ++k) programs += PyLong_AsLongLong(PyTuple_GET_ITEM(items[k], 3));
      args.push_back(PyTuple_GET_ITEM(items[0], 7));
      if (kind == 5) {  // then the hashes'; then ``stats``, the statistics' programs, which come first in the grid
        const long long hprograms = push_hashes();
        stats_programs = py::reinterpret_steal<py::object>(PyLong_FromLongLong(programs));
        if (!stats_programs) throw py::error_already_set();
        args.push_back(stats_programs.ptr());
        programs += hprograms;
      }
      grid = py::reinterpret_steal<py::object>(PyLong_FromLongLong(programs));
      if (!grid) throw py::error_already_set();
    }
    // Each tensor by its address, an int: Triton's launcher takes an int for a pointer as it is, where a tensor costs
    // it a call of its data_ptr() and a cuPointerGetAttribute check each (tests/runtime/test_triton_launch.py: the
    // fake driver counts the calls). The queue and the arenas hold the tensors until the launch has returned.
    std::vector<py::object> addresses;
    addresses.reserve(16);
    for (size_t k = 0; k < args.size(); ++k) {
      PyObject* arg = args[k];
      if (PyLong_CheckExact(arg) || !THPVariable_Check(arg)) continue;  // an int's isinstance() is not free
      py::object address = py::reinterpret_steal<py::object>(
          PyLong_FromUnsignedLongLong(reinterpret_cast<uintptr_t>(THPVariable_Unpack(arg).data_ptr())));
      if (!address) throw py::error_already_set();
      args[k] = address.ptr();
      addresses.push_back(std::move(address));
    }
    // callee(grid, 1, 1, stream, *head, *arguments), or packed: callee(grid, 1, 1, stream, *head, arguments)
    // (triton_launch.direct_call: Triton's launcher, or its C launch where the launcher adds nothing per launch)
    PyObject* head = PyTuple_GET_ITEM(entry, 1);
    const int packed = PyObject_IsTrue(PyTuple_GET_ITEM(entry, 2));
    if (!PyTuple_CheckExact(head) || packed < 0) return false;
    const Py_ssize_t n_head = PyTuple_GET_SIZE(head), n_tail = PyTuple_GET_SIZE(tail);
    const Py_ssize_t n_args = static_cast<Py_ssize_t>(args.size()) + n_tail;
    py::object call = py::reinterpret_steal<py::object>(PyTuple_New(4 + n_head + (packed ? 1 : n_args)));
    if (!call) throw py::error_already_set();
    py::object arguments = packed ? py::reinterpret_steal<py::object>(PyTuple_New(n_args)) : call;
    if (!arguments) throw py::error_already_set();
    Py_ssize_t at = 0;
    auto put = [](py::object& into, Py_ssize_t& place, PyObject* arg) {
      Py_INCREF(arg);
      PyTuple_SET_ITEM(into.ptr(), place++, arg);
    };
    for (PyObject* arg : {grid.ptr(), one.ptr(), one.ptr(), stream.ptr()}) put(call, at, arg);
    for (Py_ssize_t k = 0; k < n_head; ++k) put(call, at, PyTuple_GET_ITEM(head, k));
    Py_ssize_t arg_at = packed ? 0 : at;
    for (PyObject* arg : args) put(arguments, arg_at, arg);
    for (Py_ssize_t k = 0; k < n_tail; ++k) put(arguments, arg_at, PyTuple_GET_ITEM(tail, k));
    if (packed) put(call, at, arguments.ptr());
    out.call = std::move(call);
    return true;
  }

  // Launch what the lane's queue holds straight to the compiled kernels entered for it, as Triton's run would
  // (tests/runtime/test_triton_launch.py): one to four tensors of one arena and dtype in a launch, each unchanged
  // since it was queued (its version), its ints within int32, no launch hook set, Triton's options as they were,
  // the kernel still the one under its name. A queue of tensors of several dtypes (a cast's input and output) or
  // arenas is a launch a group, in the order of their first tensors, as the Python path's (``_launch_queue``), and
  // with a waiting call's tensors a group of more than four is launches of four; each group's kernel is found before
  // any is launched. True: launched, the queue emptied (or it was empty);
  // false: the Python path's to launch (nothing done). A failed launch raises, what it and the launches after it
  // were to take put back at the front of the queue. The caller holds the kernels' lock (TritonStats._lock), as
  // every taker of the queue does.
  //
  // ``hashes`` (a call's end, the fingerprints' lock held too): where the fingerprints' queue (``lane_fingerprints``)
  // holds one to four tensors of one arena, they go in the first group's launch, ``_partials_hash_few`` (kind 5),
  // or none does (false: the Python path's ``Fingerprints.launch_with``); both queues emptied then. With the
  // statistics' queue empty (a call of integer tensors only, whose records are the integer arenas'), they are one
  // ``_hash_few`` launch of their own (kind 6), as the Python path's ``Fingerprints.launch`` would make it.
  bool launch_direct(bool hashes) {
    static PyObject* names[] = {PyUnicode_InternFromString("launch_enter_hook"),
                                PyUnicode_InternFromString("launch_exit_hook"), PyUnicode_InternFromString("calls")};
    PyObject* queue = lane_queue_.ptr();
    if (direct_fast_.is_none() || !PyList_CheckExact(queue)) return false;
    const Py_ssize_t count = PyList_GET_SIZE(queue);
    if (count > MAX_DIRECT) return false;
    PyObject* hqueue = hash_queue_.ptr();
    const Py_ssize_t hcount = hashes && PyList_CheckExact(hqueue) ? PyList_GET_SIZE(hqueue) : 0;
    if (count == 0 && hcount == 0) return true;
    if (hcount > 4) return false;
    PyObject* hashed[4] = {};
    for (Py_ssize_t k = 0; k < hcount; ++k) hashed[k] = PyList_GET_ITEM(hqueue, k);
    for (PyObject* hook : {names[0], names[1]}) {  // a profiler's hook wants Triton's run
      py::object value = py::reinterpret_steal<py::object>(PyObject_GetAttr(direct_runtime_.ptr(), hook));
      if (!value) throw py::error_already_set();
      if (value.is_none()) continue;
      py::object calls = py::reinterpret_steal<py::object>(PyObject_GetAttr(value.ptr(), names[2]));
      if (!calls) {
        PyErr_Clear();
        return false;
      }
      if (!PyList_CheckExact(calls.ptr()) || PyList_GET_SIZE(calls.ptr()) != 0) return false;
    }
    if (count == 0) return launch_hashes(hqueue, hashed, hcount);
    // the queue's groups: the items of one arena and dtype code, in the order of each group's first item; with a
    // waiting call's tensors (triton_stats.TritonStats._carried), a group of more than four in launches of four, one
    // after another, as the Python path's (``_launch_queue``)
    PyObject* keyed[MAX_DIRECT][MAX_DIRECT] = {};
    Py_ssize_t keyed_sizes[MAX_DIRECT] = {};
    int key_of[MAX_DIRECT] = {}, place_of[MAX_DIRECT] = {};
    int n_keyed = 0;
    for (Py_ssize_t k = 0; k < count; ++k) {
      PyObject* item = PyList_GET_ITEM(queue, k);
      if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 11) return false;
      int g = 0;
      for (; g < n_keyed; ++g) {
        PyObject* first = keyed[g][0];
        if (PyTuple_GET_ITEM(first, 8) != PyTuple_GET_ITEM(item, 8)) continue;
        const int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(first, 7), PyTuple_GET_ITEM(item, 7), Py_EQ);
        if (same < 0) throw py::error_already_set();
        if (same) break;
      }
      if (g == n_keyed) ++n_keyed;
      place_of[k] = static_cast<int>(keyed_sizes[g]);
      keyed[g][keyed_sizes[g]++] = item;
      key_of[k] = g;
    }
    // a group of more than four without a waiting call's tensor (its last field a tuple) is the Python path's one
    // ``_partials_many`` launch
    for (int g = 0; g < n_keyed; ++g) {
      if (keyed_sizes[g] <= 4) continue;
      bool waiting = false;
      for (Py_ssize_t k = 0; k < keyed_sizes[g] && !waiting; ++k) {
        waiting = PyTuple_CheckExact(PyTuple_GET_ITEM(keyed[g][k], 10));
      }
      if (!waiting) return false;
    }
    PyObject* groups[MAX_DIRECT][4] = {};  // the launches: at most one a queue item
    Py_ssize_t sizes[MAX_DIRECT] = {};
    int group_of[MAX_DIRECT] = {}, first_of[MAX_DIRECT] = {};
    int n_groups = 0;
    for (int g = 0; g < n_keyed; ++g) {
      first_of[g] = n_groups;
      for (Py_ssize_t start = 0; start < keyed_sizes[g]; start += 4, ++n_groups) {
        for (Py_ssize_t k = start; k < keyed_sizes[g] && k < start + 4; ++k) {
          groups[n_groups][sizes[n_groups]++] = keyed[g][k];
        }
      }
    }
    for (Py_ssize_t k = 0; k < count; ++k) group_of[k] = first_of[key_of[k]] + place_of[k] / 4;
    DirectLaunch launches[MAX_DIRECT];
    for (int g = 0; g < n_groups; ++g) {  // the hashes with the first group, as the Python path launches them
      if (!prepare_direct(groups[g], sizes[g], hashed, g == 0 ? hcount : 0, launches[g])) return false;
    }
    // taken from the queue before the launch, which may let another thread run (a backward hook's lane appends)
    py::object taken = py::reinterpret_steal<py::object>(PyList_GetSlice(queue, 0, count));
    if (!taken || PyList_SetSlice(queue, 0, count, nullptr) != 0) throw py::error_already_set();
    py::object hash_taken;
    if (hcount > 0) {
      hash_taken = py::reinterpret_steal<py::object>(PyList_GetSlice(hqueue, 0, hcount));
      if (!hash_taken || PyList_SetSlice(hqueue, 0, hcount, nullptr) != 0) {
        py::error_already_set error;
        if (PyList_SetSlice(queue, 0, 0, taken.ptr()) != 0) PyErr_Clear();
        throw error;
      }
    }
    for (int g = 0; g < n_groups; ++g) {
      const DirectLaunch& launch = launches[g];
      py::object done = py::reinterpret_steal<py::object>(
          PyObject_Call(PyTuple_GET_ITEM(launch.entry.ptr(), 0), launch.call.ptr(), nullptr));
      if (!done) {  // back at the front of the queues, for the caller to forget (their numbers null, their hashes
        py::error_already_set error;  // the torch ops'): this group's items and those of the groups after it
        py::list back;
        for (Py_ssize_t k = 0; k < count; ++k) {
          if (group_of[k] >= g) back.append(py::handle(PyList_GET_ITEM(taken.ptr(), k)));
        }
        if (PyList_SetSlice(queue, 0, 0, back.ptr()) != 0) PyErr_Clear();
        if (hcount > 0 && PyList_SetSlice(hqueue, 0, 0, hash_taken.ptr()) != 0) PyErr_Clear();
        throw error;
      }
      ++lane_direct_;
    }
    return true;
  }

  // ``launch_direct``'s launch of the fingerprints' queue ``hqueue`` alone: its ``hcount`` items ``hashed`` (one to
  // four) in one ``_hash_few``. False where that is no launch the op makes (nothing done); a failed launch raises,
  // the items put back at the front of the queue for the caller (Fingerprints.fail_queue).
  bool launch_hashes(PyObject* hqueue, PyObject** hashed, Py_ssize_t hcount) {
    DirectLaunch launch;
    if (!prepare_direct(nullptr, 0, hashed, hcount, launch)) return false;
    py::object taken = py::reinterpret_steal<py::object>(PyList_GetSlice(hqueue, 0, hcount));
    if (!taken || PyList_SetSlice(hqueue, 0, hcount, nullptr) != 0) throw py::error_already_set();
    py::object done = py::reinterpret_steal<py::object>(
        PyObject_Call(PyTuple_GET_ITEM(launch.entry.ptr(), 0), launch.call.ptr(), nullptr));
    if (!done) {
      py::error_already_set error;
      if (PyList_SetSlice(hqueue, 0, 0, taken.ptr()) != 0) PyErr_Clear();
      throw error;
    }
    ++lane_direct_;
    return true;
  }

  int64_t lane_direct_launches() const { return lane_direct_; }

  void lane_off() {  // the kernels failed, or the lane is given up: the Python path from here
    lane_queue_ = py::none();
    lane_calls_ = py::none();
    lane_arenas_ = py::none();
    lane_renew_ = py::none();
    lane_launch_ = py::none();
  }

  // Whether this thread is making a call's records (TritonStats.begin): the depth of ``calls``, the kernels'
  // per-thread call state (a ``threading.local``), is above 0. Another thread's record (one made outside any call
  // of its own, which nothing of it launches) is not the lane's.
  bool lane_open() const {
    if (lane_calls_.is_none()) return false;
    static PyObject* depth_name = PyUnicode_InternFromString("depth");
    PyObject* depth = PyObject_GetAttr(lane_calls_.ptr(), depth_name);
    if (depth == nullptr) {
      PyErr_Clear();
      return false;
    }
    const long value = PyLong_Check(depth) ? PyLong_AsLong(depth) : 0;
    Py_DECREF(depth);
    if (value == -1 && PyErr_Occurred()) PyErr_Clear();
    return value > 0;
  }

  int64_t lane_reads() const { return lane_reads_; }

  // Why the lane was given up (an arena it could not have, a queue it could not append to), once: "" else.
  std::string take_lane_error() {
    std::string error = std::move(lane_error_);
    lane_error_.clear();
    return error;
  }

  // backward.hook_api_backward, natively: a post-hook on each grad_fn behind ``outputs`` (tensors or None), the
  // outputs grouped by node in order of first appearance. The number of hooks attached.
  int64_t hook_api(py::handle outputs, int64_t index) {
    PyObject* seq = outputs.ptr();
    if (!PyTuple_CheckExact(seq) && !PyList_CheckExact(seq)) throw py::type_error("a tuple or a list");
    std::vector<std::pair<torch::autograd::Node*, std::vector<std::pair<int64_t, int64_t>>>> nodes;
    std::vector<NodeRef> held;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
      if (item == Py_None || !THPVariable_Check(item)) continue;
      const at::Tensor& t = THPVariable_Unpack(item);
      auto fn = t.grad_fn();
      if (!fn) continue;
      const std::pair<int64_t, int64_t> position{static_cast<int64_t>(i), static_cast<int64_t>(t.output_nr())};
      bool found = false;
      for (auto& node : nodes) {
        if (node.first == fn.get()) {
          node.second.push_back(position);
          found = true;
          break;
        }
      }
      if (!found) {
        nodes.push_back({fn.get(), {position}});
        held.push_back(std::move(fn));
      }
    }
    for (size_t k = 0; k < nodes.size(); ++k) {
      drop_stale(held[k]->post_hooks(), this, generation_);
      held[k]->add_post_hook(
          std::make_unique<ApiBackwardHook>(shared_from_this(), generation_, index, std::move(nodes[k].second)));
    }
    return static_cast<int64_t>(nodes.size());
  }

  // backward.hook_module_backward in one call, where every value is None or a plain tensor (else None, for
  // the Python hooks): the module call ``index``'s tensor hooks on its outputs that require grad, and (with
  // ``want_output``) the consumer hooks after the walk of its inputs that require grad, or a tensor hook on
  // an input that no node inside takes (every input past ``limit`` nodes). ``(n_out, n_in, leaves)``: the
  // entry's widths, and ``(tensor, field, slot)`` for each hook on a leaf, whose hooks run in its gradient
  // accumulator, for the caller to hook with torch's. Nothing is hooked where no output requires grad.
  py::object hook_module(int64_t index, py::handle inputs, py::handle outputs, bool want_output, int64_t limit) {
    PyObject* ins = inputs.ptr();
    PyObject* outs = outputs.ptr();
    if (!PyList_CheckExact(ins) || !PyList_CheckExact(outs)) throw py::type_error("inputs, outputs: lists");
    for (PyObject* seq : {ins, outs}) {
      for (Py_ssize_t i = 0; i < PyList_GET_SIZE(seq); ++i) {
        PyObject* item = PyList_GET_ITEM(seq, i);
        if (item != Py_None && !THPVariable_CheckExact(item)) return py::none();
      }
    }
    auto requires_grad = [](PyObject* item) {
      return item != Py_None && THPVariable_Unpack(item).requires_grad();
    };
    std::vector<int64_t> out_positions, in_slot(static_cast<size_t>(PyList_GET_SIZE(ins)), -1);
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(outs); ++i) {
      if (requires_grad(PyList_GET_ITEM(outs, i))) out_positions.push_back(i);
    }
    py::list leaves;
    if (out_positions.empty()) return py::make_tuple(0, 0, leaves);
    std::vector<GraphKey> keys;
    int64_t n_in = 0;
    if (want_output) {
      for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ins); ++i) {
        PyObject* item = PyList_GET_ITEM(ins, i);
        if (!requires_grad(item)) continue;
        in_slot[static_cast<size_t>(i)] = n_in++;
        auto edge = gradient_edge(THPVariable_Unpack(item));
        if (edge.first == nullptr) continue;
        bool known = false;
        for (auto& key : keys) {
          if (key.first == edge) {
            key.second.push_back(i);
            known = true;
            break;
          }
        }
        if (!known) keys.push_back({edge, {static_cast<int64_t>(i)}});
      }
    }
    auto tensor_hook = [&](PyObject* item, int64_t field, int64_t slot) {
      const at::Tensor& t = THPVariable_Unpack(item);
      auto fn = t.grad_fn();
      if (!fn) {
        leaves.append(py::make_tuple(py::handle(item), field, slot));
        return;
      }
      drop_stale(fn->tensor_pre_hooks(), this, generation_);
      fn->add_tensor_pre_hook(std::make_unique<ModuleTensorHook>(shared_from_this(), generation_, index, field, slot,
                                                                 static_cast<size_t>(t.output_nr())));
    };
    for (size_t k = 0; k < out_positions.size(); ++k) {
      tensor_hook(PyList_GET_ITEM(outs, out_positions[k]), 0, static_cast<int64_t>(k));
    }
    std::vector<bool> taken(in_slot.size(), false);
    Consumers found;
    if (!keys.empty() && walk_keys(inputs, outputs, keys, limit, &found)) {
      auto call = std::make_shared<ModuleCall>();
      call->partial.resize(in_slot.size());
      call->left.assign(in_slot.size(), 0);
      for (auto& node : found) {
        for (auto& edge : node.second) {
          taken[static_cast<size_t>(edge.second)] = true;
          edge.second = in_slot[static_cast<size_t>(edge.second)];
          ++call->left[static_cast<size_t>(edge.second)];
        }
      }
      for (auto& node : found) {
        drop_stale(node.first->post_hooks(), this, generation_);
        node.first->add_post_hook(
            std::make_unique<ModuleConsumerHook>(shared_from_this(), generation_, index, call, std::move(node.second)));
      }
    }
    for (size_t i = 0; i < in_slot.size(); ++i) {
      if (in_slot[i] >= 0 && !taken[i]) tensor_hook(PyList_GET_ITEM(ins, static_cast<Py_ssize_t>(i)), 1, in_slot[i]);
    }
    return py::make_tuple(static_cast<int64_t>(out_positions.size()), n_in, leaves);
  }

  // One module tensor hook's call (or an input's completed sum), with the GIL held.
  void module_gradient(int64_t generation, int64_t index, int64_t field, int64_t slot, const at::Tensor& grad) {
    if (generation != generation_ || !collecting || arrivals_.is_none()) return;
    module_gradient_record(index, field, slot, grad);
    lane_launch();
  }

  void module_gradient_record(int64_t index, int64_t field, int64_t slot, const at::Tensor& grad) {
    try {
      at::NoGradGuard no_grad;
      PyObject* record = gradient_record(grad);
      if (record == nullptr) return module_fallback(index, field, slot, grad);
      py::tuple arrival = py::make_tuple(index, field, slot, py::reinterpret_steal<py::object>(record));
      untrack_flat(arrival.ptr());  // it waits for the collector (take_arrivals), maybe to the flush: see below
      if (PyList_Append(arrivals_.ptr(), arrival.ptr()) != 0) throw py::error_already_set();
    } catch (const std::exception&) {
      PyErr_Clear();
      module_fallback(index, field, slot, grad);
    }
  }

  // One module consumer hook's call, with the GIL held.
  void module_consumed(int64_t generation, int64_t index, ModuleCall& call,
                       const std::vector<std::pair<int64_t, int64_t>>& edges,
                       const torch::autograd::variable_list& grad_inputs) {
    if (generation != generation_ || !collecting || arrivals_.is_none()) return;
    for (const auto& edge : edges) {
      const size_t slot = static_cast<size_t>(edge.second);
      try {
        if (edge.first < static_cast<int64_t>(grad_inputs.size()) && grad_inputs[edge.first].defined()) {
          at::NoGradGuard no_grad;
          const at::Tensor& grad = grad_inputs[edge.first];
          call.partial[slot] = call.partial[slot].defined() ? call.partial[slot] + grad : grad;
        }
      } catch (const std::exception&) {
        PyErr_Clear();  // a sum that failed: this edge's gradient is left out, as a failed Python record is
      }
      if (--call.left[slot] == 0) {
        at::Tensor sum = std::move(call.partial[slot]);
        call.partial[slot] = at::Tensor();
        module_gradient(generation, index, 1, edge.second, sum);
      }
    }
  }

  // One API backward hook's call, with the GIL held.
  void api_backward(int64_t generation, int64_t index, const std::vector<std::pair<int64_t, int64_t>>& positions,
                    const torch::autograd::variable_list& grad_inputs,
                    const torch::autograd::variable_list& grad_outputs) {
    if (generation != generation_ || !collecting || arrivals_.is_none()) return;
    api_backward_records(index, positions, grad_inputs, grad_outputs);
    lane_launch();
  }

  void api_backward_records(int64_t index, const std::vector<std::pair<int64_t, int64_t>>& positions,
                            const torch::autograd::variable_list& grad_inputs,
                            const torch::autograd::variable_list& grad_outputs) {
    try {
      at::NoGradGuard no_grad;
      py::list received;  // (position, record) of the gradients w.r.t. the API's outputs
      for (const auto& position : positions) {
        if (position.second >= static_cast<int64_t>(grad_outputs.size())) continue;
        PyObject* record = gradient_record(grad_outputs[position.second]);
        if (record == nullptr) return fallback(index, positions, grad_inputs, grad_outputs);
        received.append(py::make_tuple(position.first, py::reinterpret_steal<py::object>(record)));
      }
      py::list sent(static_cast<Py_ssize_t>(grad_inputs.size()));  // records of the gradients w.r.t. its inputs
      for (size_t k = 0; k < grad_inputs.size(); ++k) {
        PyObject* record = gradient_record(grad_inputs[k]);
        if (record == nullptr) return fallback(index, positions, grad_inputs, grad_outputs);
        PyList_SET_ITEM(sent.ptr(), static_cast<Py_ssize_t>(k), record);
      }
      py::tuple arrival = py::make_tuple(index, received, sent);
      // Untracked where its records are: a step's arrivals wait for the collector's next call or its flush (a whole
      // backward pass's, where no forward call follows), and kept tracked they outlived the young collections of
      // the backward into the oldest generation, which brought on full collections of the whole heap
      // (tests/runtime/test_entry_tracking.py; bench/per_entry.py --steady). take_arrivals only reads them.
      const Py_ssize_t n_received = PyList_GET_SIZE(received.ptr());
      for (Py_ssize_t k = 0; k < n_received; ++k) untrack_flat(PyList_GET_ITEM(received.ptr(), k));
      if (untrack_flat(received.ptr()) && untrack_flat(sent.ptr())) untrack_flat(arrival.ptr());
      if (PyList_Append(arrivals_.ptr(), arrival.ptr()) != 0) throw py::error_already_set();
    } catch (const std::exception&) {
      PyErr_Clear();
      fallback(index, positions, grad_inputs, grad_outputs);  // the collector's Python records it, or logs why not
    }
  }

 private:
  PyObject* gradient_record(const at::Tensor& grad) {  // None for an undefined gradient; nullptr: not served
    if (!grad.defined()) {
      Py_INCREF(Py_None);
      return Py_None;
    }
    return tensor_record(grad, LANE_HOOK);  // the lane's, launched as the hook ends (``lane_launch``)
  }

  // What the lane queued in a backward hook, launched by its ``launch`` as the hook ends (no call's ``end``
  // follows a hook: a gradient held to the next one would keep its memory). An error is the launcher's to report.
  void lane_launch() {
    if (lane_hook_queued_ == 0) return;
    lane_hook_queued_ = 0;
    try {
      if (launch_held()) return;
      lane_launch_();
    } catch (const std::exception&) {
      PyErr_Clear();
    }
  }

  // A hook's queue launched straight (``launch_direct``) under the kernels' lock, taken without waiting: true where
  // it was. With fingerprints queued (summary_mode fingerprint), their lock too, taken after the kernels' as the
  // Python path takes them, and the hashes go with the statistics (``launch_direct(true)``). False (nothing
  // launched) where no lock was given, another thread holds one, or ``launch_direct`` cannot serve it; and where the
  // launch failed, its tensors back in the queues: the lane's ``launch`` then tries it again and leaves them null
  // if it fails there too. Python frames of the launch each hook saved (bench/per_entry.py, "its backward entry").
  bool launch_held() {
    if (direct_lock_.is_none() || direct_fast_.is_none()) return false;
    const bool hashes = PyList_CheckExact(hash_queue_.ptr()) && PyList_GET_SIZE(hash_queue_.ptr()) > 0;
    if (hashes && hash_lock_.is_none()) return false;
    if (!try_acquire(direct_lock_)) return false;
    bool launched = false;
    try {  // the kernels' lock released whatever happens here
      if (!hashes || try_acquire(hash_lock_)) {
        try {
          launched = launch_direct(hashes);
        } catch (const std::exception&) {
          PyErr_Clear();
        }
        if (hashes) release(hash_lock_);
      }
    } catch (const std::exception&) {
      PyErr_Clear();
    }
    release(direct_lock_);
    return launched;
  }

  static bool try_acquire(const py::object& lock) {  // ``lock.acquire(False)``
    static PyObject* name = PyUnicode_InternFromString("acquire");
    py::object got = py::reinterpret_steal<py::object>(PyObject_CallMethodOneArg(lock.ptr(), name, Py_False));
    if (!got) throw py::error_already_set();
    return got.ptr() == Py_True;
  }

  static void release(const py::object& lock) {
    static PyObject* name = PyUnicode_InternFromString("release");
    py::object released = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(lock.ptr(), name));
    if (!released) throw py::error_already_set();
  }

  void fallback(int64_t index, const std::vector<std::pair<int64_t, int64_t>>& positions,
                const torch::autograd::variable_list& grad_inputs,
                const torch::autograd::variable_list& grad_outputs) {
    try {
      py::list pairs;
      for (const auto& position : positions) pairs.append(py::make_tuple(position.first, position.second));
      fallback_(owner_, index, pairs, wrapped(grad_inputs), wrapped(grad_outputs));
    } catch (const std::exception&) {
      PyErr_Clear();  // the fallback logs its own errors; nothing of ours reaches the backward
    }
  }

  void module_fallback(int64_t index, int64_t field, int64_t slot, const at::Tensor& grad) {
    try {
      py::object value = grad.defined() ? py::reinterpret_steal<py::object>(THPVariable_Wrap(grad)) : py::none();
      if (!value) throw py::error_already_set();
      module_fallback_(owner_, index, field, slot, value);
    } catch (const std::exception&) {
      PyErr_Clear();
    }
  }

  static py::tuple wrapped(const torch::autograd::variable_list& grads) {  // as torch passes them to a hook
    py::tuple out(grads.size());
    for (size_t k = 0; k < grads.size(); ++k) {
      PyObject* item = grads[k].defined() ? THPVariable_Wrap(grads[k]) : (Py_INCREF(Py_None), Py_None);
      if (item == nullptr) throw py::error_already_set();
      PyTuple_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(k), item);
    }
    return out;
  }

  py::object arrivals_ = py::none();
  py::object fallback_ = py::none();
  py::object module_fallback_ = py::none();
  py::object owner_ = py::none();
  int64_t generation_ = 0;
  // Where a record is made: a call's records (the lane's while a call's records are open), a backward hook's.
  enum LaneUse { LANE_CALL, LANE_HOOK };

  // Whether ``t`` is on a device of the lane (``lane``): a CUDA tensor, or a CPU one with ``cpu``, which is then
  // never read by the op's own statistics, as a CUDA tensor is not (the Python path, or the lane, serves it).
  bool lane_device(const at::Tensor& t) const {
    if (lane_queue_.is_none() || !t.defined()) return false;
    const c10::Device device = t.device();
    return device.is_cuda() || (lane_cpu_ && device.is_cpu());
  }

  // Whether the lane takes ``t``, one of its device's whose data is its own: a float32, float16 or bfloat16 one
  // whose elements fill one block of memory, each once, from its data pointer: a contiguous one, or a transposed
  // or permuted one (a gradient through a transpose, attention's), read as that block in memory order, as the
  // Python path reads it (statistics.dense_view, then TritonStats._queued), so with the same bits. A fingerprint
  // hashes the bytes in the tensor's own order (``hash_prepare``: a transposed one's copied into that order first).
  static bool lane_takes(const at::Tensor& t) {
    const at::ScalarType type = t.scalar_type();
    if (type != at::kFloat && type != at::kBFloat16 && type != at::kHalf) return false;
    if (t.is_neg() || t.numel() == 0) return false;
    return t.is_contiguous() || t.is_non_overlapping_and_dense();
  }

  // Whether the lane takes ``t`` (one it does not take as it is: ``lane_takes``) by a copy of its values in their own
  // order (``slice_copy``): a float32, float16 or bfloat16 one of at most four dimensions whose elements do not fill
  // one block, none of them repeated: a slice (``x[..., :k]``, rotary embeddings' halves, and their gradients). The
  // Python path reads such a tensor in that order through its strides (``TritonStats.add``: ``_partials`` of its
  // layout), so with the same bits; one of more dimensions is the torch ops' there, and stays the Python path's.
  // A broadcast is ``broadcast_once``'s, its values each once.
  static bool slice_takes(const at::Tensor& t) {
    const at::ScalarType type = t.scalar_type();
    if (type != at::kFloat && type != at::kBFloat16 && type != at::kHalf) return false;
    if (t.is_neg() || t.numel() == 0 || t.dim() > 4) return false;
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (t.stride(d) == 0 && t.size(d) > 1) return false;
    }
    return true;
  }

  // ``t``'s values in their own order, copied on its device (the copy the native op makes of a CPU tensor's slice:
  // ``dense_once``), with no autograd node: what the lane queues for ``t``. One copy a tensor read, where its record
  // is not served again; it is the values at the record, so an input read after its call is read as it was then.
  static at::Tensor slice_copy(const at::Tensor& t) {
    at::NoGradGuard no_grad;
    return t.detach().contiguous();
  }

  // An arena's state as the lane reads it (triton_stats._Arena's ``rows``, ``capacity``, ``room``, ``slots``,
  // ``counts``): its attributes are slots, so reading them runs no Python code.
  struct ArenaState {
    py::object slots, counts;
    int64_t rows = 0, capacity = 0, room = 0;
  };

  // The attribute names, made once (interned: no string is made per read).
  static PyObject* name(int which) {
    static PyObject* names[6] = {PyUnicode_InternFromString("slots"), PyUnicode_InternFromString("counts"),
                                 PyUnicode_InternFromString("rows"), PyUnicode_InternFromString("capacity"),
                                 PyUnicode_InternFromString("room"), PyUnicode_InternFromString("key")};
    return names[which];
  }

  static int64_t int_attr(PyObject* arena, int which) {
    PyObject* value = PyObject_GetAttr(arena, name(which));
    if (value == nullptr) throw py::error_already_set();
    const long long out = PyLong_AsLongLong(value);
    Py_DECREF(value);
    if (out == -1 && PyErr_Occurred()) throw py::error_already_set();
    return static_cast<int64_t>(out);
  }

  static ArenaState arena_state(PyObject* arena) {
    ArenaState state;
    state.slots = py::reinterpret_steal<py::object>(PyObject_GetAttr(arena, name(0)));
    state.counts = py::reinterpret_steal<py::object>(PyObject_GetAttr(arena, name(1)));
    if (!state.slots || !state.counts) throw py::error_already_set();
    if (!PyList_CheckExact(state.slots.ptr()) || !PyList_CheckExact(state.counts.ptr()))
      throw py::type_error("an arena's slots and counts: lists");
    state.rows = int_attr(arena, 2);
    state.capacity = int_attr(arena, 3);
    state.room = int_attr(arena, 4);
    return state;
  }

  // ``t``'s rows taken in the arena filling on its device and its launch queued: the record of ``shown`` (``t``, or
  // the broadcast ``t`` is the narrowed view of, each of its values ``repeat`` times there: ``broadcast_once``),
  // its row ``(mark, arena's key, tensor)``. The arena is read afresh each time: the Python path fills it too, and
  // a flush or a full arena replaces it.
  PyObject* lane_read(const at::Tensor& t, const at::Tensor& shown, int64_t repeat, py::object* row, bool* scalar,
                      LaneUse use) {
    const int64_t n = t.numel();
    int64_t iters = 1, grid = (n + block_ - 1) / block_;
    if (n > block_ * max_rows_) {
      iters = (n + block_ * max_rows_ - 1) / (block_ * max_rows_);
      grid = (n + block_ * iters - 1) / (block_ * iters);
    }
    const int64_t index = device_index(t);
    py::object wrapped = py::reinterpret_steal<py::object>(THPVariable_Wrap(t));
    if (!wrapped) throw py::error_already_set();
    // summary_mode fingerprint: the tensor's bytes too (Fingerprints.add), their slot made and arena found first,
    // since both may run Python code (another thread then); the arenas' states are read last, with none between
    HashRead hash;
    // a broadcast's bytes are those of all its elements (the Python path hashes ``t.contiguous()``), not its block's
    if (checksums_) hash = hash_prepare(repeat > 1 ? shown : t, index, wrapped);
    auto known = lane_keys_.find(index);
    if (known == lane_keys_.end()) known = lane_keys_.emplace(index, py::make_tuple(index, 4, false)).first;
    py::object arena = py::reinterpret_borrow<py::object>(PyDict_GetItemWithError(lane_arenas_.ptr(), known->second.ptr()));
    if (!arena && PyErr_Occurred()) throw py::error_already_set();
    ArenaState state;
    if (arena) state = arena_state(arena.ptr());
    if (!arena || state.rows + grid > state.capacity || PyList_GET_SIZE(state.slots.ptr()) >= state.room) {
      arena = lane_renew_(wrapped, grid);
      state = arena_state(arena.ptr());
      if (state.rows + grid > state.capacity || PyList_GET_SIZE(state.slots.ptr()) >= state.room)
        throw py::value_error("a fresh arena without room");
    }
    if (checksums_) hash_state(&hash);
    const int64_t row0 = state.rows, tensor = PyList_GET_SIZE(state.slots.ptr());
    const int64_t version = t.is_inference() ? -1 : static_cast<int64_t>(t._version());
    const int64_t code = t.scalar_type() == at::kFloat ? 0 : t.scalar_type() == at::kHalf ? 1 : 2;
    PyObject* item = PyTuple_New(11);
    if (item == nullptr) throw py::error_already_set();
    py::object held_item = py::reinterpret_steal<py::object>(item);
    const int64_t numbers[] = {n, iters, grid, row0, tensor, repeat, code};
    PyTuple_SET_ITEM(item, 0, wrapped.release().ptr());
    for (int k = 0; k < 7; ++k) {
      PyObject* number = PyLong_FromLongLong(numbers[k]);
      if (number == nullptr) throw py::error_already_set();
      PyTuple_SET_ITEM(item, k + 1, number);
    }
    Py_INCREF(arena.ptr());
    PyTuple_SET_ITEM(item, 8, arena.ptr());
    PyObject* held_version = PyLong_FromLongLong(version);
    if (held_version == nullptr) throw py::error_already_set();
    PyTuple_SET_ITEM(item, 9, held_version);
    Py_INCREF(Py_None);
    PyTuple_SET_ITEM(item, 10, Py_None);
    py::object rows = py::reinterpret_steal<py::object>(PyLong_FromLongLong(row0 + grid));
    if (!rows) throw py::error_already_set();
    HashPlace place;
    // the row names the arena by its key (an int): plain data, which the writing process is sent as it is
    py::object key = py::reinterpret_steal<py::object>(PyObject_GetAttr(arena.ptr(), name(5)));
    if (!key) throw py::error_already_set();
    if (checksums_) {
      place = hash_place(hash);  // the fingerprint by its place too
      *row = py::make_tuple(lane_mark_, key, tensor, place.key, place.tensor);
    } else {
      *row = py::make_tuple(lane_mark_, key, tensor);
    }
    // the arenas changed only once nothing can fail: a tensor in its slots that no launch describes would have
    // ``_finish`` read a metadata row never written (only a MemoryError fails an append)
    PyObject* queue = lane_queue_.ptr();
    if (PyList_Append(queue, item) != 0) throw py::error_already_set();
    if (PyList_Append(state.slots.ptr(), lane_mark_.ptr()) != 0) {
      PyList_SetSlice(queue, PyList_GET_SIZE(queue) - 1, PyList_GET_SIZE(queue), nullptr);
      throw py::error_already_set();
    }
    if (PyList_Append(state.counts.ptr(), lane_mark_.ptr()) != 0) {
      PyList_SetSlice(queue, PyList_GET_SIZE(queue) - 1, PyList_GET_SIZE(queue), nullptr);
      PyList_SetSlice(state.slots.ptr(), tensor, tensor + 1, nullptr);
      throw py::error_already_set();
    }
    if (checksums_ && !hash_commit(hash, place)) {
      PyList_SetSlice(queue, PyList_GET_SIZE(queue) - 1, PyList_GET_SIZE(queue), nullptr);
      PyList_SetSlice(state.slots.ptr(), tensor, tensor + 1, nullptr);
      PyList_SetSlice(state.counts.ptr(), tensor, tensor + 1, nullptr);
      throw py::error_already_set();
    }
    if (PyObject_SetAttr(arena.ptr(), name(2), rows.ptr()) != 0) throw py::error_already_set();
    ++lane_reads_;
    if (use == LANE_HOOK) ++lane_hook_queued_;
    *scalar = shown.dim() == 0;
    return new_record(shown, row->ptr(), *scalar);
  }

  // A tensor's bytes on their way into the fingerprints' queue (``lane_fingerprints``), between ``hash_prepare``
  // and ``hash_queue_item``.
  struct HashRead {
    py::object raw, arena, key, watch;
    ArenaState state;
    int64_t bytes = 0, iters = 1, programs = 1;
  };

  // What a record's fingerprint takes (``hash_place``): ``hash``'s queue item, its arena's rows once it is in,
  // and the record's place there (the fingerprints' arena's key and the tensor's index), made before anything changes.
  struct HashPlace {
    py::object item, rows, key;
    Py_ssize_t tensor = 0;
  };

  HashPlace hash_place(const HashRead& hash) {
    HashPlace place;
    place.item = hash_queue_item(hash);
    place.rows = long_of(hash.state.rows + hash.programs);
    place.key = py::reinterpret_steal<py::object>(PyObject_GetAttr(hash.arena.ptr(), name(5)));
    if (!place.key) throw py::error_already_set();
    place.tensor = PyList_GET_SIZE(hash.state.slots.ptr());
    return place;
  }

  // ``place``'s item queued and its arena's slot taken, both or neither (false, the Python error set: the caller
  // undoes its own appends), then the arena's rows moved on.
  bool hash_commit(const HashRead& hash, const HashPlace& place) {
    PyObject* hashes = hash_queue_.ptr();
    if (PyList_Append(hashes, place.item.ptr()) != 0) return false;
    if (PyList_Append(hash.state.slots.ptr(), lane_mark_.ptr()) != 0) {
      PyList_SetSlice(hashes, PyList_GET_SIZE(hashes) - 1, PyList_GET_SIZE(hashes), nullptr);
      return false;
    }
    if (PyObject_SetAttr(hash.arena.ptr(), name(2), place.rows.ptr()) != 0) throw py::error_already_set();
    return true;
  }

  // ``t``'s bytes in its own order, as the Python path hashes them (``t.contiguous()``): a flat uint8 view of a
  // contiguous one (no copy), a copy of a transposed or permuted one or of a broadcast's elements (``contiguous``, an
  // ATen copy on its device, which the hash queue holds until its launch, as the Python path's copy; ``reshape``
  // gave a broadcast of one value a stride-0 view); triton_fingerprint.plan of them,
  // and an arena of their device with room for them (made by ``renew`` where the one filling is full). A copy is
  // the bytes at the record, so an input read after its call keeps its fingerprint where the call changed it (its
  // statistics null), as the Python path's copy does.
  HashRead hash_prepare(const at::Tensor& t, int64_t index, py::object& wrapped) {
    static PyObject* watch_name = PyUnicode_InternFromString("watch");
    HashRead hash;
    const at::Tensor raw = t.detach().contiguous().view({-1}).view(at::kByte);
    hash.raw = py::reinterpret_steal<py::object>(THPVariable_Wrap(raw));
    if (!hash.raw) throw py::error_already_set();
    hash.bytes = raw.numel();
    const int64_t blocks = (hash.bytes + hash_block_ - 1) / hash_block_;
    if (blocks <= hash_one_) {
      hash.iters = blocks;
    } else {
      hash.iters = std::min(std::max<int64_t>(1, (blocks + hash_programs_ - 1) / hash_programs_), hash_iters_);
      hash.programs = (blocks + hash.iters - 1) / hash.iters;
    }
    hash.watch = py::reinterpret_steal<py::object>(PyObject_GetAttr(lane_calls_.ptr(), watch_name));
    if (!hash.watch) throw py::error_already_set();
    hash.key = long_of(index);
    py::object arena = py::reinterpret_borrow<py::object>(PyDict_GetItemWithError(hash_arenas_.ptr(), hash.key.ptr()));
    if (!arena && PyErr_Occurred()) throw py::error_already_set();
    if (!arena || !hash_room(arena.ptr(), hash.programs)) arena = hash_renew_(wrapped, hash.programs);
    hash.arena = arena;
    return hash;
  }

  // Whether the fingerprints' arena ``arena`` has room for ``programs`` rows and a tensor.
  static bool hash_room(PyObject* arena, int64_t programs) {
    py::object slots = py::reinterpret_steal<py::object>(PyObject_GetAttr(arena, name(0)));
    if (!slots) throw py::error_already_set();
    if (!PyList_CheckExact(slots.ptr())) throw py::type_error("an arena's slots: a list");
    return int_attr(arena, 2) + programs <= int_attr(arena, 3) && PyList_GET_SIZE(slots.ptr()) < int_attr(arena, 4);
  }

  // The state of ``hash``'s arena, read with no Python code run after it until the record is made; the arena must
  // still be the one filling, with room (another thread's records between may have filled it: the lane then gives
  // itself up, as for a statistics arena).
  void hash_state(HashRead* hash) {
    PyObject* filling = PyDict_GetItemWithError(hash_arenas_.ptr(), hash->key.ptr());
    if (filling == nullptr && PyErr_Occurred()) throw py::error_already_set();
    if (filling != hash->arena.ptr() || !hash_room(filling, hash->programs))
      throw py::value_error("a fingerprints' arena without room");
    hash->state.slots = py::reinterpret_steal<py::object>(PyObject_GetAttr(filling, name(0)));
    if (!hash->state.slots) throw py::error_already_set();
    hash->state.rows = int_attr(filling, 2);
  }

  // The queue item of ``hash`` (Fingerprints.add's): ``(bytes, n, iters, programs, first row, index, arena,
  // version, watch, slot)``, its version counter kept where its call reads it after the call (``watch``).
  py::object hash_queue_item(const HashRead& hash) {
    py::object version = py::none();
    if (!hash.watch.is_none()) {
      const at::Tensor& raw = THPVariable_Unpack(hash.raw.ptr());
      version = long_of(raw.is_inference() ? -1 : static_cast<int64_t>(raw._version()));
    }
    return py::make_tuple(hash.raw, hash.bytes, hash.iters, hash.programs, hash.state.rows,
                          PyList_GET_SIZE(hash.state.slots.ptr()), hash.arena, version, hash.watch, py::none());
  }

  // ``block`` (the lane's): what ``broadcast_once`` made of ``t``, each of its values ``repeat`` times in ``t``.
  PyObject* read(const at::Tensor& t, py::object* row, bool* scalar, bool lane, LaneUse use,
                 const at::Tensor& block = at::Tensor(), int64_t repeat = 1, bool integers = false) {
    if (lane) {
      try {
        if (integers) return checksums_ ? integer_checksum_read(t, row, scalar) : integer_read(t, row, scalar);
        return lane_read(block.defined() ? block : t, t, repeat, row, scalar, use);
      } catch (const std::exception& error) {  // the lane given up (its error kept for the runtime to say once):
        lane_error_ = error.what();            // this record and every later one are the Python path's
        PyErr_Clear();
        lane_off();
        return nullptr;
      }
    }
    const std::vector<double> values = stats(t, counts_);
    if (values.empty()) return nullptr;
    ++reads_;
    // the numbers as native doubles, one bytes object: one allocation, marshalled as one copy and freed as one,
    // where a tuple of floats was seven objects (json_files.native_json unpacks it in the writing process)
    PyObject* packed = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(values.data()),
                                                 static_cast<Py_ssize_t>(values.size() * sizeof(double)));
    if (packed == nullptr) throw py::error_already_set();
    *row = py::reinterpret_steal<py::object>(packed);
    *scalar = t.dim() == 0;
    return new_record(t, row->ptr(), *scalar);
  }

  // A record in summary_mode fingerprint (``checksums``): the lane's only, or nullptr; the same tensor at the same
  // version served again whatever its size (Collector._reuse's rule for a checksum), never a view by place.
  PyObject* checksum_record(const at::Tensor& t, LaneUse use) {
    if (!fingerprinting() || !lane_device(t) || !own_data(t)) return nullptr;
    if (!(use == LANE_HOOK || lane_open())) return nullptr;
    // no bytes: its record made at once, as the Python path's (null statistics, the empty fingerprint), so that a
    // backward hook with an empty gradient (``cat``'s of an empty cache) is not all the Python path's
    if (t.numel() == 0) return new_record(t, hash_empty_row_.ptr(), false);
    const bool integers = integers_take(t);  // read by ``integer_checksum_read``
    // one not in one block: a broadcast (the gradient ``sum`` gives back) read as ``tensor_record`` reads it (its
    // block, each value ``repeat`` times) and hashed whole (``lane_read``), or a slice read by a copy in its own
    // order, whose bytes the fingerprint hashes too
    at::Tensor block;
    int64_t repeat = 1;
    bool slice = false;  // the copy made only where it is read
    if (!integers && !lane_takes(t)) {
      block = broadcast_once(t, &repeat);
      if (repeat == 1 || !lane_takes(block)) {
        if (!slice_takes(t)) return nullptr;
        block = at::Tensor();
        repeat = 1;
        slice = true;
      }
    }
    py::object row;
    bool scalar = false;
    if (t.is_inference()) {  // no version counter: read each time
      return read(t, &row, &scalar, true, use, slice ? slice_copy(t) : block, repeat, integers);
    }
    const int64_t version = t._version();
    Recent* same = nullptr;
    for (Recent& held : recent_) {
      if (held.tensor.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        if (held.version == version) return new_record(t, held.row.ptr(), held.scalar);
        same = &held;
        break;
      }
    }
    PyObject* record = read(t, &row, &scalar, true, use, slice ? slice_copy(t) : block, repeat, integers);
    if (record == nullptr) return nullptr;
    Recent entry{t, version, false, nullptr, t.numel(), t.scalar_type(), row, scalar};
    if (same != nullptr) {
      *same = std::move(entry);
    } else {
      recent_.push_back(std::move(entry));
      if (recent_.size() > keep_) recent_.erase(recent_.begin());
    }
    return record;
  }

  PyObject* tensor_record(const at::Tensor& t, LaneUse use = LANE_CALL) {
    if (checksums_) return checksum_record(t, use);
    bool lane = false, reuse_only = false;
    at::Tensor block;  // a broadcast's values, each once (``broadcast_once``), where the lane reads those
    int64_t repeat = 1;
    bool slice = false;  // the lane reads a copy of ``t`` (``slice_copy``), made only where it is read
    bool integers = false;  // an integer or bool one, read by ``integer_read``
    if (lane_device(t)) {
      if (!own_data(t)) return nullptr;  // a subclass's, say: the Python path's
      const bool open = use == LANE_HOOK || lane_open();
      lane = open && lane_takes(t);
      if (open && !lane && integers_take(t)) {
        lane = integers = true;
      } else if (open && !lane) {  // a broadcast (the gradient ``sum`` gives back): its block, if the lane takes that
        block = broadcast_once(t, &repeat);
        lane = repeat > 1 && lane_takes(block);
        if (!lane && repeat == 1 && slice_takes(t)) lane = slice = true;
      }
      // one it does not take (outside a call, another layout): served again where its elements were read by the
      // lane (a transpose of an activation), else left to the Python path, which reads it (nullptr)
      reuse_only = !lane;
    }
    if (!lane && !reuse_only && !readable(t)) return integral_record(t);
    const int64_t n = t.numel();
    // nothing to read: its statistics null, as the Python path's record of an empty tensor (no counts), made here so
    // that a backward hook with an empty gradient (``cat``'s of an empty tensor) is not all the Python path's
    if (n == 0) return new_record(t, empty_row(), false);
    py::object row;
    bool scalar = false;
    if (n < below_ || t.is_inference()) {
      if (reuse_only) return nullptr;
      return read(t, &row, &scalar, lane, use, slice ? slice_copy(t) : block, repeat, integers);
    }
    const int64_t version = t._version();
    Recent* same = nullptr;
    for (Recent& held : recent_) {
      if (held.tensor.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        if (held.version == version) return new_record(t, held.row.ptr(), held.scalar);
        same = &held;
        break;
      }
    }
    const bool placed = !t.is_neg() && t.is_non_overlapping_and_dense();
    const void* data = placed ? t.data_ptr() : nullptr;
    const Recent* match = nullptr;
    if (placed) {
      for (const Recent& held : recent_) {
        if (held.placed && held.data == data && held.numel == n && held.dtype == t.scalar_type() &&
            held.version == version && held.tensor._version() == version) {
          match = &held;
          break;
        }
      }
    }
    const Leaf* leaf = match == nullptr && placed ? leaf_at(data, n, t.scalar_type(), version) : nullptr;
    PyObject* record;
    if (match != nullptr) {
      row = match->row;
      scalar = match->scalar;
      record = new_record(t, row.ptr(), scalar);
    } else if (leaf != nullptr) {
      row = leaf->row;
      scalar = leaf->scalar;
      record = new_record(t, row.ptr(), scalar);
    } else {
      if (reuse_only) return nullptr;
      record = read(t, &row, &scalar, lane, use, slice ? slice_copy(t) : block, repeat, integers);
      if (record == nullptr) return nullptr;
      if (placed && t.is_leaf() && t.requires_grad()) {
        leaves_.insert_or_assign(
            data, Leaf{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t.getIntrusivePtr()),
                       version, n, t.scalar_type(), row, scalar});
      }
    }
    Recent entry{t, version, placed, data, n, t.scalar_type(), row, scalar};
    if (same != nullptr) {
      *same = std::move(entry);  // where it was: the oldest goes first, as in a dict
    } else {
      recent_.push_back(std::move(entry));
      if (recent_.size() > keep_) recent_.erase(recent_.begin());
    }
    return record;
  }

  // The leaf read this step whose elements are exactly these (the leaf itself or a view of it: a transpose, a
  // detach), unchanged since: views share their base's version counter. None where the leaf is gone, or now
  // holds other memory (``param.data = ...``), or moved on.
  const Leaf* leaf_at(const void* data, int64_t n, at::ScalarType dtype, int64_t version) {
    auto found = leaves_.find(data);
    if (found == leaves_.end()) return nullptr;
    const Leaf& leaf = found->second;
    if (leaf.numel != n || leaf.dtype != dtype || leaf.version != version) return nullptr;
    auto held = leaf.impl.lock();
    if (!held || held->version_counter().current_version() != version || !held->has_storage() ||
        held->data() != data || held->numel() != n || c10::typeMetaToScalarType(held->dtype()) != dtype) {
      return nullptr;
    }
    return &leaf;
  }

  bool counts_;
  int64_t below_;
  size_t keep_;
  py::object lane_queue_ = py::none();
  py::object lane_renew_ = py::none();
  py::object lane_launch_ = py::none();
  py::object lane_mark_ = py::none();
  bool lane_cpu_ = false;
  int64_t block_ = 1, max_rows_ = 1, lane_reads_ = 0, lane_hook_queued_ = 0;
  std::string lane_error_;
  py::object lane_calls_ = py::none();
  py::object lane_arenas_ = py::none();
  py::object direct_fast_ = py::none(), direct_driver_ = py::none(), direct_runtime_ = py::none();
  py::object direct_options_ = py::none();
  py::object direct_lock_ = py::none();
  int64_t lane_direct_ = 0;
  std::unordered_map<int64_t, py::object> lane_keys_;  // device index -> the arenas' key of its lane
  // summary_mode fingerprint (``checksums``): records only by the lane, each with its fingerprint queued too
  bool checksums_ = false;
  py::object hash_queue_ = py::none(), hash_arenas_ = py::none(), hash_renew_ = py::none();
  py::object hash_lock_ = py::none();  // the fingerprints' lock (``lane_fingerprints``)
  py::object hash_empty_row_ = py::none();
  py::object int_arenas_ = py::none(), int_renew_ = py::none(), int_mark_ = py::none();  // ``lane_integers``
  int64_t int_reads_ = 0;
  int64_t hash_block_ = 1, hash_one_ = 1, hash_programs_ = 1, hash_iters_ = 1;
  py::object later_;
  std::vector<Recent> recent_;
  std::unordered_map<const void*, Leaf> leaves_;
  int64_t reads_ = 0;
};

torch::autograd::variable_list ModuleTensorHook::operator()(const torch::autograd::variable_list& grads) {
  if (Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    recorder_->module_gradient(generation_, index_, field_, slot_, value_ < grads.size() ? grads[value_] : at::Tensor());
  }
  return grads;
}

torch::autograd::variable_list ModuleConsumerHook::operator()(const torch::autograd::variable_list& grad_inputs,
                                                               const torch::autograd::variable_list& grad_outputs) {
  if (Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    recorder_->module_consumed(generation_, index_, *call_, edges_, grad_inputs);
  }
  return grad_inputs;
}

torch::autograd::variable_list ApiBackwardHook::operator()(const torch::autograd::variable_list& grad_inputs,
                                                            const torch::autograd::variable_list& grad_outputs) {
  if (Py_IsInitialized()) {
    py::gil_scoped_acquire gil;
    recorder_->api_backward(generation_, index_, positions_, grad_inputs, grad_outputs);
  }
  return grad_inputs;
}

#if PY_VERSION_HEX >= 0x030B0000
// A captured stack's identity: each frame's code object and instruction offset, and the outer pair it refers
// to (null when the walk did not stop at an anchor). The pair stored for a key holds every object it names, so
// no address in a stored key can be taken by another object meanwhile.
struct StackKey {
  std::vector<std::pair<const void*, int>> frames;
  const void* outer;
  bool operator==(const StackKey& other) const { return outer == other.outer && frames == other.frames; }
};

struct StackKeyHash {
  size_t operator()(const StackKey& key) const {
    size_t h = std::hash<const void*>()(key.outer);
    for (const auto& frame : key.frames) {
      h = (h * 1000003u) ^ std::hash<const void*>()(frame.first);
      h = (h * 1000003u) ^ static_cast<size_t>(frame.second);
    }
    return h;
  }
};

constexpr size_t STACKS_KEPT = 1 << 13;  // past it the table starts over (a few thousand call paths is usual)

// Never destroyed: its pairs are Python objects, which must not be released after the interpreter is gone.
std::unordered_map<StackKey, PyObject*, StackKeyHash>& captured_stacks() {
  static auto* table = new std::unordered_map<StackKey, PyObject*, StackKeyHash>();
  return *table;
}

// call_stacks.capture, one frame object at a time through the public API (PyFrame_GetBack, PyFrame_GetCode,
// PyFrame_GetLasti: Python 3.11+): ``((code, f_lasti, code, f_lasti, ...), outer)``, innermost first, to
// ``anchor`` (included, the pair then holding ``outer``) or ``limit`` frames (then None). Equal stacks are one
// pair (call_stacks.capture's contract): the same call site gives back the same object every step, made once.
py::tuple capture(py::handle frame, py::handle anchor, py::handle outer, int64_t limit) {
  if (!frame.is_none() && !PyFrame_Check(frame.ptr())) throw py::type_error("a frame or None");
  std::vector<py::object> codes;
  StackKey key{{}, nullptr};
  py::object current = py::reinterpret_borrow<py::object>(frame);
  bool anchored = false;
  int64_t count = 0;
  while (!current.is_none() && count < limit) {
    PyFrameObject* f = reinterpret_cast<PyFrameObject*>(current.ptr());
    codes.push_back(py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(PyFrame_GetCode(f))));
    key.frames.push_back({codes.back().ptr(), PyFrame_GetLasti(f)});
    if (current.ptr() == anchor.ptr()) {
      anchored = true;
      break;
    }
    PyFrameObject* back = PyFrame_GetBack(f);  // a new reference, or NULL at the outermost frame
    current = back == nullptr ? py::none() : py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(back));
    ++count;
  }
  if (anchored) key.outer = outer.ptr();
  auto& table = captured_stacks();
  auto known = table.find(key);
  if (known != table.end()) return py::reinterpret_borrow<py::tuple>(known->second);
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(2 * codes.size()));
  if (tuple == nullptr) throw py::error_already_set();
  for (size_t i = 0; i < codes.size(); ++i) {
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(2 * i), codes[i].release().ptr());
    PyObject* lasti = PyLong_FromLong(key.frames[i].second);
    if (lasti == nullptr) {
      Py_DECREF(tuple);
      throw py::error_already_set();
    }
    PyTuple_SET_ITEM(tuple, static_cast<Py_ssize_t>(2 * i + 1), lasti);
  }
  py::tuple pair = py::make_tuple(py::reinterpret_steal<py::object>(untracked(tuple)),  // code objects, ints
                                  anchored ? py::reinterpret_borrow<py::object>(outer) : py::none());
  if (!anchored || outer.is_none() || !PyObject_GC_IsTracked(outer.ptr())) untracked(pair.ptr());
  if (table.size() >= STACKS_KEPT) {
    for (auto& item : table) Py_DECREF(item.second);
    table.clear();
  }
  Py_INCREF(pair.ptr());
  table.emplace(std::move(key), pair.ptr());
  return pair;
}
#endif

// The Python path's record classes (``seal_types``: records.TensorRecord, statistics.Slot), whose instances ``seal``
// may untrack: what is assigned to one later (a Slot's Batch of numbers, a fallback's tensor) refers back to none of
// them, so that no reference cycle passes through one, and an untracked object's referents are only ever kept
// alive by it, never freed early.
PyObject* sealed_types[4] = {};

void seal_types(py::tuple types) {
  if (PyTuple_GET_SIZE(types.ptr()) > 4) throw py::value_error("seal_types: four classes at most");
  for (PyObject*& held : sealed_types) Py_CLEAR(held);
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(types.ptr()); ++k) {
    PyObject* type = PyTuple_GET_ITEM(types.ptr(), k);
    // a class of __slots__ only: its referents are its fields and the class itself (subtype_traverse)
    if (!PyType_Check(type) || reinterpret_cast<PyTypeObject*>(type)->tp_dictoffset != 0) {
      throw py::type_error("seal_types: classes of __slots__ only");
    }
    Py_INCREF(type);
    sealed_types[k] = type;
  }
}

// Whether ``object`` holds nothing the garbage collector need look at, untracked where it can be: an untracked
// object; an exact tuple of such (as CPython untracks one itself at its next collection); an instance of a class of
// ``seal_types`` whose fields are such. ``depth``: how far down the fields are looked at (a record, its slot).
bool seal_item(PyObject* object, int depth) {
  if (!PyObject_GC_IsTracked(object)) return true;
  if (depth == 0) return false;
  PyTypeObject* type = Py_TYPE(object);
  if (type == &PyTuple_Type) {
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(object); ++k) {
      if (!seal_item(PyTuple_GET_ITEM(object, k), depth - 1)) return false;
    }
    PyObject_GC_UnTrack(object);
    return true;
  }
  bool known = false;
  for (PyObject* held : sealed_types) known = known || held == reinterpret_cast<PyObject*>(type);
  if (!known || type->tp_traverse == nullptr) return false;
  struct Walk {
    PyObject* type;
    int depth;
  } walk{reinterpret_cast<PyObject*>(type), depth - 1};
  const int stopped = type->tp_traverse(
      object,
      [](PyObject* field, void* arg) -> int {
        const Walk* walk = static_cast<const Walk*>(arg);
        return field == walk->type || seal_item(field, walk->depth) ? 0 : 1;
      },
      &walk);
  if (stopped != 0) return false;
  PyObject_GC_UnTrack(object);
  return true;
}

// A finished entry (``{"input_args": [records], "input_kwargs": {...}, "output": [records], ...}``, or a backward
// entry's ``input`` and ``output``) whose every record holds nothing the garbage collector need look at (the op's
// untracked tuples, None, the Python path's records of ``seal_types`` once their fields are such) is untracked
// itself, with its lists and records: what is written into its lists later is the op's records (the Python hooks
// write into fresh lists: backward.writable). Kept tracked, an entry, its two lists and a Python path's records and
// slots outlived the young collections of its step into the oldest generation, where they brought on full
// collections of the whole heap (bench/per_entry.py --steady; tests/runtime/test_entry_tracking.py). A dict that is
// given a tracked value later is tracked again by CPython itself; a list is not, so only a list of untracked items
// is untracked. A tuple (a named one without a ``__dict__``: the step's ``ApiBackwardHook``) of untracked items is
// untracked as CPython would untrack an exact tuple at its next collection. True where the entry was.
bool seal(py::handle entry) {
  PyObject* object = entry.ptr();
  if (PyTuple_Check(object)) return untrack_flat(object);
  if (!PyDict_CheckExact(object)) return false;
  PyObject* lists[8];
  int n_lists = 0;
  Py_ssize_t place = 0;
  PyObject *key, *value;
  while (PyDict_Next(object, &place, &key, &value)) {
    if (PyList_CheckExact(value)) {
      if (n_lists == 8) return false;
      lists[n_lists++] = value;
    } else if (PyDict_CheckExact(value)) {  // keyword arguments' records: tracked again if given a tracked value
      Py_ssize_t at = 0;
      PyObject *name, *record;
      while (PyDict_Next(value, &at, &name, &record)) {
        if (!seal_item(record, 3)) return false;
      }
      if (PyObject_GC_IsTracked(value)) PyObject_GC_UnTrack(value);
    } else if (!seal_item(value, 3)) {
      return false;
    }
  }
  for (int k = 0; k < n_lists; ++k) {  // all or none: a list of an item that stays tracked leaves the entry tracked
    const Py_ssize_t count = PyList_GET_SIZE(lists[k]);
    for (Py_ssize_t i = 0; i < count; ++i) {
      if (!seal_item(PyList_GET_ITEM(lists[k], i), 3)) return false;
    }
  }
  for (int k = 0; k < n_lists; ++k) untrack_flat(lists[k]);
  if (PyObject_GC_IsTracked(object)) PyObject_GC_UnTrack(object);
  return true;
}

// backward._consumer_edges over autograd's own graph (walk_module): ``[(node, [(edge index, input position)])]``,
// or None past ``limit`` nodes.
py::object consumer_edges(py::handle inputs, py::handle outputs, py::handle targets, int64_t limit) {
  std::vector<std::pair<NodeRef, std::vector<std::pair<int64_t, int64_t>>>> found;
  if (!walk_module(inputs, outputs, targets, limit, &found)) return py::none();
  py::list out;
  for (const auto& node : found) {
    py::list edges;
    for (const auto& edge : node.second) edges.append(py::make_tuple(edge.first, edge.second));
    py::object python_node = py::reinterpret_steal<py::object>(torch::autograd::functionToPyObject(node.first));
    if (!python_node) throw py::error_already_set();
    out.append(py::make_tuple(python_node, edges));
  }
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
#if PY_VERSION_HEX >= 0x030B0000
  m.def("capture", &capture, "call_stacks.capture: a stack's code objects and instruction offsets, to an anchor");
#endif
  m.def("seal", &seal, "A finished entry of untracked records untracked, with its lists");
  m.def("seal_types", &seal_types, "The Python path's record classes, whose instances seal may untrack");
  m.def("consumer_edges", &consumer_edges, "backward._consumer_edges: a module's nodes that consume its inputs");
  m.def("stats", &stats, "Max, Min, Mean, Norm, NaN and Inf counts of a CPU float tensor in one pass");
  m.def("monitor_figures", &monitor_figures, "msprobe's monitor ops of a CPU float tensor in one pass (metrics.py)");
  m.def("stats_low", &stats_low, "stats, then the zero and largest-magnitude counts, of a CPU float8 tensor");
  py::class_<Recorder, std::shared_ptr<Recorder>>(m, "Recorder")
      .def(py::init<bool, int64_t, size_t, py::object>())
      .def("observe_backward", &Recorder::observe_backward, "Where API backward hooks put their records")
      .def("hook_api", &Recorder::hook_api, "backward.hook_api_backward: a native post-hook on each grad_fn")
      .def("hook_module", &Recorder::hook_module, "backward.hook_module_backward's hooks of one module call")
      .def("hooks_on", &Recorder::hooks_on, "this Recorder's hooks on a tensor's grad_fn (for tests)")
      .def_readwrite("collecting", &Recorder::collecting, "Whether the hooks record (the collector's flag)")
      .def("lane", &Recorder::lane, "Records of a call's device tensors queued for the Triton kernels")
      .def("lane_off", &Recorder::lane_off, "No more device tensors in the lane")
      .def("lane_direct", &Recorder::lane_direct, "The compiled kernels the lane's queue may be launched to directly",
           py::arg("fast"), py::arg("driver"), py::arg("runtime"), py::arg("options"), py::arg("lock") = py::none())
      .def("launch_direct", &Recorder::launch_direct, "Launch the lane's queue straight to its compiled kernel",
           py::arg("hashes") = false)
      .def("direct_key", &Recorder::direct_key, "The key of the compiled kernel a launch of queue items goes to",
           py::arg("items"), py::arg("hashes") = py::none())
      .def("checksums", &Recorder::checksums, "summary_mode fingerprint: records by the lane only, with fingerprints")
      .def("lane_fingerprints", &Recorder::lane_fingerprints, "The lane's records queue their fingerprints too")
      .def("fingerprints_off", &Recorder::fingerprints_off, "No more fingerprints by the lane")
      .def("lane_integers", &Recorder::lane_integers, "The lane records integer and bool device tensors too, exactly")
      .def_property_readonly("integer_reads", &Recorder::integer_reads, "integer and bool tensors the lane recorded")
      .def_property_readonly("fingerprinting", &Recorder::fingerprinting, "Whether the lane makes fingerprints")
      .def_property_readonly("direct_launches", &Recorder::lane_direct_launches, "Launches made by launch_direct")
      .def_property_readonly("lane_open", &Recorder::lane_open, "Whether this thread is making a call's records")
      .def_property_readonly("lane_reads", &Recorder::lane_reads, "Device tensors queued by the lane this step")
      .def("take_lane_error", &Recorder::take_lane_error, "Why the lane was given up, once; empty else")
      .def("records", &Recorder::records, "Records of a call's arguments or outputs: plain tensors, None, builtins")
      .def("clear", &Recorder::clear, "Forget the tensors read (a new step)")
      .def("forget", &Recorder::forget, "Forget the tensors read, not the hooks (start, stop, an optimizer step)")
      .def_property_readonly("reads", &Recorder::reads, "Tensors read so far (not those served again)");
}

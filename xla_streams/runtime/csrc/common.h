// Shared by the host and CUDA backends: the attributes lower-to-ffi writes into
// each custom call, element types, reductions, configuration and the trace.
//
// The custom calls' attributes (names, types, meanings) are defined once, in
// xla_streams/runtime/abi.py (CollectiveCall): `xla_streams_start` carries all of
// them as an MLIR dictionary in backend_config, `xla_streams_done` op_id, name,
// kind and stream. DecodeAttrs below reads them; tests/runtime/test_abi.py checks
// that the two name the same attributes with the same types.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace xs {

namespace ffi = xla::ffi;

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

enum class Kind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kCollectivePermute };
enum class Reduction { kNone, kAdd, kMultiply, kMin, kMax, kAnd, kOr };

inline bool ParseKind(std::string_view s, Kind* kind) {
  if (s == "all-reduce") *kind = Kind::kAllReduce;
  else if (s == "all-gather") *kind = Kind::kAllGather;
  else if (s == "reduce-scatter") *kind = Kind::kReduceScatter;
  else if (s == "all-to-all") *kind = Kind::kAllToAll;
  else if (s == "collective-permute") *kind = Kind::kCollectivePermute;
  else return false;
  return true;
}

inline const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce: return "all-reduce";
    case Kind::kAllGather: return "all-gather";
    case Kind::kReduceScatter: return "reduce-scatter";
    case Kind::kAllToAll: return "all-to-all";
    case Kind::kCollectivePermute: return "collective-permute";
  }
  return "?";
}

inline bool ParseReduction(std::string_view s, Reduction* r) {
  if (s.empty()) *r = Reduction::kNone;
  else if (s == "add") *r = Reduction::kAdd;
  else if (s == "multiply") *r = Reduction::kMultiply;
  else if (s == "min") *r = Reduction::kMin;
  else if (s == "max") *r = Reduction::kMax;
  else if (s == "and") *r = Reduction::kAnd;
  else if (s == "or") *r = Reduction::kOr;
  else return false;
  return true;
}

inline const char* DTypeName(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::PRED: return "pred";
    case ffi::DataType::S8: return "s8";
    case ffi::DataType::S16: return "s16";
    case ffi::DataType::S32: return "s32";
    case ffi::DataType::S64: return "s64";
    case ffi::DataType::U8: return "u8";
    case ffi::DataType::U16: return "u16";
    case ffi::DataType::U32: return "u32";
    case ffi::DataType::U64: return "u64";
    case ffi::DataType::F16: return "f16";
    case ffi::DataType::BF16: return "bf16";
    case ffi::DataType::F32: return "f32";
    case ffi::DataType::F64: return "f64";
    default: return "unsupported";
  }
}

// The attributes of one collective, decoded from the call's dictionary.
struct OpAttrs {
  int64_t op_id = -1;
  std::string name;
  Kind kind = Kind::kAllReduce;
  int64_t stream = 0;
  Reduction reduction = Reduction::kNone;
  std::vector<std::vector<int64_t>> groups;
  int64_t dimension = -1;
  std::vector<int64_t> outer;
  int64_t channel = 0;
  int64_t num_partitions = 1;
  std::vector<int64_t> device_ids;

  std::string Describe() const {
    std::ostringstream os;
    os << KindName(kind) << " '" << name << "' (op " << op_id << ", stream " << stream << ")";
    return os.str();
  }
};

template <typename T>
inline ffi::Error Get(const ffi::Dictionary& attrs, std::string_view key, T* out) {
  auto value = attrs.get<T>(key);
  if (!value.has_value()) {
    return ffi::Error::InvalidArgument("xla_streams: attribute '" + std::string(key) +
                                       "' missing or of the wrong type");
  }
  *out = *value;
  return ffi::Error::Success();
}

inline std::vector<int64_t> GetArray(const ffi::Dictionary& attrs, std::string_view key) {
  if (!attrs.contains(key)) return {};
  auto value = attrs.get<ffi::Span<const int64_t>>(key);
  if (!value.has_value()) return {};
  return std::vector<int64_t>(value->begin(), value->end());
}

// Decodes what a done needs (op_id, name, kind, stream) or, with `full`, everything.
inline ffi::Error DecodeAttrs(const ffi::Dictionary& attrs, bool full, OpAttrs* op) {
  if (auto e = Get<int64_t>(attrs, "op_id", &op->op_id); !e.success()) return e;
  std::string_view name, kind;
  if (auto e = Get<std::string_view>(attrs, "name", &name); !e.success()) return e;
  op->name = std::string(name);
  if (auto e = Get<std::string_view>(attrs, "kind", &kind); !e.success()) return e;
  if (!ParseKind(kind, &op->kind)) {
    return ffi::Error::InvalidArgument("xla_streams: unknown collective kind '" +
                                       std::string(kind) + "'");
  }
  if (auto e = Get<int64_t>(attrs, "stream", &op->stream); !e.success()) return e;
  if (op->stream < 0 || op->stream >= 64) {
    return ffi::Error::InvalidArgument("xla_streams: stream " + std::to_string(op->stream) +
                                       " outside 0..63 in " + op->Describe());
  }
  if (!full) return ffi::Error::Success();
  std::string_view reduction;
  if (auto e = Get<std::string_view>(attrs, "reduction", &reduction); !e.success()) return e;
  if (!ParseReduction(reduction, &op->reduction)) {
    return ffi::Error::InvalidArgument("xla_streams: unknown reduction '" +
                                       std::string(reduction) + "' in " + op->Describe());
  }
  std::vector<int64_t> flat = GetArray(attrs, "groups");
  std::vector<int64_t> sizes = GetArray(attrs, "group_sizes");
  size_t at = 0;
  for (int64_t size : sizes) {
    if (size < 0 || at + size > flat.size()) {
      return ffi::Error::InvalidArgument("xla_streams: groups and group_sizes disagree in " +
                                         op->Describe());
    }
    op->groups.emplace_back(flat.begin() + at, flat.begin() + at + size);
    at += size;
  }
  if (at != flat.size()) {
    return ffi::Error::InvalidArgument("xla_streams: groups and group_sizes disagree in " +
                                       op->Describe());
  }
  if (auto e = Get<int64_t>(attrs, "dimension", &op->dimension); !e.success()) return e;
  op->outer = GetArray(attrs, "outer");
  if (attrs.contains("channel")) {
    if (auto e = Get<int64_t>(attrs, "channel", &op->channel); !e.success()) return e;
  }
  if (auto e = Get<int64_t>(attrs, "num_partitions", &op->num_partitions); !e.success()) return e;
  op->device_ids = GetArray(attrs, "device_ids");
  if ((op->reduction == Reduction::kNone) !=
      (op->kind != Kind::kAllReduce && op->kind != Kind::kReduceScatter)) {
    return ffi::Error::InvalidArgument("xla_streams: " + op->Describe() +
                                       (op->reduction == Reduction::kNone
                                            ? " needs a reduction"
                                            : " takes no reduction"));
  }
  return ffi::Error::Success();
}

inline std::string ShapeString(ffi::DataType dtype, ffi::Span<const int64_t> dims) {
  std::ostringstream os;
  os << DTypeName(dtype) << "[";
  for (size_t i = 0; i < dims.size(); ++i) os << (i ? "," : "") << dims[i];
  os << "]";
  return os.str();
}

inline std::string JoinIds(const std::vector<int64_t>& ids) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ids.size(); ++i) os << (i ? ", " : "") << ids[i];
  os << "]";
  return os.str();
}

// ---------------------------------------------------------------------------
// Configuration and trace, one instance per library.

// The timeout's bounds, as Python's abi.MIN_TIMEOUT_S and abi.MAX_TIMEOUT_S
// (Python checks XLA_STREAMS_TIMEOUT_S and sets the timeout when it loads the
// library): at most a week, so that NowNs() + TimeoutNs() cannot overflow.
constexpr int64_t kMinTimeoutMs = 1;
constexpr int64_t kMaxTimeoutMs = int64_t{7} * 24 * 3600 * 1000;

struct Config {
  std::atomic<int64_t> timeout_ms{300000};
  std::atomic<bool> trace{false};
};

inline Config& GlobalConfig() {
  static Config* config = [] {
    auto* c = new Config();
    if (const char* env = std::getenv("XLA_STREAMS_TRACE")) {
      c->trace = env[0] == '1';
    }
    return c;
  }();
  return *config;
}

inline void SetTimeoutMs(int64_t ms) {
  GlobalConfig().timeout_ms = std::clamp(ms, kMinTimeoutMs, kMaxTimeoutMs);
}

inline int64_t TimeoutMs() { return GlobalConfig().timeout_ms.load(); }
inline int64_t TimeoutNs() { return TimeoutMs() * 1000000; }

// One trace record. `what`: start | done | collective | compute.
struct TraceEvent {
  std::string what;
  int64_t device = -1;   // device ordinal
  int64_t logical = -1;  // logical id (replica * num_partitions + partition)
  int64_t stream = -1;
  int64_t op_id = -1;
  std::string name;
  std::string kind;
  int64_t begin_ns = 0;
  int64_t end_ns = 0;
  double begin_ms = -1;  // CUDA event timings, relative to the device's base event
  double end_ms = -1;
};

class Trace {
 public:
  static Trace& Get() {
    static Trace* trace = new Trace();
    return *trace;
  }
  bool enabled() const { return GlobalConfig().trace.load(std::memory_order_relaxed); }
  void Add(TraceEvent event) {
    std::lock_guard<std::mutex> lock(mu_);
    if (events_.size() >= kMaxEvents) events_.pop_front();
    events_.push_back(std::move(event));
  }
  void Clear() {
    std::lock_guard<std::mutex> lock(mu_);
    events_.clear();
  }
  std::string Json() {
    std::lock_guard<std::mutex> lock(mu_);
    std::ostringstream os;
    os << "[";
    bool first = true;
    for (const TraceEvent& e : events_) {
      os << (first ? "" : ",") << "{\"what\":\"" << e.what << "\",\"device\":" << e.device
         << ",\"logical\":" << e.logical << ",\"stream\":" << e.stream
         << ",\"op_id\":" << e.op_id << ",\"name\":\"" << Escape(e.name) << "\",\"kind\":\""
         << e.kind << "\",\"begin_ns\":" << e.begin_ns << ",\"end_ns\":" << e.end_ns;
      if (e.begin_ms >= 0) os << ",\"begin_ms\":" << e.begin_ms << ",\"end_ms\":" << e.end_ms;
      os << "}";
      first = false;
    }
    os << "]";
    return os.str();
  }

 private:
  static constexpr size_t kMaxEvents = 1 << 20;
  static std::string Escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '"' || c == '\\') out.push_back('\\');
      if (static_cast<unsigned char>(c) >= 0x20) out.push_back(c);
    }
    return out;
  }
  std::mutex mu_;
  std::deque<TraceEvent> events_;
};

// Runs a handler body, turning a C++ exception (say, std::bad_alloc) into an
// error for the call: nothing may unwind through XLA's C API and abort.
template <typename F>
ffi::Error Guarded(const char* what, F&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("xla_streams: ") + what + ": " + e.what());
  } catch (...) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("xla_streams: ") + what + " failed");
  }
}

// Copies `text` into a caller buffer; returns the length it needs (without NUL).
inline size_t CopyOut(const std::string& text, char* buffer, size_t capacity) {
  if (buffer != nullptr && capacity > 0) {
    size_t n = std::min(capacity - 1, text.size());
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return text.size();
}

}  // namespace xs

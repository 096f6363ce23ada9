// Host backend of the xla_streams runtime: collectives between the CPU devices
// of one process, run by per-device, per-stream worker threads.
//
// `xla_streams_start` (typed FFI, platform Host) registers its operand and
// result buffers with an in-process rendezvous keyed by (run id, op id,
// occurrence, group) and returns at once; the last member to arrive hands the
// collective to the worker of (device, stream) of every member.
// `xla_streams_done` returns an ffi::Future that completes when every member
// has finished its part, so no XLA thread ever blocks on a peer.
//
// Workers read their peers' operands in place, without a copy. lower-to-ffi
// passes the operands to the done as well, so XLA keeps them alive and
// unwritten until the done, and a done completes only once every member has
// finished; a start's results are defined while its operands are live, so XLA
// gives them buffers of their own. Only a caller that aliases a result with an
// operand (input_output_aliases on a start, which lower-to-ffi never writes)
// gets that operand copied at the start.
//
// A worker never waits for a peer: it is handed a collective only once every
// member has arrived and computes its own part (its results from everyone's
// operands; for an all-reduce, one slice of every member's result), so devices
// that issue collectives in different orders cannot deadlock. A small
// collective is not handed over at all: the last member to arrive runs every
// part in its start. A watchdog fails a rendezvous that does not complete
// within the timeout, naming the devices that never arrived.
#include <condition_variable>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <type_traits>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common.h"

namespace xs::host {
namespace {

// ---------------------------------------------------------------------------
// Element arithmetic.

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400) == 0) {
        mantissa <<= 1;
        --exponent;
      }
      mantissa &= 0x3ff;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    // value = mantissa * 2^(exponent - 150); in units of 2^-24: >> (126 - exponent).
    uint32_t exponent = abs >> 23;
    uint32_t mantissa = (abs & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - exponent;
    uint32_t result = mantissa >> shift;
    uint32_t rest = mantissa & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (result & 1))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
  uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1);  // round to nearest even
  rounded -= (127 - 15) << 23;
  return static_cast<uint16_t>(sign | (rounded >> 13));
}

float Bf16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // nan
  x += 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

// Integers wrap like XLA's: computed in uint64_t, truncated to T.
template <typename T>
T Sum(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  } else {
    return a + b;
  }
}

template <typename T>
T Product(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
  } else {
    return a * b;
  }
}

// Calls fn(op) with reduction r as a binary operation on V; false if V has none
// (and/or of floating point values).
template <typename V, typename Fn>
bool WithOperation(Reduction r, Fn fn) {
  switch (r) {
    case Reduction::kAdd: fn([](V a, V b) { return Sum(a, b); }); return true;
    case Reduction::kMultiply: fn([](V a, V b) { return Product(a, b); }); return true;
    case Reduction::kMin: fn([](V a, V b) { return b < a ? b : a; }); return true;
    case Reduction::kMax: fn([](V a, V b) { return a < b ? b : a; }); return true;
    case Reduction::kAnd:
    case Reduction::kOr:
      if constexpr (std::is_integral_v<V>) {
        if (r == Reduction::kAnd) {
          fn([](V a, V b) { return static_cast<V>(a & b); });
        } else {
          fn([](V a, V b) { return static_cast<V>(a | b); });
        }
        return true;
      }
      return false;
    case Reduction::kNone: return false;
  }
  return false;
}

// Copies a slice of a result; `stream`: with non-temporal stores, which do not
// read the destination into the cache first (a third less memory traffic for
// results too large to stay in the cache until their consumers read them).
void CopyResult(char* dst, const char* src, size_t bytes, bool stream) {
#if defined(__SSE2__)
  if (stream && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
    size_t i = 0;
    for (; i + 16 <= bytes; i += 16) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    }
    std::memcpy(dst + i, src + i, bytes - i);
    _mm_sfence();  // non-temporal stores are not ordered by the release that follows
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

// out[i] = ins[0][i] op ins[1][i] op ... (rank order, rounding every step as
// XLA's own CPU collectives do) for i < count: a pass over `out` per operand.
template <typename T, typename Op>
void ReduceInto(const std::vector<const char*>& ins, char* out, size_t count, Op op) {
  if (count == 0) return;  // `ins` may be empty then (Reducible asks so)
  T* acc = reinterpret_cast<T*>(out);
  std::memcpy(acc, ins[0], count * sizeof(T));
  for (size_t r = 1; r < ins.size(); ++r) {
    const T* in = reinterpret_cast<const T*>(ins[r]);
    for (size_t i = 0; i < count; ++i) acc[i] = op(acc[i], in[i]);
  }
}

// Reduces `count` elements of every input into `out`; false if the runtime has
// no such reduction of `dtype`.
bool Reduce(ffi::DataType dtype, Reduction r, const std::vector<const char*>& ins, char* out,
            size_t count) {
  auto plain = [&](auto zero) {
    using T = decltype(zero);
    return WithOperation<T>(r, [&](auto op) { ReduceInto<T>(ins, out, count, op); });
  };
  // Halves are computed in float and rounded back after every step.
  auto half = [&](auto to_float, auto from_float) {
    return WithOperation<float>(r, [&](auto op) {
      ReduceInto<uint16_t>(ins, out, count, [&](uint16_t a, uint16_t b) {
        return from_float(op(to_float(a), to_float(b)));
      });
    });
  };
  switch (dtype) {
    case ffi::DataType::F32: return plain(float{});
    case ffi::DataType::F64: return plain(double{});
    case ffi::DataType::S8: return plain(int8_t{});
    case ffi::DataType::S16: return plain(int16_t{});
    case ffi::DataType::S32: return plain(int32_t{});
    case ffi::DataType::S64: return plain(int64_t{});
    case ffi::DataType::U8: return plain(uint8_t{});
    case ffi::DataType::U32: return plain(uint32_t{});
    case ffi::DataType::F16:
      return half([](uint16_t h) { return HalfToFloat(h); },
                  [](float f) { return FloatToHalf(f); });
    case ffi::DataType::BF16:
      return half([](uint16_t h) { return Bf16ToFloat(h); },
                  [](float f) { return FloatToBf16(f); });
    case ffi::DataType::PRED:  // add/max/or are logical or; multiply/min/and logical and
      if (r == Reduction::kNone) return false;
      if (r == Reduction::kAdd || r == Reduction::kMax || r == Reduction::kOr) {
        ReduceInto<uint8_t>(ins, out, count, [](uint8_t a, uint8_t b) -> uint8_t {
          return (a | b) != 0;
        });
      } else {
        ReduceInto<uint8_t>(ins, out, count, [](uint8_t a, uint8_t b) -> uint8_t {
          return a != 0 && b != 0;
        });
      }
      return true;
    default:
      return false;
  }
}

// Whether Reduce implements reduction r of dtype (asked with nothing to reduce,
// so that the two cannot disagree).
bool Reducible(ffi::DataType dtype, Reduction r) { return Reduce(dtype, r, {}, nullptr, 0); }

// ---------------------------------------------------------------------------
// Runtime state.

struct Copy {
  const void* src;
  void* dst;
  size_t bytes;
};

struct Leaf {
  void* data;
  size_t bytes;
  int64_t count;
  std::vector<int64_t> dims;
};

class Worker;
class Device;

// One device's part of a collective, from its start to its done.
struct Participant {
  int rank = 0;
  int device = 0;
  int64_t logical = 0;
  ffi::DataType dtype = ffi::DataType::INVALID;
  std::vector<Leaf> in, out;
  std::vector<std::unique_ptr<char[]>> staged;  // copies of operands a result overlaps
  Worker* worker = nullptr;
  Device* owner = nullptr;
  int64_t begin_ns = 0;  // when its part began
  // The done's future completes once the collective has finished and the done
  // has been called, whichever comes last.
  std::mutex mu;
  bool complete = false;
  std::string error;                    // non-empty: failed
  std::optional<ffi::Promise> promise;  // set by a done that came first
  std::vector<Copy> copies;             // done outputs not aliased to the start's
  bool trace_done = false;
  TraceEvent done_event;
};

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // run, op, occurrence, group

struct Instance {
  Key key;
  std::shared_ptr<const OpAttrs> attrs;
  std::vector<int64_t> members;  // logical ids in rank order
  std::vector<std::shared_ptr<Participant>> by_rank;
  int arrived = 0;  // under the registry's lock
  int64_t created_ns = 0;
  std::atomic<int> finished{0};
  std::mutex error_mu;
  std::string error;  // the first member's failure
};

struct Task {
  std::shared_ptr<Instance> instance;
  int rank = 0;
};

// Operands staged because a result overlaps them (see the top of the file).
std::atomic<int64_t> g_staged_operands{0};

// Runs the completions of one device's dones on its own thread: XLA's
// continuation of a done (the rest of the program, which may run long and
// start more collectives) never runs on a worker or in another device's start.
class Completer {
 public:
  Completer() { std::thread([this] { Loop(); }).detach(); }
  void Post(std::shared_ptr<Participant> p) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(p));
    }
    cv_.notify_one();
  }

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Participant>> queue_;
};

class Worker {
 public:
  explicit Worker(int stream) : stream_(stream) { std::thread([this] { Loop(); }).detach(); }
  void Push(Task task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  void Loop();
  int stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
};

class Device {
 public:
  explicit Device(int ordinal) : ordinal_(ordinal) {}
  int ordinal() const { return ordinal_; }
  Completer& completer() { return completer_; }

  Worker* worker(int64_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& w = workers_[stream];
    if (!w) w = std::make_unique<Worker>(static_cast<int>(stream));
    return w.get();
  }

  // Occurrence number of op in this run (a loop body runs its ops many times).
  int64_t NextOccurrence(int64_t run, int64_t op) {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::find(recent_runs_.begin(), recent_runs_.end(), run) == recent_runs_.end()) {
      recent_runs_.push_back(run);
      if (recent_runs_.size() > kRecentRuns) {
        int64_t old = recent_runs_.front();
        recent_runs_.pop_front();
        for (auto it = occurrences_.begin(); it != occurrences_.end();) {
          it = it->first.first == old ? occurrences_.erase(it) : std::next(it);
        }
      }
    }
    return occurrences_[{run, op}]++;
  }

  void AddPending(int64_t run, int64_t op, std::shared_ptr<Participant> p) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_[{run, op}].push_back(std::move(p));
  }

  std::shared_ptr<Participant> TakePending(int64_t run, int64_t op) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find({run, op});
    if (it == pending_.end() || it->second.empty()) return nullptr;
    auto p = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) pending_.erase(it);
    return p;
  }

 private:
  static constexpr size_t kRecentRuns = 256;
  int ordinal_;
  std::mutex mu_;
  std::map<int64_t, std::unique_ptr<Worker>> workers_;
  std::deque<int64_t> recent_runs_;
  std::map<std::pair<int64_t, int64_t>, int64_t> occurrences_;
  std::map<std::pair<int64_t, int64_t>, std::deque<std::shared_ptr<Participant>>> pending_;
  Completer completer_;
};

Device* GetDevice(int ordinal) {
  static std::mutex* mu = new std::mutex();
  static auto* devices = new std::map<int, std::unique_ptr<Device>>();
  std::lock_guard<std::mutex> lock(*mu);
  auto& d = (*devices)[ordinal];
  if (!d) d = std::make_unique<Device>(ordinal);
  return d.get();
}

// Marks p's collective finished; its done's future completes now if the done
// was called, else when it is.
void Complete(const std::shared_ptr<Participant>& p, const std::string& error) {
  {
    std::lock_guard<std::mutex> lock(p->mu);
    if (p->complete) return;
    p->complete = true;
    p->error = error;
    if (!p->promise.has_value()) return;
  }
  p->owner->completer().Post(p);
}

void Completer::Loop() {
  for (;;) {
    std::shared_ptr<Participant> p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !queue_.empty(); });
      p = std::move(queue_.front());
      queue_.pop_front();
    }
    // Complete() and the done are through with promise and copies once both ran.
    if (p->error.empty()) {
      for (const Copy& c : p->copies) std::memmove(c.dst, c.src, c.bytes);
    }
    try {
      if (p->trace_done) {
        p->done_event.end_ns = NowNs();
        Trace::Get().Add(p->done_event);
      }
    } catch (...) {  // out of memory for the trace: the collective itself succeeded
    }
    if (p->error.empty()) {
      p->promise->SetAvailable();
    } else {
      p->promise->SetError(ffi::Error(ffi::ErrorCode::kAborted, p->error));
    }
  }
}

// ---------------------------------------------------------------------------
// The rendezvous.

class Registry {
 public:
  static Registry& Get() {
    static Registry* registry = new Registry();
    return *registry;
  }

  // Adds `p` to its instance; returns a non-empty error when the instance failed.
  // Sets `ready` to the instance when `p` was its last member to arrive.
  std::string Arrive(const Key& key, std::shared_ptr<const OpAttrs> attrs,
                     const std::vector<int64_t>& members, std::shared_ptr<Participant> p,
                     std::shared_ptr<Instance>* ready) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto t = tombstones_.find(key); t != tombstones_.end()) return t->second.first;
    std::shared_ptr<Instance>& slot = live_[key];
    if (!slot) {
      slot = std::make_shared<Instance>();
      slot->key = key;
      slot->attrs = attrs;
      slot->members = members;
      slot->by_rank.resize(members.size());
      slot->created_ns = NowNs();
      EnsureWatchdog();
    }
    std::shared_ptr<Instance> instance = slot;
    if (instance->by_rank[p->rank]) {
      std::string error = "xla_streams: " + attrs->Describe() + ": logical device " +
                          std::to_string(p->logical) + " arrived twice";
      FailLocked(instance, error);
      return error;
    }
    if (std::string mismatch = Mismatch(*instance, *p); !mismatch.empty()) {
      FailLocked(instance, mismatch);
      return mismatch;
    }
    instance->by_rank[p->rank] = std::move(p);
    if (++instance->arrived == static_cast<int>(members.size())) {
      live_.erase(key);
      *ready = std::move(instance);
    }
    return "";
  }

 private:
  // Members must bring the same number of buffers, element type and sizes.
  static std::string Mismatch(const Instance& instance, const Participant& p) {
    for (const auto& q : instance.by_rank) {
      if (!q) continue;
      bool same = q->dtype == p.dtype && q->in.size() == p.in.size();
      for (size_t i = 0; same && i < p.in.size(); ++i) {
        same = q->in[i].dims == p.in[i].dims && q->out[i].dims == p.out[i].dims;
      }
      if (same) return "";
      auto shapes = [](const Participant& x) {
        std::string s = "(";
        for (size_t i = 0; i < x.in.size(); ++i) {
          s += (i ? ", " : "") + ShapeString(x.dtype, ffi::Span<const int64_t>(x.in[i].dims));
        }
        return s + ")";
      };
      return "xla_streams: shape mismatch in " + instance.attrs->Describe() + ": device " +
             std::to_string(p.device) + " (logical " + std::to_string(p.logical) +
             ") brings " + shapes(p) + " but device " + std::to_string(q->device) +
             " (logical " + std::to_string(q->logical) + ") brings " + shapes(*q);
    }
    return "";
  }

  void FailLocked(const std::shared_ptr<Instance>& instance, const std::string& error) {
    live_.erase(instance->key);
    int64_t keep_ns = std::max<int64_t>(TimeoutNs(), int64_t{60} * 1000000000) * 2;
    tombstones_[instance->key] = {error, NowNs() + keep_ns};
    for (auto& q : instance->by_rank) {
      if (q) Complete(q, error);
    }
  }

  void EnsureWatchdog() {
    if (watchdog_started_) return;
    watchdog_started_ = true;
    std::thread([this] { Watchdog(); }).detach();
  }

  void Watchdog() {
    for (;;) {
      int64_t period_ms = std::clamp<int64_t>(TimeoutMs() / 20, 5, 200);
      std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
      try {
        Sweep(TimeoutMs());
      } catch (...) {  // out of memory while building a message: try again next period
      }
    }
  }

  void Sweep(int64_t timeout_ms) {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t now = NowNs();
    std::vector<std::shared_ptr<Instance>> expired;
    for (auto& [key, instance] : live_) {
      if (now - instance->created_ns > timeout_ms * 1000000) expired.push_back(instance);
    }
    for (auto& instance : expired) FailLocked(instance, TimeoutMessage(*instance, timeout_ms));
    for (auto it = tombstones_.begin(); it != tombstones_.end();) {
      it = it->second.second < now ? tombstones_.erase(it) : std::next(it);
    }
  }

  static std::string TimeoutMessage(const Instance& instance, int64_t timeout_ms) {
    std::vector<int64_t> missing, arrived, arrived_devices;
    for (size_t r = 0; r < instance.members.size(); ++r) {
      if (instance.by_rank[r]) {
        arrived.push_back(instance.members[r]);
        arrived_devices.push_back(instance.by_rank[r]->device);
      } else {
        missing.push_back(instance.members[r]);
      }
    }
    std::ostringstream os;
    os << "xla_streams: " << instance.attrs->Describe() << " timed out after "
       << timeout_ms / 1000.0 << " s: logical devices " << JoinIds(missing)
       << " never arrived (arrived: logical " << JoinIds(arrived) << " on device ordinals "
       << JoinIds(arrived_devices) << "; group " << JoinIds(instance.members) << ", run "
       << std::get<0>(instance.key) << ", occurrence " << std::get<2>(instance.key)
       << "). Set XLA_STREAMS_TIMEOUT_S to change the timeout.";
    return os.str();
  }

  std::mutex mu_;
  std::map<Key, std::shared_ptr<Instance>> live_;
  std::map<Key, std::pair<std::string, int64_t>> tombstones_;
  bool watchdog_started_ = false;
};

// ---------------------------------------------------------------------------
// One member's part of a collective.

// Where part k of n nearly equal parts of `count` elements begins, rounded down
// to a cache line so that no two workers write the same line of a result.
size_t Cut(size_t count, size_t k, size_t n, size_t width) {
  if (k == n) return count;
  const size_t line = std::max<size_t>(1, 64 / width);
  size_t at = count * k / n;
  return at - at % line;
}

// Collectives whose members bring at most this many operand bytes in all run
// in the start of the last member to arrive: waking a worker per member costs
// more than the copying (measured with benchmarks/bench_ffi.py, 8 devices).
constexpr size_t kInlineBytes = size_t{1} << 20;

// All-reduce results larger than this in all (a share of a server's last-level
// cache) are copied to the members with non-temporal stores.
constexpr size_t kStreamBytes = size_t{16} << 20;

std::string Execute(const Instance& instance, const Participant& me) {
  const OpAttrs& op = *instance.attrs;
  const size_t n = instance.members.size();
  const size_t width = ffi::ByteWidth(me.dtype);
  auto peer = [&](size_t r) -> const Participant& { return *instance.by_rank[r]; };
  auto input = [&](size_t r, size_t i) { return static_cast<const char*>(peer(r).in[i].data); };
  switch (op.kind) {
    case Kind::kAllReduce:
      // Slice `rank` of every member's result: reduced into this member's from
      // every operand, then copied to the others'.
      for (size_t i = 0; i < me.out.size(); ++i) {
        const size_t count = static_cast<size_t>(me.out[i].count);
        const size_t lo = Cut(count, me.rank, n, width), hi = Cut(count, me.rank + 1, n, width);
        std::vector<const char*> ins(n);
        for (size_t r = 0; r < n; ++r) ins[r] = input(r, i) + lo * width;
        char* mine = static_cast<char*>(me.out[i].data) + lo * width;
        Reduce(me.dtype, op.reduction, ins, mine, hi - lo);
        const bool stream = n * me.out[i].bytes >= kStreamBytes;
        for (size_t r = 0; r < n; ++r) {
          if (r == static_cast<size_t>(me.rank)) continue;
          char* theirs = static_cast<char*>(peer(r).out[i].data) + lo * width;
          CopyResult(theirs, mine, (hi - lo) * width, stream);
        }
      }
      return "";
    case Kind::kAllGather:
      for (size_t i = 0; i < me.out.size(); ++i) {
        const int64_t outer = op.outer[i];
        size_t block = static_cast<size_t>(me.in[i].count / outer) * width;
        auto* out = static_cast<char*>(me.out[i].data);
        for (int64_t o = 0; o < outer; ++o) {
          for (size_t r = 0; r < n; ++r) {
            std::memcpy(out + (o * n + r) * block, input(r, i) + o * block, block);
          }
        }
      }
      return "";
    case Kind::kReduceScatter:
      for (size_t i = 0; i < me.out.size(); ++i) {
        const int64_t outer = op.outer[i];
        size_t elements = static_cast<size_t>(me.out[i].count / outer);
        auto* out = static_cast<char*>(me.out[i].data);
        std::vector<const char*> ins(n);
        for (int64_t o = 0; o < outer; ++o) {
          for (size_t r = 0; r < n; ++r) {
            ins[r] = input(r, i) + (o * n + me.rank) * elements * width;
          }
          Reduce(me.dtype, op.reduction, ins, out + o * elements * width, elements);
        }
      }
      return "";
    case Kind::kAllToAll:
      if (op.dimension < 0) {  // tuple form: result s comes from member s's operand `rank`
        for (size_t s = 0; s < n; ++s) {
          std::memcpy(me.out[s].data, peer(s).in[me.rank].data, me.out[s].count * width);
        }
        return "";
      }
      for (size_t i = 0; i < me.out.size(); ++i) {
        const int64_t outer = op.outer[i];
        size_t chunk = static_cast<size_t>(me.in[i].count / outer / n) * width;
        auto* out = static_cast<char*>(me.out[i].data);
        for (int64_t o = 0; o < outer; ++o) {
          for (size_t s = 0; s < n; ++s) {
            std::memcpy(out + (o * n + s) * chunk, input(s, i) + (o * n + me.rank) * chunk, chunk);
          }
        }
      }
      return "";
    case Kind::kCollectivePermute: {
      int64_t source = -1;
      for (const auto& pair : op.groups) {
        if (pair.size() == 2 && pair[1] == me.logical) source = pair[0];
      }
      const Participant* from = nullptr;
      for (size_t r = 0; r < n; ++r) {
        if (instance.members[r] == source) from = &peer(r);
      }
      for (size_t i = 0; i < me.out.size(); ++i) {
        size_t bytes = me.out[i].count * width;
        if (from != nullptr) {
          std::memcpy(me.out[i].data, from->in[i].data, bytes);
        } else {
          std::memset(me.out[i].data, 0, bytes);
        }
      }
      return "";
    }
  }
  return "xla_streams: unknown collective kind";
}

// Runs one member's part of a ready collective, on its worker or inline.
void RunPart(const Task& task, int64_t stream) {
  Instance& instance = *task.instance;
  Participant& me = *instance.by_rank[task.rank];
  me.begin_ns = NowNs();
  std::string error;
  try {
    error = Execute(instance, me);
    if (Trace::Get().enabled()) {
      TraceEvent e;
      e.what = "collective";
      e.device = me.device;
      e.logical = me.logical;
      e.stream = stream;
      e.op_id = instance.attrs->op_id;
      e.name = instance.attrs->name;
      e.kind = KindName(instance.attrs->kind);
      e.begin_ns = me.begin_ns;
      e.end_ns = NowNs();
      Trace::Get().Add(std::move(e));
    }
  } catch (const std::exception& e) {
    error = std::string("xla_streams: ") + e.what() + " in " + instance.attrs->Describe();
  } catch (...) {
    error = "xla_streams: " + instance.attrs->Describe() + " failed";
  }
  if (!error.empty()) {
    std::lock_guard<std::mutex> lock(instance.error_mu);
    if (instance.error.empty()) instance.error = error;
  }
  // Only the last member to finish completes the dones: until then, peers may
  // still be reading any member's operands or writing its results.
  if (instance.finished.fetch_add(1, std::memory_order_acq_rel) + 1 ==
      static_cast<int>(instance.members.size())) {
    std::lock_guard<std::mutex> lock(instance.error_mu);
    for (auto& q : instance.by_rank) Complete(q, instance.error);
  }
}

void Worker::Loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !queue_.empty(); });
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    RunPart(task, stream_);
  }
}

// ---------------------------------------------------------------------------
// FFI handlers.

ffi::Error Invalid(const OpAttrs& op, const std::string& what) {
  return ffi::Error::InvalidArgument("xla_streams: " + op.Describe() + ": " + what);
}

std::vector<int64_t> Dims(const ffi::AnyBuffer& b) {
  auto d = b.dimensions();
  return std::vector<int64_t>(d.begin(), d.end());
}

// Checks a member's buffers against the collective's semantics.
ffi::Error CheckLocal(const OpAttrs& op, const Participant& p, size_t group_size) {
  if (p.in.size() != p.out.size()) {
    return Invalid(op, std::to_string(p.in.size()) + " operands but " +
                           std::to_string(p.out.size()) + " results");
  }
  if (op.kind == Kind::kAllReduce || op.kind == Kind::kReduceScatter) {
    if (!Reducible(p.dtype, op.reduction)) {
      return Invalid(op, std::string("cannot reduce ") + DTypeName(p.dtype));
    }
  }
  const int64_t n = static_cast<int64_t>(group_size);
  for (size_t i = 0; i < p.in.size(); ++i) {
    const Leaf& in = p.in[i];
    const Leaf& out = p.out[i];
    std::string shapes = ShapeString(p.dtype, ffi::Span<const int64_t>(in.dims)) + " -> " +
                         ShapeString(p.dtype, ffi::Span<const int64_t>(out.dims));
    bool needs_dim = op.kind == Kind::kAllGather || op.kind == Kind::kReduceScatter ||
                     (op.kind == Kind::kAllToAll && op.dimension >= 0);
    int64_t outer = 1;
    if (needs_dim) {
      outer = i < op.outer.size() ? op.outer[i] : 0;
      int64_t rank = static_cast<int64_t>(in.dims.size());
      if (op.dimension >= rank || outer <= 0 || in.count % outer != 0 || out.count % outer != 0) {
        return Invalid(op, "dimension " + std::to_string(op.dimension) + " with " +
                               std::to_string(outer) + " outer blocks does not fit " + shapes);
      }
    }
    bool ok = true;
    switch (op.kind) {
      case Kind::kAllReduce:
      case Kind::kCollectivePermute:
        ok = in.count == out.count;
        break;
      case Kind::kAllGather:
        ok = out.count == in.count * n;
        break;
      case Kind::kReduceScatter:
        ok = in.count == out.count * n && (in.count / outer) % n == 0;
        break;
      case Kind::kAllToAll:
        ok = in.count == out.count &&
             (op.dimension < 0 ? p.in.size() == group_size : (in.count / outer) % n == 0);
        break;
    }
    if (!ok) {
      return Invalid(op, "buffer shapes " + shapes + " do not fit a group of " +
                             std::to_string(n));
    }
  }
  return ffi::Error::Success();
}

bool Overlap(const Leaf& a, const Leaf& b) {
  auto x = reinterpret_cast<uintptr_t>(a.data), y = reinterpret_cast<uintptr_t>(b.data);
  return a.bytes > 0 && b.bytes > 0 && x < y + b.bytes && y < x + a.bytes;
}

ffi::Error HostStartImpl(ffi::RunId run, int32_t device_ordinal, ffi::RemainingArgs args,
                         ffi::RemainingRets rets, ffi::Dictionary attrs) {
  int64_t issue = NowNs();
  auto op = std::make_shared<OpAttrs>();
  if (auto e = DecodeAttrs(attrs, /*full=*/true, op.get()); !e.success()) return e;
  if (args.size() < 2) return Invalid(*op, "expected operands followed by replica-id, partition-id");
  const size_t leaves = args.size() - 2;
  auto replica = args.get<ffi::AnyBuffer>(leaves);
  auto partition = args.get<ffi::AnyBuffer>(leaves + 1);
  if (!replica.has_value() || !partition.has_value() ||
      replica->element_type() != ffi::DataType::U32 ||
      partition->element_type() != ffi::DataType::U32) {
    return Invalid(*op, "the last two operands must be u32[] replica-id and partition-id");
  }
  auto p = std::make_shared<Participant>();
  p->logical = static_cast<int64_t>(*replica->typed_data<uint32_t>()) * op->num_partitions +
               *partition->typed_data<uint32_t>();
  p->device = device_ordinal;
  for (size_t i = 0; i < leaves; ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    if (!in.has_value()) return in.error();
    if (i == 0) p->dtype = in->element_type();
    if (in->element_type() != p->dtype) return Invalid(*op, "operands of different element types");
    p->in.push_back(Leaf{in->untyped_data(), in->size_bytes(),
                         static_cast<int64_t>(in->element_count()), Dims(*in)});
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (!out.has_value()) return out.error();
    if ((*out)->element_type() != p->dtype) return Invalid(*op, "result type differs from operand type");
    p->out.push_back(Leaf{(*out)->untyped_data(), (*out)->size_bytes(),
                          static_cast<int64_t>((*out)->element_count()), Dims(**out)});
  }
  if (ffi::ByteWidth(p->dtype) == 0) {
    return Invalid(*op, std::string("unsupported element type ") + DTypeName(p->dtype));
  }

  // This member's group and rank.
  std::vector<int64_t> members;
  int64_t group_index = -1;
  if (op->kind == Kind::kCollectivePermute) {
    std::set<int64_t> ids;
    for (const auto& pair : op->groups) ids.insert(pair.begin(), pair.end());
    members.assign(ids.begin(), ids.end());
    if (ids.count(p->logical)) group_index = 0;
  } else {
    for (size_t g = 0; g < op->groups.size() && group_index < 0; ++g) {
      if (std::find(op->groups[g].begin(), op->groups[g].end(), p->logical) !=
          op->groups[g].end()) {
        group_index = static_cast<int64_t>(g);
        members = op->groups[g];
      }
    }
    if (group_index < 0) {
      return Invalid(*op, "logical device " + std::to_string(p->logical) + " is in no group");
    }
  }

  Device* device = GetDevice(device_ordinal);
  p->owner = device;
  p->worker = device->worker(op->stream);
  int64_t occurrence = device->NextOccurrence(run.run_id, op->op_id);
  device->AddPending(run.run_id, op->op_id, p);

  if (Trace::Get().enabled()) {
    TraceEvent e;
    e.what = "start";
    e.device = device_ordinal;
    e.logical = p->logical;
    e.stream = op->stream;
    e.op_id = op->op_id;
    e.name = op->name;
    e.kind = KindName(op->kind);
    e.begin_ns = issue;
    e.end_ns = NowNs();
    Trace::Get().Add(std::move(e));
  }

  if (group_index < 0) {  // a permute that neither sends nor receives here: zeros
    for (const Leaf& out : p->out) std::memset(out.data, 0, out.bytes);
    Complete(p, "");
    return ffi::Error::Success();
  }
  p->rank = static_cast<int>(std::find(members.begin(), members.end(), p->logical) - members.begin());
  if (auto e = CheckLocal(*op, *p, members.size()); !e.success()) {
    Complete(p, e.message());
    return e;
  }
  // Peers read operands in place: one that a result overlaps (the caller aliased
  // them) would change under them, so it is read from a copy.
  for (Leaf& in : p->in) {
    bool overlaps = std::any_of(p->out.begin(), p->out.end(),
                                [&](const Leaf& out) { return Overlap(in, out); });
    if (!overlaps) continue;
    p->staged.emplace_back(new char[in.bytes]);
    std::memcpy(p->staged.back().get(), in.data, in.bytes);
    in.data = p->staged.back().get();
    g_staged_operands.fetch_add(1, std::memory_order_relaxed);
  }
  std::shared_ptr<Instance> ready;
  std::string error = Registry::Get().Arrive(Key{run.run_id, op->op_id, occurrence, group_index},
                                             op, members, p, &ready);
  if (!error.empty()) {
    Complete(p, error);
    return ffi::Error(ffi::ErrorCode::kAborted, error);
  }
  if (ready) {  // the last member to arrive: hand every part to its worker, or run them here
    size_t bytes = 0;
    for (const auto& q : ready->by_rank) {
      for (const Leaf& leaf : q->in) bytes += leaf.bytes;
    }
    for (size_t r = 0; r < ready->by_rank.size(); ++r) {
      Task task{ready, static_cast<int>(r)};
      if (bytes <= kInlineBytes) {
        RunPart(task, op->stream);
      } else {
        ready->by_rank[r]->worker->Push(std::move(task));
      }
    }
  }
  return ffi::Error::Success();
}

ffi::Future HostDoneImpl(ffi::RunId run, int32_t device_ordinal, ffi::RemainingArgs args,
                         ffi::RemainingRets rets, ffi::Dictionary attrs) {
  ffi::Promise promise;
  ffi::Future future(promise);
  OpAttrs op;
  if (auto e = DecodeAttrs(attrs, /*full=*/false, &op); !e.success()) {
    promise.SetError(e);
    return future;
  }
  Device* device = GetDevice(device_ordinal);
  std::shared_ptr<Participant> p = device->TakePending(run.run_id, op.op_id);
  if (!p) {
    promise.SetError(Invalid(op, "done without a start on device " +
                                     std::to_string(device_ordinal)));
    return future;
  }
  // The done's results alias the start's; copy only if XLA did not honour that.
  std::vector<Copy> copies;
  for (size_t i = 0; i < rets.size() && i < args.size(); ++i) {
    auto src = args.get<ffi::AnyBuffer>(i);
    auto dst = rets.get<ffi::AnyBuffer>(i);
    if (src.has_value() && dst.has_value() && src->untyped_data() != (*dst)->untyped_data()) {
      copies.push_back(Copy{src->untyped_data(), (*dst)->untyped_data(), (*dst)->size_bytes()});
    }
  }
  std::unique_lock<std::mutex> lock(p->mu);
  if (Trace::Get().enabled()) {
    p->trace_done = true;
    p->done_event.what = "done";
    p->done_event.device = device_ordinal;
    p->done_event.logical = p->logical;
    p->done_event.stream = op.stream;
    p->done_event.op_id = op.op_id;
    p->done_event.name = op.name;
    p->done_event.kind = KindName(op.kind);
    p->done_event.begin_ns = NowNs();
  }
  if (!p->complete) {
    p->copies = std::move(copies);
    p->promise = promise;
    return future;
  }
  std::string error = p->error;
  lock.unlock();
  if (p->trace_done) {
    p->done_event.end_ns = NowNs();
    Trace::Get().Add(p->done_event);
  }
  if (!error.empty()) {
    promise.SetError(ffi::Error(ffi::ErrorCode::kAborted, error));
  } else {
    for (const Copy& c : copies) std::memmove(c.dst, c.src, c.bytes);
    promise.SetAvailable();
  }
  return future;
}

ffi::Error HostStart(ffi::RunId run, int32_t device_ordinal, ffi::RemainingArgs args,
                     ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return Guarded("start", [&] { return HostStartImpl(run, device_ordinal, args, rets, attrs); });
}

ffi::Future HostDone(ffi::RunId run, int32_t device_ordinal, ffi::RemainingArgs args,
                     ffi::RemainingRets rets, ffi::Dictionary attrs) {
  std::string error;
  try {
    return HostDoneImpl(run, device_ordinal, args, rets, attrs);
  } catch (const std::exception& e) {
    error = std::string("xla_streams: done: ") + e.what();
  } catch (...) {
    error = "xla_streams: done failed";
  }
  ffi::Promise promise;
  ffi::Future future(promise);
  promise.SetError(ffi::Error(ffi::ErrorCode::kInternal, error));
  return future;
}

// A traced stand-in for compute in tests and benchmarks: copies its operand to
// its result and keeps the core busy for `spin_us` microseconds.
ffi::Error HostCompute(int32_t device_ordinal, ffi::AnyBuffer in, ffi::Result<ffi::AnyBuffer> out,
                       int64_t spin_us, std::string_view label) {
  int64_t begin = NowNs();
  if (in.size_bytes() != out->size_bytes()) {
    return ffi::Error::InvalidArgument("xla_streams compute probe: operand and result sizes differ");
  }
  std::memmove(out->untyped_data(), in.untyped_data(), in.size_bytes());
  volatile uint64_t sink = 0;
  const auto* bytes = static_cast<const unsigned char*>(in.untyped_data());
  size_t size = in.size_bytes();
  while (NowNs() - begin < spin_us * 1000) {
    uint64_t acc = 0;
    for (size_t i = 0; i < size && i < 4096; ++i) acc = acc * 31 + bytes[i];
    sink = sink + acc;
  }
  if (Trace::Get().enabled()) {
    TraceEvent e;
    e.what = "compute";
    e.device = device_ordinal;
    e.name = std::string(label);
    e.begin_ns = begin;
    e.end_ns = NowNs();
    Trace::Get().Add(std::move(e));
  }
  return ffi::Error::Success();
}

// Start and done take the same context, operands, results and attributes.
auto CollectiveBinding() {
  return xla::ffi::Ffi::Bind()
      .Ctx<xla::ffi::RunId>()
      .Ctx<xla::ffi::DeviceOrdinal>()
      .RemainingArgs()
      .RemainingRets()
      .Attrs();
}

}  // namespace
}  // namespace xs::host

XLA_FFI_DEFINE_HANDLER_SYMBOL(xla_streams_host_start, xs::host::HostStart,
                              xs::host::CollectiveBinding());

XLA_FFI_DEFINE_HANDLER_SYMBOL(xla_streams_host_done, xs::host::HostDone,
                              xs::host::CollectiveBinding());

XLA_FFI_DEFINE_HANDLER_SYMBOL(xla_streams_host_compute, xs::host::HostCompute,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("spin_us")
                                  .Attr<std::string_view>("label"));

extern "C" {
// How many operands the host runtime has copied because a result overlapped them.
int64_t xs_host_staged_operands() {
  return xs::host::g_staged_operands.load(std::memory_order_relaxed);
}
}

// The C entry points both libraries export are in common_api.cc.

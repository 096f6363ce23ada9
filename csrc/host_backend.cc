// Host backend of the xla_streams runtime: collectives between the CPU devices
// of one process, run by per-device, per-stream worker threads.
//
// `xla_streams_start` (typed FFI, platform Host) copies its operands (a start's
// result may share an operand's buffer on XLA:CPU) and registers them and its
// result buffers with an in-process rendezvous keyed by (run id, op id, occurrence, group) and
// queues the collective on the worker of (device, stream); it returns at once.
// `xla_streams_done` returns an ffi::Future that completes when every member
// of the group has finished its part, so no XLA thread ever blocks on a peer.
//
// A worker never waits for a peer either: of the collectives queued on it, it
// runs the first one whose members have all arrived (its own output, read from
// every member's input; an all-reduce in two phases, a slice each, then the
// result out), so devices that issue collectives in different orders cannot
// deadlock. Inputs stay valid until the last member has finished
// because each member's done waits for that. A watchdog fails a rendezvous that
// does not complete within the timeout, naming the devices that never arrived.
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>

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

template <typename T>
T Apply(Reduction r, T a, T b) {
  switch (r) {
    case Reduction::kAdd: return a + b;
    case Reduction::kMultiply: return a * b;
    case Reduction::kMin: return b < a ? b : a;
    case Reduction::kMax: return a < b ? b : a;
    default: return a;
  }
}

// Integers wrap like XLA's: compute in the unsigned type of the same width.
template <typename T>
T ApplyInt(Reduction r, T a, T b) {
  using U = std::make_unsigned_t<T>;
  switch (r) {
    case Reduction::kAdd: return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    case Reduction::kMultiply: return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
    case Reduction::kMin: return b < a ? b : a;
    case Reduction::kMax: return a < b ? b : a;
    case Reduction::kAnd: return a & b;
    case Reduction::kOr: return a | b;
    default: return a;
  }
}

// dst[i] = src[0][i] op src[1][i] op ... in rank order, rounding every step as
// XLA's own CPU collectives do.
template <typename T, typename F>
void ReduceWith(void* dst, const std::vector<const void*>& srcs, size_t n, F op) {
  T* out = static_cast<T*>(dst);
  const T* first = static_cast<const T*>(srcs[0]);
  for (size_t i = 0; i < n; ++i) out[i] = first[i];
  for (size_t r = 1; r < srcs.size(); ++r) {
    const T* in = static_cast<const T*>(srcs[r]);
    for (size_t i = 0; i < n; ++i) out[i] = op(out[i], in[i]);
  }
}

bool Reduce(ffi::DataType dtype, Reduction r, void* dst, const std::vector<const void*>& srcs,
            size_t n) {
  switch (dtype) {
    case ffi::DataType::F32:
      ReduceWith<float>(dst, srcs, n, [r](float a, float b) { return Apply(r, a, b); });
      return r != Reduction::kAnd && r != Reduction::kOr;
    case ffi::DataType::F64:
      ReduceWith<double>(dst, srcs, n, [r](double a, double b) { return Apply(r, a, b); });
      return r != Reduction::kAnd && r != Reduction::kOr;
    case ffi::DataType::F16:
      ReduceWith<uint16_t>(dst, srcs, n, [r](uint16_t a, uint16_t b) {
        return FloatToHalf(Apply(r, HalfToFloat(a), HalfToFloat(b)));
      });
      return r != Reduction::kAnd && r != Reduction::kOr;
    case ffi::DataType::BF16:
      ReduceWith<uint16_t>(dst, srcs, n, [r](uint16_t a, uint16_t b) {
        return FloatToBf16(Apply(r, Bf16ToFloat(a), Bf16ToFloat(b)));
      });
      return r != Reduction::kAnd && r != Reduction::kOr;
    case ffi::DataType::S8:
      ReduceWith<int8_t>(dst, srcs, n, [r](int8_t a, int8_t b) { return ApplyInt(r, a, b); });
      return true;
    case ffi::DataType::S16:
      ReduceWith<int16_t>(dst, srcs, n, [r](int16_t a, int16_t b) { return ApplyInt(r, a, b); });
      return true;
    case ffi::DataType::S32:
      ReduceWith<int32_t>(dst, srcs, n, [r](int32_t a, int32_t b) { return ApplyInt(r, a, b); });
      return true;
    case ffi::DataType::S64:
      ReduceWith<int64_t>(dst, srcs, n, [r](int64_t a, int64_t b) { return ApplyInt(r, a, b); });
      return true;
    case ffi::DataType::U8:
      ReduceWith<uint8_t>(dst, srcs, n, [r](uint8_t a, uint8_t b) {
        return static_cast<uint8_t>(ApplyInt<int8_t>(r, a, b));
      });
      return true;
    case ffi::DataType::U32:
      ReduceWith<uint32_t>(dst, srcs, n, [r](uint32_t a, uint32_t b) {
        return r == Reduction::kMin ? std::min(a, b)
               : r == Reduction::kMax ? std::max(a, b)
                                       : static_cast<uint32_t>(ApplyInt<int32_t>(r, a, b));
      });
      return true;
    case ffi::DataType::PRED:
      // add/max/or are logical or; multiply/min/and are logical and.
      ReduceWith<uint8_t>(dst, srcs, n, [r](uint8_t a, uint8_t b) -> uint8_t {
        bool x = a != 0, y = b != 0;
        bool any = r == Reduction::kAdd || r == Reduction::kMax || r == Reduction::kOr;
        return any ? (x || y) : (x && y);
      });
      return true;
    default:
      return false;
  }
}

bool Reducible(ffi::DataType dtype, Reduction r) {
  switch (dtype) {
    case ffi::DataType::F32:
    case ffi::DataType::F64:
    case ffi::DataType::F16:
    case ffi::DataType::BF16:
      return r != Reduction::kAnd && r != Reduction::kOr;
    case ffi::DataType::S8:
    case ffi::DataType::S16:
    case ffi::DataType::S32:
    case ffi::DataType::S64:
    case ffi::DataType::U8:
    case ffi::DataType::U32:
    case ffi::DataType::PRED:
      return true;
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------
// Runtime state.

// Runs functions one at a time on its own thread (completions of one device,
// so XLA's continuation of a done never runs on a collective worker).
class SerialExecutor {
 public:
  SerialExecutor() : thread_([this] { Loop(); }) { thread_.detach(); }
  void Post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(fn));
    }
    cv_.notify_one();
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !queue_.empty(); });
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      try {
        fn();
      } catch (...) {  // keep the thread; the failure already reached its promise
      }
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::thread thread_;
};

struct Copy {
  const void* src;
  void* dst;
  size_t bytes;
};

// One device's collective from its start to its done.
struct Pending {
  std::mutex mu;
  bool complete = false;
  std::string error;                    // non-empty: failed
  std::optional<ffi::Promise> promise;  // set by a done that came first
  std::vector<Copy> copies;             // done outputs not aliased to the start's
  int64_t logical = -1;
  TraceEvent done_event;
  bool trace_done = false;
};

struct Leaf {
  void* data;
  int64_t count;
  std::vector<int64_t> dims;
};

class Worker;
class Device;

struct Participant {
  int rank = 0;
  int device = 0;
  int64_t logical = 0;
  ffi::DataType dtype = ffi::DataType::INVALID;
  std::vector<Leaf> in, out;
  // Copies of the operands taken at the start: on XLA:CPU a start's result may
  // share its operand's buffer (loop-carried values), and peers read operands
  // while results are being written.
  std::vector<std::unique_ptr<char[]>> staged;
  std::shared_ptr<Pending> pending;
  Worker* worker = nullptr;
  Device* owner = nullptr;
  int64_t issue_ns = 0;
  int64_t begin_ns = 0;  // when its worker began (phase 1)
};

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t>;  // run, op, occurrence, group

struct Instance {
  Key key;
  std::shared_ptr<const OpAttrs> attrs;
  std::vector<int64_t> members;  // logical ids in rank order
  std::vector<std::shared_ptr<Participant>> by_rank;
  int arrived = 0;
  // 0 waiting for members, 1 ready, 2 failed, 3 all-reduce: every slice reduced.
  std::atomic<int> state{0};
  std::atomic<int> reduced{0};
  std::atomic<int> finished{0};
  // All-reduce runs in two phases without any worker waiting for another:
  // member r reduces slice r of every leaf into `scratch`; once all slices are
  // reduced, each member copies the result out.
  std::vector<std::unique_ptr<char[]>> scratch;
  int64_t created_ns = 0;
};

struct Task {
  std::shared_ptr<Instance> instance;
  int rank;
  int phase = 1;
};

bool Runnable(const Task& t) {
  int state = t.instance->state.load(std::memory_order_acquire);
  return t.phase == 1 ? state != 0 : (state == 2 || state == 3);
}

void CompletePending(Device* device, const std::shared_ptr<Pending>& pending,
                     const std::string& error);

class Worker {
 public:
  Worker(Device* device, int stream) : device_(device), stream_(stream) {
    std::thread([this] { Loop(); }).detach();
  }
  void Push(Task task) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  void Notify() {
    { std::lock_guard<std::mutex> lock(mu_); }
    cv_.notify_all();
  }

 private:
  void Loop();
  void Process(Task& task);
  Device* device_;
  int stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
};

class Device {
 public:
  explicit Device(int ordinal) : ordinal_(ordinal) {}
  int ordinal() const { return ordinal_; }
  SerialExecutor& completer() { return completer_; }

  Worker* worker(int64_t stream) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& w = workers_[stream];
    if (!w) w = std::make_unique<Worker>(this, static_cast<int>(stream));
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

  void AddPending(int64_t run, int64_t op, std::shared_ptr<Pending> pending) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_[{run, op}].push_back(std::move(pending));
  }

  std::shared_ptr<Pending> TakePending(int64_t run, int64_t op) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find({run, op});
    if (it == pending_.end() || it->second.empty()) return nullptr;
    auto pending = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) pending_.erase(it);
    return pending;
  }

 private:
  static constexpr size_t kRecentRuns = 256;
  int ordinal_;
  std::mutex mu_;
  std::map<int64_t, std::unique_ptr<Worker>> workers_;
  std::deque<int64_t> recent_runs_;
  std::map<std::pair<int64_t, int64_t>, int64_t> occurrences_;
  std::map<std::pair<int64_t, int64_t>, std::deque<std::shared_ptr<Pending>>> pending_;
  SerialExecutor completer_;
};

Device* GetDevice(int ordinal) {
  static std::mutex* mu = new std::mutex();
  static auto* devices = new std::map<int, std::unique_ptr<Device>>();
  std::lock_guard<std::mutex> lock(*mu);
  auto& d = (*devices)[ordinal];
  if (!d) d = std::make_unique<Device>(ordinal);
  return d.get();
}

void CompletePending(Device* device, const std::shared_ptr<Pending>& pending,
                     const std::string& error) {
  std::optional<ffi::Promise> promise;
  std::vector<Copy> copies;
  {
    std::lock_guard<std::mutex> lock(pending->mu);
    if (pending->complete) return;
    pending->complete = true;
    pending->error = error;
    promise = std::move(pending->promise);
    pending->promise.reset();
    copies = pending->copies;
  }
  if (!promise.has_value()) return;  // the done has not been called yet
  device->completer().Post([pending, promise = std::move(*promise), copies, error]() mutable {
    if (error.empty()) {
      for (const Copy& c : copies) std::memmove(c.dst, c.src, c.bytes);
    }
    if (pending->trace_done) {
      pending->done_event.end_ns = NowNs();
      Trace::Get().Add(pending->done_event);
    }
    if (error.empty()) {
      promise.SetAvailable();
    } else {
      promise.SetError(ffi::Error(ffi::ErrorCode::kAborted, error));
    }
  });
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
  std::string Arrive(const Key& key, std::shared_ptr<const OpAttrs> attrs,
                     const std::vector<int64_t>& members, std::shared_ptr<Participant> p) {
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
    instance->by_rank[p->rank] = p;
    ++instance->arrived;
    p->worker->Push(Task{instance, p->rank});
    if (instance->arrived == static_cast<int>(members.size())) {
      if (attrs->kind == Kind::kAllReduce) {
        try {
          for (const Leaf& out : p->out) {
            size_t bytes = static_cast<size_t>(out.count) * ffi::ByteWidth(p->dtype);
            instance->scratch.emplace_back(new char[bytes > 0 ? bytes : 1]);
          }
        } catch (const std::bad_alloc&) {
          std::string error = "xla_streams: out of host memory for " + attrs->Describe();
          FailLocked(instance, error);
          return error;
        }
      }
      live_.erase(key);
      instance->state.store(1, std::memory_order_release);
      for (auto& q : instance->by_rank) q->worker->Notify();
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
    instance->state.store(2, std::memory_order_release);
    live_.erase(instance->key);
    int64_t keep = std::max<int64_t>(GlobalConfig().timeout_ms.load(), 60000) * 2;
    tombstones_[instance->key] = {error, NowNs() + keep * 1000000};
    for (auto& q : instance->by_rank) {
      if (!q) continue;
      CompletePending(q->owner, q->pending, error);
      q->worker->Notify();
    }
  }

  void EnsureWatchdog() {
    if (watchdog_started_) return;
    watchdog_started_ = true;
    std::thread([this] { Watchdog(); }).detach();
  }

  void Watchdog() {
    for (;;) {
      int64_t timeout_ms = GlobalConfig().timeout_ms.load();
      int64_t period_ms = std::clamp<int64_t>(timeout_ms / 20, 5, 200);
      std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
      try {
        Sweep(timeout_ms);
      } catch (...) {  // out of memory while building a message: try again next period
      }
    }
  }

  void Sweep(int64_t timeout_ms) {
    {
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
// One member's part of a collective: its own outputs from everyone's inputs.

std::string Execute(const Instance& instance, const Participant& me) {
  const OpAttrs& op = *instance.attrs;
  const size_t n = instance.members.size();
  const size_t width = ffi::ByteWidth(me.dtype);
  auto peer = [&](size_t r) -> const Participant& { return *instance.by_rank[r]; };
  switch (op.kind) {
    case Kind::kAllReduce:  // phase 1: slice `rank` of every leaf into the scratch
      for (size_t i = 0; i < me.out.size(); ++i) {
        size_t count = static_cast<size_t>(me.out[i].count);
        size_t lo = count * me.rank / n, hi = count * (me.rank + 1) / n;
        std::vector<const void*> srcs(n);
        for (size_t r = 0; r < n; ++r) {
          srcs[r] = static_cast<const char*>(peer(r).in[i].data) + lo * width;
        }
        Reduce(me.dtype, op.reduction, instance.scratch[i].get() + lo * width, srcs, hi - lo);
      }
      return "";
    case Kind::kAllGather:
      for (size_t i = 0; i < me.out.size(); ++i) {
        const int64_t outer = op.outer[i];
        size_t block = static_cast<size_t>(me.in[i].count / outer) * width;
        auto* out = static_cast<char*>(me.out[i].data);
        for (int64_t o = 0; o < outer; ++o) {
          for (size_t r = 0; r < n; ++r) {
            const char* in = static_cast<const char*>(peer(r).in[i].data);
            std::memcpy(out + (o * n + r) * block, in + o * block, block);
          }
        }
      }
      return "";
    case Kind::kReduceScatter:
      for (size_t i = 0; i < me.out.size(); ++i) {
        const int64_t outer = op.outer[i];
        size_t elements = static_cast<size_t>(me.out[i].count / outer);
        auto* out = static_cast<char*>(me.out[i].data);
        std::vector<const void*> srcs(n);
        for (int64_t o = 0; o < outer; ++o) {
          for (size_t r = 0; r < n; ++r) {
            srcs[r] = static_cast<const char*>(peer(r).in[i].data) +
                      (o * n + me.rank) * elements * width;
          }
          Reduce(me.dtype, op.reduction, out + o * elements * width, srcs, elements);
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
            const char* in = static_cast<const char*>(peer(s).in[i].data);
            std::memcpy(out + (o * n + s) * chunk, in + (o * n + me.rank) * chunk, chunk);
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

void Worker::Loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      std::deque<Task>::iterator it;
      cv_.wait(lock, [&] {
        it = std::find_if(queue_.begin(), queue_.end(), Runnable);
        return it != queue_.end();
      });
      task = std::move(*it);
      queue_.erase(it);
    }
    std::string error;
    try {
      Process(task);
    } catch (const std::exception& e) {
      error = std::string("xla_streams: ") + e.what();
    } catch (...) {
      error = "xla_streams: a collective worker failed";
    }
    if (!error.empty()) {  // fail the whole collective; completing twice is a no-op
      task.instance->state.store(2, std::memory_order_release);
      for (auto& q : task.instance->by_rank) {
        if (q) CompletePending(q->owner, q->pending, error + " in " + task.instance->attrs->Describe());
      }
    }
  }
}

void Worker::Process(Task& task) {
  Instance& instance = *task.instance;
  if (instance.state.load(std::memory_order_acquire) == 2) return;  // failed
  Participant& me = *instance.by_rank[task.rank];
  const int n = static_cast<int>(instance.members.size());
  std::string error;
  if (task.phase == 1) {
    me.begin_ns = NowNs();
    error = Execute(instance, me);
    if (instance.attrs->kind == Kind::kAllReduce && error.empty()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        queue_.push_front(Task{task.instance, task.rank, 2});
      }
      if (instance.reduced.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
        instance.state.store(3, std::memory_order_release);
        for (auto& q : instance.by_rank) q->worker->Notify();
      }
      return;
    }
  } else {  // all-reduce phase 2: the reduced leaves out
    const size_t width = ffi::ByteWidth(me.dtype);
    for (size_t i = 0; i < me.out.size(); ++i) {
      std::memcpy(me.out[i].data, instance.scratch[i].get(), me.out[i].count * width);
    }
  }
  if (Trace::Get().enabled()) {
    TraceEvent e;
    e.what = "collective";
    e.device = me.device;
    e.logical = me.logical;
    e.stream = stream_;
    e.op_id = instance.attrs->op_id;
    e.name = instance.attrs->name;
    e.kind = KindName(instance.attrs->kind);
    e.begin_ns = me.begin_ns;
    e.end_ns = NowNs();
    Trace::Get().Add(std::move(e));
  }
  (void)device_;
  if (instance.finished.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
    for (auto& q : instance.by_rank) CompletePending(q->owner, q->pending, error);
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
  p->issue_ns = issue;
  for (size_t i = 0; i < leaves; ++i) {
    auto in = args.get<ffi::AnyBuffer>(i);
    if (!in.has_value()) return in.error();
    if (i == 0) p->dtype = in->element_type();
    if (in->element_type() != p->dtype) return Invalid(*op, "operands of different element types");
    p->in.push_back(Leaf{in->untyped_data(), static_cast<int64_t>(in->element_count()), Dims(*in)});
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto out = rets.get<ffi::AnyBuffer>(i);
    if (!out.has_value()) return out.error();
    if ((*out)->element_type() != p->dtype) return Invalid(*op, "result type differs from operand type");
    p->out.push_back(
        Leaf{(*out)->untyped_data(), static_cast<int64_t>((*out)->element_count()), Dims(**out)});
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
  p->pending = std::make_shared<Pending>();
  p->pending->logical = p->logical;
  p->worker = device->worker(op->stream);
  int64_t occurrence = device->NextOccurrence(run.run_id, op->op_id);
  device->AddPending(run.run_id, op->op_id, p->pending);

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
    for (const Leaf& out : p->out) std::memset(out.data, 0, out.count * ffi::ByteWidth(p->dtype));
    CompletePending(device, p->pending, "");
    return ffi::Error::Success();
  }
  p->rank = static_cast<int>(std::find(members.begin(), members.end(), p->logical) - members.begin());
  if (auto e = CheckLocal(*op, *p, members.size()); !e.success()) {
    CompletePending(device, p->pending, e.message());
    return e;
  }
  const size_t width = ffi::ByteWidth(p->dtype);
  for (Leaf& in : p->in) {
    size_t bytes = static_cast<size_t>(in.count) * width;
    p->staged.emplace_back(new char[bytes > 0 ? bytes : 1]);
    std::memcpy(p->staged.back().get(), in.data, bytes);
    in.data = p->staged.back().get();
  }
  std::string error = Registry::Get().Arrive(Key{run.run_id, op->op_id, occurrence, group_index},
                                             op, members, p);
  if (!error.empty()) {
    CompletePending(device, p->pending, error);
    return ffi::Error(ffi::ErrorCode::kAborted, error);
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
  std::shared_ptr<Pending> pending = device->TakePending(run.run_id, op.op_id);
  if (!pending) {
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
  std::unique_lock<std::mutex> lock(pending->mu);
  if (Trace::Get().enabled()) {
    pending->trace_done = true;
    pending->done_event.what = "done";
    pending->done_event.device = device_ordinal;
    pending->done_event.logical = pending->logical;
    pending->done_event.stream = op.stream;
    pending->done_event.op_id = op.op_id;
    pending->done_event.name = op.name;
    pending->done_event.kind = KindName(op.kind);
    pending->done_event.begin_ns = NowNs();
  }
  if (!pending->complete) {
    pending->copies = std::move(copies);
    pending->promise = promise;
    return future;
  }
  std::string error = pending->error;
  lock.unlock();
  if (pending->trace_done) {
    pending->done_event.end_ns = NowNs();
    Trace::Get().Add(pending->done_event);
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

}  // namespace
}  // namespace xs::host

XLA_FFI_DEFINE_HANDLER_SYMBOL(xla_streams_host_start, xs::host::HostStart,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::RunId>()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs());

XLA_FFI_DEFINE_HANDLER_SYMBOL(xla_streams_host_done, xs::host::HostDone,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::RunId>()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .RemainingArgs()
                                  .RemainingRets()
                                  .Attrs());

XLA_FFI_DEFINE_HANDLER_SYMBOL(xla_streams_host_compute, xs::host::HostCompute,
                              xla::ffi::Ffi::Bind()
                                  .Ctx<xla::ffi::DeviceOrdinal>()
                                  .Arg<xla::ffi::AnyBuffer>()
                                  .Ret<xla::ffi::AnyBuffer>()
                                  .Attr<int64_t>("spin_us")
                                  .Attr<std::string_view>("label"));

// The plain C entry points for ctypes are in common_api.cc.

// CUDA backend of the xla_streams runtime: collectives on K CUDA streams per
// device, through NCCL.
//
// `xla_streams_start` (typed FFI, platform CUDA) makes collective stream k wait
// on an event recorded on XLA's compute stream, launches the NCCL operation(s)
// there and records a completion event; `xla_streams_done` makes the compute
// stream wait on that event. Neither ever synchronizes the host with the GPU.
//
// One NCCL communicator per (device group, stream), created on first use:
// the unique id is shared in-process when every member is a local device, else
// through JAX's distributed key-value store (callbacks set from Python).
// Communicators are created non-blocking so that a member that never joins is
// a timeout error, not a hang; a creation that timed out is aborted and its id
// forgotten, so a later step creates the communicator again (one id makes one
// communicator). Every NCCL call on a communicator, the watchdog's included,
// holds its mutex: NCCL forbids concurrent calls on one (NCCL docs, "Thread
// safety"), and an aborted one is never touched again.
//
// A watchdog polls the completion events of collectives in flight. One that
// does not complete within the timeout is reported at once (stderr), naming the
// op and the devices that never started it, and every later call on its device
// fails with that message. Its communicator is not aborted: after an abort the
// outputs are undefined yet look like data on a GPU, so the hung step's results
// are left unreadable instead (the compute stream keeps waiting for them), as
// XLA leaves its own hung collectives (docs/runtimes.md, "When a collective
// hangs"). NCCL's own errors are returned with its message.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <condition_variable>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <tuple>

#include "common.h"

namespace xs::cuda {
namespace {

std::string CudaMessage(const char* what, cudaError_t e) {
  return std::string("xla_streams: ") + what + " failed: " + cudaGetErrorName(e) + ": " +
         cudaGetErrorString(e);
}

std::string NcclMessage(const char* what, ncclResult_t r, ncclComm_t comm) {
  std::string message = std::string("xla_streams: ") + what + " failed: NCCL error " +
                        std::to_string(static_cast<int>(r)) + " (" + ncclGetErrorString(r) + ")";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') message += ": " + std::string(last);
  return message;
}

#define XS_CUDA(expr)                                                          \
  do {                                                                         \
    cudaError_t xs_status = (expr);                                            \
    if (xs_status != cudaSuccess) {                                            \
      return ffi::Error(ffi::ErrorCode::kInternal, CudaMessage(#expr, xs_status)); \
    }                                                                          \
  } while (0)

// ---------------------------------------------------------------------------
// Configuration set from Python.

// Stream priority: INT32_MIN means "the device's greatest priority".
std::atomic<int> g_priority{std::numeric_limits<int>::min()};

using KvSet = int (*)(const char* key, const char* value, size_t size, int overwrite);
using KvGet = int64_t (*)(const char* key, int64_t timeout_ms, char* buffer, size_t capacity);
std::atomic<KvSet> g_kv_set{nullptr};
std::atomic<KvGet> g_kv_get{nullptr};

std::mutex g_local_mu;
std::map<int, int64_t> g_global_id;  // device ordinal -> global device id (default: same)

int64_t GlobalId(int ordinal) {
  std::lock_guard<std::mutex> lock(g_local_mu);
  auto it = g_global_id.find(ordinal);
  return it == g_global_id.end() ? ordinal : it->second;
}

bool IsLocal(int64_t global_id) {
  std::lock_guard<std::mutex> lock(g_local_mu);
  if (g_global_id.empty()) return true;  // single process, ids are ordinals
  for (auto& [ordinal, id] : g_global_id) {
    if (id == global_id) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------
// NCCL types.

bool NcclType(ffi::DataType t, ncclDataType_t* out) {
  switch (t) {
    case ffi::DataType::PRED:
    case ffi::DataType::U8: *out = ncclUint8; return true;
    case ffi::DataType::S8: *out = ncclInt8; return true;
    case ffi::DataType::S32: *out = ncclInt32; return true;
    case ffi::DataType::U32: *out = ncclUint32; return true;
    case ffi::DataType::S64: *out = ncclInt64; return true;
    case ffi::DataType::U64: *out = ncclUint64; return true;
    case ffi::DataType::F16: *out = ncclFloat16; return true;
    case ffi::DataType::BF16: *out = ncclBfloat16; return true;
    case ffi::DataType::F32: *out = ncclFloat32; return true;
    case ffi::DataType::F64: *out = ncclFloat64; return true;
    default: return false;
  }
}

bool NcclOp(Reduction r, ffi::DataType t, ncclRedOp_t* out) {
  if (t == ffi::DataType::PRED) {  // 0/1 bytes: or = max, and = min
    bool any = r == Reduction::kAdd || r == Reduction::kMax || r == Reduction::kOr;
    *out = any ? ncclMax : ncclMin;
    return true;
  }
  switch (r) {
    case Reduction::kAdd: *out = ncclSum; return true;
    case Reduction::kMultiply: *out = ncclProd; return true;
    case Reduction::kMin: *out = ncclMin; return true;
    case Reduction::kMax: *out = ncclMax; return true;
    default: return false;  // NCCL has no bitwise and/or
  }
}

// ---------------------------------------------------------------------------
// Per-device state.

struct Timing {  // events for the trace (timing-enabled)
  cudaEvent_t begin = nullptr, end = nullptr;
};

struct CommKey {
  std::vector<int64_t> devices;  // global device ids, in rank order
  int stream;
  bool operator<(const CommKey& o) const {
    return std::tie(devices, stream) < std::tie(o.devices, o.stream);
  }
};

// One rank's NCCL communicator. Every NCCL call on it holds `mu`.
struct Comm {
  std::mutex mu;
  ncclComm_t handle = nullptr;
  bool aborted = false;  // the handle is freed: never used again
  CommKey key;
  std::string id;  // the unique id's bytes: the same on every rank of this communicator
  int rank = 0;
  int64_t launched = 0;  // collectives this rank has enqueued on it
};
using CommPtr = std::shared_ptr<Comm>;

// Aborts `comm` unless it was already (the caller holds comm.mu).
void AbortLocked(Comm& comm) {
  if (comm.aborted) return;
  comm.aborted = true;
  ncclCommAbort(comm.handle);
}

struct InFlight {
  int64_t op_id = 0;
  std::string description;
  int stream = 0;
  cudaEvent_t done = nullptr;
  CommPtr comm;       // null: a permute member that neither sends nor receives
  int64_t seq = 0;    // this collective is the seq-th this rank enqueued on comm
  int64_t issued_ns = 0;
  Timing collective, compute_start;
  int64_t logical = -1;
};

class Device;
Device* GetDevice(int ordinal);

// Keeps a device's CUDA context current on this thread for a scope.
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != ordinal) {
      changed_ = cudaSetDevice(ordinal) == cudaSuccess;
    }
  }
  ~ScopedDevice() {
    if (changed_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
  bool changed_ = false;
};

class Device {
 public:
  explicit Device(int ordinal) : ordinal_(ordinal) {}
  int ordinal() const { return ordinal_; }

  ffi::Error Stream(int k, cudaStream_t* out) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = streams_.find(k);
    if (it != streams_.end()) {
      *out = it->second;
      return ffi::Error::Success();
    }
    int least = 0, greatest = 0;
    XS_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    int priority = g_priority.load();
    if (priority == std::numeric_limits<int>::min()) priority = greatest;
    priority = std::clamp(priority, std::min(least, greatest), std::max(least, greatest));
    cudaStream_t stream;
    XS_CUDA(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority));
    streams_[k] = stream;
    *out = stream;
    return ffi::Error::Success();
  }

  ffi::Error Event(cudaEvent_t* out, bool timing = false) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& pool = timing ? timing_pool_ : pool_;
      if (!pool.empty()) {
        *out = pool.back();
        pool.pop_back();
        return ffi::Error::Success();
      }
    }
    XS_CUDA(cudaEventCreateWithFlags(out, timing ? cudaEventDefault : cudaEventDisableTiming));
    return ffi::Error::Success();
  }

  void Release(cudaEvent_t event, bool timing = false) {
    if (event == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    (timing ? timing_pool_ : pool_).push_back(event);
  }

  void AddPending(int64_t run, int64_t op, InFlight flight) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_[{run, op}].push_back(std::move(flight));
  }

  bool TakePending(int64_t run, int64_t op, InFlight* out) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find({run, op});
    if (it == pending_.end() || it->second.empty()) return false;
    *out = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) pending_.erase(it);
    return true;
  }

  std::string error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  void SetError(const std::string& e) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = e;
  }

  std::map<CommKey, CommPtr>& comms() { return comms_; }
  std::mutex& comm_mu() { return comm_mu_; }

  // The base event the trace's millisecond timings are relative to, recorded
  // on the compute stream by the first traced start.
  cudaEvent_t base(cudaStream_t record_on = nullptr) {
    std::lock_guard<std::mutex> lock(mu_);
    if (base_ == nullptr && record_on != nullptr && cudaEventCreate(&base_) == cudaSuccess) {
      cudaEventRecord(base_, record_on);
    }
    return base_;
  }

 private:
  int ordinal_;
  std::mutex mu_;
  std::map<int, cudaStream_t> streams_;
  std::vector<cudaEvent_t> pool_, timing_pool_;
  std::map<std::pair<int64_t, int64_t>, std::deque<InFlight>> pending_;
  std::string error_;
  std::mutex comm_mu_;
  std::map<CommKey, CommPtr> comms_;
  cudaEvent_t base_ = nullptr;
};

Device* GetDevice(int ordinal) {
  static std::mutex* mu = new std::mutex();
  static auto* devices = new std::map<int, std::unique_ptr<Device>>();
  std::lock_guard<std::mutex> lock(*mu);
  auto& d = (*devices)[ordinal];
  if (!d) d = std::make_unique<Device>(ordinal);
  return d.get();
}

// How many collectives each rank of a communicator has enqueued, by the
// communicator's unique id and rank, for the ranks of this process: who never
// started a collective that hangs.
std::mutex g_progress_mu;
std::map<std::string, std::map<int, int64_t>> g_progress;
// Communicators of this process with a collective that timed out, by unique id:
// no rank of this process enqueues on them again, which would pair its next
// collective with the hung one and let that step finish with wrong results.
std::map<std::string, std::string> g_hung;

// ---------------------------------------------------------------------------
// Watchdog over collectives in flight, and the trace records to collect.

std::string ProgressKey(const Comm& comm, int rank) {
  std::ostringstream os;
  os << "xla_streams/progress/" << std::hex << std::hash<std::string>()(comm.id) << std::dec << "/"
     << rank;
  return os.str();
}

// Which devices of a hung collective's group never started it: from this
// process's ranks' progress, and the other processes' as they publish theirs
// when their own collective times out (waiting up to 2 s for them).
std::string NeverStarted(const InFlight& flight) {
  const Comm* comm = flight.comm.get();
  if (comm == nullptr) return "it has no peers";
  std::map<int, int64_t> local;
  {
    std::lock_guard<std::mutex> lock(g_progress_mu);
    local = g_progress[comm->id];
  }
  KvSet set = g_kv_set.load();
  KvGet get = g_kv_get.load();
  for (auto& [rank, launched] : local) {
    std::string value = std::to_string(launched);
    if (set != nullptr) set(ProgressKey(*comm, rank).c_str(), value.data(), value.size(), 1);
  }
  int64_t deadline = NowNs() + 2000000000;
  std::vector<int64_t> missing, unknown;
  for (size_t rank = 0; rank < comm->key.devices.size(); ++rank) {
    int64_t device = comm->key.devices[rank];
    auto it = local.find(static_cast<int>(rank));
    if (it != local.end()) {
      if (it->second < flight.seq) missing.push_back(device);
      continue;
    }
    char buffer[32] = {0};
    int64_t n = get == nullptr ? -1
                               : get(ProgressKey(*comm, static_cast<int>(rank)).c_str(),
                                     std::max<int64_t>(0, (deadline - NowNs()) / 1000000), buffer,
                                     sizeof(buffer) - 1);
    if (n <= 0) {
      unknown.push_back(device);
    } else if (std::strtoll(buffer, nullptr, 10) < flight.seq) {
      missing.push_back(device);
    }
  }
  std::ostringstream os;
  if (!missing.empty()) {
    os << "the devices that never started it: ";
    for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
  }
  if (!unknown.empty()) {
    os << (missing.empty() ? "" : "; ") << "devices in other processes that did not say whether "
       << "they started it (they never timed out, or have no key-value store): ";
    for (size_t i = 0; i < unknown.size(); ++i) os << (i ? ", " : "") << unknown[i];
  }
  if (missing.empty() && unknown.empty()) {
    os << "every device of its group started it (NCCL stalled, or a device waits in an "
          "earlier collective)";
  }
  return os.str();
}

struct Watched {
  Device* device;
  InFlight flight;
};

struct PendingTrace {
  Device* device;
  TraceEvent event;
  cudaEvent_t begin, end;
};

class Watchdog {
 public:
  static Watchdog& Get() {
    static Watchdog* w = new Watchdog();
    return *w;
  }
  void Watch(Device* device, InFlight flight) {
    std::lock_guard<std::mutex> lock(mu_);
    watched_.push_back(Watched{device, std::move(flight)});
    if (!started_) {
      started_ = true;
      std::thread([this] { Loop(); }).detach();
    }
  }
  void AddTrace(PendingTrace t) {
    std::lock_guard<std::mutex> lock(mu_);
    traces_.push_back(std::move(t));
  }
  // Converts the trace records whose CUDA events are complete to events; those
  // of collectives still running (or hung) stay for a later call.
  void CollectTrace() {
    std::vector<PendingTrace> traces, later;
    {
      std::lock_guard<std::mutex> lock(mu_);
      traces.swap(traces_);
    }
    for (PendingTrace& t : traces) {
      ScopedDevice scoped(t.device->ordinal());
      cudaError_t state = cudaEventQuery(t.end);
      if (state == cudaErrorNotReady) {
        later.push_back(std::move(t));
        continue;
      }
      cudaEvent_t base = t.device->base();
      float begin = -1, end = -1;
      if (base != nullptr && state == cudaSuccess) {
        cudaEventElapsedTime(&begin, base, t.begin);
        cudaEventElapsedTime(&end, base, t.end);
      }
      t.event.begin_ms = begin;
      t.event.end_ms = end;
      Trace::Get().Add(t.event);
      t.device->Release(t.begin, true);
      if (t.end != t.begin) t.device->Release(t.end, true);
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (PendingTrace& t : later) traces_.push_back(std::move(t));
  }

 private:
  void Loop() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      try {
        Sweep();
      } catch (...) {  // out of memory while building a message: try again next period
      }
    }
  }

  void Sweep() {
    {
      std::vector<Watched> watched;
      {
        std::lock_guard<std::mutex> lock(mu_);
        watched.swap(watched_);
      }
      std::vector<Watched> still;
      int64_t timeout_ns = TimeoutNs();
      for (Watched& w : watched) {
        ScopedDevice scoped(w.device->ordinal());
        cudaError_t q = cudaEventQuery(w.flight.done);
        ncclResult_t async = ncclSuccess;
        Comm* comm = w.flight.comm.get();
        // A communicator busy in another call (a start settling its group) is
        // asked next period: NCCL forbids a second call meanwhile.
        if (comm != nullptr && comm->mu.try_lock()) {
          if (!comm->aborted) ncclCommGetAsyncError(comm->handle, &async);
          comm->mu.unlock();
        }
        if (q == cudaSuccess) {
          w.device->Release(w.flight.done);
          continue;
        }
        if (async != ncclSuccess && async != ncclInProgress) {
          w.device->SetError(NcclMessage(w.flight.description.c_str(), async, comm->handle));
          continue;
        }
        if (q != cudaErrorNotReady) {
          w.device->SetError(CudaMessage(w.flight.description.c_str(), q));
          continue;
        }
        if (NowNs() - w.flight.issued_ns > timeout_ns) {
          std::ostringstream os;
          os << "xla_streams: " << w.flight.description << " on device "
             << w.device->ordinal() << " did not complete within " << timeout_ns / 1e9
             << " s; " << NeverStarted(w.flight)
             << ". Its results will never be ready (its communicator is not aborted: the "
                "outputs would be undefined); this process cannot run collectives any more. "
                "Set XLA_STREAMS_TIMEOUT_S to change the timeout.";
          w.device->SetError(os.str());
          if (comm != nullptr) {
            std::lock_guard<std::mutex> lock(g_progress_mu);
            g_hung.emplace(comm->id, os.str());
          }
          std::fprintf(stderr, "%s\n", os.str().c_str());
          continue;
        }
        still.push_back(std::move(w));
      }
      std::lock_guard<std::mutex> lock(mu_);
      for (Watched& w : still) watched_.push_back(std::move(w));
    }
  }
  std::mutex mu_;
  std::vector<Watched> watched_;
  std::vector<PendingTrace> traces_;
  bool started_ = false;
};

// ---------------------------------------------------------------------------
// Communicators.

ffi::Error Invalid(const OpAttrs& op, const std::string& what) {
  return ffi::Error::InvalidArgument("xla_streams: " + op.Describe() + ": " + what);
}


// NCCL unique ids. In one process: one per communicator key and creation
// attempt, forgotten when the attempt fails. Across processes, rank 0 publishes
// attempt g's id under "<key>/g<g>" and the attempt under "<key>/current"; the
// others take the current attempt, or a later one than an attempt they saw
// fail, so every member meets at the owner's latest attempt.
std::mutex g_ids_mu;
std::map<CommKey, std::string> g_ids;  // in-process: the id of the attempt under way
std::map<CommKey, int64_t> g_attempt;  // across processes: the attempt to use next

std::string KeyName(const CommKey& key) {
  std::ostringstream os;
  os << "xla_streams/nccl/s" << key.stream << "/";
  for (size_t i = 0; i < key.devices.size(); ++i) os << (i ? "," : "") << key.devices[i];
  return os.str();
}

std::string IdBytes(const ncclUniqueId& id) {
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

ffi::Error NoStore(const CommKey& key) {
  return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                    "xla_streams: the group " + KeyName(key) +
                        " spans processes and JAX's distributed key-value store is not "
                        "available (call jax.distributed.initialize())");
}

// The id of this creation attempt of `key`'s communicator, and the attempt.
ffi::Error UniqueId(const CommKey& key, bool owner, bool all_local, ncclUniqueId* id,
                    int64_t* attempt_out) {
  auto fresh = [&]() -> ffi::Error {
    ncclResult_t r = ncclGetUniqueId(id);
    if (r != ncclSuccess) {
      return ffi::Error(ffi::ErrorCode::kInternal, NcclMessage("ncclGetUniqueId", r, nullptr));
    }
    return ffi::Error::Success();
  };
  if (all_local) {
    std::lock_guard<std::mutex> lock(g_ids_mu);
    *attempt_out = 0;
    auto it = g_ids.find(key);
    if (it != g_ids.end()) {
      std::memcpy(id, it->second.data(), sizeof(*id));
      return ffi::Error::Success();
    }
    if (auto e = fresh(); !e.success()) return e;
    g_ids[key] = IdBytes(*id);
    return ffi::Error::Success();
  }
  KvSet set = g_kv_set.load();
  KvGet get = g_kv_get.load();
  if (set == nullptr || get == nullptr) return NoStore(key);
  int64_t attempt;
  {
    std::lock_guard<std::mutex> lock(g_ids_mu);
    attempt = g_attempt[key];
  }
  std::string current = KeyName(key) + "/current";
  if (owner) {
    if (auto e = fresh(); !e.success()) return e;
    std::string number = std::to_string(attempt);
    std::string name = KeyName(key) + "/g" + number;
    if (set(name.c_str(), reinterpret_cast<const char*>(id), sizeof(*id), 0) != 0 ||
        set(current.c_str(), number.data(), number.size(), 1) != 0) {
      return ffi::Error(ffi::ErrorCode::kFailedPrecondition,
                        "xla_streams: cannot publish the NCCL id of " + name +
                            " in JAX's distributed key-value store");
    }
    *attempt_out = attempt;
    return ffi::Error::Success();
  }
  // The owner's current attempt, once it is no older than ours.
  int64_t deadline = NowNs() + TimeoutNs();
  for (;;) {
    char buffer[32] = {0};
    int64_t n = get(current.c_str(), std::max<int64_t>(1, (deadline - NowNs()) / 1000000), buffer,
                    sizeof(buffer) - 1);
    if (n > 0 && std::strtoll(buffer, nullptr, 10) >= attempt) {
      attempt = std::strtoll(buffer, nullptr, 10);
      break;
    }
    if (NowNs() > deadline) {
      return ffi::Error(ffi::ErrorCode::kDeadlineExceeded,
                        "xla_streams: the NCCL id of " + KeyName(key) +
                            " did not arrive through the key-value store within the timeout");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::string name = KeyName(key) + "/g" + std::to_string(attempt);
  int64_t n = get(name.c_str(), TimeoutMs(), reinterpret_cast<char*>(id), sizeof(*id));
  if (n != static_cast<int64_t>(sizeof(*id))) {
    return ffi::Error(ffi::ErrorCode::kDeadlineExceeded,
                      "xla_streams: the NCCL id of " + name +
                          " did not arrive through the key-value store within the timeout");
  }
  *attempt_out = attempt;
  return ffi::Error::Success();
}

// Creation attempt `attempt` of `key`'s communicator, with `id`, failed: the next
// one uses another id (an id is consumed by its first attempt, NVIDIA/nccl#1038).
void ForgetId(const CommKey& key, const ncclUniqueId& id, int64_t attempt) {
  std::lock_guard<std::mutex> lock(g_ids_mu);
  auto it = g_ids.find(key);
  if (it != g_ids.end() && it->second == IdBytes(id)) g_ids.erase(it);
  g_attempt[key] = std::max(g_attempt[key], attempt + 1);
}

ffi::Error Communicator(Device* device, const OpAttrs& op, const std::vector<int64_t>& members,
                        int rank, CommPtr* out) {
  // Keyed by devices, not logical ids: another executable may put the same
  // logical group on other devices.
  CommKey key{{}, static_cast<int>(op.stream)};
  bool all_local = true;
  for (int64_t logical : members) {
    if (!op.device_ids.empty() &&
        (logical < 0 || logical >= static_cast<int64_t>(op.device_ids.size()))) {
      return Invalid(op, "logical device " + std::to_string(logical) +
                             " is outside the device assignment");
    }
    int64_t global = op.device_ids.empty() ? logical : op.device_ids[logical];
    key.devices.push_back(global);
    all_local = all_local && IsLocal(global);
  }
  std::lock_guard<std::mutex> lock(device->comm_mu());
  auto it = device->comms().find(key);
  if (it != device->comms().end()) {
    std::lock_guard<std::mutex> comm_lock(it->second->mu);
    if (!it->second->aborted) {
      *out = it->second;
      return ffi::Error::Success();
    }
    device->comms().erase(it);  // aborted after a failure: created again below
  }
  ncclUniqueId id;
  int64_t attempt = 0;
  if (auto e = UniqueId(key, rank == 0, all_local, &id, &attempt); !e.success()) return e;
  auto comm = std::make_shared<Comm>();
  comm->key = key;
  comm->id = IdBytes(id);
  comm->rank = rank;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  std::lock_guard<std::mutex> comm_lock(comm->mu);
  ncclResult_t r =
      ncclCommInitRankConfig(&comm->handle, static_cast<int>(members.size()), id, rank, &config);
  int64_t deadline = NowNs() + TimeoutNs();
  while (r == ncclInProgress || (r == ncclSuccess && comm->handle != nullptr)) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(comm->handle, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      r = state;
      break;
    }
    if (NowNs() > deadline) {
      AbortLocked(*comm);
      ForgetId(key, id, attempt);
      return ffi::Error(ffi::ErrorCode::kDeadlineExceeded,
                        "xla_streams: creating the NCCL communicator for " + op.Describe() +
                            " (group " + JoinIds(members) + ", rank " + std::to_string(rank) +
                            ") timed out: not every member joined; a later step tries again "
                            "with a new NCCL id. Set XLA_STREAMS_TIMEOUT_S to change the "
                            "timeout.");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (r != ncclSuccess && r != ncclInProgress) {
    std::string message = NcclMessage("ncclCommInitRankConfig", r, comm->handle);
    if (comm->handle != nullptr) AbortLocked(*comm);
    ForgetId(key, id, attempt);
    return ffi::Error(ffi::ErrorCode::kInternal, message + " for " + op.Describe());
  }
  {
    std::lock_guard<std::mutex> progress(g_progress_mu);  // a rank of this process, none yet
    g_progress[comm->id][rank] = 0;
  }
  device->comms()[key] = comm;
  *out = comm;
  return ffi::Error::Success();
}

// Waits (host side, bounded) for a non-blocking communicator to accept the
// operations just enqueued; NCCL may still be connecting peers on first use.
// The caller holds comm.mu.
ffi::Error Settle(Comm& comm, ncclResult_t r, const OpAttrs& op) {
  int64_t deadline = NowNs() + TimeoutNs();
  while (r == ncclInProgress) {
    if (NowNs() > deadline) {
      AbortLocked(comm);
      return ffi::Error(ffi::ErrorCode::kDeadlineExceeded,
                        "xla_streams: enqueueing " + op.Describe() +
                            " timed out (peers never connected); communicator aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    ncclCommGetAsyncError(comm.handle, &r);
  }
  if (r != ncclSuccess) {
    return ffi::Error(ffi::ErrorCode::kInternal,
                      NcclMessage(op.Describe().c_str(), r, comm.handle));
  }
  return ffi::Error::Success();
}

// ---------------------------------------------------------------------------
// Handlers.

// Checks the buffers against the collective before anything is enqueued.
ffi::Error CheckBuffers(const OpAttrs& op, int n, const std::vector<ffi::AnyBuffer>& ins,
                        const std::vector<ffi::AnyBuffer>& outs) {
  ffi::DataType dtype = ins[0].element_type();
  ncclDataType_t type;
  if (!NcclType(dtype, &type)) return Invalid(op, std::string("NCCL cannot move ") + DTypeName(dtype));
  ncclRedOp_t red;
  if ((op.kind == Kind::kAllReduce || op.kind == Kind::kReduceScatter) &&
      !NcclOp(op.reduction, dtype, &red)) {
    return Invalid(op, std::string("NCCL has no such reduction for ") + DTypeName(dtype));
  }
  if (op.kind == Kind::kAllToAll && op.dimension < 0 && static_cast<int>(ins.size()) != n) {
    return Invalid(op, "a tuple all-to-all needs one operand per member");
  }
  for (size_t i = 0; i < ins.size(); ++i) {
    if (ins[i].element_type() != dtype || outs[i].element_type() != dtype) {
      return Invalid(op, "operands and results must share one element type");
    }
    if (op.dimension >= 0 && i < op.outer.size() && op.outer[i] != 1) {
      return Invalid(op, "the dimension is not the most major one; NCCL needs contiguous blocks");
    }
    size_t in = ins[i].element_count(), out = outs[i].element_count();
    bool ok = true;
    switch (op.kind) {
      case Kind::kAllReduce:
      case Kind::kCollectivePermute:
        ok = in == out;
        break;
      case Kind::kAllGather:
        ok = out == in * n;
        break;
      case Kind::kReduceScatter:
        ok = in == out * n;
        break;
      case Kind::kAllToAll:
        ok = in == out && (op.dimension < 0 || in % n == 0);
        break;
    }
    if (!ok) {
      return Invalid(op, "buffer shapes " + ShapeString(dtype, ins[i].dimensions()) + " -> " +
                             ShapeString(dtype, outs[i].dimensions()) + " do not fit a group of " +
                             std::to_string(n));
    }
  }
  return ffi::Error::Success();
}

// Enqueues the collective on `stream` (buffers already checked); `seq`: how
// many collectives this rank has enqueued on the communicator, this one included.
ffi::Error Launch(const OpAttrs& op, Comm* comm_state, cudaStream_t stream, int n,
                  int64_t logical, const std::vector<int64_t>& members,
                  const std::vector<ffi::AnyBuffer>& ins, const std::vector<ffi::AnyBuffer>& outs,
                  int64_t* seq) {
  ffi::DataType dtype = ins[0].element_type();
  ncclDataType_t type = ncclUint8;
  NcclType(dtype, &type);
  size_t width = ffi::ByteWidth(dtype);
  if (comm_state == nullptr) {  // a permute member that neither sends nor receives
    for (const ffi::AnyBuffer& out : outs) {
      XS_CUDA(cudaMemsetAsync(out.untyped_data(), 0, out.size_bytes(), stream));
    }
    return ffi::Error::Success();
  }
  std::lock_guard<std::mutex> lock(comm_state->mu);
  if (comm_state->aborted) {
    return ffi::Error(ffi::ErrorCode::kAborted,
                      "xla_streams: " + op.Describe() + ": its NCCL communicator was aborted");
  }
  {
    std::lock_guard<std::mutex> progress(g_progress_mu);
    auto hung = g_hung.find(comm_state->id);
    if (hung != g_hung.end()) {
      return ffi::Error(ffi::ErrorCode::kAborted,
                        "xla_streams: " + op.Describe() + " is not run: its NCCL communicator "
                        "holds a collective that timed out (" + hung->second + ")");
    }
  }
  ncclComm_t comm = comm_state->handle;
  ncclRedOp_t red = ncclSum;
  NcclOp(op.reduction, dtype, &red);
  auto rank_of = [&](int64_t id) {
    return static_cast<int>(std::find(members.begin(), members.end(), id) - members.begin());
  };
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) return Settle(*comm_state, r, op);
  cudaError_t copy = cudaSuccess;
  for (size_t i = 0; i < ins.size() && r == ncclSuccess; ++i) {
    const void* in = ins[i].untyped_data();
    void* out = outs[i].untyped_data();
    size_t in_count = ins[i].element_count(), out_count = outs[i].element_count();
    switch (op.kind) {
      case Kind::kAllReduce:
        r = ncclAllReduce(in, out, in_count, type, red, comm, stream);
        break;
      case Kind::kAllGather:
        r = ncclAllGather(in, out, in_count, type, comm, stream);
        break;
      case Kind::kReduceScatter:
        r = ncclReduceScatter(in, out, out_count, type, red, comm, stream);
        break;
      case Kind::kAllToAll:
        if (op.dimension < 0) {  // tuple form: operand p goes to member p, result p from it
          int peer = static_cast<int>(i);
          r = ncclSend(in, in_count, type, peer, comm, stream);
          if (r == ncclSuccess) r = ncclRecv(out, out_count, type, peer, comm, stream);
        } else {
          size_t chunk = in_count / n;
          for (int p = 0; p < n && r == ncclSuccess; ++p) {
            r = ncclSend(static_cast<const char*>(in) + p * chunk * width, chunk, type, p, comm,
                         stream);
            if (r == ncclSuccess) {
              r = ncclRecv(static_cast<char*>(out) + p * chunk * width, chunk, type, p, comm,
                           stream);
            }
          }
        }
        break;
      case Kind::kCollectivePermute: {
        bool received = false;
        for (const auto& pair : op.groups) {
          if (pair.size() != 2 || r != ncclSuccess) continue;
          if (pair[0] == logical && pair[1] == logical) {
            copy = cudaMemcpyAsync(out, in, in_count * width, cudaMemcpyDeviceToDevice, stream);
            received = true;
            continue;
          }
          if (pair[0] == logical) r = ncclSend(in, in_count, type, rank_of(pair[1]), comm, stream);
          if (pair[1] == logical && r == ncclSuccess) {
            r = ncclRecv(out, out_count, type, rank_of(pair[0]), comm, stream);
            received = true;
          }
        }
        if (!received && copy == cudaSuccess) {
          copy = cudaMemsetAsync(out, 0, out_count * width, stream);
        }
        break;
      }
    }
  }
  ncclResult_t end = ncclGroupEnd();  // always close the group, even after an error
  if (r != ncclSuccess && r != ncclInProgress) {
    return ffi::Error(ffi::ErrorCode::kInternal, NcclMessage(op.Describe().c_str(), r, comm));
  }
  if (copy != cudaSuccess) {
    return ffi::Error(ffi::ErrorCode::kInternal, CudaMessage(op.Describe().c_str(), copy));
  }
  if (auto e = Settle(*comm_state, end, op); !e.success()) return e;
  *seq = ++comm_state->launched;
  std::lock_guard<std::mutex> progress(g_progress_mu);
  g_progress[comm_state->id][comm_state->rank] = *seq;
  return ffi::Error::Success();
}

ffi::Error CudaStartImpl(cudaStream_t compute, ffi::RunId run, int32_t ordinal,
                         ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  int64_t issued = NowNs();
  OpAttrs op;
  if (auto e = DecodeAttrs(attrs, /*full=*/true, &op); !e.success()) return e;
  Device* device = GetDevice(ordinal);
  if (std::string error = device->error(); !error.empty()) {
    return ffi::Error(ffi::ErrorCode::kAborted, error);
  }
  std::vector<ffi::AnyBuffer> ins, outs;
  for (size_t i = 0; i < args.size(); ++i) {
    auto b = args.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return b.error();
    ins.push_back(*b);
  }
  for (size_t i = 0; i < rets.size(); ++i) {
    auto b = rets.get<ffi::AnyBuffer>(i);
    if (!b.has_value()) return b.error();
    outs.push_back(**b);
  }
  if (ins.empty() || ins.size() != outs.size()) {
    return Invalid(op, std::to_string(ins.size()) + " operands but " + std::to_string(outs.size()) +
                           " results");
  }
  // This device's logical id, group and rank.
  int64_t global = GlobalId(ordinal);
  int64_t logical = global;
  if (!op.device_ids.empty()) {
    auto it = std::find(op.device_ids.begin(), op.device_ids.end(), global);
    if (it == op.device_ids.end()) {
      return Invalid(op, "device " + std::to_string(global) + " is not in the device assignment");
    }
    logical = it - op.device_ids.begin();
  }
  std::vector<int64_t> members;
  if (op.kind == Kind::kCollectivePermute) {
    std::set<int64_t> ids;
    for (const auto& pair : op.groups) ids.insert(pair.begin(), pair.end());
    members.assign(ids.begin(), ids.end());
  } else {
    for (const auto& g : op.groups) {
      if (std::find(g.begin(), g.end(), logical) != g.end()) members = g;
    }
  }
  auto found = std::find(members.begin(), members.end(), logical);
  // A permute member that neither sends nor receives just zeroes its result.
  bool idle = found == members.end() && op.kind == Kind::kCollectivePermute;
  if (found == members.end() && !idle) {
    return Invalid(op, "logical device " + std::to_string(logical) + " is in no group");
  }
  int rank = static_cast<int>(found - members.begin());
  int n = static_cast<int>(members.size());

  if (!idle) {
    if (auto e = CheckBuffers(op, n, ins, outs); !e.success()) return e;
  }
  ScopedDevice scoped(ordinal);
  CommPtr comm;
  if (!idle) {
    if (auto e = Communicator(device, op, members, rank, &comm); !e.success()) return e;
  }
  cudaStream_t stream;
  if (auto e = device->Stream(static_cast<int>(op.stream), &stream); !e.success()) return e;

  bool trace = Trace::Get().enabled();
  InFlight flight;
  flight.op_id = op.op_id;
  flight.description = op.Describe();
  flight.stream = static_cast<int>(op.stream);
  flight.comm = comm;
  flight.issued_ns = issued;
  flight.logical = logical;
  cudaEvent_t ready;
  if (auto e = device->Event(&ready); !e.success()) return e;
  XS_CUDA(cudaEventRecord(ready, compute));
  XS_CUDA(cudaStreamWaitEvent(stream, ready, 0));
  device->Release(ready);  // the wait captured the record; the event may be reused
  if (trace) {
    device->base(compute);
    if (auto e = device->Event(&flight.collective.begin, true); !e.success()) return e;
    if (auto e = device->Event(&flight.compute_start.begin, true); !e.success()) return e;
    XS_CUDA(cudaEventRecord(flight.compute_start.begin, compute));
    XS_CUDA(cudaEventRecord(flight.collective.begin, stream));
  }
  if (auto e = Launch(op, comm.get(), stream, n, logical, members, ins, outs, &flight.seq);
      !e.success()) {
    return e;
  }
  if (trace) {
    if (auto e = device->Event(&flight.collective.end, true); !e.success()) return e;
    XS_CUDA(cudaEventRecord(flight.collective.end, stream));
  }
  if (auto e = device->Event(&flight.done); !e.success()) return e;
  XS_CUDA(cudaEventRecord(flight.done, stream));
  device->AddPending(run.run_id, op.op_id, std::move(flight));
  return ffi::Error::Success();
}

ffi::Error CudaDoneImpl(cudaStream_t compute, ffi::RunId run, int32_t ordinal,
                        ffi::RemainingArgs args, ffi::RemainingRets rets, ffi::Dictionary attrs) {
  OpAttrs op;
  if (auto e = DecodeAttrs(attrs, /*full=*/false, &op); !e.success()) return e;
  Device* device = GetDevice(ordinal);
  if (std::string error = device->error(); !error.empty()) {
    return ffi::Error(ffi::ErrorCode::kAborted, error);
  }
  InFlight flight;
  if (!device->TakePending(run.run_id, op.op_id, &flight)) {
    return Invalid(op, "done without a start on device " + std::to_string(ordinal));
  }
  ScopedDevice scoped(ordinal);
  XS_CUDA(cudaStreamWaitEvent(compute, flight.done, 0));
  // The results alias the start's; copy (stream-ordered) only if XLA did not honour that.
  for (size_t i = 0; i < rets.size() && i < args.size(); ++i) {
    auto src = args.get<ffi::AnyBuffer>(i);
    auto dst = rets.get<ffi::AnyBuffer>(i);
    if (src.has_value() && dst.has_value() && src->untyped_data() != (*dst)->untyped_data()) {
      XS_CUDA(cudaMemcpyAsync((*dst)->untyped_data(), src->untyped_data(), (*dst)->size_bytes(),
                              cudaMemcpyDeviceToDevice, compute));
    }
  }
  if (flight.collective.begin != nullptr) {
    TraceEvent e;
    e.what = "collective";
    e.device = ordinal;
    e.logical = flight.logical;
    e.stream = flight.stream;
    e.op_id = op.op_id;
    e.name = op.name;
    e.kind = KindName(op.kind);
    e.begin_ns = flight.issued_ns;
    e.end_ns = NowNs();
    Watchdog::Get().AddTrace({device, e, flight.collective.begin, flight.collective.end});
    cudaEvent_t done_mark;
    if (auto err = device->Event(&done_mark, true); !err.success()) return err;
    XS_CUDA(cudaEventRecord(done_mark, compute));
    TraceEvent c = e;
    c.what = "compute";  // the compute stream from the start's call to the done's
    c.stream = -1;
    Watchdog::Get().AddTrace({device, c, flight.compute_start.begin, done_mark});
  }
  flight.collective = Timing{};
  flight.compute_start = Timing{};
  Watchdog::Get().Watch(device, std::move(flight));
  return ffi::Error::Success();
}

ffi::Error CudaStart(cudaStream_t compute, ffi::RunId run, int32_t ordinal, ffi::RemainingArgs args,
                     ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return Guarded("start", [&] { return CudaStartImpl(compute, run, ordinal, args, rets, attrs); });
}

ffi::Error CudaDone(cudaStream_t compute, ffi::RunId run, int32_t ordinal, ffi::RemainingArgs args,
                    ffi::RemainingRets rets, ffi::Dictionary attrs) {
  return Guarded("done", [&] { return CudaDoneImpl(compute, run, ordinal, args, rets, attrs); });
}

// Start and done take the same context, operands, results and attributes.
auto CollectiveBinding() {
  return xla::ffi::Ffi::Bind()
      .Ctx<xla::ffi::PlatformStream<cudaStream_t>>()
      .Ctx<xla::ffi::RunId>()
      .Ctx<xla::ffi::DeviceOrdinal>()
      .RemainingArgs()
      .RemainingRets()
      .Attrs();
}

}  // namespace
}  // namespace xs::cuda

XLA_FFI_DEFINE_HANDLER_SYMBOL(xla_streams_cuda_start, xs::cuda::CudaStart,
                              xs::cuda::CollectiveBinding());

XLA_FFI_DEFINE_HANDLER_SYMBOL(xla_streams_cuda_done, xs::cuda::CudaDone,
                              xs::cuda::CollectiveBinding());

extern "C" {
// Waits for the CUDA events of finished collectives and adds them to the trace.
void xs_cuda_trace_collect() { xs::cuda::Watchdog::Get().CollectTrace(); }
// Collective stream priority: "high" (the device's greatest; default), "low"/"default" (0), or
// an integer. Applies to streams created afterwards. Returns 0, or -1 for a bad spec.
int xs_cuda_set_stream_priority(const char* spec) {
  std::string s = spec ? spec : "";
  if (s == "high") {
    xs::cuda::g_priority = std::numeric_limits<int>::min();
  } else if (s == "low" || s == "default") {
    xs::cuda::g_priority = 0;
  } else {
    char* end = nullptr;
    long value = std::strtol(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0') return -1;
    xs::cuda::g_priority = static_cast<int>(value);
  }
  return 0;
}
// Global device id of each local device ordinal (multi-process jobs).
void xs_cuda_set_global_id(int ordinal, int64_t global_id) {
  std::lock_guard<std::mutex> lock(xs::cuda::g_local_mu);
  xs::cuda::g_global_id[ordinal] = global_id;
}
// JAX's distributed key-value store, for NCCL ids of groups that span processes.
void xs_cuda_set_kv(xs::cuda::KvSet set, xs::cuda::KvGet get) {
  xs::cuda::g_kv_set = set;
  xs::cuda::g_kv_get = get;
}
// The error that fails every later call on device `ordinal` (a collective that
// timed out, an NCCL or CUDA error): copied into `buffer`; returns its length, 0
// if none.
size_t xs_cuda_device_error(int ordinal, char* buffer, size_t capacity) {
  return xs::CopyOut(xs::cuda::GetDevice(ordinal)->error(), buffer, capacity);
}
// NCCL's version, e.g. 23203 (0 if unavailable).
int xs_cuda_nccl_version() {
  int version = 0;
  return ncclGetVersion(&version) == ncclSuccess ? version : 0;
}
}

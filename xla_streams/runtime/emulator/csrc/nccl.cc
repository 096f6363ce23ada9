// The stand-in libnccl: the NCCL functions xla_streams' CUDA backend calls,
// compiled against the real nccl.h. Collectives and send/recv are work on the
// emulated streams of model.h, with exact results. The rules and their sources
// (NCCL User Guide, docs.nvidia.com/deeplearning/nccl/user-guide/docs/):
//
// [id]       ncclGetUniqueId makes the id of one communicator: exactly nranks
//            ranks join it once each ("Creating a communicator"). A join beyond
//            that (an id used again, or a rank joining twice) hangs in NCCL's
//            bootstrap (NVIDIA/nccl#1038): here it never completes and is reported.
// [nonblock] With config.blocking = 0, ncclCommInitRankConfig returns
//            ncclInProgress and the communicator is usable once
//            ncclCommGetAsyncError returns ncclSuccess; a collective or a group
//            may also return ncclInProgress, and its work is enqueued on the
//            stream only later; before that, no other NCCL call may use the
//            communicator ("Fault Tolerance", "Non-blocking group operation").
// [group]    Calls between ncclGroupStart and ncclGroupEnd are issued together at
//            the outermost ncclGroupEnd; a call outside a group is a group of one
//            ("Group Calls").
// [stream]   A collective is stream work: it starts after the stream's earlier
//            work, and completes only when every rank's matching call runs; the
//            calls of a communicator match by order, so every rank must issue
//            them in the same order with the same counts, types and reduction
//            ("CUDA Stream Semantics"; "Using multiple NCCL communicators
//            concurrently"). A send from a to b matches b's receive from a in order.
// [abort]    ncclCommAbort stops the communicator's unfinished work (its outputs
//            are undefined: here every byte is 0xff) and frees the handle; its
//            peers are not told ("ncclCommAbort"; what peers see is our reading).
//            Freed handles are handed out again, last freed first, as malloc would.
// [threads]  No two threads may call NCCL on one communicator at once,
//            ncclCommGetAsyncError and ncclCommAbort included ("Thread safety";
//            XLA and PyTorch hold a lock per communicator). Checked as Eraser's
//            lockset: the mutexes held at every call on a communicator (seen by
//            libxsim_locks, locks.cc) must keep one in common once two threads
//            call on it, whatever the interleaving of this run.
#include <dlfcn.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>
#include <sstream>
#include <thread>

#include "model.h"
#include "transport.h"

namespace xsim {
namespace {

// ---------------------------------------------------------------------------
// Element types and reductions, exact: every element is converted to double,
// reduced in rank order and rounded back to its type at every step, as NCCL's
// kernels reduce half and bfloat16 values in their own type.

size_t Width(int dtype) {
  switch (dtype) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
  }
  return 0;
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToHalf(float f) {  // round to nearest even
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((bits >> 23) & 0xff) - 127 + 15;
  uint32_t man = bits & 0x7fffff;
  if (((bits >> 23) & 0xff) == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (man ? 0x200 : 0));
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    man |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = man >> shift, rest = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = (static_cast<uint32_t>(exp) << 10) | (man >> 13), rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float Bf16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

template <typename T>
T Apply(int op, T a, T b) {
  switch (op) {
    case ncclSum: return static_cast<T>(a + b);
    case ncclProd: return static_cast<T>(a * b);
    case ncclMax: return a > b ? a : b;
    case ncclMin: return a < b ? a : b;
  }
  return a;
}

template <typename T>
void ReduceTyped(int op, char* acc, const char* in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    T a, b;
    std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
    std::memcpy(&b, in + i * sizeof(T), sizeof(T));
    a = Apply(op, a, b);
    std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
  }
}

template <float (*To)(uint16_t), uint16_t (*From)(float)>
void ReduceNarrow(int op, char* acc, const char* in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t a, b;
    std::memcpy(&a, acc + i * 2, 2);
    std::memcpy(&b, in + i * 2, 2);
    uint16_t r = From(Apply(op, To(a), To(b)));
    std::memcpy(acc + i * 2, &r, 2);
  }
}

// acc = acc (op) in, element-wise over n elements of dtype.
bool Reduce(int dtype, int op, char* acc, const char* in, size_t n) {
  switch (dtype) {
    case ncclInt8: ReduceTyped<int8_t>(op, acc, in, n); return true;
    case ncclUint8: ReduceTyped<uint8_t>(op, acc, in, n); return true;
    case ncclInt32: ReduceTyped<int32_t>(op, acc, in, n); return true;
    case ncclUint32: ReduceTyped<uint32_t>(op, acc, in, n); return true;
    case ncclInt64: ReduceTyped<int64_t>(op, acc, in, n); return true;
    case ncclUint64: ReduceTyped<uint64_t>(op, acc, in, n); return true;
    case ncclFloat32: ReduceTyped<float>(op, acc, in, n); return true;
    case ncclFloat64: ReduceTyped<double>(op, acc, in, n); return true;
    case ncclFloat16: ReduceNarrow<HalfToFloat, FloatToHalf>(op, acc, in, n); return true;
    case ncclBfloat16: ReduceNarrow<Bf16ToFloat, FloatToBf16>(op, acc, in, n); return true;
  }
  return false;
}

const char* KindName(Prim::Kind k) {
  switch (k) {
    case Prim::kAllReduce: return "ncclAllReduce";
    case Prim::kAllGather: return "ncclAllGather";
    case Prim::kReduceScatter: return "ncclReduceScatter";
    case Prim::kSend: return "ncclSend";
    case Prim::kRecv: return "ncclRecv";
  }
  return "?";
}

std::string PrimText(const Prim& p) {
  std::ostringstream os;
  os << KindName(p.kind) << "(count " << p.count << ", type " << p.dtype;
  if (p.kind == Prim::kAllReduce || p.kind == Prim::kReduceScatter) os << ", op " << p.op;
  if (p.peer >= 0) os << ", peer " << p.peer;
  os << ")";
  return os.str();
}

// ---------------------------------------------------------------------------
// Communicators.

struct UniqueId {  // what ncclUniqueId holds here
  char magic[8];
  uint32_t pid;
  uint32_t unused;
  uint64_t serial;
};
constexpr char kMagic[8] = {'x', 's', 'i', 'm', 'n', 'c', 'c', 'l'};

std::string HubName(const UniqueId& id) {
  return "xsim-nccl-" + std::to_string(id.pid) + "-" + std::to_string(id.serial);
}

// One call of a group, with the buffers it uses on this rank.
struct Call {
  Prim prim;  // data empty until it runs
  const void* send = nullptr;
  void* recv = nullptr;
  cudaStream_t stream = nullptr;
};

struct CommState;
using Endpoint = std::function<void(const Message&)>;

// The process-side bookkeeping of every hub this process owns [id].
class Hub {
 public:
  explicit Hub(const std::string& name) : name_(name) {}

  void Join(const Message& m, Endpoint to) {
    std::string refused;
    if (broken_) {
      refused = "its bootstrap was abandoned when rank " + std::to_string(broken_rank_) +
                " was aborted before every rank joined";
    } else if (formed_) {
      refused = "it made a communicator already: an id is for one ncclCommInitRank* of each "
                "rank (NVIDIA/nccl#1038: NCCL's bootstrap hangs)";
    } else if (nranks_ > 0 && m.nranks != nranks_) {
      refused = "rank " + std::to_string(m.rank) + " says " + std::to_string(m.nranks) +
                " ranks, others " + std::to_string(nranks_);
    } else if (members_.count(m.rank)) {
      refused = "rank " + std::to_string(m.rank) + " joined it already";
    }
    if (!refused.empty()) {
      Message refuse;
      refuse.type = Message::kRefuse;
      refuse.text = "unique id " + name_ + ": " + refused;
      to(refuse);
      return;
    }
    nranks_ = m.nranks;
    members_[m.rank] = std::move(to);
    if (static_cast<int>(members_.size()) == nranks_) {
      formed_ = true;
      Message ready;
      ready.type = Message::kReady;
      for (auto& [rank, endpoint] : members_) endpoint(ready);
    }
  }

  void Contribute(const Message& m) {
    auto& round = rounds_[m.seq];
    round.push_back(m.contributions.at(0));
    if (static_cast<int>(round.size()) < nranks_) return;
    std::sort(round.begin(), round.end(),
              [](const Contribution& a, const Contribution& b) { return a.rank < b.rank; });
    Message out;
    out.seq = m.seq;
    std::string mismatch = Check(round);
    if (!mismatch.empty()) {
      out.type = Message::kMismatch;
      out.text = mismatch;
    } else {
      out.type = Message::kComplete;
      out.contributions = std::move(round);
    }
    rounds_.erase(m.seq);
    for (auto& [rank, endpoint] : members_) endpoint(out);
  }

  void Aborted(int rank) {
    if (!formed_ && !broken_) {
      broken_ = true;
      broken_rank_ = rank;
    }
  }

 private:
  // [stream] The ranks' calls of one round must agree.
  std::string Check(const std::vector<Contribution>& round) const {
    const Contribution& first = round[0];
    std::vector<const Prim*> first_collectives;
    for (const Prim& p : first.prims) {
      if (p.kind != Prim::kSend && p.kind != Prim::kRecv) first_collectives.push_back(&p);
    }
    std::map<std::pair<int, int>, std::vector<int64_t>> sends, recvs;  // (from, to) -> counts
    for (const Contribution& c : round) {
      size_t k = 0;
      for (const Prim& p : c.prims) {
        if (p.kind == Prim::kSend) {
          sends[{c.rank, p.peer}].push_back(p.count * static_cast<int64_t>(Width(p.dtype)));
          continue;
        }
        if (p.kind == Prim::kRecv) {
          recvs[{p.peer, c.rank}].push_back(p.count * static_cast<int64_t>(Width(p.dtype)));
          continue;
        }
        const Prim* q = k < first_collectives.size() ? first_collectives[k] : nullptr;
        ++k;
        if (q == nullptr || q->kind != p.kind || q->count != p.count || q->dtype != p.dtype ||
            q->op != p.op) {
          return "rank " + std::to_string(c.rank) + " calls " + PrimText(p) + " where rank " +
                 std::to_string(first.rank) + " calls " + (q ? PrimText(*q) : "nothing");
        }
      }
      if (k != first_collectives.size()) {
        return "rank " + std::to_string(c.rank) + " makes " + std::to_string(k) +
               " collective calls in this group, rank " + std::to_string(first.rank) + " " +
               std::to_string(first_collectives.size());
      }
    }
    if (sends != recvs) {
      for (auto& [pair, bytes] : sends) {
        if (recvs[pair] != bytes) {
          return "rank " + std::to_string(pair.first) + " sends " + std::to_string(bytes.size()) +
                 " message(s) to rank " + std::to_string(pair.second) +
                 " that its receives do not match in number or size";
        }
      }
      return "a receive has no matching send";
    }
    return "";
  }

  std::string name_;
  int nranks_ = -1;
  bool formed_ = false, broken_ = false;
  int broken_rank_ = -1;
  std::map<int, Endpoint> members_;
  std::map<uint64_t, std::vector<Contribution>> rounds_;
};

struct CommState : std::enable_shared_from_this<CommState> {
  std::string id;  // the hub's name
  int nranks = 0, rank = 0, device = 0;
  bool blocking = true;
  bool ready = false;
  int init_polls = 0;       // polls left before a joined init reports success
  bool aborted = false;
  ncclResult_t async = ncclSuccess;
  bool in_progress = false;  // [nonblock] a group not yet enqueued
  int defer_polls = 0;
  std::vector<OpPtr> deferred;
  uint64_t next_seq = 0;
  std::map<uint64_t, OpPtr> ops;  // issued and not done, by call number
  std::function<void(const Message&)> to_hub;
  std::string last_error;
  // [threads] The locks held at every call so far, and who called.
  std::set<void*> lockset;
  std::set<std::thread::id> callers;
  bool lockset_reported = false;

  void OnMessage(const Message& m);
  void CheckThreads(const char* call);
};

struct ncclCommHandle;

struct Registry {
  std::map<uint64_t, std::unique_ptr<Hub>> hubs;  // this process's hubs, by serial
  std::map<std::string, std::vector<std::weak_ptr<CommState>>> local;  // by hub name
  std::vector<ncclComm*> free_handles;  // [abort] last freed first
  std::set<ncclComm*> handles;
  std::atomic<uint64_t> serial{0};
  std::string last_error;
};

Registry& Reg() {
  static Registry* registry = new Registry();
  return *registry;
}

}  // namespace
}  // namespace xsim

// nccl.h declares ncclComm_t as a pointer to this.
struct ncclComm {
  std::shared_ptr<xsim::CommState> state;  // null once aborted (freed)
};

namespace xsim {
namespace {

int Setting(const char* key, int fallback) {
  int v = Model::Get().Setting(key);
  return v < 0 ? fallback : v;
}

// The running op of a group on this rank: what the model calls back into.
class GroupWork : public Collective {
 public:
  GroupWork(std::shared_ptr<CommState> comm, uint64_t seq, std::vector<Call> calls)
      : comm_(std::move(comm)), seq_(seq), calls_(std::move(calls)) {}

  void Run(const OpPtr& op) override {
    Model& model = Model::Get();
    if (comm_->aborted) {
      Poison();
      model.Finish(op, op->begin_us);
      return;
    }
    if (Setting("nccl_fault_device", -1) == comm_->device) {
      comm_->async = ncclRemoteError;  // injected: it never completes
      model.Set("nccl_fault_device", -1);
      return;
    }
    Message m;
    m.type = Message::kContribute;
    m.seq = seq_;
    Contribution c;
    c.rank = comm_->rank;
    c.begin_us = op->begin_us;
    for (const Call& call : calls_) {
      Prim p = call.prim;
      size_t bytes = SendBytes(p, comm_->nranks);
      if (bytes > 0) p.data.assign(static_cast<const char*>(call.send), bytes);
      c.prims.push_back(std::move(p));
    }
    m.contributions.push_back(std::move(c));
    comm_->to_hub(m);
  }

  std::string Peers(const OpPtr&) const override {
    std::ostringstream os;
    os << "rank " << comm_->rank << " of " << comm_->nranks << " of communicator " << comm_->id
       << ", call " << seq_;
    return os.str();
  }

  std::vector<OpPtr> Waiting(const OpPtr&) const override {
    std::vector<OpPtr> out;
    for (auto& weak : Reg().local[comm_->id]) {
      auto peer = weak.lock();
      if (peer == nullptr || peer == comm_) continue;
      auto it = peer->ops.find(seq_);
      if (it != peer->ops.end() && it->second->state == OpState::kQueued) out.push_back(it->second);
    }
    return out;
  }

  // Every rank's contributions arrived: this rank's results.
  void Complete(const OpPtr& op, const std::vector<Contribution>& all) {
    int me = comm_->rank, n = comm_->nranks;
    std::map<int, size_t> sends_taken;  // per sender: messages to me used so far
    size_t collective = 0;
    double begin = 0, bytes = 0;
    for (const Contribution& c : all) begin = std::max(begin, c.begin_us);
    for (const Call& call : calls_) {
      const Prim& p = call.prim;
      size_t width = Width(p.dtype), count = static_cast<size_t>(p.count);
      char* out = static_cast<char*>(call.recv);
      auto nth = [&](const Contribution& c, size_t k) -> const Prim& {
        size_t seen = 0;
        for (const Prim& q : c.prims) {
          if (q.kind == Prim::kSend || q.kind == Prim::kRecv) continue;
          if (seen++ == k) return q;
        }
        return c.prims.front();  // unreachable: Hub::Check matched the counts
      };
      switch (p.kind) {
        case Prim::kAllReduce: {
          std::string acc = nth(all[0], collective).data;
          for (int r = 1; r < n; ++r) Reduce(p.dtype, p.op, acc.data(), nth(all[r], collective).data.data(), count);
          std::memcpy(out, acc.data(), count * width);
          bytes += count * width;
          ++collective;
          break;
        }
        case Prim::kAllGather:
          for (int r = 0; r < n; ++r) {
            std::memcpy(out + r * count * width, nth(all[r], collective).data.data(), count * width);
          }
          bytes += n * count * width;
          ++collective;
          break;
        case Prim::kReduceScatter: {
          std::string acc = nth(all[0], collective).data.substr(me * count * width, count * width);
          for (int r = 1; r < n; ++r) {
            Reduce(p.dtype, p.op, acc.data(), nth(all[r], collective).data.data() + me * count * width, count);
          }
          std::memcpy(out, acc.data(), count * width);
          bytes += n * count * width;
          ++collective;
          break;
        }
        case Prim::kSend:
          break;
        case Prim::kRecv: {
          size_t k = sends_taken[p.peer]++, seen = 0;
          for (const Prim& q : all[p.peer].prims) {
            if (q.kind == Prim::kSend && q.peer == me && seen++ == k) {
              std::memcpy(out, q.data.data(), q.data.size());
              bytes += q.data.size();
              break;
            }
          }
          break;
        }
      }
    }
    // Virtual time: 10 us of latency and 100 GB/s, once every rank's call runs.
    Model::Get().Finish(op, begin + 10.0 + bytes / 1.0e5);
  }

  void Poison() {
    for (const Call& call : calls_) {
      size_t bytes = RecvBytes(call.prim, comm_->nranks);
      if (bytes > 0 && call.recv != nullptr) std::memset(call.recv, 0xff, bytes);
    }
  }

  // What a rank's call reads and writes (reduce-scatter's count is per rank).
  static size_t SendBytes(const Prim& p, int n) {
    size_t bytes = static_cast<size_t>(p.count) * Width(p.dtype);
    if (p.kind == Prim::kRecv) return 0;
    return p.kind == Prim::kReduceScatter ? bytes * n : bytes;
  }
  static size_t RecvBytes(const Prim& p, int n) {
    size_t bytes = static_cast<size_t>(p.count) * Width(p.dtype);
    if (p.kind == Prim::kSend) return 0;
    return p.kind == Prim::kAllGather ? bytes * n : bytes;
  }

  const std::vector<Call>& calls() const { return calls_; }

 private:
  std::shared_ptr<CommState> comm_;
  uint64_t seq_;
  std::vector<Call> calls_;
};

// [threads] (the model's own lock is held by every call, and does not count).
void CommState::CheckThreads(const char* call) {
  using Held = int (*)(void**, int);
  static Held held_by_this_thread = reinterpret_cast<Held>(dlsym(RTLD_DEFAULT, "xsim_locks_held"));
  if (held_by_this_thread == nullptr) return;  // libxsim_locks is not loaded: no check
  void* locks[64];
  int n = held_by_this_thread(locks, 64);
  if (n < 0) return;  // loaded, not preloaded: it sees no lock
  std::set<void*> held(locks, locks + n);
  held.erase(Model::Get().mu().native_handle());
  if (callers.empty()) {
    lockset = held;
  } else {
    std::set<void*> both;
    for (void* l : lockset) {
      if (held.count(l)) both.insert(l);
    }
    lockset.swap(both);
  }
  callers.insert(std::this_thread::get_id());
  if (callers.size() > 1 && lockset.empty() && !lockset_reported) {
    lockset_reported = true;
    Model::Get().AddReport(
        "misuse", std::string(call) + " (rank " + std::to_string(rank) + ", device " +
                      std::to_string(device) + ") on communicator " + id + ": " +
                      std::to_string(callers.size()) +
                      " threads call NCCL on it and no lock is held at every call, so two "
                      "calls may overlap: NCCL forbids that, ncclCommGetAsyncError and "
                      "ncclCommAbort included [threads]");
  }
}

void CommState::OnMessage(const Message& m) {
  Model& model = Model::Get();
  switch (m.type) {
    case Message::kReady:
      ready = true;
      model.changed().notify_all();
      break;
    case Message::kRefuse:
      model.AddReport("misuse", "ncclCommInitRankConfig (rank " + std::to_string(rank) +
                                    ", device " + std::to_string(device) + "): " + m.text);
      break;
    case Message::kComplete: {
      auto it = ops.find(m.seq);
      if (it == ops.end() || aborted) break;
      OpPtr op = it->second;
      ops.erase(it);
      static_cast<GroupWork*>(op->collective.get())->Complete(op, m.contributions);
      break;
    }
    case Message::kMismatch:
      model.AddReport("mismatch", "communicator " + id + ", call " + std::to_string(m.seq) +
                                      ": " + m.text + " (NCCL hangs or corrupts data here)");
      break;
    default:
      break;
  }
}

thread_local int g_group_depth = 0;
thread_local std::vector<std::pair<std::shared_ptr<CommState>, Call>> g_group;

ncclResult_t Misuse(ncclResult_t result, const std::string& what) {
  Model::Get().AddReport("misuse", what);
  Reg().last_error = what;
  return result;
}

// The live state of a handle, or a misuse report and null.
std::shared_ptr<CommState> Live(ncclComm_t comm, const char* call, ncclResult_t* error) {
  *error = ncclInvalidArgument;
  if (comm == nullptr || !Reg().handles.count(comm)) {
    Misuse(ncclInvalidArgument, std::string(call) + ": not a communicator");
    return nullptr;
  }
  if (comm->state == nullptr) {
    Misuse(ncclInvalidArgument, std::string(call) + ": the communicator was freed by "
                                                    "ncclCommAbort [abort]");
    return nullptr;
  }
  *error = ncclSuccess;
  return comm->state;
}

// Issues the ops of a group on their streams (locked).
void IssueAll(const std::vector<OpPtr>& ops) {
  for (const OpPtr& op : ops) Model::Get().Issue(op);
}

ncclResult_t Flush() {
  Model& model = Model::Get();
  std::vector<std::pair<std::shared_ptr<CommState>, std::vector<Call>>> by_comm;
  for (auto& [comm, call] : g_group) {
    auto it = std::find_if(by_comm.begin(), by_comm.end(),
                           [&](const auto& entry) { return entry.first == comm; });
    if (it == by_comm.end()) {
      by_comm.push_back({comm, {}});
      it = by_comm.end() - 1;
    }
    it->second.push_back(call);
  }
  g_group.clear();
  bool in_progress = false;
  for (auto& [comm, calls] : by_comm) {
    cudaStream_t stream = calls[0].stream;
    std::string what = Model::Label();
    std::vector<Access> accesses;
    for (const Call& call : calls) {
      if (call.stream != stream) {
        return Misuse(ncclInvalidUsage, "one communicator's calls in one group use two streams");
      }
      what += (what.empty() ? "" : " ") + PrimText(call.prim);
      auto s = reinterpret_cast<uintptr_t>(call.send), r = reinterpret_cast<uintptr_t>(call.recv);
      size_t in = GroupWork::SendBytes(call.prim, comm->nranks);
      size_t out = GroupWork::RecvBytes(call.prim, comm->nranks);
      if (in > 0) accesses.push_back({comm->device, s, s + in, false});
      if (out > 0) accesses.push_back({comm->device, r, r + out, true});
    }
    uint64_t seq = comm->next_seq++;
    auto op = std::make_shared<Op>();
    op->kind = OpKind::kCollective;
    op->stream = stream;
    op->what = what;
    op->accesses = std::move(accesses);
    op->collective = std::make_shared<GroupWork>(comm, seq, std::move(calls));
    comm->ops[seq] = op;
    int polls = Setting("defer_polls", 1);
    if (!comm->blocking && polls > 0) {  // [nonblock]
      comm->in_progress = true;
      comm->defer_polls = polls;
      comm->deferred.push_back(op);
      in_progress = true;
    } else {
      model.Issue(op);
    }
  }
  return in_progress ? ncclInProgress : ncclSuccess;
}

ncclResult_t AddCall(ncclComm_t comm, const char* name, Prim prim, const void* send, void* recv,
                     cudaStream_t stream) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  ncclResult_t error;
  auto state = Live(comm, name, &error);
  if (state == nullptr) return error;
  state->CheckThreads(name);
  std::string where = std::string(name) + " (rank " + std::to_string(state->rank) + ", device " +
                      std::to_string(state->device) + ")";
  if (!state->ready) return Misuse(ncclInvalidArgument, where + ": the communicator is still being initialized [nonblock]");
  if (state->in_progress) {
    return Misuse(ncclInvalidArgument,
                  where + ": Attempt to use communicator before the previous operation returned "
                          "ncclSuccess [nonblock]");
  }
  if (state->aborted) return ncclInvalidArgument;
  if (!model.IsStream(stream)) return Misuse(ncclInvalidArgument, where + ": not a stream");
  if (stream->device != state->device) {
    return Misuse(ncclInvalidArgument, where + ": a stream of device " +
                                           std::to_string(stream->device) +
                                           " on a communicator of device " +
                                           std::to_string(state->device));
  }
  if (Width(prim.dtype) == 0 || prim.dtype == ncclFloat8e4m3 || prim.dtype == ncclFloat8e5m2) {
    return Misuse(ncclInvalidArgument, where + ": an element type the emulator does not model");
  }
  if ((prim.kind == Prim::kAllReduce || prim.kind == Prim::kReduceScatter) &&
      (prim.op < ncclSum || prim.op > ncclMin)) {
    return Misuse(ncclInvalidArgument, where + ": a reduction the emulator does not model");
  }
  if ((prim.kind == Prim::kSend || prim.kind == Prim::kRecv) &&
      (prim.peer < 0 || prim.peer >= state->nranks)) {
    return Misuse(ncclInvalidArgument, where + ": peer " + std::to_string(prim.peer) + " of " +
                                           std::to_string(state->nranks) + " ranks");
  }
  Call call{std::move(prim), send, recv, stream};
  g_group.push_back({state, call});
  if (g_group_depth > 0) return ncclSuccess;  // [group]
  return Flush();
}

}  // namespace
}  // namespace xsim

using xsim::Model;
using xsim::Prim;
using xsim::Reg;

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) {
  std::lock_guard<std::mutex> lock(Model::Get().mu());
  thread_local std::string copy;
  copy = Reg().last_error;
  return copy.c_str();
}

// [id] A new hub, listening for the ranks of other processes.
ncclResult_t ncclGetUniqueId(ncclUniqueId* out) {
  if (out == nullptr) return ncclInvalidArgument;
  std::lock_guard<std::mutex> lock(Model::Get().mu());
  xsim::UniqueId id{};
  std::memcpy(id.magic, xsim::kMagic, sizeof(id.magic));
  id.pid = static_cast<uint32_t>(getpid());
  id.serial = ++Reg().serial;
  std::string name = xsim::HubName(id);
  auto hub = std::make_unique<xsim::Hub>(name);
  xsim::Hub* raw = hub.get();
  Reg().hubs[id.serial] = std::move(hub);
  bool listening = xsim::Transport::Get().Listen(name, [raw](int fd) {
    xsim::Transport::Get().Watch(
        fd,
        [raw, fd](const xsim::Message& m) {
          auto to = [fd](const xsim::Message& reply) { xsim::Transport::Get().Send(fd, reply); };
          if (m.type == xsim::Message::kJoin) raw->Join(m, to);
          if (m.type == xsim::Message::kContribute) raw->Contribute(m);
          if (m.type == xsim::Message::kAbort) raw->Aborted(m.rank);
        },
        nullptr);
  });
  if (!listening) return xsim::Misuse(ncclSystemError, "ncclGetUniqueId: cannot listen on " + name);
  std::memset(out, 0, sizeof(*out));
  std::memcpy(out->internal, &id, sizeof(id));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config) {
  Model& model = Model::Get();
  std::unique_lock<std::mutex> lock(model.mu());
  if (comm == nullptr) return ncclInvalidArgument;
  xsim::UniqueId id;
  std::memcpy(&id, commId.internal, sizeof(id));
  if (std::memcmp(id.magic, xsim::kMagic, sizeof(id.magic)) != 0) {
    return xsim::Misuse(ncclInvalidArgument, "ncclCommInitRankConfig: not an id of ncclGetUniqueId");
  }
  if (config != nullptr && (config->size != sizeof(ncclConfig_t) || config->magic != NCCL_API_MAGIC)) {
    return xsim::Misuse(ncclInvalidArgument,
                        "ncclCommInitRankConfig: the config was not made by NCCL_CONFIG_INITIALIZER");
  }
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return xsim::Misuse(ncclInvalidArgument, "ncclCommInitRankConfig: rank " + std::to_string(rank) +
                                                 " of " + std::to_string(nranks));
  }
  auto state = std::make_shared<xsim::CommState>();
  state->id = xsim::HubName(id);
  state->nranks = nranks;
  state->rank = rank;
  state->device = Model::CurrentDevice();
  state->blocking = config == nullptr || config->blocking != 0;  // NCCL_CONFIG_UNDEF_INT: blocking
  state->init_polls = xsim::Setting("init_polls", 1);
  state->CheckThreads("ncclCommInitRankConfig");
  for (auto& weak : Reg().local[state->id]) {
    auto other = weak.lock();
    if (other && other->device == state->device && !other->aborted) {
      xsim::Misuse(ncclInvalidUsage, "ncclCommInitRankConfig: ranks " + std::to_string(other->rank) +
                                         " and " + std::to_string(rank) + " of " + state->id +
                                         " on one device " + std::to_string(state->device));
    }
  }
  Reg().local[state->id].push_back(state);
  std::weak_ptr<xsim::CommState> weak = state;
  xsim::Endpoint to_me = [weak](const xsim::Message& m) {
    if (auto s = weak.lock()) s->OnMessage(m);
  };
  auto local = id.pid == static_cast<uint32_t>(getpid()) ? Reg().hubs.find(id.serial) : Reg().hubs.end();
  if (local != Reg().hubs.end()) {
    xsim::Hub* hub = local->second.get();
    state->to_hub = [hub, to_me](const xsim::Message& m) {
      if (m.type == xsim::Message::kJoin) hub->Join(m, to_me);
      if (m.type == xsim::Message::kContribute) hub->Contribute(m);
      if (m.type == xsim::Message::kAbort) hub->Aborted(m.rank);
    };
  } else {
    int fd = xsim::Transport::Get().Connect(state->id);
    if (fd < 0) {
      state->async = ncclSystemError;
      return xsim::Misuse(ncclSystemError, "ncclCommInitRankConfig: no process keeps " + state->id);
    }
    xsim::Transport::Get().Watch(fd, to_me, [weak] {
      if (auto s = weak.lock()) s->async = ncclRemoteError;  // the hub's process is gone
    });
    state->to_hub = [fd](const xsim::Message& m) { xsim::Transport::Get().Send(fd, m); };
  }
  ncclComm* handle;
  if (!Reg().free_handles.empty()) {  // [abort]
    handle = Reg().free_handles.back();
    Reg().free_handles.pop_back();
  } else {
    handle = new ncclComm();
    Reg().handles.insert(handle);
  }
  handle->state = state;
  *comm = handle;
  xsim::Message join;
  join.type = xsim::Message::kJoin;
  join.nranks = nranks;
  join.rank = rank;
  state->to_hub(join);
  if (!state->blocking) return ncclInProgress;  // [nonblock]
  model.changed().wait(lock, [&] { return state->ready; });
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* result) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  ncclResult_t error;
  auto state = xsim::Live(comm, "ncclCommGetAsyncError", &error);
  if (state == nullptr) return error;
  state->CheckThreads("ncclCommGetAsyncError");
  if (result == nullptr) return ncclInvalidArgument;
  if (state->async != ncclSuccess) {
    *result = state->async;
  } else if (!state->ready) {
    *result = ncclInProgress;
  } else if (state->init_polls > 0) {
    --state->init_polls;
    *result = ncclInProgress;
  } else if (state->in_progress && --state->defer_polls > 0) {
    *result = ncclInProgress;
  } else {
    if (state->in_progress) {  // [nonblock] the deferred group reaches its streams now
      state->in_progress = false;
      std::vector<xsim::OpPtr> ops;
      ops.swap(state->deferred);
      xsim::IssueAll(ops);
    }
    *result = ncclSuccess;
  }
  return ncclSuccess;
}

// [abort]
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  ncclResult_t error;
  auto state = xsim::Live(comm, "ncclCommAbort", &error);
  if (state == nullptr) return error;
  state->CheckThreads("ncclCommAbort");
  state->aborted = true;
  state->deferred.clear();
  for (auto& [seq, op] : state->ops) {
    if (op->state == xsim::OpState::kRunning) {
      static_cast<xsim::GroupWork*>(op->collective.get())->Poison();
      model.Finish(op, op->begin_us);
    }
  }
  xsim::Message abort;
  abort.type = xsim::Message::kAbort;
  abort.rank = state->rank;
  state->to_hub(abort);
  comm->state = nullptr;
  Reg().free_handles.push_back(comm);
  model.Progress();
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++xsim::g_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (xsim::g_group_depth == 0) {
    std::lock_guard<std::mutex> lock(Model::Get().mu());
    return xsim::Misuse(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  }
  if (--xsim::g_group_depth > 0) return ncclSuccess;
  std::lock_guard<std::mutex> lock(Model::Get().mu());
  return xsim::Flush();
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  Prim p{Prim::kAllReduce, datatype, op, static_cast<int64_t>(count), -1, {}};
  return xsim::AddCall(comm, "ncclAllReduce", p, sendbuff, recvbuff, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  Prim p{Prim::kAllGather, datatype, 0, static_cast<int64_t>(sendcount), -1, {}};
  return xsim::AddCall(comm, "ncclAllGather", p, sendbuff, recvbuff, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  Prim p{Prim::kReduceScatter, datatype, op, static_cast<int64_t>(recvcount), -1, {}};
  return xsim::AddCall(comm, "ncclReduceScatter", p, sendbuff, recvbuff, stream);
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  Prim p{Prim::kSend, datatype, 0, static_cast<int64_t>(count), peer, {}};
  return xsim::AddCall(comm, "ncclSend", p, sendbuff, nullptr, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  Prim p{Prim::kRecv, datatype, 0, static_cast<int64_t>(count), peer, {}};
  return xsim::AddCall(comm, "ncclRecv", p, nullptr, recvbuff, stream);
}

}  // extern "C"

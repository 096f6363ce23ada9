// The emulated GPU: devices, streams, events, the work queued on them, and the
// checks that run as work is issued. Shared by the two stand-in libraries:
// libcudart (cudart.cc, which also holds this model, model.cc) and libnccl
// (nccl.cc, which queues its collectives here).
//
// Device memory is host memory: a device pointer is an address in this process.
// Nothing runs on a clock of its own: work executes when the host issues it or
// when a peer's collective arrives, in an order drawn from a seeded generator
// among the work that may run (model.cc, Model::Progress), and times are virtual
// (a DAG of durations), so cudaEventElapsedTime is repeatable.
//
// Every rule cites the document it models; docs/runtimes.md ("The emulated CUDA
// runtime") lists them with what the model cannot see.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace xsim {

// A vector clock: one counter per actor (a stream or a host thread).
class Clock {
 public:
  uint64_t Get(int actor) const { return actor < static_cast<int>(c_.size()) ? c_[actor] : 0; }
  void Tick(int actor) {
    Grow(actor);
    ++c_[actor];
  }
  void Join(const Clock& o) {
    if (o.c_.size() > c_.size()) c_.resize(o.c_.size(), 0);
    for (size_t i = 0; i < o.c_.size(); ++i) c_[i] = std::max(c_[i], o.c_[i]);
  }

 private:
  void Grow(int actor) {
    if (actor >= static_cast<int>(c_.size())) c_.resize(actor + 1, 0);
  }
  std::vector<uint64_t> c_;
};

// One access of device memory, [begin, end).
struct Access {
  int device;
  uintptr_t begin, end;
  bool write;
};

// Who did something, when: an actor at a point of its clock, with a description.
struct Epoch {
  int actor = -1;
  uint64_t clock = 0;
  std::string what;
};

enum class OpKind { kKernel, kCopy, kWait, kCollective };
enum class OpState { kQueued, kRunning, kDone };

struct Stream;
struct Record;
struct Collective;

// One unit of work on a stream.
struct Op {
  uint64_t serial = 0;
  OpKind kind = OpKind::kKernel;
  Stream* stream = nullptr;
  OpState state = OpState::kQueued;
  std::string what;                        // for reports: the harness label and the call
  std::vector<Access> accesses;            // checked at issue (CheckAccesses)
  std::function<void()> effect;            // what it does to memory, run when it executes
  std::shared_ptr<Record> waits_on;        // kWait: the record it waits for
  std::shared_ptr<Collective> collective;  // kCollective: the NCCL group this rank runs
  double duration_us = 0;
  double begin_us = 0, end_us = 0;  // virtual times, set when it runs and ends
  bool aborted = false;
};
using OpPtr = std::shared_ptr<Op>;

// What cudaEventRecord captured: the last work on the stream and its clock.
struct Record {
  OpPtr op;  // null: nothing pending when recorded (complete at once)
  Clock clock;
  double time_us = 0;  // the stream's virtual time when nothing was pending
  int device = 0;
};

struct Stream {
  int actor = -1;  // its clock's index
  int device = 0;
  int queue = 0;  // hardware queue (CUDA_DEVICE_MAX_CONNECTIONS)
  int priority = 0;
  std::string label;
  Clock clock;
  std::deque<OpPtr> pending;  // issued and not done, in order
  OpPtr last;                 // the last op issued
  double time_us = 0;         // virtual end of the last op done
};

// The NCCL side of a collective op: implemented in nccl.cc.
struct Collective {
  virtual ~Collective() = default;
  virtual void Run(const OpPtr& op) = 0;  // it started running on this rank
  virtual std::string Peers(const OpPtr& op) const = 0;  // who it waits for, for reports
  // The local ops of the other ranks it waits for (none known: empty).
  virtual std::vector<OpPtr> Waiting(const OpPtr& op) const = 0;
};

struct Report {
  std::string kind;  // race | deadlock | misuse | mismatch
  std::string message;
};

struct Event {
  int device = 0;
  unsigned flags = 0;
  std::shared_ptr<Record> last;  // null: never recorded
};

// The one model of this process's devices. Callers hold mu() for every member
// but Get, CurrentDevice and Label (which are per host thread).
}  // namespace xsim

struct CUstream_st;
struct CUevent_st;

namespace xsim {

class Model {
 public:
  static Model& Get();

  std::mutex& mu() { return mu_; }

  // Configuration (xsim_configure); CUDA_DEVICE_MAX_CONNECTIONS is read at start.
  int devices() const { return devices_; }
  bool Configure(const std::string& key, const std::string& value);
  int Setting(const std::string& key) const;  // -1 if not set
  void Set(const std::string& key, int value) { settings_[key] = value; }

  // Per host thread: the current device, and the label its next ops carry.
  static int& CurrentDevice();
  static std::string& Label();

  // Streams and events, which are the handles the CUDA API returns (locked).
  CUstream_st* NewStream(int device, int priority, const std::string& label);
  bool IsStream(const void* s) const { return stream_set_.count(s) > 0; }
  CUevent_st* NewEvent(int device, unsigned flags);
  bool IsEvent(const void* e) const { return event_set_.count(e) > 0; }

  // Issues `op` on its stream from this host thread (locked by the caller).
  void Issue(const OpPtr& op);
  // cudaEventRecord / cudaStreamWaitEvent (locked by the caller).
  void RecordEvent(Event* e, Stream* s);
  void WaitEvent(Stream* s, Event* e);
  // A host access (the harness's reads and writes of device memory).
  void HostAccess(const Access& a, const std::string& what);
  // The host waits for a stream (takes and releases the lock).
  // False if `timeout_ms` (>= 0) passed first.
  bool HostWaitStream(std::unique_lock<std::mutex>& lock, Stream* s, int64_t timeout_ms = -1);
  bool RecordDone(const std::shared_ptr<Record>& r) const;
  double RecordTime(const std::shared_ptr<Record>& r) const;
  void HostJoin(const Clock& c);
  Clock StreamClock(Stream* s) const { return s->clock; }

  // Runs what may run; called after every change (locked by the caller).
  void Progress();
  // A running collective finished (nccl.cc), or was aborted.
  void Finish(const OpPtr& op, double end_us);

  void AddReport(const std::string& kind, const std::string& message);
  std::vector<Report> Reports();
  void ClearReports();
  std::string OpLog();  // JSON: every collective op run: device, stream, queue, label
  std::condition_variable& changed() { return changed_; }
  std::mt19937_64& rng() { return rng_; }
  uint64_t NextSerial() { return ++serial_; }
  int HostActor();

 private:
  Model();
  bool CanRun(const OpPtr& op) const;
  void Start(const OpPtr& op);
  void Complete(const OpPtr& op, double end_us);
  void CheckAccesses(const OpPtr& op, const Clock& clock, int actor);
  void CheckAccess(const Access& a, const Epoch& who, const Clock& clock);
  void FindDeadlock();
  std::string Describe(const OpPtr& op) const;

  std::mutex mu_;
  std::condition_variable changed_;
  int devices_ = 8;
  int connections_ = 8;
  int residency_ = 0;  // 0: unbounded
  std::map<std::string, int> settings_;
  std::mt19937_64 rng_{0};
  uint64_t serial_ = 0;
  int actors_ = 0;
  std::vector<std::unique_ptr<CUstream_st>> streams_;
  std::set<const void*> stream_set_;
  std::vector<std::unique_ptr<CUevent_st>> events_;
  std::set<const void*> event_set_;
  std::map<int, Clock> host_clocks_;
  // Per device and hardware queue: ops issued and not yet started, in issue order.
  std::map<std::pair<int, int>, std::deque<OpPtr>> queues_;
  std::vector<int> running_collectives_;
  // Shadow memory per device: cell start -> (end, last write, reads since).
  struct Cell {
    uintptr_t end;
    Epoch write;
    std::vector<Epoch> reads;
  };
  std::vector<std::map<uintptr_t, Cell>> shadow_;
  std::vector<Report> reports_;
  std::set<std::string> reported_;
  std::vector<std::string> op_log_;
  bool stuck_checked_ = false;
};

}  // namespace xsim

// The CUDA handles (cudaStream_t is CUstream_st*, cudaEvent_t CUevent_st*) are the
// model's own objects.
struct CUstream_st : xsim::Stream {};
struct CUevent_st : xsim::Event {};

// The emulated GPU's model (model.h): how issued work runs, and the race and
// deadlock checks. The rules and their sources:
//
// [streams]  Work on one stream runs in issue order, each op after the previous
//            one completed, asynchronously to the host (CUDA Programming Guide,
//            "Streams"; Runtime API, "Stream synchronization behavior").
// [record]   cudaEventRecord captures the work issued to the stream so far; the
//            event completes when that work has (Runtime API, cudaEventRecord).
// [wait]     cudaStreamWaitEvent makes later work on the stream wait for the
//            event's most recent record as of the call; an event never recorded
//            is no wait; recording it again later changes nothing for this wait
//            (Runtime API, cudaStreamWaitEvent).
// [queues]   A device feeds its streams to CUDA_DEVICE_MAX_CONNECTIONS hardware
//            queues (default 8), and an op that cannot start at the head of a queue
//            holds back the ops behind it, whatever their stream (CUDA Programming
//            Guide, "Environment Variables"); which queue a stream gets no document
//            says, and the driver may make fewer than asked: a draw from the seed.
// [resident] A collective kernel occupies SMs while it waits for its peers; the
//            `residency` setting bounds how many may wait at once on a device
//            (0: no bound). NCCL's kernels spin until every rank's kernel runs
//            (NCCL docs, "Using multiple NCCL communicators concurrently").
// [hb]       Two accesses of the same bytes conflict unless one happens before
//            the other: in issue order on one stream or host thread, or ordered
//            by an event record and wait, or a host synchronize, as the vector
//            clocks of PyTorch's CUDA stream sanitizer (torch/cuda/_sanitizer.py)
//            compute them at issue time: a race is found whether or not this run's
//            interleaving hit it.
#include "model.h"

#include "json.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <sstream>

namespace xsim {
namespace {

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  long n = std::strtol(v, &end, 10);
  return *end == '\0' ? static_cast<int>(n) : fallback;
}

std::string Hex(uintptr_t p) {
  std::ostringstream os;
  os << "0x" << std::hex << p;
  return os.str();
}


}  // namespace

Model& Model::Get() {
  static Model* model = new Model();
  return *model;
}

Model::Model() {
  // [queues] CUDA reads the variable when it creates a context; 1..32.
  connections_ = std::clamp(EnvInt("CUDA_DEVICE_MAX_CONNECTIONS", 8), 1, 32);
  devices_ = EnvInt("XSIM_DEVICES", 8);
  rng_.seed(static_cast<uint64_t>(EnvInt("XSIM_SEED", 0)));
  running_collectives_.assign(devices_, 0);
  shadow_.resize(devices_);
}

bool Model::Configure(const std::string& key, const std::string& value) {
  char* end = nullptr;
  long n = std::strtol(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || n < 0) return false;
  if (key == "devices") {
    if (!streams_.empty() || n < 1) return false;  // before any stream exists
    devices_ = static_cast<int>(n);
      running_collectives_.assign(devices_, 0);
    shadow_.assign(devices_, {});
  } else if (key == "connections") {
    if (!streams_.empty() || n < 1 || n > 32) return false;
    connections_ = static_cast<int>(n);
  } else if (key == "residency") {
    residency_ = static_cast<int>(n);
  } else if (key == "seed") {
    rng_.seed(static_cast<uint64_t>(n));
  }
  settings_[key] = static_cast<int>(n);
  return true;
}

int Model::Setting(const std::string& key) const {
  auto it = settings_.find(key);
  return it == settings_.end() ? -1 : it->second;
}

int& Model::CurrentDevice() {
  thread_local int device = 0;  // Runtime API: the current device is per host thread, 0 at first
  return device;
}

std::string& Model::Label() {
  thread_local std::string label;
  return label;
}

int Model::HostActor() {
  thread_local int actor = -1;
  if (actor < 0) {
    actor = actors_++;
    host_clocks_[actor];
  }
  return actor;
}

CUstream_st* Model::NewStream(int device, int priority, const std::string& label) {
  auto stream = std::make_unique<CUstream_st>();
  stream->actor = actors_++;
  stream->device = device;
  stream->queue = static_cast<int>(rng_() % connections_);
  stream->priority = priority;
  stream->label = label.empty() ? "stream " + std::to_string(stream->actor) : label;
  CUstream_st* raw = stream.get();
  stream_set_.insert(raw);
  streams_.push_back(std::move(stream));
  return raw;
}

CUevent_st* Model::NewEvent(int device, unsigned flags) {
  auto event = std::make_unique<CUevent_st>();
  event->device = device;
  event->flags = flags;
  CUevent_st* raw = event.get();
  event_set_.insert(raw);
  events_.push_back(std::move(event));
  return raw;
}

void Model::Issue(const OpPtr& op) {
  Stream* s = op->stream;
  op->serial = NextSerial();
  s->clock.Join(host_clocks_[HostActor()]);  // [hb] host order before the op
  s->clock.Tick(s->actor);
  CheckAccesses(op, s->clock, s->actor);
  s->pending.push_back(op);
  s->last = op;
  queues_[{s->device, s->queue}].push_back(op);
  stuck_checked_ = false;
  Progress();
}

void Model::RecordEvent(Event* e, Stream* s) {
  s->clock.Join(host_clocks_[HostActor()]);
  auto record = std::make_shared<Record>();
  record->op = s->pending.empty() ? nullptr : s->pending.back();  // [record]
  record->clock = s->clock;
  record->time_us = s->time_us;
  record->device = s->device;
  e->last = record;
}

void Model::WaitEvent(Stream* s, Event* e) {
  if (e->last == nullptr) return;  // [wait] never recorded: no wait
  auto op = std::make_shared<Op>();
  op->kind = OpKind::kWait;
  op->stream = s;
  op->waits_on = e->last;  // [wait] the record as of this call
  op->what = Label() + (Label().empty() ? "" : ": ") + "cudaStreamWaitEvent";
  s->clock.Join(e->last->clock);
  Issue(op);
}

void Model::HostAccess(const Access& a, const std::string& what) {
  int actor = HostActor();
  Clock& clock = host_clocks_[actor];
  clock.Tick(actor);
  CheckAccess(a, Epoch{actor, clock.Get(actor), "host " + what}, clock);
}

bool Model::RecordDone(const std::shared_ptr<Record>& r) const {
  return r == nullptr || r->op == nullptr || r->op->state == OpState::kDone;
}

double Model::RecordTime(const std::shared_ptr<Record>& r) const {
  if (r == nullptr) return 0;
  return r->op != nullptr ? r->op->end_us : r->time_us;
}

void Model::HostJoin(const Clock& c) { host_clocks_[HostActor()].Join(c); }

bool Model::HostWaitStream(std::unique_lock<std::mutex>& lock, Stream* s, int64_t timeout_ms) {
  OpPtr last = s->pending.empty() ? nullptr : s->pending.back();
  Clock clock = s->clock;
  auto done = [&] { return last == nullptr || last->state == OpState::kDone; };
  if (timeout_ms < 0) {
    changed_.wait(lock, done);
  } else if (!changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), done)) {
    return false;
  }
  HostJoin(clock);
  return true;
}

bool Model::CanRun(const OpPtr& op) const {
  Stream* s = op->stream;
  if (s->pending.front() != op) return false;  // [streams]
  if (op->kind == OpKind::kWait) return RecordDone(op->waits_on);
  if (op->kind == OpKind::kCollective && residency_ > 0) {
    return running_collectives_[s->device] < residency_;  // [resident]
  }
  return true;
}

void Model::Progress() {
  for (;;) {
    std::vector<std::deque<OpPtr>*> ready;
    for (auto& [key, queue] : queues_) {
      if (!queue.empty() && CanRun(queue.front())) ready.push_back(&queue);
    }
    if (ready.empty()) break;
    std::deque<OpPtr>* queue = ready[rng_() % ready.size()];
    OpPtr op = queue->front();
    queue->pop_front();
    Start(op);
  }
  if (!stuck_checked_) {
    stuck_checked_ = true;
    FindDeadlock();
  }
}

void Model::Start(const OpPtr& op) {
  Stream* s = op->stream;
  op->begin_us = s->time_us;
  if (op->kind == OpKind::kWait) op->begin_us = std::max(op->begin_us, RecordTime(op->waits_on));
  if (op->kind != OpKind::kCollective) {
    if (op->effect) op->effect();
    Complete(op, op->begin_us + op->duration_us);
    return;
  }
  op->state = OpState::kRunning;
  ++running_collectives_[s->device];
  std::ostringstream log;
  log << "{\"device\":" << s->device << ",\"stream\":" << s->actor
      << ",\"stream_label\":" << JsonString(s->label) << ",\"queue\":" << s->queue
      << ",\"what\":" << JsonString(op->what) << "}";
  op_log_.push_back(log.str());
  op->collective->Run(op);
}

void Model::Finish(const OpPtr& op, double end_us) {
  --running_collectives_[op->stream->device];
  Complete(op, end_us);
}

void Model::Complete(const OpPtr& op, double end_us) {
  Stream* s = op->stream;
  op->state = OpState::kDone;
  op->end_us = end_us;
  s->time_us = std::max(s->time_us, end_us);
  // Only the stream's first pending op runs, so the one done is the first.
  if (!s->pending.empty() && s->pending.front() == op) s->pending.pop_front();
  stuck_checked_ = false;
  changed_.notify_all();
}

// ---------------------------------------------------------------------------
// [hb] Races.

void Model::CheckAccesses(const OpPtr& op, const Clock& clock, int actor) {
  if (op->accesses.empty()) return;
  Epoch who{actor, clock.Get(actor), Describe(op)};
  for (const Access& a : op->accesses) CheckAccess(a, who, clock);
}

void Model::CheckAccess(const Access& a, const Epoch& who, const Clock& clock) {
  if (a.begin >= a.end || a.device < 0 || a.device >= devices_) return;
  auto& cells = shadow_[a.device];
  // Cells that cover [begin, end) exactly: split at both ends, fill the gaps.
  auto split = [&](uintptr_t at) {
    auto it = cells.upper_bound(at);
    if (it == cells.begin()) return;
    --it;
    if (it->first < at && at < it->second.end) {
      Cell tail = it->second;
      it->second.end = at;
      cells.emplace(at, std::move(tail));
    }
  };
  split(a.begin);
  split(a.end);
  for (uintptr_t at = a.begin; at < a.end;) {
    auto it = cells.find(at);
    if (it == cells.end()) {
      auto next = cells.upper_bound(at);
      uintptr_t end = next == cells.end() ? a.end : std::min(a.end, next->first);
      it = cells.emplace(at, Cell{end, Epoch{}, {}}).first;
    }
    Cell& cell = it->second;
    auto ordered = [&](const Epoch& e) {
      return e.actor < 0 || e.actor == who.actor || e.clock <= clock.Get(e.actor);
    };
    auto race = [&](const Epoch& earlier, const char* how) {
      std::string key = earlier.what + "|" + who.what;
      if (!reported_.insert("race|" + key).second) return;
      std::ostringstream os;
      os << "device " << a.device << ", bytes [" << Hex(at) << ", " << Hex(cell.end) << "): "
         << who.what << (a.write ? " writes" : " reads") << " what " << earlier.what << " "
         << how << ", and nothing orders the two (no event record and wait, no host "
         << "synchronize between them)";
      reports_.push_back({"race", os.str()});
    };
    if (!ordered(cell.write)) race(cell.write, "wrote");
    if (a.write) {
      for (const Epoch& r : cell.reads) {
        if (!ordered(r)) race(r, "reads");
      }
      cell.write = who;
      cell.reads.clear();
    } else {
      // The latest read of an actor stands for its earlier ones.
      auto same = std::find_if(cell.reads.begin(), cell.reads.end(),
                               [&](const Epoch& r) { return r.actor == who.actor; });
      if (same != cell.reads.end()) {
        *same = who;
      } else {
        cell.reads.push_back(who);
      }
    }
    at = cell.end;
  }
}

// ---------------------------------------------------------------------------
// Deadlocks: a cycle in the graph of what waits for what. Nothing issued later
// can break one (work never leaves a queue out of order), so it is reported when
// it forms, before any timeout.

void Model::FindDeadlock() {
  std::map<Op*, std::vector<OpPtr>> waits;
  auto blocked_by = [&](const OpPtr& op) -> std::vector<OpPtr> {
    if (op->state == OpState::kRunning) return op->collective->Waiting(op);
    Stream* s = op->stream;
    if (s->pending.front() != op) return {s->pending.front()};  // [streams]
    if (op->kind == OpKind::kWait && !RecordDone(op->waits_on)) return {op->waits_on->op};
    if (op->kind == OpKind::kCollective && residency_ > 0) {  // [resident]
      std::vector<OpPtr> holders;
      for (auto& stream : streams_) {
        if (stream->device != s->device || stream->pending.empty()) continue;
        if (stream->pending.front()->state == OpState::kRunning) {
          holders.push_back(stream->pending.front());
        }
      }
      return holders;
    }
    return {};
  };
  std::vector<OpPtr> nodes;
  for (auto& [key, queue] : queues_) {
    for (size_t i = 0; i < queue.size(); ++i) {
      nodes.push_back(queue[i]);
      // [queues] behind the head of its hardware queue
      waits[queue[i].get()] = i == 0 ? blocked_by(queue[i]) : std::vector<OpPtr>{queue[0]};
    }
  }
  for (auto& stream : streams_) {
    if (!stream->pending.empty() && stream->pending.front()->state == OpState::kRunning) {
      nodes.push_back(stream->pending.front());
      waits[stream->pending.front().get()] = blocked_by(stream->pending.front());
    }
  }
  std::map<Op*, int> color;  // 0 new, 1 on the path, 2 done
  std::vector<OpPtr> path;
  std::function<bool(const OpPtr&)> visit = [&](const OpPtr& op) -> bool {
    color[op.get()] = 1;
    path.push_back(op);
    for (const OpPtr& next : waits[op.get()]) {
      if (next == nullptr || next->state == OpState::kDone) continue;
      if (color[next.get()] == 1) {
        auto from = std::find(path.begin(), path.end(), next);
        std::vector<OpPtr> cycle(from, path.end());
        std::vector<uint64_t> ids;
        for (const OpPtr& o : cycle) ids.push_back(o->serial);
        std::sort(ids.begin(), ids.end());
        std::ostringstream key;
        for (uint64_t id : ids) key << id << ",";
        if (reported_.insert("deadlock|" + key.str()).second) {
          std::ostringstream os;
          os << "a cycle of " << cycle.size() << " ops, none of which can ever run: ";
          for (size_t i = 0; i < cycle.size(); ++i) {
            os << (i ? " waits for " : "") << Describe(cycle[i]);
          }
          os << " waits for the first";
          reports_.push_back({"deadlock", os.str()});
        }
        return true;
      }
      if (color[next.get()] == 0 && visit(next)) return true;
    }
    color[op.get()] = 2;
    path.pop_back();
    return false;
  };
  for (const OpPtr& op : nodes) {
    if (color[op.get()] == 0) {
      path.clear();
      // A path that reached a cycle is done: left on the path, a later search
      // would take its ops for a cycle of its own.
      if (visit(op)) {
        for (const OpPtr& on_path : path) color[on_path.get()] = 2;
      }
    }
  }
}

std::string Model::Describe(const OpPtr& op) const {
  std::ostringstream os;
  os << "[" << op->what << " on device " << op->stream->device << ", " << op->stream->label
     << ", queue " << op->stream->queue;
  if (op->collective) os << ", " << op->collective->Peers(op);
  os << "]";
  return os.str();
}

void Model::AddReport(const std::string& kind, const std::string& message) {
  if (reported_.insert(kind + "|" + message).second) reports_.push_back({kind, message});
}

std::vector<Report> Model::Reports() { return reports_; }

void Model::ClearReports() {
  reports_.clear();
  reported_.clear();
}

std::string Model::OpLog() {
  std::string out = "[";
  for (size_t i = 0; i < op_log_.size(); ++i) out += (i ? "," : "") + op_log_[i];
  return out + "]";
}

}  // namespace xsim

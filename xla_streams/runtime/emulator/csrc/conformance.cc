// xsim-conformance: rules the emulator's stand-ins model (cudart.cc, nccl.cc,
// model.cc), as expectations that run against whichever libcudart and libnccl
// this program is linked with: the stand-ins (make test:
// tests/runtime/emulated/test_conformance.py) or the real ones on a GPU
// (tools/gpu_check.py, check `conformance`). The same expectations on both, so
// that the model itself is checked the day a GPU is lent.
//
// Compiled against the real cuda_runtime_api.h and nccl.h. It calls only the
// functions the stand-ins export (those the CUDA backend imports); device memory
// is allocated and copied through cudaMalloc and cudaMemcpy looked up at run time
// where the runtime has them (the real one), else malloc and memcpy (the
// stand-ins' devices are host memory).
//
// Prints one JSON line, {"devices": N, "checks": [{"name", "passed", "detail",
// "cites"}, ...]} ("passed": null for an expectation skipped: the two-device ones
// with one device); exits 0 when none failed, 1 otherwise.
//
// Sources: "RT" is the CUDA Runtime API reference, 12.9 (the Doxygen text of
// nvidia-cuda-runtime-cu12==12.9.79's cuda_runtime_api.h, by line); "NCCL" is the
// NCCL User Guide (docs.nvidia.com/deeplearning/nccl/user-guide/docs/, the
// sources' docs/userguide/source/<path>.rst, by line).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "json.h"

namespace {

constexpr double kPatienceS = 10.0;  // how long a poll waits for what must happen
constexpr double kQuietS = 0.5;      // how long to leave what must not happen to happen
constexpr size_t kCount = 4096;      // floats per buffer

const char* const kQueryNever =
    "RT cudaEventRecord, l.3526-3528: \"Before the first call to cudaEventRecord(), an event "
    "represents an empty set of work, so for example cudaEventQuery() would return cudaSuccess.\"";
const char* const kWaitNever =
    "RT cudaEventRecord, l.3526-3528 (a never-recorded event is an empty set of work) and "
    "cudaStreamWaitEvent, l.2821-2822: \"Makes all future work submitted to stream wait for all "
    "work captured in event.\"";
const char* const kElapsedNever =
    "RT cudaEventElapsedTime, l.3709-3710: \"If cudaEventRecord() has not been called on either "
    "event, then cudaErrorInvalidResourceHandle is returned.\"";
const char* const kElapsedUntimed =
    "RT cudaEventElapsedTime, l.3713-3715: \"If either event was created with the "
    "cudaEventDisableTiming flag, then this function will return "
    "cudaErrorInvalidResourceHandle.\"";
const char* const kElapsedDone =
    "RT cudaEventElapsedTime, l.3709-3715: its errors are for events not recorded, not "
    "complete (cudaErrorNotReady) or without timing; two recorded, complete, timed events "
    "give the time between them";
const char* const kVersion =
    "NCCL api/comms.rst, ncclGetVersion: the version code of the library, "
    "major * 10000 + minor * 100 + patch since 2.9 (nccl.h NCCL_VERSION)";
const char* const kInit =
    "NCCL usage/communicators.rst l.57-73: with config.blocking = 0 \"NCCL [...] never "
    "block[s] in any NCCL call\"; ncclCommInitRankConfig may return ncclInProgress and the "
    "communicator is ready once ncclCommGetAsyncError polls ncclSuccess";
const char* const kGroupEnd =
    "NCCL usage/groups.rst l.178-183: \"If ncclGroupEnd() returns ncclSuccess, it means NCCL "
    "kernels have been issued to streams; if it returns ncclInProgress, it means NCCL kernels "
    "are being issued to streams in the background. It is users' responsibility to make sure "
    "the state of the communicator changes into ncclSuccess before calling related CUDA "
    "calls\"; api/comms.rst l.228-231";
const char* const kAbort =
    "NCCL api/comms.rst l.215-217: ncclCommAbort \"frees resources that are allocated to a "
    "communicator object comm and aborts any uncompleted operations before destroying the "
    "communicator\"";
const char* const kBusy =
    "NCCL usage/streams.rst l.6: \"The NCCL call returns when the operation has been "
    "effectively enqueued to the given stream [...] then executed asynchronously on the CUDA "
    "device\"; RT cudaEventQuery l.3608-3609: \"cudaErrorNotReady if any captured work is "
    "incomplete\". That the collective cannot complete before its peer calls is the "
    "emulator's model assumption ([stream] in nccl.cc): no NCCL text states it";
const char* const kWaitRecord =
    "RT cudaEventRecord, l.3521-3525: \"cudaEventRecord() can be called multiple times on the "
    "same event and will overwrite the previously captured state. Other APIs such as "
    "cudaStreamWaitEvent() use the most recently captured state at the time of the API call, "
    "and are not affected by later calls to cudaEventRecord().\"";
const char* const kPeer =
    "NCCL usage/collectives.rst l.5: \"Collective operations have to be called for each rank "
    "[...] using the same count and the same datatype\"; the sum of both ranks' buffers";

struct Check {
  std::string name;
  int passed;  // 1, 0, or -1: skipped
  std::string detail;
  std::string cites;
};
std::vector<Check> g_checks;

void Report(const std::string& name, const char* cites, bool passed, const std::string& detail) {
  g_checks.push_back({name, passed ? 1 : 0, detail, cites});
}

void Skip(const std::string& name, const char* cites, const std::string& why) {
  g_checks.push_back({name, -1, why, cites});
}

// A call the expectations need on the way, which failed: the rest of the group
// cannot run, and the group's expectation fails saying why.
struct SetupError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string Name(cudaError_t e) { return cudaGetErrorName(e); }

std::string Name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    default: return "ncclResult_t " + std::to_string(static_cast<int>(r));
  }
}

void Need(cudaError_t e, const std::string& call) {
  if (e != cudaSuccess) throw SetupError(call + " returned " + Name(e));
}

// ncclInProgress is no failure on a non-blocking communicator.
void Need(ncclResult_t r, const std::string& call) {
  if (r != ncclSuccess && r != ncclInProgress) throw SetupError(call + " returned " + Name(r));
}

bool Started(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

double Now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string Seconds(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", s);
  return text;
}

void Sleep(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// The event's state once it is no longer cudaErrorNotReady, or after `seconds`.
cudaError_t Settle(cudaEvent_t event, double seconds = kPatienceS) {
  double deadline = Now() + seconds;
  for (;;) {
    cudaError_t e = cudaEventQuery(event);
    if (e != cudaErrorNotReady || Now() > deadline) return e;
    Sleep(0.001);
  }
}

// The communicator's state (ncclCommGetAsyncError) once it is no longer
// ncclInProgress, or after `seconds`; what the call returned if it failed.
ncclResult_t Settle(ncclComm_t comm, double seconds = kPatienceS) {
  double deadline = Now() + seconds;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress || Now() > deadline) return state;
    Sleep(0.001);
  }
}

template <typename F>
F Lookup(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

// Device memory of the current device: the real runtime's, looked up (the
// stand-ins do not export these: the backend never calls them), else host memory.
class Memory {
  // The C API's signatures (cuda_runtime.h overloads cudaMalloc for C++).
  using MallocFn = cudaError_t (*)(void**, size_t);
  using MemcpyFn = cudaError_t (*)(void*, const void*, size_t, cudaMemcpyKind);
  using SynchronizeFn = cudaError_t (*)();

 public:
  Memory()
      : malloc_(Lookup<MallocFn>("cudaMalloc")),
        memcpy_(Lookup<MemcpyFn>("cudaMemcpy")),
        synchronize_(Lookup<SynchronizeFn>("cudaDeviceSynchronize")) {}

  bool real() const { return malloc_ != nullptr && memcpy_ != nullptr && synchronize_ != nullptr; }

  float* Floats(size_t count) {
    void* p = nullptr;
    if (!real()) {
      p = std::calloc(count, sizeof(float));
      if (p == nullptr) throw SetupError("malloc failed");
    } else {
      Need(malloc_(&p, count * sizeof(float)), "cudaMalloc");
    }
    return static_cast<float*>(p);
  }

  void Put(float* device, const std::vector<float>& host) {
    if (!real()) {
      std::memcpy(device, host.data(), host.size() * sizeof(float));
      return;
    }
    Need(memcpy_(device, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
         "cudaMemcpy to the device");
    // RT, "API synchronization behavior": a copy from pageable memory may return
    // before its DMA has ended, and our streams do not synchronize with it.
    Need(synchronize_(), "cudaDeviceSynchronize");
  }

  std::vector<float> Get(const float* device, size_t count) {
    std::vector<float> host(count);
    if (!real()) {
      std::memcpy(host.data(), device, count * sizeof(float));
    } else {
      Need(memcpy_(host.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost),
           "cudaMemcpy to the host");
    }
    return host;
  }

 private:
  MallocFn malloc_;
  MemcpyFn memcpy_;
  SynchronizeFn synchronize_;
};

cudaStream_t NewStream(int device) {
  Need(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  cudaStream_t stream = nullptr;
  Need(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, 0),
       "cudaStreamCreateWithPriority");
  return stream;
}

cudaEvent_t NewEvent(int device, unsigned flags = cudaEventDefault) {
  Need(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  cudaEvent_t event = nullptr;
  Need(cudaEventCreateWithFlags(&event, flags), "cudaEventCreateWithFlags");
  return event;
}

// Devices: cudaGetDeviceCount where the runtime has it (the stand-ins do not
// export it), else the devices cudaSetDevice accepts.
int CountDevices() {
  int count = 0;
  if (auto get = Lookup<cudaError_t (*)(int*)>("cudaGetDeviceCount")) {
    if (get(&count) != cudaSuccess) count = 0;
  } else {
    while (count < 1024 && cudaSetDevice(count) == cudaSuccess) ++count;
  }
  cudaSetDevice(0);
  return count;
}

std::vector<float> Values(int seed) {
  std::vector<float> v(kCount);
  for (size_t i = 0; i < kCount; ++i) v[i] = static_cast<float>((i * (2 * seed + 1)) % 97) - 48;
  return v;
}

// "exact", or where the first element differs.
std::string Compare(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) {
      return "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
             std::to_string(want[i]);
    }
  }
  return "exact";
}

// ---------------------------------------------------------------------------
// One device: events.

void Events() {
  cudaStream_t stream = NewStream(0);
  cudaEvent_t never = NewEvent(0), before = NewEvent(0), after = NewEvent(0);
  cudaEvent_t untimed = NewEvent(0, cudaEventDisableTiming);

  cudaError_t query = cudaEventQuery(never);
  Report("cudaEventQuery of a never-recorded event is cudaSuccess", kQueryNever,
         query == cudaSuccess, "returned " + Name(query));

  Need(cudaEventRecord(before, stream), "cudaEventRecord");
  Need(cudaStreamWaitEvent(stream, never, 0), "cudaStreamWaitEvent");
  Need(cudaEventRecord(after, stream), "cudaEventRecord");
  Need(cudaEventRecord(untimed, stream), "cudaEventRecord");
  cudaError_t behind = Settle(after);
  Report("cudaStreamWaitEvent on a never-recorded event is no wait", kWaitNever,
         behind == cudaSuccess,
         "an event recorded after the wait: " + Name(behind) + " within " + Seconds(kPatienceS));
  Need(Settle(untimed), "cudaEventQuery of an event on an idle stream");

  float ms = -1;
  cudaError_t elapsed = cudaEventElapsedTime(&ms, never, after);
  Report("cudaEventElapsedTime with a never-recorded event is cudaErrorInvalidResourceHandle",
         kElapsedNever, elapsed == cudaErrorInvalidResourceHandle, "returned " + Name(elapsed));
  elapsed = cudaEventElapsedTime(&ms, before, untimed);
  Report(
      "cudaEventElapsedTime with a cudaEventDisableTiming event is cudaErrorInvalidResourceHandle",
      kElapsedUntimed, elapsed == cudaErrorInvalidResourceHandle, "returned " + Name(elapsed));
  ms = -1;
  elapsed = cudaEventElapsedTime(&ms, before, after);
  Report("cudaEventElapsedTime of two recorded, complete events is cudaSuccess", kElapsedDone,
         elapsed == cudaSuccess && ms >= 0,
         "returned " + Name(elapsed) + ", " + std::to_string(ms) + " ms between them");
}

// ---------------------------------------------------------------------------
// One device: NCCL.

// A non-blocking communicator of `nranks` for rank `rank` on device `rank`;
// what ncclCommInitRankConfig returned.
ncclResult_t InitNonBlocking(ncclComm_t* comm, int nranks, const ncclUniqueId& id, int rank) {
  Need(cudaSetDevice(rank), "cudaSetDevice(" + std::to_string(rank) + ")");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return ncclCommInitRankConfig(comm, nranks, id, rank, &config);
}

void OneRank(Memory& memory) {
  int version = 0;
  ncclResult_t got = ncclGetVersion(&version);
  Report("ncclGetVersion gives a version of the header's major version", kVersion,
         got == ncclSuccess && version / 10000 == NCCL_MAJOR,
         "returned " + Name(got) + ", version " + std::to_string(version) + " (header: " +
             std::to_string(NCCL_VERSION_CODE) + ")");

  ncclUniqueId id;
  Need(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclComm_t comm = nullptr;
  ncclResult_t init = InitNonBlocking(&comm, 1, id, 0);
  ncclResult_t state = Started(init) ? Settle(comm) : init;
  Report("a non-blocking ncclCommInitRankConfig returns ncclInProgress or ncclSuccess, then "
         "ncclCommGetAsyncError reaches ncclSuccess",
         kInit, Started(init) && state == ncclSuccess,
         "returned " + Name(init) + ", then the state " + Name(state));
  if (state != ncclSuccess) throw SetupError("the one-rank communicator is not ready");

  cudaStream_t stream = NewStream(0);
  float* send = memory.Floats(kCount);
  float* recv = memory.Floats(kCount);
  std::vector<float> values = Values(1);
  memory.Put(send, values);
  Need(ncclGroupStart(), "ncclGroupStart");
  ncclResult_t call = ncclAllReduce(send, recv, kCount, ncclFloat32, ncclSum, comm, stream);
  ncclResult_t end = ncclGroupEnd();
  state = Settle(comm);
  cudaEvent_t done = NewEvent(0);
  Need(cudaEventRecord(done, stream), "cudaEventRecord");
  cudaError_t finished = Settle(done);
  std::string result = finished == cudaSuccess ? Compare(memory.Get(recv, kCount), values)
                                               : "not read: the collective did not finish";
  Report("a one-rank ncclAllReduce on a non-blocking communicator: ncclGroupEnd returns "
         "ncclInProgress or ncclSuccess, the state is polled to ncclSuccess, the result is exact",
         kGroupEnd,
         call == ncclSuccess && Started(end) && state == ncclSuccess && result == "exact",
         "ncclAllReduce " + Name(call) + ", ncclGroupEnd " + Name(end) + ", then the state " +
             Name(state) + "; an event recorded after it: " + Name(finished) + "; result " +
             result);

  ncclResult_t abort = ncclCommAbort(comm);
  Report("ncclCommAbort of an idle communicator returns ncclSuccess", kAbort,
         abort == ncclSuccess, "returned " + Name(abort));
}

// ---------------------------------------------------------------------------
// Two devices: a collective that waits for its peer blocks its stream.

const char* const kTwoRanks[] = {
    "a collective whose peer has not called keeps its stream busy: an event recorded after "
    "it is cudaErrorNotReady",
    "cudaStreamWaitEvent waits for the record current at the call: the event recorded again "
    "on an idle stream does not release the wait",
    "once the peer calls, the collective completes on both ranks with exact results, and "
    "the wait behind it is released",
};

void TwoRanks(Memory& memory, int devices) {
  const char* cites[] = {kBusy, kWaitRecord, kPeer};
  if (devices < 2) {
    for (int i = 0; i < 3; ++i) {
      Skip(kTwoRanks[i], cites[i], "skipped: " + std::to_string(devices) + " device(s), needs 2");
    }
    return;
  }
  ncclUniqueId id;
  Need(ncclGetUniqueId(&id), "ncclGetUniqueId");
  ncclComm_t comms[2] = {nullptr, nullptr};
  for (int rank = 0; rank < 2; ++rank) {
    Need(InitNonBlocking(&comms[rank], 2, id, rank), "ncclCommInitRankConfig");
  }
  for (int rank = 0; rank < 2; ++rank) {
    ncclResult_t state = Settle(comms[rank]);
    if (state != ncclSuccess) {
      throw SetupError("the two-rank communicator's rank " + std::to_string(rank) + " is " +
                       Name(state));
    }
  }
  cudaStream_t streams[2] = {NewStream(0), NewStream(1)};
  cudaStream_t waiting = NewStream(0), idle = NewStream(0);
  float *send[2], *recv[2];
  for (int rank = 0; rank < 2; ++rank) {
    Need(cudaSetDevice(rank), "cudaSetDevice");
    send[rank] = memory.Floats(kCount);
    recv[rank] = memory.Floats(kCount);
  }
  // Both ranks set `seed`'s values; what their sum must be.
  auto fill = [&](int seed) {
    std::vector<float> sum(kCount, 0.0f);
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<float> values = Values(seed + rank);
      for (size_t i = 0; i < kCount; ++i) sum[i] += values[i];
      Need(cudaSetDevice(rank), "cudaSetDevice");
      memory.Put(send[rank], values);
    }
    return sum;
  };
  auto all_reduce = [&](int rank) {
    Need(cudaSetDevice(rank), "cudaSetDevice");
    return ncclAllReduce(send[rank], recv[rank], kCount, ncclFloat32, ncclSum, comms[rank],
                         streams[rank]);
  };
  auto finish = [&](int rank) {
    cudaEvent_t done = NewEvent(rank);
    Need(cudaEventRecord(done, streams[rank]), "cudaEventRecord");
    return Settle(done);
  };

  // First both ranks at once (one thread, two devices: a group): NCCL connects a
  // communicator's peers at its first collective (NCCL_RUNTIME_CONNECT, default
  // 1), a host-side wait for the peer that must not happen in the test below.
  std::vector<float> sum = fill(1);
  Need(ncclGroupStart(), "ncclGroupStart");
  Need(all_reduce(0), "ncclAllReduce (rank 0)");
  Need(all_reduce(1), "ncclAllReduce (rank 1)");
  Need(ncclGroupEnd(), "ncclGroupEnd");
  for (int rank = 0; rank < 2; ++rank) Need(Settle(comms[rank]), "ncclCommGetAsyncError");
  for (int rank = 0; rank < 2; ++rank) {
    Need(finish(rank), "the first two-rank all-reduce: cudaEventQuery");
    std::string result = Compare(memory.Get(recv[rank], kCount), sum);
    if (result != "exact") throw SetupError("the first two-rank all-reduce: " + result);
  }

  sum = fill(5);
  ncclResult_t call0 = all_reduce(0);
  ncclResult_t state0 = Settle(comms[0]);
  cudaEvent_t first = NewEvent(0);
  Need(cudaEventRecord(first, streams[0]), "cudaEventRecord");
  Sleep(kQuietS);
  cudaError_t busy = cudaEventQuery(first);
  Report(kTwoRanks[0], kBusy,
         Started(call0) && state0 == ncclSuccess && busy == cudaErrorNotReady,
         "rank 0 alone: ncclAllReduce " + Name(call0) + ", then the state " + Name(state0) +
             "; an event recorded after it, queried " + Seconds(kQuietS) + " later: " +
             Name(busy));

  Need(cudaStreamWaitEvent(waiting, first, 0), "cudaStreamWaitEvent");
  Need(cudaEventRecord(first, idle), "cudaEventRecord (again, on an idle stream)");
  cudaEvent_t behind = NewEvent(0);
  Need(cudaEventRecord(behind, waiting), "cudaEventRecord");
  cudaError_t again = Settle(first);
  Sleep(kQuietS);
  cudaError_t held = cudaEventQuery(behind);
  Report(kTwoRanks[1], kWaitRecord, again == cudaSuccess && held == cudaErrorNotReady,
         "the event recorded again on an idle stream: " + Name(again) +
             "; an event recorded after the wait on another stream: " + Name(held));

  ncclResult_t call1 = all_reduce(1);
  ncclResult_t state1 = Settle(comms[1]);
  cudaError_t done[2] = {finish(0), finish(1)};
  cudaError_t released = Settle(behind);
  std::string results;
  for (int rank = 0; rank < 2; ++rank) {
    std::string result = done[rank] == cudaSuccess
                             ? Compare(memory.Get(recv[rank], kCount), sum)
                             : "not read (" + Name(done[rank]) + ")";
    results += (rank ? ", rank 1 " : "rank 0 ") + result;
  }
  Report(kTwoRanks[2], kPeer,
         Started(call1) && state1 == ncclSuccess && released == cudaSuccess &&
             results == "rank 0 exact, rank 1 exact",
         "rank 1: ncclAllReduce " + Name(call1) + ", then the state " + Name(state1) + "; " +
             results + "; the event behind the wait: " + Name(released));
  // The communicators stay: aborting one rank of a clique this process holds both
  // ranks of may wait for the other, and the process exits next (main).
}

// ---------------------------------------------------------------------------

// Runs a group of expectations; a failed call on its way fails it, named `group`.
void Run(const char* group, const std::function<void()>& body) {
  try {
    body();
  } catch (const SetupError& e) {
    g_checks.push_back({group, 0, std::string("could not run: ") + e.what(), ""});
  }
}

// The stand-ins' own findings (xsim.h), where they are the runtime.
void EmulatorReports() {
  auto reports = Lookup<size_t (*)(char*, size_t)>("xsim_reports");
  if (reports == nullptr) return;
  std::string text(reports(nullptr, 0) + 1, '\0');
  reports(text.data(), text.size());
  text.resize(text.size() - 1);
  Report("the emulator saw no misuse, race or deadlock", "xsim.h, xsim_reports", text == "[]",
         text);
}


}  // namespace

int main() {
  Memory memory;
  int devices = CountDevices();
  Run("events on one device", Events);
  Run("NCCL on one device", [&] { OneRank(memory); });
  Run("a collective waiting for its peer", [&] { TwoRanks(memory, devices); });
  EmulatorReports();
  bool failed = false;
  std::string out = "{\"devices\":" + std::to_string(devices) + ",\"checks\":[";
  for (size_t i = 0; i < g_checks.size(); ++i) {
    const Check& c = g_checks[i];
    failed = failed || c.passed == 0;
    out += (i ? "," : "") + std::string("{\"name\":") + xsim::JsonString(c.name) + ",\"passed\":" +
           (c.passed < 0 ? "null" : c.passed ? "true" : "false") + ",\"detail\":" +
           xsim::JsonString(c.detail) + ",\"cites\":" + xsim::JsonString(c.cites) + "}";
  }
  std::printf("%s]}\n", out.c_str());
  std::fflush(stdout);
  // Without tearing down what is still live (a collective whose peer never called
  // keeps its kernel waiting), which could wait for ever.
  std::_Exit(failed ? 1 : 0);
}

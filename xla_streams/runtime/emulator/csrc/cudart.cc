// The stand-in libcudart: the CUDA runtime functions xla_streams' CUDA backend
// calls, over the emulated devices of model.h, and the emulator's control API
// (xsim.h). Compiled against the real cuda_runtime_api.h, so every signature is
// the real one; linked with a version script giving the real soname and symbol
// version (libcudart.so.12 or .13), so the backend binds to it unchanged.
//
// Rules (each function names the CUDA Runtime API reference entry it models):
// [device]  the current device is per host thread, 0 until cudaSetDevice; streams
//           and events belong to the device current when they are created.
// [sticky]  after a sticky error (xsim_inject "sticky"), every call on that
//           device returns it (Runtime API, "Error Handling": sticky errors leave
//           the context unusable).
#include <cuda_runtime_api.h>

#include <cstring>
#include <sstream>

#include "json.h"
#include "model.h"
#include "xsim.h"

using xsim::Access;
using xsim::Model;
using xsim::Op;
using xsim::OpKind;

namespace {

std::set<int>& Sticky() {
  static std::set<int>* sticky = new std::set<int>();
  return *sticky;
}

// Reports a misuse and returns `error`.
cudaError_t Misuse(cudaError_t error, const std::string& what) {
  Model::Get().AddReport("misuse", what);
  return error;
}

bool Valid(const void* stream) { return Model::Get().IsStream(stream); }

std::string Label(const char* call) {
  const std::string& label = Model::Label();
  return label.empty() ? call : label + ": " + call;
}

cudaError_t Enqueue(cudaStream_t stream, const char* call, std::vector<Access> accesses,
                    double duration_us, std::function<void()> effect) {
  auto op = std::make_shared<Op>();
  op->kind = OpKind::kCopy;
  op->stream = stream;
  op->what = Label(call);
  op->accesses = std::move(accesses);
  op->duration_us = duration_us;
  op->effect = std::move(effect);
  Model::Get().Issue(op);
  return cudaSuccess;
}

// A copy's virtual duration: HBM at about 3 TB/s, 2 us to launch.
double CopyUs(size_t bytes) { return 2.0 + static_cast<double>(bytes) / 3.0e6; }

}  // namespace

extern "C" {

// cudaGetDevice, cudaSetDevice [device]
cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return cudaErrorInvalidValue;
  *device = Model::CurrentDevice();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  std::lock_guard<std::mutex> lock(Model::Get().mu());
  if (device < 0 || device >= Model::Get().devices()) return cudaErrorInvalidDevice;
  Model::CurrentDevice() = device;
  return cudaSuccess;
}

// cudaDeviceGetStreamPriorityRange: lower numbers are higher priorities; an H100
// reports least 0, greatest -5.
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return cudaSuccess;
}

// cudaStreamCreateWithPriority: a new stream on the current device [device];
// cudaStreamNonBlocking: no implicit synchronisation with the legacy stream,
// which the backend never uses (the model has none).
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int flags, int priority) {
  std::lock_guard<std::mutex> lock(Model::Get().mu());
  int device = Model::CurrentDevice();
  if (Sticky().count(device)) return cudaErrorLaunchFailure;
  if (stream == nullptr) return cudaErrorInvalidValue;
  if (flags != cudaStreamNonBlocking) {
    return Misuse(cudaErrorInvalidValue,
                  "cudaStreamCreateWithPriority: a blocking stream synchronises with the legacy "
                  "default stream, which the emulator does not model");
  }
  // "Priorities outside the range are clamped to the range": Runtime API.
  priority = std::clamp(priority, -5, 0);
  *stream = Model::Get().NewStream(device, priority, "");
  return cudaSuccess;
}

// cudaEventCreate, cudaEventCreateWithFlags: an event on the current device.
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  std::lock_guard<std::mutex> lock(Model::Get().mu());
  int device = Model::CurrentDevice();
  if (Sticky().count(device)) return cudaErrorLaunchFailure;
  if (event == nullptr) return cudaErrorInvalidValue;
  if ((flags & ~(cudaEventDisableTiming | cudaEventBlockingSync)) != 0) {
    return Misuse(cudaErrorInvalidValue, "cudaEventCreateWithFlags: unmodelled flags");
  }
  *event = Model::Get().NewEvent(device, flags);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

// cudaEventRecord: captures the work issued to `stream` so far [record]. The
// stream and the event must belong to the same device.
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  if (!model.IsEvent(event)) return Misuse(cudaErrorInvalidResourceHandle, "cudaEventRecord: not an event");
  if (!Valid(stream)) {
    return Misuse(cudaErrorInvalidResourceHandle,
                  "cudaEventRecord: not a stream of this process (the legacy default stream is "
                  "not modelled)");
  }
  if (Sticky().count(stream->device)) return cudaErrorLaunchFailure;
  if (event->device != stream->device) {
    return Misuse(cudaErrorInvalidResourceHandle,
                  Label("cudaEventRecord") + ": event of device " + std::to_string(event->device) +
                      " recorded on a stream of device " + std::to_string(stream->device));
  }
  model.RecordEvent(event, stream);
  return cudaSuccess;
}

// cudaStreamWaitEvent: later work on `stream` waits for the event's latest
// record as of this call [wait]. Flags: cudaEventWaitDefault only.
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  if (!model.IsEvent(event)) return Misuse(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: not an event");
  if (!Valid(stream)) return Misuse(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: not a stream");
  if (Sticky().count(stream->device)) return cudaErrorLaunchFailure;
  if (flags != 0) return Misuse(cudaErrorInvalidValue, "cudaStreamWaitEvent: flags must be 0");
  std::string label = Model::Label();
  Model::Label() = Label("cudaStreamWaitEvent");
  model.WaitEvent(stream, event);
  Model::Label() = label;
  return cudaSuccess;
}

// cudaEventQuery: cudaSuccess once the captured work is done, or when the event
// was never recorded; else cudaErrorNotReady.
cudaError_t cudaEventQuery(cudaEvent_t event) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  if (!model.IsEvent(event)) return Misuse(cudaErrorInvalidResourceHandle, "cudaEventQuery: not an event");
  if (Sticky().count(event->device)) return cudaErrorLaunchFailure;
  if (!model.RecordDone(event->last)) return cudaErrorNotReady;
  if (event->last != nullptr) model.HostJoin(event->last->clock);  // [hb] the host saw it done
  return cudaSuccess;
}

// cudaEventElapsedTime: both events recorded, complete, on one device and with
// timing; else cudaErrorInvalidResourceHandle (not recorded, timing disabled) or
// cudaErrorNotReady (not complete). Times are the model's virtual ones.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  if (ms == nullptr) return cudaErrorInvalidValue;
  if (!model.IsEvent(start) || !model.IsEvent(end)) return cudaErrorInvalidResourceHandle;
  if ((start->flags | end->flags) & cudaEventDisableTiming) return cudaErrorInvalidResourceHandle;
  if (start->last == nullptr || end->last == nullptr) return cudaErrorInvalidResourceHandle;
  if (start->device != end->device) return cudaErrorInvalidResourceHandle;
  if (!model.RecordDone(start->last) || !model.RecordDone(end->last)) return cudaErrorNotReady;
  *ms = static_cast<float>((model.RecordTime(end->last) - model.RecordTime(start->last)) / 1000.0);
  return cudaSuccess;
}

// cudaMemcpyAsync (device to device): reads src and writes dst in stream order.
// Overlapping ranges are undefined behaviour.
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  if (!Valid(stream)) return Misuse(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: not a stream");
  if (Sticky().count(stream->device)) return cudaErrorLaunchFailure;
  if (kind != cudaMemcpyDeviceToDevice) {
    return Misuse(cudaErrorInvalidValue, "cudaMemcpyAsync: only device-to-device copies are modelled");
  }
  auto d = reinterpret_cast<uintptr_t>(dst), s = reinterpret_cast<uintptr_t>(src);
  if (count > 0 && d < s + count && s < d + count) {
    return Misuse(cudaErrorInvalidValue, Label("cudaMemcpyAsync") + ": source and destination overlap");
  }
  int device = stream->device;
  return Enqueue(stream, "cudaMemcpyAsync",
                 {{device, s, s + count, false}, {device, d, d + count, true}}, CopyUs(count),
                 [dst, src, count] { std::memcpy(dst, src, count); });
}

// cudaMemsetAsync: writes `count` bytes of `value` in stream order.
cudaError_t cudaMemsetAsync(void* ptr, int value, size_t count, cudaStream_t stream) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  if (!Valid(stream)) return Misuse(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: not a stream");
  if (Sticky().count(stream->device)) return cudaErrorLaunchFailure;
  auto p = reinterpret_cast<uintptr_t>(ptr);
  return Enqueue(stream, "cudaMemsetAsync", {{stream->device, p, p + count, true}}, CopyUs(count),
                 [ptr, value, count] { std::memset(ptr, value, count); });
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    default: return "unknown error";
  }
}

// ---------------------------------------------------------------------------
// The control API (xsim.h).

int xsim_configure(const char* key, const char* value) {
  if (key == nullptr || value == nullptr) return -1;
  static const std::set<std::string> known = {"devices",    "connections", "residency",
                                              "seed",       "defer_polls", "init_polls"};
  if (!known.count(key)) return -1;
  std::lock_guard<std::mutex> lock(Model::Get().mu());
  return Model::Get().Configure(key, value) ? 0 : -1;
}

void* xsim_stream_create(int device, const char* label) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  if (device < 0 || device >= model.devices()) return nullptr;
  return model.NewStream(device, 0, label ? label : "");
}

int xsim_kernel(void* stream, const char* what, const xsim_access* accesses, int count,
                double duration_us, void (*run)(void*), void* arg) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  if (!Valid(stream)) return -1;
  auto* s = static_cast<cudaStream_t>(stream);
  std::vector<Access> list;
  for (int i = 0; i < count; ++i) {
    auto b = reinterpret_cast<uintptr_t>(accesses[i].begin);
    list.push_back({accesses[i].device, b, b + accesses[i].bytes, accesses[i].write != 0});
  }
  auto op = std::make_shared<Op>();
  op->kind = OpKind::kKernel;
  op->stream = s;
  op->what = what ? what : "kernel";
  op->accesses = std::move(list);
  op->duration_us = duration_us;
  if (run != nullptr) op->effect = [run, arg] { run(arg); };
  model.Issue(op);
  return 0;
}

int xsim_host_access(const xsim_access* access, const char* what) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  auto b = reinterpret_cast<uintptr_t>(access->begin);
  model.HostAccess({access->device, b, b + access->bytes, access->write != 0}, what ? what : "");
  return 0;
}

int xsim_stream_wait(void* stream, int64_t timeout_ms) {
  Model& model = Model::Get();
  std::unique_lock<std::mutex> lock(model.mu());
  if (!Valid(stream)) return -1;
  return model.HostWaitStream(lock, static_cast<cudaStream_t>(stream), timeout_ms) ? 0 : 1;
}

void xsim_set_label(const char* label) { Model::Label() = label ? label : ""; }

int xsim_inject(const char* what, int device) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  if (what == nullptr || device < 0 || device >= model.devices()) return -1;
  if (std::strcmp(what, "sticky") == 0) {
    Sticky().insert(device);
    model.changed().notify_all();
    return 0;
  }
  if (std::strcmp(what, "nccl") == 0) {
    model.Set("nccl_fault_device", device);
    return 0;
  }
  return -1;
}

static size_t CopyOut(const std::string& text, char* buffer, size_t capacity) {
  if (buffer != nullptr && capacity > 0) {
    size_t n = std::min(capacity - 1, text.size());
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return text.size();
}

size_t xsim_reports(char* buffer, size_t capacity) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  std::ostringstream os;
  os << "[";
  bool first = true;
  for (const xsim::Report& r : model.Reports()) {
    os << (first ? "" : ",") << "{\"kind\":\"" << r.kind
       << "\",\"message\":" << xsim::JsonString(r.message) << "}";
    first = false;
  }
  os << "]";
  return CopyOut(os.str(), buffer, capacity);
}

int xsim_deadlocks(void) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  int n = 0;
  for (const xsim::Report& r : model.Reports()) n += r.kind == "deadlock";
  return n;
}

void xsim_clear_reports(void) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  model.ClearReports();
}

size_t xsim_op_log(char* buffer, size_t capacity) {
  Model& model = Model::Get();
  std::lock_guard<std::mutex> lock(model.mu());
  return CopyOut(model.OpLog(), buffer, capacity);
}

}  // extern "C"

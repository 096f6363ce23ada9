// The forwarding handlers: XLA:CPU calls the CUDA backend's handlers, unchanged,
// on the emulated devices. XLA:CPU has no GPU stream to give a handler
// (Ctx<PlatformStream<cudaStream_t>> fails there), so these plain XLA FFI
// handlers, registered for platform "cpu" as the backend's targets, pass the
// backend a copy of the call frame whose API gives an emulated compute stream per
// device in XLA_FFI_Stream_Get; the buffers, the attributes, the run id, the
// device ordinal and the errors all go through XLA's own API.
//
// They also give XLA:CPU what XLA:GPU gives the backend: one host thread per
// device, making its calls in schedule order. XLA:CPU runs a device's
// independent calls in any order, on a shared pool, while XLA:GPU runs them in
// schedule order, the same on every device, and the backend relies on that (a
// start may wait on the host for its peers to create a communicator). So a call
// returns an XLA FFI future at once and goes to its device's thread, which makes
// the starts in the order of their computation's schedule (xsim_forward_order,
// from the lowered module) and completes the future.
//
// XLA:CPU computes on the host between the calls, so the host plays the compute
// stream's consumers: it reads a done's results after the call, once the emulated
// compute stream has run what the done made it wait for (its producers wrote a
// start's operands before the call, on the host, which needs no check). That wait never blocks for ever: while it
// lasts, the backend's per-device error (xs_cuda_device_error) is polled, and an
// error fails the call, as the step on a CPU device must (docs/runtimes.md).
#include <dlfcn.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "context.h"
#include "xla/ffi/api/c_api.h"
#include "xsim.h"

namespace {

using xsim::Context;

XLA_FFI_Handler* g_start = nullptr;
XLA_FFI_Handler* g_done = nullptr;
size_t (*g_device_error)(int, char*, size_t) = nullptr;
const XLA_FFI_Api* g_api = nullptr;  // XLA's
XLA_FFI_Api g_forward_api;           // XLA's, but reading the forwarded calls' Contexts

// XLA:CPU's device ordinal -> the emulated device (a job's CPU devices are
// numbered by their global ids, 2048 onward in its second process); the
// identity where none is set.
struct Ordinals {
  std::mutex mu;
  std::map<int, int> local;
};
// Never destroyed, as every table here: the device threads use them until the
// process ends, after static destructors ran.
Ordinals& XlaOrdinals() {
  static auto* ordinals = new Ordinals();
  return *ordinals;
}

// Asks XLA's API `get` about `ctx` (XLA_FFI_DeviceOrdinal_Get, XLA_FFI_RunId_Get);
// false, the error dropped, if it fails.
template <typename Args>
bool Ask(XLA_FFI_Error* (*get)(Args*), XLA_FFI_InvokeContext* ctx, Args* args) {
  args->struct_size = sizeof(Args);
  args->extension_start = nullptr;
  args->ctx = ctx;
  XLA_FFI_Error* e = get(args);
  if (e == nullptr) return true;
  XLA_FFI_Error_Destroy_Args destroy{XLA_FFI_Error_Destroy_Args_STRUCT_SIZE, nullptr, e};
  g_api->XLA_FFI_Error_Destroy(&destroy);
  return false;
}

int Ordinal(XLA_FFI_InvokeContext* ctx) {
  XLA_FFI_DeviceOrdinal_Get_Args args{};
  if (!Ask(g_api->XLA_FFI_DeviceOrdinal_Get, ctx, &args)) return -1;
  Ordinals& ordinals = XlaOrdinals();
  std::lock_guard<std::mutex> lock(ordinals.mu);
  auto it = ordinals.local.find(args.device_ordinal);
  return it == ordinals.local.end() ? args.device_ordinal : it->second;
}

int64_t RunId(XLA_FFI_InvokeContext* ctx) {
  XLA_FFI_RunId_Get_Args args{};
  return Ask(g_api->XLA_FFI_RunId_Get, ctx, &args) ? args.run_id : 0;
}

XLA_FFI_Error* ApiError(const std::string& message) {
  XLA_FFI_Error_Create_Args args{XLA_FFI_Error_Create_Args_STRUCT_SIZE, nullptr, message.c_str(),
                                 XLA_FFI_Error_Code_INTERNAL};
  return g_api->XLA_FFI_Error_Create(&args);
}

// The host reads or writes every buffer of `buffers`.
void HostAccess(int ordinal, int64_t size, void** buffers, int write, const char* what) {
  for (int64_t i = 0; i < size; ++i) {
    auto* b = static_cast<XLA_FFI_Buffer*>(buffers[i]);
    size_t width = 8;
    switch (b->dtype) {
      case XLA_FFI_DataType_PRED: case XLA_FFI_DataType_S8: case XLA_FFI_DataType_U8: width = 1; break;
      case XLA_FFI_DataType_S16: case XLA_FFI_DataType_U16: case XLA_FFI_DataType_F16:
      case XLA_FFI_DataType_BF16: width = 2; break;
      case XLA_FFI_DataType_S32: case XLA_FFI_DataType_U32: case XLA_FFI_DataType_F32: width = 4; break;
      default: break;
    }
    size_t bytes = width;
    for (int64_t d = 0; d < b->rank; ++d) bytes *= static_cast<size_t>(b->dims[d]);
    xsim_access access{ordinal, b->data, bytes, write};
    xsim_host_access(&access, what);
  }
}

// A start, by instruction name and op id.
using Start = std::pair<std::string, int64_t>;

Start Identify(const XLA_FFI_CallFrame* frame) {
  Start id{"", -1};
  for (int64_t i = 0; i < frame->attrs.size; ++i) {
    std::string_view name(frame->attrs.names[i]->ptr, frame->attrs.names[i]->len);
    if (name == "name") {
      auto* text = static_cast<XLA_FFI_ByteSpan*>(frame->attrs.attrs[i]);
      id.first.assign(text->ptr, text->len);
    } else if (name == "op_id") {
      id.second = *static_cast<int64_t*>(static_cast<XLA_FFI_Scalar*>(frame->attrs.attrs[i])->value);
    }
  }
  return id;
}

struct Schedule {
  std::mutex mu;
  std::map<Start, Start> before;  // a start -> the start before it in its computation
};
Schedule& Schedules() {
  static auto* schedule = new Schedule();
  return *schedule;
}

// A call frame owned by this library: XLA keeps the buffers alive until the
// call's future completes, not the frame that describes them.
class OwnedFrame {
 public:
  OwnedFrame(const XLA_FFI_CallFrame& frame, Context context) : context_(context) {
    frame_ = frame;
    frame_.ctx = reinterpret_cast<XLA_FFI_InvokeContext*>(&context_);
    frame_.future = nullptr;
    auto copy_buffers = [](int64_t n, void** from, std::vector<XLA_FFI_Buffer>& buffers,
                           std::vector<std::vector<int64_t>>& dims, std::vector<void*>& out) {
      for (int64_t i = 0; i < n; ++i) {
        auto* b = static_cast<XLA_FFI_Buffer*>(from[i]);
        buffers.push_back(*b);
        dims.emplace_back(b->dims, b->dims + b->rank);
      }
      for (size_t i = 0; i < buffers.size(); ++i) {
        buffers[i].dims = dims[i].data();
        out.push_back(&buffers[i]);
      }
    };
    copy_buffers(frame.args.size, frame.args.args, arg_buffers_, arg_dims_, args_);
    copy_buffers(frame.rets.size, frame.rets.rets, ret_buffers_, ret_dims_, rets_);
    arg_types_.assign(frame.args.types, frame.args.types + frame.args.size);
    ret_types_.assign(frame.rets.types, frame.rets.types + frame.rets.size);
    frame_.args.types = arg_types_.data();
    frame_.args.args = args_.data();
    frame_.rets.types = ret_types_.data();
    frame_.rets.rets = rets_.data();
    int64_t n = frame.attrs.size;
    names_.resize(n);
    texts_.resize(n);
    spans_.resize(n);
    scalars_.resize(n);
    arrays_.resize(n);
    integers_.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      names_[i].assign(frame.attrs.names[i]->ptr, frame.attrs.names[i]->len);
      attr_types_.push_back(frame.attrs.types[i]);
      void* value = frame.attrs.attrs[i];
      switch (frame.attrs.types[i]) {
        case XLA_FFI_AttrType_STRING: {
          auto* text = static_cast<XLA_FFI_ByteSpan*>(value);
          texts_[i].assign(text->ptr, text->len);
          spans_[i] = {texts_[i].data(), texts_[i].size()};
          attr_values_.push_back(&spans_[i]);
          break;
        }
        case XLA_FFI_AttrType_SCALAR: {  // the backend's attributes are i64
          auto* scalar = static_cast<XLA_FFI_Scalar*>(value);
          integers_[i].assign(1, *static_cast<int64_t*>(scalar->value));
          scalars_[i] = {scalar->dtype, integers_[i].data()};
          attr_values_.push_back(&scalars_[i]);
          break;
        }
        case XLA_FFI_AttrType_ARRAY: {
          auto* array = static_cast<XLA_FFI_Array*>(value);
          auto* data = static_cast<int64_t*>(array->data);
          integers_[i].assign(data, data + array->size);
          arrays_[i] = {array->dtype, array->size, integers_[i].data()};
          attr_values_.push_back(&arrays_[i]);
          break;
        }
        default:
          attr_values_.push_back(value);
      }
    }
    for (int64_t i = 0; i < n; ++i) name_spans_.push_back({names_[i].data(), names_[i].size()});
    for (auto& span : name_spans_) name_ptrs_.push_back(&span);
    frame_.attrs.types = attr_types_.data();
    frame_.attrs.names = name_ptrs_.data();
    frame_.attrs.attrs = attr_values_.data();
  }
  OwnedFrame(const OwnedFrame&) = delete;
  OwnedFrame& operator=(const OwnedFrame&) = delete;

  XLA_FFI_CallFrame* frame() { return &frame_; }
  const Context& context() const { return context_; }

 private:
  XLA_FFI_CallFrame frame_;
  Context context_;
  std::vector<XLA_FFI_Buffer> arg_buffers_, ret_buffers_;
  std::vector<std::vector<int64_t>> arg_dims_, ret_dims_;
  std::vector<void*> args_, rets_;
  std::vector<XLA_FFI_ArgType> arg_types_;
  std::vector<XLA_FFI_RetType> ret_types_;
  std::vector<std::string> names_, texts_;
  std::vector<XLA_FFI_ByteSpan> name_spans_, spans_;
  std::vector<XLA_FFI_ByteSpan*> name_ptrs_;
  std::vector<XLA_FFI_Scalar> scalars_;
  std::vector<XLA_FFI_Array> arrays_;
  std::vector<std::vector<int64_t>> integers_;
  std::vector<XLA_FFI_AttrType> attr_types_;
  std::vector<void*> attr_values_;
};

// One call waiting for its device's thread.
struct Call {
  std::shared_ptr<OwnedFrame> frame;
  bool start;
  Start id;
  XLA_FFI_Future* future;
  std::chrono::steady_clock::time_point queued;
};

// A device's host thread, as XLA:GPU has one per device.
class DeviceThread {
 public:
  explicit DeviceThread(int ordinal) : ordinal_(ordinal) {
    stream_ = xsim_stream_create(ordinal, ("compute " + std::to_string(ordinal)).c_str());
    std::thread([this] { Loop(); }).detach();
  }
  void* stream() const { return stream_; }

  void Add(Call call) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(call));
    wake_.notify_all();
  }

 private:
  // The next call to make: a done at once; a start once the start before it in
  // its computation's schedule has run more often in this run (or after 10 s: a
  // start under a conditional may never come).
  bool Next(Call* out) {
    auto now = std::chrono::steady_clock::now();
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      bool ready = !it->start || now - it->queued > std::chrono::seconds(10);
      if (!ready) {
        Schedule& schedule = Schedules();
        std::lock_guard<std::mutex> order(schedule.mu);
        auto before = schedule.before.find(it->id);
        auto& counts = runs_[it->frame->context().run];
        ready = before == schedule.before.end() || counts[before->second] > counts[it->id];
      }
      if (ready) {
        *out = std::move(*it);
        queue_.erase(it);
        return true;
      }
    }
    return false;
  }

  void Loop() {
    for (;;) {
      Call call;
      {
        std::unique_lock<std::mutex> lock(mu_);
        while (!Next(&call)) wake_.wait_for(lock, std::chrono::milliseconds(100));
        if (call.start) ++runs_[call.frame->context().run][call.id];
      }
      XLA_FFI_Error* error = Make(call);
      if (error != nullptr) {
        XLA_FFI_Future_SetError_Args args{XLA_FFI_Future_SetError_Args_STRUCT_SIZE, nullptr,
                                          call.future, error};
        g_api->XLA_FFI_Future_SetError(&args);
      } else {
        XLA_FFI_Future_SetAvailable_Args args{XLA_FFI_Future_SetAvailable_Args_STRUCT_SIZE,
                                              nullptr, call.future};
        g_api->XLA_FFI_Future_SetAvailable(&args);
      }
      std::lock_guard<std::mutex> lock(mu_);
      wake_.notify_all();  // a start may now be next
    }
  }

  XLA_FFI_Error* Make(Call& call) {
    XLA_FFI_CallFrame& frame = *call.frame->frame();
    xsim_set_label(call.id.first.c_str());
    frame.api = &g_forward_api;
    XLA_FFI_Error* error = (call.start ? g_start : g_done)(&frame);
    if (error != nullptr || call.start) return error;
    while (xsim_stream_wait(stream_, 20) == 1) {
      char message[4096];
      if (g_device_error != nullptr && g_device_error(ordinal_, message, sizeof(message)) > 0) {
        return ApiError(message);
      }
    }
    HostAccess(ordinal_, frame.rets.size, frame.rets.rets, 0, "XLA:CPU read a result");
    return nullptr;
  }

  int ordinal_;
  void* stream_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Call> queue_;
  std::map<int64_t, std::map<Start, int64_t>> runs_;  // per run: how often each start ran
};

DeviceThread* Device(int ordinal) {
  static auto* mu = new std::mutex();
  static auto* devices = new std::map<int, DeviceThread*>();
  std::lock_guard<std::mutex> lock(*mu);
  DeviceThread*& device = (*devices)[ordinal];
  if (device == nullptr) device = new DeviceThread(ordinal);
  return device;
}

XLA_FFI_Error* Forward(XLA_FFI_CallFrame* frame, bool start) {
  if (g_start == nullptr) return nullptr;  // registered before the backend: cannot happen
  // XLA asks a handler for its metadata (API version, traits): the backend's answers.
  if (frame->extension_start != nullptr) return (start ? g_start : g_done)(frame);
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return nullptr;
  static std::once_flag api_once;  // the API is XLA's, the same for every call
  std::call_once(api_once, [frame] {
    g_api = frame->api;
    g_forward_api = *frame->api;
    xsim::ReadContexts(&g_forward_api);
  });
  XLA_FFI_Future_Create_Args create{XLA_FFI_Future_Create_Args_STRUCT_SIZE, nullptr, nullptr};
  if (XLA_FFI_Error* e = g_api->XLA_FFI_Future_Create(&create)) return e;
  frame->future = create.future;
  DeviceThread* device = Device(Ordinal(frame->ctx));
  Context context{Ordinal(frame->ctx), RunId(frame->ctx), device->stream()};
  device->Add(Call{std::make_shared<OwnedFrame>(*frame, context), start, Identify(frame),
                   create.future, std::chrono::steady_clock::now()});
  return nullptr;
}

}  // namespace

extern "C" {

// The backend's handlers, and its per-device error (a function of the backend
// library, null if it has none).
void xsim_forward_set_backend(void* start, void* done, void* device_error) {
  g_start = reinterpret_cast<XLA_FFI_Handler*>(start);
  g_done = reinterpret_cast<XLA_FFI_Handler*>(done);
  g_device_error = reinterpret_cast<size_t (*)(int, char*, size_t)>(device_error);
}

// XLA's device ordinal `xla` is the emulated device `local`.
void xsim_forward_set_ordinal(int xla, int local) {
  Ordinals& ordinals = XlaOrdinals();
  std::lock_guard<std::mutex> lock(ordinals.mu);
  ordinals.local[xla] = local;
}

// In the schedule of one computation, the start (name, op_id) comes after the
// start (before_name, before_op_id).
void xsim_forward_order(const char* name, int64_t op_id, const char* before_name,
                        int64_t before_op_id) {
  Schedule& schedule = Schedules();
  std::lock_guard<std::mutex> lock(schedule.mu);
  schedule.before[{name, op_id}] = {before_name, before_op_id};
}

XLA_FFI_Error* xsim_forward_start(XLA_FFI_CallFrame* frame) { return Forward(frame, true); }
XLA_FFI_Error* xsim_forward_done(XLA_FFI_CallFrame* frame) { return Forward(frame, false); }

}  // extern "C"

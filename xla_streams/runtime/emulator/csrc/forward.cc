// The forwarding handlers: XLA:CPU calls the CUDA backend's handlers, unchanged,
// on the emulated devices. XLA:CPU has no GPU stream to give a handler
// (Ctx<PlatformStream<cudaStream_t>> fails there), so these plain XLA FFI
// handlers, registered for platform "cpu" as the backend's targets, copy the call
// frame with an API whose XLA_FFI_Stream_Get returns an emulated compute stream
// per device, and call the backend's handler; the buffers, the attributes, the
// run id, the device ordinal and the errors all go through XLA's own API.
//
// XLA:CPU computes on the host between the calls, so the host plays the compute
// stream's producers and consumers: it writes a start's operands before the call
// and reads a done's results after it, once the emulated compute stream has run
// what the done made it wait for. That wait never blocks for ever: while it
// lasts, the backend's per-device error (xs_cuda_device_error) is polled, and an
// error fails the call, as the step on a CPU device must (docs/runtimes.md).
#include <dlfcn.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "xla/ffi/api/c_api.h"
#include "xsim.h"

namespace {

XLA_FFI_Handler* g_start = nullptr;
XLA_FFI_Handler* g_done = nullptr;
size_t (*g_device_error)(int, char*, size_t) = nullptr;
const XLA_FFI_Api* g_api = nullptr;  // XLA's
XLA_FFI_Api g_forward_api;           // XLA's, but for Stream_Get
std::mutex g_mu;
std::map<int, void*> g_streams;

int Ordinal(XLA_FFI_InvokeContext* ctx) {
  XLA_FFI_DeviceOrdinal_Get_Args args{};
  args.struct_size = XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE;
  args.ctx = ctx;
  if (XLA_FFI_Error* e = g_api->XLA_FFI_DeviceOrdinal_Get(&args)) {
    XLA_FFI_Error_Destroy_Args destroy{XLA_FFI_Error_Destroy_Args_STRUCT_SIZE, nullptr, e};
    g_api->XLA_FFI_Error_Destroy(&destroy);
    return -1;
  }
  return args.device_ordinal;
}

void* ComputeStream(int ordinal) {
  std::lock_guard<std::mutex> lock(g_mu);
  void*& stream = g_streams[ordinal];
  if (stream == nullptr) stream = xsim_stream_create(ordinal, ("compute " + std::to_string(ordinal)).c_str());
  return stream;
}

XLA_FFI_Error* StreamGet(XLA_FFI_Stream_Get_Args* args) {
  args->stream = ComputeStream(Ordinal(args->ctx));
  return nullptr;
}

XLA_FFI_Error* Error(const std::string& message) {
  XLA_FFI_Error_Create_Args args{XLA_FFI_Error_Create_Args_STRUCT_SIZE, nullptr, message.c_str(),
                                 XLA_FFI_Error_Code_INTERNAL};
  return g_api->XLA_FFI_Error_Create(&args);
}

// The host reads or writes every buffer of `list`.
void HostAccess(int ordinal, int64_t size, void** buffers, int write, const char* what) {
  for (int64_t i = 0; i < size; ++i) {
    auto* b = static_cast<XLA_FFI_Buffer*>(buffers[i]);
    size_t width = 0;
    switch (b->dtype) {
      case XLA_FFI_DataType_PRED: case XLA_FFI_DataType_S8: case XLA_FFI_DataType_U8: width = 1; break;
      case XLA_FFI_DataType_S16: case XLA_FFI_DataType_U16: case XLA_FFI_DataType_F16:
      case XLA_FFI_DataType_BF16: width = 2; break;
      case XLA_FFI_DataType_S32: case XLA_FFI_DataType_U32: case XLA_FFI_DataType_F32: width = 4; break;
      default: width = 8; break;
    }
    size_t bytes = width;
    for (int64_t d = 0; d < b->rank; ++d) bytes *= static_cast<size_t>(b->dims[d]);
    xsim_access access{ordinal, b->data, bytes, write};
    xsim_host_access(&access, what);
  }
}

XLA_FFI_Error* Forward(XLA_FFI_CallFrame* frame, bool start) {
  if (g_start == nullptr) return nullptr;  // registered before the backend: cannot happen
  XLA_FFI_Handler* handler = start ? g_start : g_done;
  // XLA asks a handler for its metadata (API version, traits): the backend's answers.
  if (frame->extension_start != nullptr) return handler(frame);
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) return nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_api == nullptr) {
      g_api = frame->api;
      g_forward_api = *frame->api;
      g_forward_api.XLA_FFI_Stream_Get = StreamGet;
    }
  }
  int ordinal = Ordinal(frame->ctx);
  if (start) HostAccess(ordinal, frame->args.size, frame->args.args, 1, "XLA:CPU wrote an operand");
  XLA_FFI_CallFrame copy = *frame;
  copy.api = &g_forward_api;
  XLA_FFI_Error* error = handler(&copy);
  if (error != nullptr || start) return error;
  void* stream = ComputeStream(ordinal);
  while (xsim_stream_wait(stream, 20) == 1) {
    char message[4096];
    if (g_device_error != nullptr && g_device_error(ordinal, message, sizeof(message)) > 0) {
      return Error(message);
    }
  }
  HostAccess(ordinal, frame->rets.size, frame->rets.rets, 0, "XLA:CPU read a result");
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

XLA_FFI_Error* xsim_forward_start(XLA_FFI_CallFrame* frame) { return Forward(frame, true); }
XLA_FFI_Error* xsim_forward_done(XLA_FFI_CallFrame* frame) { return Forward(frame, false); }

}  // extern "C"

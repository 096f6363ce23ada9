// What a harness gives the backend's Ctx<PlatformStream>, Ctx<RunId> and
// Ctx<DeviceOrdinal> bindings: its XLA_FFI_InvokeContext is a Context, and these
// are the XLA C API's functions that read it (xsim-replay's API, and the
// forwarding handlers' copy of XLA:CPU's).
#pragma once

#include <cstdint>

#include "xla/ffi/api/c_api.h"

namespace xsim {

struct Context {
  int device;
  int64_t run;
  void* stream;  // the device's compute stream
};

inline Context* Of(XLA_FFI_InvokeContext* ctx) { return reinterpret_cast<Context*>(ctx); }

inline XLA_FFI_Error* StreamGet(XLA_FFI_Stream_Get_Args* args) {
  args->stream = Of(args->ctx)->stream;
  return nullptr;
}
inline XLA_FFI_Error* RunIdGet(XLA_FFI_RunId_Get_Args* args) {
  args->run_id = Of(args->ctx)->run;
  return nullptr;
}
inline XLA_FFI_Error* DeviceOrdinalGet(XLA_FFI_DeviceOrdinal_Get_Args* args) {
  args->device_ordinal = Of(args->ctx)->device;
  return nullptr;
}

// `api` reading its contexts as Contexts.
inline void ReadContexts(XLA_FFI_Api* api) {
  api->XLA_FFI_Stream_Get = StreamGet;
  api->XLA_FFI_RunId_Get = RunIdGet;
  api->XLA_FFI_DeviceOrdinal_Get = DeviceOrdinalGet;
}

}  // namespace xsim

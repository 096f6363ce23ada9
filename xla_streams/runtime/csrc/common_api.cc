// C entry points that both runtime libraries export for ctypes: ABI version,
// timeout, trace and clock. Compiled into each library beside its backend.
#include "common.h"

extern "C" {
int xs_abi_version() { return 1; }
void xs_set_timeout_ms(int64_t ms) { xs::SetTimeoutMs(ms); }
int64_t xs_get_timeout_ms() { return xs::TimeoutMs(); }
void xs_trace_enable(int on) { xs::GlobalConfig().trace = on != 0; }
void xs_trace_clear() { xs::Trace::Get().Clear(); }
size_t xs_trace_json(char* buffer, size_t capacity) {
  return xs::CopyOut(xs::Trace::Get().Json(), buffer, capacity);
}
}

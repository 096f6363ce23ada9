// The emulator's control API, beside the CUDA and NCCL functions it stands in
// for: what the harnesses (replay.cc, forward.cc, Python through ctypes) use to
// configure it, to play XLA's part (compute streams, kernels, host accesses) and
// to read what it found. Exported by the stand-in libcudart.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// One byte range a kernel reads or writes, on a device.
typedef struct {
  int device;
  const void* begin;
  size_t bytes;
  int write;
} xsim_access;

// Settings, before any stream exists for `devices` and `connections`:
//   devices N        devices in this process (default $XSIM_DEVICES, else 8)
//   connections N    hardware queues per device (default $CUDA_DEVICE_MAX_CONNECTIONS, else 8)
//   residency N      collective kernels that may wait for peers at once per device (0: any)
//   seed N           the seed of every choice among work that may run
//   defer_polls N    a non-blocking NCCL group is enqueued after N polls (0: at ncclGroupEnd)
//   init_polls N     a non-blocking init completes N polls after the last rank joined
// Returns 0, or -1 for an unknown key or a bad value.
int xsim_configure(const char* key, const char* value);

// A stream playing XLA's compute stream (or any other) on `device`.
void* xsim_stream_create(int device, const char* label);
// A kernel on `stream`: accesses checked at issue; `run(arg)` runs when it executes.
int xsim_kernel(void* stream, const char* what, const xsim_access* accesses, int count,
                double duration_us, void (*run)(void*), void* arg);
// The host reads or writes device memory now (what XLA:CPU does between calls).
int xsim_host_access(const xsim_access* access, const char* what);
// The host waits until the stream's work issued so far is done: at most
// `timeout_ms` (negative: no limit). Returns 0 when done, 1 on timeout, -1 for a
// bad stream.
int xsim_stream_wait(void* stream, int64_t timeout_ms);
// The label that this host thread's next CUDA and NCCL work carries in reports.
void xsim_set_label(const char* label);
// Makes `device` fail: "sticky" (every later CUDA call returns cudaErrorLaunchFailure)
// or "nccl" (its next collective hangs and its communicator reports ncclRemoteError).
int xsim_inject(const char* what, int device);

// What the checks found: a JSON array of {"kind": race|deadlock|misuse|mismatch,
// "message": ...}. Like snprintf: returns the length needed.
size_t xsim_reports(char* buffer, size_t capacity);
void xsim_clear_reports(void);
// How many deadlocks the checks have reported (a stream in one never drains).
int xsim_deadlocks(void);
// Every collective that ran: a JSON array of {device, stream, stream_label, queue, what}.
size_t xsim_op_log(char* buffer, size_t capacity);

#ifdef __cplusplus
}
#endif

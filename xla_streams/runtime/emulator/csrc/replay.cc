// xsim-replay: plays a lowered program's collectives through the unchanged CUDA
// backend on the emulated devices, as XLA:GPU drives it: one host thread per
// device calling the typed-FFI handlers through XLA's C API, each device's
// compute stream given by XLA_FFI_Stream_Get, producer kernels writing a start's
// operands before it and consumer kernels reading a done's results after it,
// buffers given back to an allocator after the done and handed out again, as
// XLA's allocator does.
//
//     xsim-replay BACKEND.so SCRIPT     (the script: xla_streams/runtime/emulator/replay.py)
//
// Prints one JSON object: the handlers' errors, the results that differ from the
// script's expectations, the devices whose compute stream never drained, the
// error the backend holds against each device, the emulator's reports and the
// log of collectives run.
// Linked against the stand-in libcudart and libnccl (their directory is its
// rpath), so the backend, opened after them, binds to them by soname.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "context.h"
#include "json.h"
#include "xla/ffi/api/c_api.h"
#include "xsim.h"

// What an XLA_FFI_Error is here (c_api.h leaves it to the implementation).
struct XLA_FFI_Error {
  std::string message;
  XLA_FFI_Error_Code code;
};

namespace {

// ---------------------------------------------------------------------------
// Element types: the script writes values as integers (exact in every type).

struct DType {
  const char* name;
  XLA_FFI_DataType ffi;
  size_t width;
};

const DType kTypes[] = {
    {"f32", XLA_FFI_DataType_F32, 4},  {"bf16", XLA_FFI_DataType_BF16, 2},
    {"f16", XLA_FFI_DataType_F16, 2},  {"f64", XLA_FFI_DataType_F64, 8},
    {"s8", XLA_FFI_DataType_S8, 1},    {"s32", XLA_FFI_DataType_S32, 4},
    {"s64", XLA_FFI_DataType_S64, 8},  {"u8", XLA_FFI_DataType_U8, 1},
    {"u32", XLA_FFI_DataType_U32, 4},  {"u64", XLA_FFI_DataType_U64, 8},
    {"pred", XLA_FFI_DataType_PRED, 1},
};

const DType* FindType(const std::string& name) {
  for (const DType& t : kTypes) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

uint16_t ToHalf(float f) {  // small integers only: exact
  if (f == 0) return std::signbit(f) ? 0x8000 : 0;
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint32_t sign = (bits >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((bits >> 23) & 0xff) - 127 + 15;
  return static_cast<uint16_t>(sign | (exp << 10) | ((bits & 0x7fffff) >> 13));
}

double FromHalf(uint16_t h) {
  int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v = exp == 0 ? std::ldexp(man, -24) : exp == 31 ? NAN : std::ldexp(man | 0x400, exp - 25);
  return (h & 0x8000) ? -v : v;
}

void Store(const DType& t, char* at, double v) {
  switch (t.ffi) {
    case XLA_FFI_DataType_F32: { float f = static_cast<float>(v); std::memcpy(at, &f, 4); break; }
    case XLA_FFI_DataType_F64: std::memcpy(at, &v, 8); break;
    case XLA_FFI_DataType_BF16: {
      float f = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      uint16_t b = static_cast<uint16_t>(bits >> 16);
      std::memcpy(at, &b, 2);
      break;
    }
    case XLA_FFI_DataType_F16: { uint16_t h = ToHalf(static_cast<float>(v)); std::memcpy(at, &h, 2); break; }
    case XLA_FFI_DataType_S8: *reinterpret_cast<int8_t*>(at) = static_cast<int8_t>(v); break;
    case XLA_FFI_DataType_PRED:
    case XLA_FFI_DataType_U8: *reinterpret_cast<uint8_t*>(at) = static_cast<uint8_t>(v); break;
    case XLA_FFI_DataType_S32: { int32_t i = static_cast<int32_t>(v); std::memcpy(at, &i, 4); break; }
    case XLA_FFI_DataType_U32: { uint32_t i = static_cast<uint32_t>(v); std::memcpy(at, &i, 4); break; }
    case XLA_FFI_DataType_S64: { int64_t i = static_cast<int64_t>(v); std::memcpy(at, &i, 8); break; }
    case XLA_FFI_DataType_U64: { uint64_t i = static_cast<uint64_t>(v); std::memcpy(at, &i, 8); break; }
    default: break;
  }
}

double Load(const DType& t, const char* at) {
  switch (t.ffi) {
    case XLA_FFI_DataType_F32: { float f; std::memcpy(&f, at, 4); return f; }
    case XLA_FFI_DataType_F64: { double d; std::memcpy(&d, at, 8); return d; }
    case XLA_FFI_DataType_BF16: {
      uint16_t b;
      std::memcpy(&b, at, 2);
      uint32_t bits = static_cast<uint32_t>(b) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case XLA_FFI_DataType_F16: { uint16_t h; std::memcpy(&h, at, 2); return FromHalf(h); }
    case XLA_FFI_DataType_S8: return *reinterpret_cast<const int8_t*>(at);
    case XLA_FFI_DataType_PRED:
    case XLA_FFI_DataType_U8: return *reinterpret_cast<const uint8_t*>(at);
    case XLA_FFI_DataType_S32: { int32_t i; std::memcpy(&i, at, 4); return i; }
    case XLA_FFI_DataType_U32: { uint32_t i; std::memcpy(&i, at, 4); return i; }
    case XLA_FFI_DataType_S64: { int64_t i; std::memcpy(&i, at, 8); return static_cast<double>(i); }
    case XLA_FFI_DataType_U64: { uint64_t i; std::memcpy(&i, at, 8); return static_cast<double>(i); }
    default: return NAN;
  }
}

// When the replay began: `at` steps count from here.
const auto g_began = std::chrono::steady_clock::now();

// ---------------------------------------------------------------------------
// The script.

struct Attr {
  std::string name;
  char type;  // i, s, a
  int64_t scalar = 0;
  std::string text;
  std::vector<int64_t> array;
};

struct Step {
  std::string what;  // fill, check, start, done, free, label
  std::vector<std::string> buffers, results;
  const DType* dtype = nullptr;
  std::vector<double> values;
  std::vector<Attr> attrs;
  std::string text;
  int64_t milliseconds = 0;
  int line = 0;
};

struct Script {
  int64_t timeout_ms = 0;
  int process = 0, processes = 1;
  std::map<int, int64_t> global;
  std::string kv;
  std::map<std::string, size_t> sizes;  // buffer -> bytes
  std::map<std::string, const DType*> types;  // buffer -> element type
  std::map<int, std::vector<Step>> threads;
};

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "xsim-replay: %s\n", message.c_str());
  std::exit(2);
}

Script Read(const char* path) {
  std::ifstream in(path);
  if (!in) Fail(std::string("cannot read ") + path);
  Script script;
  int device = -1, line_no = 0;
  std::string line;
  while (std::getline(in, line)) {
    ++line_no;
    std::istringstream words(line);
    std::string word;
    if (!(words >> word) || word[0] == '#') continue;
    auto where = [&] { return std::string(path) + ":" + std::to_string(line_no) + ": "; };
    if (word == "timeout_ms") {
      words >> script.timeout_ms;
    } else if (word == "process") {
      words >> script.process >> script.processes;
    } else if (word == "global") {
      int ordinal;
      int64_t id;
      words >> ordinal >> id;
      script.global[ordinal] = id;
    } else if (word == "kv") {
      words >> script.kv;
    } else if (word == "configure") {  // an emulator setting (xsim_configure)
      std::string key, value;
      words >> key >> value;
      if (xsim_configure(key.c_str(), value.c_str()) != 0) Fail(where() + "bad setting " + key);
    } else if (word == "buffer") {
      std::string name, type;
      size_t bytes;
      words >> name >> type >> bytes;
      script.sizes[name] = bytes;
      script.types[name] = FindType(type);
      if (script.types[name] == nullptr) Fail(where() + "unknown element type " + type);
    } else if (word == "thread") {
      words >> device;
    } else {
      if (device < 0) Fail(where() + "a step before any 'thread'");
      Step step;
      step.what = word;
      step.line = line_no;
      if (word == "fill" || word == "check") {
        std::string buffer;
        double v;
        words >> buffer;
        step.buffers.push_back(buffer);
        step.dtype = script.types[buffer];
        while (words >> v) step.values.push_back(v);
      } else if (word == "start" || word == "done") {
        bool results = false, attrs = false;
        while (words >> word) {
          if (word == "->") {
            results = true;
          } else if (word == "|") {
            attrs = true;
          } else if (attrs) {
            size_t eq = word.find('='), colon = word.find(':', eq);
            if (eq == std::string::npos || colon != eq + 2) Fail(where() + "bad attribute " + word);
            Attr a;
            a.name = word.substr(0, eq);
            a.type = word[eq + 1];
            std::string value = word.substr(colon + 1);
            if (a.type == 'i') a.scalar = std::stoll(value);
            if (a.type == 's') a.text = value;
            if (a.type == 'a') {
              std::istringstream items(value);
              std::string item;
              while (std::getline(items, item, ',')) a.array.push_back(std::stoll(item));
            }
            step.attrs.push_back(a);
          } else {
            (results ? step.results : step.buffers).push_back(word);
          }
        }
      } else if (word == "free") {
        std::string buffer;
        while (words >> buffer) step.buffers.push_back(buffer);
      } else if (word == "at") {
        words >> step.milliseconds;
      } else if (word == "label") {
        std::getline(words, step.text);
        if (!step.text.empty() && step.text[0] == ' ') step.text.erase(0, 1);
      } else {
        Fail(where() + "unknown step " + word);
      }
      script.threads[device].push_back(std::move(step));
    }
  }
  return script;
}

// ---------------------------------------------------------------------------
// XLA's C API, the part the handlers use.

XLA_FFI_Error* ErrorCreate(XLA_FFI_Error_Create_Args* args) {
  return new XLA_FFI_Error{args->message ? args->message : "", args->errc};
}
void ErrorGetDetails(XLA_FFI_Error_GetDetails_Args* args) {
  args->message = args->error->message.c_str();
  args->errc = args->error->code;
}
void ErrorDestroy(XLA_FFI_Error_Destroy_Args* args) { delete args->error; }
XLA_FFI_Api MakeApi() {
  XLA_FFI_Api api{};
  api.struct_size = XLA_FFI_Api_STRUCT_SIZE;
  api.api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
  api.api_version.major_version = XLA_FFI_API_MAJOR;
  api.api_version.minor_version = XLA_FFI_API_MINOR;
  api.XLA_FFI_Error_Create = ErrorCreate;
  api.XLA_FFI_Error_GetDetails = ErrorGetDetails;
  api.XLA_FFI_Error_Destroy = ErrorDestroy;
  xsim::ReadContexts(&api);
  return api;
}

const XLA_FFI_Api kApi = MakeApi();

// ---------------------------------------------------------------------------
// Running it.

struct Outcome {
  std::mutex mu;
  std::vector<std::string> errors, mismatches;
};


// One device's host thread: its buffers, its compute stream, its steps.
class Device {
 public:
  Device(int ordinal, const Script& script, Outcome* outcome, XLA_FFI_Handler* start,
         XLA_FFI_Handler* done)
      : ordinal_(ordinal), script_(script), outcome_(outcome), start_(start), done_(done) {
    compute_ = xsim_stream_create(ordinal, ("compute " + std::to_string(ordinal)).c_str());
  }

  // Runs the steps, then waits for the compute stream: false if it is still
  // blocked after `drain_ms` or deadlocked (a collective that never completes
  // holds it).
  // A call that fails ends the execution on this device, as in XLA: the steps up
  // to the next `at` (the next execution) are not made.
  bool Run(const std::vector<Step>& steps, int64_t drain_ms) {
    bool failed = false;
    for (const Step& step : steps) {
      if (step.what == "at") failed = false;
      if (!failed) failed = !Do(step);
    }
    // Drained, or never: a stream caught in a deadlock the checks reported is
    // not waited for.
    for (int64_t waited = 0; waited < drain_ms; waited += 50) {
      if (xsim_stream_wait(compute_, 50) == 0) return true;
      if (xsim_deadlocks() > 0) return false;
    }
    return false;
  }

 private:
  struct Checked {
    Device* device;
    std::string buffer, where;
    const DType* dtype;
    const char* data;
    std::vector<double> values;
  };
  struct Filled {
    const DType* dtype;
    char* data;
    std::vector<double> values;
  };

  char* Memory(const std::string& name) {
    auto it = live_.find(name);
    if (it != live_.end()) return it->second;
    auto size = script_.sizes.find(name);
    if (size == script_.sizes.end()) Fail("buffer " + name + " was not declared");
    size_t bytes = std::max<size_t>(size->second, 1);
    auto& pool = free_[bytes];
    char* p;
    if (!pool.empty()) {  // the allocator's most recently freed block first
      p = pool.back();
      pool.pop_back();
    } else {
      p = static_cast<char*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256));
    }
    live_[name] = p;
    return p;
  }

  // False if the step was a call that failed.
  bool Do(const Step& step) {
    std::string where = "device " + std::to_string(ordinal_) + ", script line " + std::to_string(step.line);
    if (step.what == "label") {
      xsim_set_label(step.text.c_str());
    } else if (step.what == "at") {  // a later execution, at a time every device shares
      std::this_thread::sleep_until(g_began + std::chrono::milliseconds(step.milliseconds));
    } else if (step.what == "fill") {
      char* data = Memory(step.buffers[0]);
      auto* filled = new Filled{step.dtype, data, step.values};
      xsim_access access{ordinal_, data, step.values.size() * step.dtype->width, 1};
      xsim_kernel(compute_, ("producer of " + step.buffers[0]).c_str(), &access, 1, 5.0,
                  [](void* arg) {
                    auto* f = static_cast<Filled*>(arg);
                    for (size_t i = 0; i < f->values.size(); ++i) {
                      Store(*f->dtype, f->data + i * f->dtype->width, f->values[i]);
                    }
                    delete f;
                  },
                  filled);
    } else if (step.what == "check") {
      char* data = Memory(step.buffers[0]);
      auto* checked = new Checked{this, step.buffers[0], where, step.dtype, data, step.values};
      xsim_access access{ordinal_, data, step.values.size() * step.dtype->width, 0};
      xsim_kernel(compute_, ("consumer of " + step.buffers[0]).c_str(), &access, 1, 5.0,
                  [](void* arg) {
                    auto* c = static_cast<Checked*>(arg);
                    for (size_t i = 0; i < c->values.size(); ++i) {
                      double got = Load(*c->dtype, c->data + i * c->dtype->width);
                      if (got != c->values[i]) {
                        std::ostringstream os;
                        os << c->where << ": " << c->buffer << "[" << i << "] is " << got
                           << ", expected " << c->values[i];
                        std::lock_guard<std::mutex> lock(c->device->outcome_->mu);
                        c->device->outcome_->mismatches.push_back(os.str());
                        break;
                      }
                    }
                    delete c;
                  },
                  checked);
    } else if (step.what == "free") {
      for (const std::string& name : step.buffers) {
        auto it = live_.find(name);
        if (it == live_.end()) continue;
        free_[std::max<size_t>(script_.sizes.at(name), 1)].push_back(it->second);
        live_.erase(it);
      }
    } else {
      return Call(step, where);
    }
    return true;
  }

  bool Call(const Step& step, const std::string& where) {
    std::vector<std::vector<int64_t>> dims;
    std::vector<XLA_FFI_Buffer> buffers;
    auto add = [&](const std::string& name) {
      const DType* t = script_.types.at(name);
      dims.push_back({static_cast<int64_t>(script_.sizes.at(name) / t->width)});
      buffers.push_back({XLA_FFI_Buffer_STRUCT_SIZE, nullptr, t->ffi, Memory(name), 1, nullptr});
    };
    for (const std::string& b : step.buffers) add(b);
    for (const std::string& b : step.results) add(b);
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].dims = dims[i].data();
    size_t nargs = step.buffers.size(), nrets = step.results.size();
    std::vector<XLA_FFI_ArgType> arg_types(nargs, XLA_FFI_ArgType_BUFFER);
    std::vector<XLA_FFI_RetType> ret_types(nrets, XLA_FFI_RetType_BUFFER);
    std::vector<void*> args, rets;
    for (size_t i = 0; i < nargs; ++i) args.push_back(&buffers[i]);
    for (size_t i = 0; i < nrets; ++i) rets.push_back(&buffers[nargs + i]);

    // Attributes, sorted by name as XLA passes them.
    std::vector<Attr> attrs = step.attrs;
    std::sort(attrs.begin(), attrs.end(), [](const Attr& a, const Attr& b) { return a.name < b.name; });
    std::vector<XLA_FFI_ByteSpan> names(attrs.size()), strings(attrs.size());
    std::vector<XLA_FFI_ByteSpan*> name_ptrs;
    std::vector<XLA_FFI_Scalar> scalars(attrs.size());
    std::vector<XLA_FFI_Array> arrays(attrs.size());
    std::vector<XLA_FFI_AttrType> attr_types;
    std::vector<void*> attr_values;
    for (size_t i = 0; i < attrs.size(); ++i) {
      names[i] = {attrs[i].name.data(), attrs[i].name.size()};
      name_ptrs.push_back(&names[i]);
      if (attrs[i].type == 'i') {
        scalars[i] = {XLA_FFI_DataType_S64, &attrs[i].scalar};
        attr_types.push_back(XLA_FFI_AttrType_SCALAR);
        attr_values.push_back(&scalars[i]);
      } else if (attrs[i].type == 's') {
        strings[i] = {attrs[i].text.data(), attrs[i].text.size()};
        attr_types.push_back(XLA_FFI_AttrType_STRING);
        attr_values.push_back(&strings[i]);
      } else {
        arrays[i] = {XLA_FFI_DataType_S64, attrs[i].array.size(), attrs[i].array.data()};
        attr_types.push_back(XLA_FFI_AttrType_ARRAY);
        attr_values.push_back(&arrays[i]);
      }
    }
    xsim::Context ctx{ordinal_, /*run=*/1, compute_};
    XLA_FFI_CallFrame frame{};
    frame.struct_size = XLA_FFI_CallFrame_STRUCT_SIZE;
    frame.api = &kApi;
    frame.ctx = reinterpret_cast<XLA_FFI_InvokeContext*>(&ctx);
    frame.stage = XLA_FFI_ExecutionStage_EXECUTE;
    frame.args = {XLA_FFI_Args_STRUCT_SIZE, nullptr, static_cast<int64_t>(nargs), arg_types.data(), args.data()};
    frame.rets = {XLA_FFI_Rets_STRUCT_SIZE, nullptr, static_cast<int64_t>(nrets), ret_types.data(), rets.data()};
    frame.attrs = {XLA_FFI_Attrs_STRUCT_SIZE, nullptr, static_cast<int64_t>(attrs.size()),
                   attr_types.data(), name_ptrs.data(), attr_values.data()};
    XLA_FFI_Error* error = (step.what == "start" ? start_ : done_)(&frame);
    if (error == nullptr) return true;
    std::lock_guard<std::mutex> lock(outcome_->mu);
    outcome_->errors.push_back(where + ": " + step.what + ": " + error->message);
    delete error;
    return false;
  }

  int ordinal_;
  const Script& script_;
  Outcome* outcome_;
  XLA_FFI_Handler *start_, *done_;
  void* compute_;
  std::map<std::string, char*> live_;
  std::map<size_t, std::vector<char*>> free_;
};

// A key-value store in a directory shared by the processes of one job: what
// JAX's distributed client is to the backend (xs_cuda_set_kv).
std::string g_kv;

std::string KvPath(const char* key) {
  std::string name = key;
  for (char& c : name) {
    if (c == '/') c = '_';
  }
  return g_kv + "/" + name;
}

int KvSet(const char* key, const char* value, size_t size, int overwrite) {
  std::string path = KvPath(key), tmp = path + ".tmp" + std::to_string(getpid());
  if (!overwrite && access(path.c_str(), F_OK) == 0) return -1;  // as JAX's store refuses
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return -1;
  bool ok = std::fwrite(value, 1, size, f) == size;
  ok = std::fclose(f) == 0 && ok;
  return ok && std::rename(tmp.c_str(), path.c_str()) == 0 ? 0 : -1;
}

int64_t KvGet(const char* key, int64_t timeout_ms, char* buffer, size_t capacity) {
  std::string path = KvPath(key);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (FILE* f = std::fopen(path.c_str(), "rb")) {
      size_t n = std::fread(buffer, 1, capacity, f);
      std::fclose(f);
      return static_cast<int64_t>(n);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return -1;
}

template <typename T>
T Symbol(void* library, const char* name) {
  void* p = dlsym(library, name);
  if (p == nullptr) Fail(std::string("the backend has no ") + name);
  return reinterpret_cast<T>(p);
}

std::string Buffered(size_t (*read)(char*, size_t)) {
  std::string out(read(nullptr, 0) + 1, '\0');
  read(out.data(), out.size());
  out.resize(out.size() - 1);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) Fail("usage: xsim-replay BACKEND.so SCRIPT");
  Script script = Read(argv[2]);
  void* backend = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (backend == nullptr) Fail(std::string("cannot load the backend: ") + dlerror());
  auto start = Symbol<XLA_FFI_Handler*>(backend, "xla_streams_cuda_start");
  auto done = Symbol<XLA_FFI_Handler*>(backend, "xla_streams_cuda_done");
  if (script.timeout_ms > 0) Symbol<void (*)(int64_t)>(backend, "xs_set_timeout_ms")(script.timeout_ms);
  for (auto& [ordinal, id] : script.global) {
    Symbol<void (*)(int, int64_t)>(backend, "xs_cuda_set_global_id")(ordinal, id);
  }
  if (!script.kv.empty()) {
    g_kv = script.kv;
    Symbol<void (*)(decltype(&KvSet), decltype(&KvGet))>(backend, "xs_cuda_set_kv")(KvSet, KvGet);
  }
  Outcome outcome;
  std::vector<std::unique_ptr<Device>> devices;
  for (auto& [ordinal, steps] : script.threads) {
    devices.push_back(std::make_unique<Device>(ordinal, script, &outcome, start, done));
  }
  // A stream still blocked this long after its thread's last step is reported,
  // not waited for: a collective still running past its timeout is hung and holds
  // its device's compute stream for ever.
  int64_t drain_ms = script.timeout_ms > 0 ? script.timeout_ms + 1000 : 60000;
  std::vector<std::thread> threads;
  std::vector<int> blocked;
  std::mutex blocked_mu;
  size_t i = 0;
  for (auto& [ordinal, steps] : script.threads) {
    Device* device = devices[i++].get();
    const std::vector<Step>* list = &steps;
    int id = ordinal;
    threads.emplace_back([&, device, list, id] {
      if (!device->Run(*list, drain_ms)) {
        std::lock_guard<std::mutex> lock(blocked_mu);
        blocked.push_back(id);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  // The backend's watchdog polls the collectives in flight every 20 ms from a
  // thread of its own: linger for a few of its sweeps, so that its NCCL calls are
  // checked too (the lockset check of nccl.cc).
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::sort(blocked.begin(), blocked.end());
  std::ostringstream os;
  os << "{\"errors\":[";
  for (size_t k = 0; k < outcome.errors.size(); ++k) os << (k ? "," : "") << xsim::JsonString(outcome.errors[k]);
  os << "],\"mismatches\":[";
  for (size_t k = 0; k < outcome.mismatches.size(); ++k) os << (k ? "," : "") << xsim::JsonString(outcome.mismatches[k]);
  os << "],\"blocked\":[";
  for (size_t k = 0; k < blocked.size(); ++k) os << (k ? "," : "") << blocked[k];
  // What the backend holds against each device at the end (xs_cuda_device_error).
  os << "],\"device_errors\":{";
  auto device_error = reinterpret_cast<size_t (*)(int, char*, size_t)>(dlsym(backend, "xs_cuda_device_error"));
  bool first = true;
  for (auto& [ordinal, steps] : script.threads) {
    char message[4096];
    if (device_error != nullptr && device_error(ordinal, message, sizeof(message)) > 0) {
      os << (first ? "" : ",") << "\"" << ordinal << "\":" << xsim::JsonString(message);
      first = false;
    }
  }
  os << "},\"reports\":" << Buffered(xsim_reports) << ",\"op_log\":" << Buffered(xsim_op_log) << "}";
  std::printf("%s\n", os.str().c_str());
  std::fflush(stdout);
  // The backend's watchdog thread is detached and never ends: leave without
  // running static destructors under it.
  std::_Exit(0);
}

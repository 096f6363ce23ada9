// How the emulated NCCL's ranks meet: every communicator's ranks talk to one
// hub, kept by the process that called ncclGetUniqueId, directly when they live
// in that process and over an abstract Unix socket named in the unique id when
// they do not (so a job of several processes on one machine works as one
// clique). The hub counts joins and contributions; each rank computes its own
// results from everyone's contributions (nccl.cc).
//
// Sends never block: they queue, and one I/O thread per process writes and reads
// the sockets; received messages are handled under the model's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace xsim {

// One primitive of a rank's NCCL group: a collective or one half of a send/recv.
struct Prim {
  enum Kind : uint8_t { kAllReduce, kAllGather, kReduceScatter, kSend, kRecv };
  Kind kind = kAllReduce;
  int32_t dtype = 0;
  int32_t op = 0;      // reduction
  int64_t count = 0;   // elements, as the NCCL call counts them
  int32_t peer = -1;   // send/recv
  std::string data;    // what the rank sends (collectives: its input; send: the message)
};

struct Contribution {
  int32_t rank = -1;
  double begin_us = 0;
  std::vector<Prim> prims;
};

struct Message {
  enum Type : uint8_t { kJoin = 1, kReady, kRefuse, kContribute, kComplete, kMismatch, kAbort };
  Type type = kJoin;
  int32_t nranks = 0, rank = -1;
  uint64_t seq = 0;
  std::string text;
  std::vector<Contribution> contributions;
};

std::string Encode(const Message& m);
// Decodes one message of `buffer` from `at` (advanced past it); false if incomplete.
bool Decode(const std::string& buffer, size_t* at, Message* out);

// The process's sockets and their I/O thread.
class Transport {
 public:
  using OnMessage = std::function<void(const Message&)>;
  using OnClose = std::function<void()>;
  using OnAccept = std::function<void(int fd)>;

  static Transport& Get();
  // Listens on the abstract socket `name`; `accept` is called for each peer.
  bool Listen(const std::string& name, OnAccept accept);
  // Connects to `name`; -1 if no one listens there.
  int Connect(const std::string& name);
  // What happens with the messages of `fd` (handlers run under the model's lock).
  void Watch(int fd, OnMessage on_message, OnClose on_close);
  void Send(int fd, const Message& m);

 private:
  struct Conn {
    std::string in, out;
    OnMessage on_message;
    OnClose on_close;
    OnAccept on_accept;  // a listening socket
  };
  Transport();
  void Loop();
  void Wake();

  std::mutex mu_;
  std::map<int, Conn> conns_;
  int wake_[2] = {-1, -1};
};

}  // namespace xsim

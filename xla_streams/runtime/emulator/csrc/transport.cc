// transport.h: message encoding and the socket I/O thread.
#include "transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "model.h"

namespace xsim {
namespace {

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    out.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void Bytes(const std::string& s) {
    Put<uint64_t>(s.size());
    out += s;
  }
  std::string out;
};

class Reader {
 public:
  Reader(const std::string& s, size_t at, size_t end) : s_(s), at_(at), end_(end) {}
  template <typename T>
  bool Get(T* v) {
    if (end_ - at_ < sizeof(T)) return false;
    std::memcpy(v, s_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }
  bool Bytes(std::string* v) {
    uint64_t n;
    if (!Get(&n) || end_ - at_ < n) return false;
    v->assign(s_, at_, n);
    at_ += n;
    return true;
  }

 private:
  const std::string& s_;
  size_t at_, end_;
};

sockaddr_un Address(const std::string& name, socklen_t* length) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  // An abstract name: a NUL, then the name; nothing on the file system.
  size_t n = std::min(name.size(), sizeof(address.sun_path) - 1);
  std::memcpy(address.sun_path + 1, name.data(), n);
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return address;
}

}  // namespace

std::string Encode(const Message& m) {
  Writer body;
  body.Put<uint8_t>(m.type);
  body.Put(m.nranks);
  body.Put(m.rank);
  body.Put(m.seq);
  body.Bytes(m.text);
  body.Put<uint32_t>(static_cast<uint32_t>(m.contributions.size()));
  for (const Contribution& c : m.contributions) {
    body.Put(c.rank);
    body.Put(c.begin_us);
    body.Put<uint32_t>(static_cast<uint32_t>(c.prims.size()));
    for (const Prim& p : c.prims) {
      body.Put<uint8_t>(p.kind);
      body.Put(p.dtype);
      body.Put(p.op);
      body.Put(p.count);
      body.Put(p.peer);
      body.Bytes(p.data);
    }
  }
  Writer framed;
  framed.Bytes(body.out);
  return framed.out;
}

bool Decode(const std::string& buffer, size_t* at, Message* out) {
  uint64_t size;
  if (buffer.size() - *at < sizeof(size)) return false;
  std::memcpy(&size, buffer.data() + *at, sizeof(size));
  if (buffer.size() - *at - sizeof(size) < size) return false;
  size_t begin = *at + sizeof(size);
  Reader r(buffer, begin, begin + size);
  *at = begin + size;
  uint8_t type;
  uint32_t n;
  Message m;
  if (!r.Get(&type) || !r.Get(&m.nranks) || !r.Get(&m.rank) || !r.Get(&m.seq) ||
      !r.Bytes(&m.text) || !r.Get(&n)) {
    return false;
  }
  m.type = static_cast<Message::Type>(type);
  for (uint32_t i = 0; i < n; ++i) {
    Contribution c;
    uint32_t prims;
    if (!r.Get(&c.rank) || !r.Get(&c.begin_us) || !r.Get(&prims)) return false;
    for (uint32_t j = 0; j < prims; ++j) {
      Prim p;
      uint8_t kind;
      if (!r.Get(&kind) || !r.Get(&p.dtype) || !r.Get(&p.op) || !r.Get(&p.count) ||
          !r.Get(&p.peer) || !r.Bytes(&p.data)) {
        return false;
      }
      p.kind = static_cast<Prim::Kind>(kind);
      c.prims.push_back(std::move(p));
    }
    m.contributions.push_back(std::move(c));
  }
  *out = std::move(m);
  return true;
}

Transport& Transport::Get() {
  static Transport* transport = new Transport();
  return *transport;
}

Transport::Transport() {
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) wake_[0] = wake_[1] = -1;
  std::thread([this] { Loop(); }).detach();
}

void Transport::Wake() {
  char byte = 0;
  if (wake_[1] >= 0) (void)!write(wake_[1], &byte, 1);
}

bool Transport::Listen(const std::string& name, OnAccept accept) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return false;
  socklen_t length;
  sockaddr_un address = Address(name, &length);
  if (bind(fd, reinterpret_cast<sockaddr*>(&address), length) != 0 || listen(fd, 256) != 0) {
    close(fd);
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  conns_[fd].on_accept = std::move(accept);
  Wake();
  return true;
}

int Transport::Connect(const std::string& name) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  socklen_t length;
  sockaddr_un address = Address(name, &length);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), length) != 0) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, O_NONBLOCK);
  return fd;
}

void Transport::Watch(int fd, OnMessage on_message, OnClose on_close) {
  std::lock_guard<std::mutex> lock(mu_);
  Conn& conn = conns_[fd];
  conn.on_message = std::move(on_message);
  conn.on_close = std::move(on_close);
  Wake();
}

void Transport::Send(int fd, const Message& m) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;  // closed: the peer is gone, as a dead rank is
  it->second.out += Encode(m);
  Wake();
}

void Transport::Loop() {
  for (;;) {
    std::vector<pollfd> fds;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fds.push_back({wake_[0], POLLIN, 0});
      for (auto& [fd, conn] : conns_) {
        short events = POLLIN;
        if (!conn.out.empty()) events |= POLLOUT;
        fds.push_back({fd, events, 0});
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) return;
    char drain[256];
    while (read(wake_[0], drain, sizeof(drain)) > 0) {
    }
    // Handlers run after the transport's lock is released, under the model's.
    std::vector<std::function<void()>> handlers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 1; i < fds.size(); ++i) {
        auto it = conns_.find(fds[i].fd);
        if (it == conns_.end() || fds[i].revents == 0) continue;
        Conn& conn = it->second;
        int fd = fds[i].fd;
        if (conn.on_accept) {
          int peer = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (peer >= 0) {
            conns_[peer];  // handlers set by on_accept's Watch
            OnAccept on_accept = conn.on_accept;
            handlers.push_back([on_accept, peer] { on_accept(peer); });
          }
          continue;
        }
        if (fds[i].revents & POLLOUT) {
          ssize_t n = write(fd, conn.out.data(), conn.out.size());
          if (n > 0) conn.out.erase(0, static_cast<size_t>(n));
        }
        bool closed = (fds[i].revents & (POLLHUP | POLLERR)) != 0;
        if (fds[i].revents & POLLIN) {
          char buffer[65536];
          ssize_t n;
          while ((n = read(fd, buffer, sizeof(buffer))) > 0) conn.in.append(buffer, n);
          if (n == 0) closed = true;
        }
        size_t at = 0;
        Message m;
        while (Decode(conn.in, &at, &m)) {
          OnMessage on_message = conn.on_message;
          handlers.push_back([on_message, m] {
            if (on_message) on_message(m);
          });
        }
        conn.in.erase(0, at);
        if (closed) {
          OnClose on_close = conn.on_close;
          if (on_close) handlers.push_back(on_close);
          close(fd);
          conns_.erase(it);
        }
      }
    }
    if (handlers.empty()) continue;
    Model& model = Model::Get();
    std::lock_guard<std::mutex> lock(model.mu());
    for (auto& handler : handlers) handler();
    model.Progress();
  }
}

}  // namespace xsim
